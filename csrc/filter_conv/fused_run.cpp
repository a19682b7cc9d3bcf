// Fused bottleneck of filter-sparse layers over bands of output rows (fused_run.h).
#include "csrc/filter_conv/fused_run.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "csrc/core/isa.h"

namespace sparsejit::filter_conv {

std::string check_bottleneck(int64_t c_in, int64_t h, int64_t w, const Pattern& p1,
                             int64_t cin1, const Pattern& p2, int64_t cin2, int64_t r, int64_t s,
                             int64_t stride, const Pattern& p3, int64_t cin3, const Pattern* p4,
                             int64_t cin4) {
  auto n = [](int64_t v) { return std::to_string(v); };
  if (h < 1 || w < 1) return "x must have at least one row and column; got " + n(h) + "x" + n(w);
  if (cin1 != c_in)
    return "conv1 takes " + n(cin1) + " channels but x has " + n(c_in);
  if (p1.cols != cin1) return "conv1 must be 1x1";
  if (r < 1 || s < 1 || r % 2 == 0 || s % 2 == 0)
    return "conv2's kernel must be odd in both dimensions; got " + n(r) + "x" + n(s);
  if (r > 63 || s > 63) return "conv2's kernel must be at most 63x63";
  if (stride < 1 || stride > 8) return "stride2 must be in [1, 8]; got " + n(stride);
  if (cin2 != p1.c_out)
    return "conv2 takes " + n(cin2) + " channels but conv1 gives " + n(p1.c_out);
  if (p2.cols != cin2 * r * s) return "conv2's pattern does not match its kernel";
  if (cin3 != p2.c_out)
    return "conv3 takes " + n(cin3) + " channels but conv2 gives " + n(p2.c_out);
  if (p3.cols != cin3) return "conv3 must be 1x1";
  if (p4 == nullptr && stride != 1)
    return "a strided block (stride2 = " + n(stride) + ") needs the projection shortcut";
  if (p4 == nullptr && p3.c_out != c_in)
    return "conv3 gives " + n(p3.c_out) + " channels; the identity residual needs " + n(c_in);
  if (p4 != nullptr) {
    if (cin4 != c_in)
      return "the shortcut takes " + n(cin4) + " channels but x has " + n(c_in);
    if (p4->cols != cin4) return "the shortcut must be 1x1";
    if (p4->c_out != p3.c_out)
      return "the shortcut gives " + n(p4->c_out) + " channels but conv3 gives " + n(p3.c_out);
  }
  if (double(c_in) * h * w > double(1 << 30)) return "x's image is too large (over 2^30 floats)";
  return "";
}

int64_t choose_band(int64_t h2, int64_t w, int64_t w2, int64_t m1, int64_t m2, int64_t r,
                    int64_t s, int64_t stride) {
  // A quarter of L2 for the two buffers (the rest for the weights and the input rows);
  // `bench_filter_conv.py --blocks --bands` times other heights against it.
  const double budget = double(cpu_l2_bytes()) / 4;
  const double per_row = 4.0 * (double(m1) * stride * (w + s - 1) + double(m2) * w2);
  const int64_t fit = static_cast<int64_t>(budget / std::max(per_row, 1.0)) - (r - 1);
  return std::clamp<int64_t>(fit, std::min<int64_t>(r, h2), h2);
}

std::shared_ptr<const Bottleneck> prepare_bottleneck(int64_t c_in, int64_t h, int64_t w,
                                                     const BlockWeights& W, int64_t r, int64_t s,
                                                     int64_t stride, int64_t band, Variant v) {
  auto out = std::make_shared<Bottleneck>();
  Bottleneck& B = *out;
  const Pattern &p1 = *W.p1, &p2 = *W.p2, &p3 = *W.p3;
  B.c_in = c_in;
  B.m1 = p1.c_out;
  B.m2 = p2.c_out;
  B.c_out = p3.c_out;
  B.h = h;
  B.w = w;
  B.r = r;
  B.s = s;
  B.stride = stride;
  B.h2 = (h + 2 * (r / 2) - r) / stride + 1;
  B.w2 = (w + 2 * (s / 2) - s) / stride + 1;
  B.band = band > 0 ? std::min(band, B.h2)
                    : choose_band(B.h2, w, B.w2, B.m1, B.m2, r, s, stride);
  // Each layer prepared on one band: its tap offsets index the per-thread buffers. conv2's
  // band reads stride * (band - 1) + r input rows: its phase planes are conv1's buffer.
  Geometry g1;
  g1.batch = 1;
  g1.c_in = c_in;
  g1.h = B.band;
  g1.w = B.w2;
  g1.c_out = B.m1;
  Geometry g2;
  g2.batch = 1;
  g2.c_in = B.m1;
  g2.c_out = B.m2;
  g2.h = stride * (B.band - 1) + r - 2 * (r / 2);
  g2.w = w;
  g2.r = r;
  g2.s = s;
  g2.pad_h = r / 2;
  g2.pad_w = s / 2;
  g2.stride_h = g2.stride_w = stride;
  Geometry g3 = g1;
  g3.c_in = B.m2;
  g3.c_out = B.c_out;
  // Each layer keeps the tile its own call on the whole image gets (choose_variant of the
  // layer's full geometry), so the block's sums are those of the layer calls, bit for bit,
  // whatever the band height.
  Geometry f1 = g1, f2 = g2, f3 = g3;
  f1.h = h;
  f1.w = w;
  f2.h = h;
  f3.h = B.h2;
  auto nnz = [](const Pattern& p) { return p.rowptr[p.c_out]; };
  B.P1 = prepare(g1, p1, v, choose_variant(f1, nnz(p1)));
  B.P2 = prepare(g2, p2, v, choose_variant(f2, nnz(p2)));
  B.P3 = prepare(g3, p3, v, choose_variant(f3, nnz(p3)));
  if (W.p4 != nullptr) {  // its output pixels are conv3's: the same tiles
    Geometry g4 = g1;
    g4.c_out = B.c_out;
    B.P4 = prepare(g4, *W.p4, v, B.P3->variant);
    if (tile_pixels(B.P4->variant) != tile_pixels(B.P3->variant))  // a forced variant
      B.P4 = prepare(g4, *W.p4, B.P3->variant);
  }
  return out;
}

namespace {

constexpr int64_t kSlack = 128;  // floats past each buffer (vector overrun of a tile, >= 64)
constexpr int64_t kAccBytes = 4 * 1024;  // accumulators of one output-channel block

inline void run_tile(const Prepared& P, const BlockLaunch& bl) {
  if (P.block_fn != nullptr) {
    P.block_fn(&bl);
  } else if (P.variant != Variant::Scalar && cpu_has_avx2_fma()) {
    run_block_avx2(bl, P.variant);
  } else {
    run_block_generic(bl, P.variant);
  }
}

inline int64_t block_of(int64_t tile, int64_t c_out) {
  return std::clamp<int64_t>(kAccBytes / (tile * 4), 8, std::max<int64_t>(c_out, 1));
}

float* aligned(std::vector<float>& store) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(store.data()) + 63) &
                                  ~uintptr_t(63));
}

// One thread's buffers and the walk down one strip of one image.
//
// conv1's buffer is conv2's phase planes for one band ([m1][slots][hq][wq], P2's layout):
// input row y, column x sits at padded (y - base, x + pad_w), i.e. in the plane of phase
// ((y - base) % stride, (x + pad_w) % stride), row (y - base) / stride, column (x + pad_w) /
// stride, where base = stride * r0 - pad_h is the band's first padded row. The next band's
// base is stride * band rows further: each plane's rows from `band` on move to the top.
struct StripRunner {
  const Bottleneck& B;
  const Pattern &p1, &p2, &p3;
  const Pattern* p4;
  const float *b1, *b2, *b3, *b4;
  int64_t T1, T2, T3, st, ph_pad, pw_pad, wq, hq, plane, plane_c, tiles3;
  std::vector<float> buf1, buf2, panel_store, acc, acc4;
  float* panel;

  StripRunner(const Bottleneck& b, const BlockWeights& W)
      : B(b), p1(*W.p1), p2(*W.p2), p3(*W.p3), p4(W.p4), b1(W.b1), b2(W.b2), b3(W.b3),
        b4(W.b4) {
    T1 = tile_pixels(B.P1->variant);
    T2 = tile_pixels(B.P2->variant);
    T3 = tile_pixels(B.P3->variant);
    st = B.stride;
    ph_pad = B.r / 2;
    pw_pad = B.s / 2;
    wq = B.P2->wq;
    hq = B.P2->hq;
    plane = B.P2->plane;
    plane_c = B.P2->plane_c;
    tiles3 = (B.band * B.w2 + T3 - 1) / T3;
    // Zeroed once: the padding columns of buf1 are never written, and the tails of the last
    // panel of buf2 are only read into discarded outputs.
    buf1.assign(B.m1 * plane_c + kSlack, 0.0f);
    buf2.assign(tiles3 * B.m2 * T3 + kSlack, 0.0f);
    panel_store.assign(B.c_in * std::max(T1, T3) + 16, 0.0f);  // conv1's and the shortcut's
    panel = aligned(panel_store);
    acc.assign(std::max({block_of(T1, B.m1) * T1, block_of(T2, B.m2) * T2,
                         block_of(T3, B.c_out) * T3}), 0.0f);
    if (B.P4) acc4.assign(block_of(T3, B.c_out) * T3, 0.0f);
  }

  // Where padded row pr (from the band's base) and padded column pc start in channel 0's
  // planes (null for a phase no tap reads).
  float* at(int64_t pr, int64_t pc) {
    const int64_t sl = B.P2->slot.empty() ? 0 : B.P2->slot[(pr % st) * st + pc % st];
    return sl < 0 ? nullptr : buf1.data() + sl * plane + (pr / st) * wq + pc / st;
  }

  // conv1 on image rows [ra, rb) of image xn into buf1 (padded row = image row - base).
  template <typename E>
  void conv1_rows(const E* xn, int64_t ra, int64_t rb, int64_t base) {
    const int64_t hw = B.h * B.w, W = B.w;
    const Prepared& P = *B.P1;
    const int64_t ocb = block_of(T1, B.m1);
    for (int64_t p0 = ra * W; p0 < rb * W; p0 += T1) {
      const int64_t n = std::min(T1, rb * W - p0);
      for (int64_t c = 0; c < B.c_in; ++c) {
        float* d = panel + c * T1;
        if constexpr (std::is_same_v<E, float>) {
          std::memcpy(d, xn + c * hw + p0, sizeof(float) * n);
        } else {  // bfloat16 widened where it is staged (exact)
          for (int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(xn[c * hw + p0 + i]);
        }
        std::fill(d + n, d + T1, 0.0f);
      }
      for (int64_t oc0 = 0; oc0 < B.m1; oc0 += ocb) {
        const int64_t oc1 = std::min(B.m1, oc0 + ocb);
        const BlockLaunch bl{panel, P.off_packed.data(), p1.values, P.cp.data(), acc.data(),
                             oc0, oc1, P.chunks, B.m1, B.c_in * T1};
        run_tile(P, bl);
        for (int64_t oc = oc0; oc < oc1; ++oc) {
          const float bias = b1 != nullptr ? b1[oc] : 0.0f;
          const float* a = acc.data() + (oc - oc0) * T1;
          float* chan = buf1.data() + oc * plane_c;
          for (int64_t i = 0; i < n;) {  // runs within one image row
            const int64_t pix = p0 + i, row = pix / W, col = pix % W;
            const int64_t run = std::min(n - i, W - col);
            if (st == 1) {
              float* d = at(row - base, col + pw_pad) - buf1.data() + chan;
              for (int64_t k = 0; k < run; ++k) {
                const float z = a[i + k] + bias;
                d[k] = z > 0.0f ? z : 0.0f;
              }
            } else {  // columns cycle through the phases' planes: one row pointer each
              float* dst[8];
              for (int64_t ph = 0; ph < st; ++ph) {
                float* d = at(row - base, ph);  // padded column ph: phase ph, column 0
                dst[ph] = d == nullptr ? nullptr : d - buf1.data() + chan;
              }
              int64_t pc = col + pw_pad, phase = pc % st, j = pc / st;
              for (int64_t k = 0; k < run; ++k) {
                if (dst[phase] != nullptr) {  // (null: a phase no tap reads)
                  const float z = a[i + k] + bias;
                  dst[phase][j] = z > 0.0f ? z : 0.0f;
                }
                if (++phase == st) {
                  phase = 0;
                  ++j;
                }
              }
            }
            i += run;
          }
        }
      }
    }
  }

  // Padded rows [first, first + count) of every channel's planes are zeros (outside the image).
  void zero_rows(int64_t first, int64_t count) {
    for (int64_t pr = first; pr < first + count; ++pr) {
      for (int64_t pc = 0; pc < st; ++pc) {
        float* row = at(pr, pc);  // (pc < st: column 0 of phase pc's plane row)
        if (row == nullptr) continue;
        for (int64_t c = 0; c < B.m1; ++c) std::fill_n(row + c * plane_c, wq, 0.0f);
      }
    }
  }

  // Output rows [s0, s1) of image xn (its output yn), band by band.
  template <typename E>
  void run(const E* xn, E* yn, int64_t s0, int64_t s1) {
    const int64_t H = B.h, W = B.w, hw = H * W, W2 = B.w2, hw2 = B.h2 * W2;
    // conv1 rows up to this image row (excl.) sit in buf1; none before the first band
    int64_t have_hi = std::numeric_limits<int64_t>::min();
    for (int64_t r0 = s0; r0 < s1; r0 += B.band) {
      const int64_t r1 = std::min(s1, r0 + B.band), rows = r1 - r0;
      const int64_t base = st * r0 - ph_pad;  // image row of padded row 0
      // The rows this band reads: [base, need_hi). Keep what the last band computed.
      const int64_t need_hi = st * (r1 - 1) + B.r - ph_pad;
      int64_t from = base;
      if (have_hi > base) {
        const int64_t keep_rows = hq - B.band;  // plane rows from `band` on move up
        for (int64_t c = 0; c < B.m1; ++c) {
          for (int64_t sl = 0; sl < plane_c / plane; ++sl) {  // each phase plane read
            float* p = buf1.data() + c * plane_c + sl * plane;
            std::memmove(p, p + B.band * wq, sizeof(float) * keep_rows * wq);
          }
        }
        from = have_hi;
      }
      if (from < 0) {  // the padding above the image
        zero_rows(from - base, std::min<int64_t>(0, need_hi) - from);
        from = 0;
      }
      const int64_t comp_hi = std::min(need_hi, H);
      if (comp_hi > from) conv1_rows(xn, from, comp_hi, base);
      if (need_hi > std::max(comp_hi, from))  // and below it
        zero_rows(std::max(comp_hi, from) - base, need_hi - std::max(comp_hi, from));
      have_hi = need_hi;  // buf1 holds image rows [base, need_hi), padding rows included

      // conv2 over the band's flattened output rows (columns past W2 dropped) into conv3's
      // panels
      {
        const Prepared& P = *B.P2;
        const int64_t ocb = block_of(T2, B.m2);
        const int64_t len = (rows - 1) * wq + W2;
        for (int64_t q0 = 0; q0 < len; q0 += T2) {
          const int64_t n = std::min(T2, len - q0);
          for (int64_t oc0 = 0; oc0 < B.m2; oc0 += ocb) {
            const int64_t oc1 = std::min(B.m2, oc0 + ocb);
            const BlockLaunch bl{buf1.data() + q0, P.off.data(), p2.values, P.cp.data(),
                                 acc.data(), oc0, oc1, P.chunks, B.m2, B.m1 * plane_c};
            run_tile(P, bl);
            for (int64_t oc = oc0; oc < oc1; ++oc) {
              const float bias = b2 != nullptr ? b2[oc] : 0.0f;
              const float* a = acc.data() + (oc - oc0) * T2;
              for (int64_t i = 0; i < n;) {
                const int64_t q = q0 + i, row = q / wq, col = q % wq;
                const int64_t run = std::min(n - i, wq - col);
                // the run's pixels, split where conv3's panels split them
                int64_t pix = row * W2 + col, k = i;
                for (int64_t left = std::max<int64_t>(0, std::min(run, W2 - col)); left > 0;) {
                  const int64_t o = pix % T3, len3 = std::min(left, T3 - o);
                  float* d = buf2.data() + (pix / T3) * B.m2 * T3 + oc * T3 + o;
                  for (int64_t j = 0; j < len3; ++j) {
                    const float z = a[k + j] + bias;
                    d[j] = z > 0.0f ? z : 0.0f;
                  }
                  pix += len3;
                  k += len3;
                  left -= len3;
                }
                i += run;
              }
            }
          }
        }
      }
      // conv3 + bias + residual (x, or the shortcut on the same output pixels) + ReLU to the
      // output rows
      {
        const Prepared& P = *B.P3;
        const int64_t ocb = block_of(T3, B.c_out);
        const int64_t npix = rows * W2;
        for (int64_t t = 0; t * T3 < npix; ++t) {
          const int64_t n = std::min(T3, npix - t * T3);
          const int64_t at3 = r0 * W2 + t * T3;
          if (B.P4) {  // the shortcut's input: x at the tile's output pixels (strided)
            for (int64_t c = 0; c < B.c_in; ++c) {
              float* d = panel + c * T3;
              const E* xc = xn + c * hw;
              if (st == 1) {
                for (int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(xc[at3 + i]);
              } else {
                int64_t oh = at3 / W2, ow = at3 % W2;
                for (int64_t i = 0; i < n; ++i) {
                  d[i] = static_cast<float>(xc[st * (oh * W + ow)]);
                  if (++ow == W2) {
                    ow = 0;
                    ++oh;
                  }
                }
              }
              std::fill(d + n, d + T3, 0.0f);
            }
          }
          for (int64_t oc0 = 0; oc0 < B.c_out; oc0 += ocb) {
            const int64_t oc1 = std::min(B.c_out, oc0 + ocb);
            const BlockLaunch bl{buf2.data() + t * B.m2 * T3, P.off_packed.data(), p3.values,
                                 P.cp.data(), acc.data(), oc0, oc1, P.chunks, B.c_out,
                                 B.m2 * T3};
            run_tile(P, bl);
            if (B.P4) {
              const Prepared& Q = *B.P4;
              const BlockLaunch sl{panel, Q.off_packed.data(), p4->values, Q.cp.data(),
                                   acc4.data(), oc0, oc1, Q.chunks, B.c_out, B.c_in * T3};
              run_tile(Q, sl);
            }
            for (int64_t oc = oc0; oc < oc1; ++oc) {
              const float bias = b3 != nullptr ? b3[oc] : 0.0f;
              const float* a = acc.data() + (oc - oc0) * T3;
              E* d = yn + oc * hw2 + at3;
              if (B.P4) {  // the shortcut's value as its own layer would store it (float32)
                const float sb = b4 != nullptr ? b4[oc] : 0.0f;
                const float* s4 = acc4.data() + (oc - oc0) * T3;
                for (int64_t k = 0; k < n; ++k) {
                  const float z = (a[k] + bias) + (s4[k] + sb);
                  d[k] = E(z > 0.0f ? z : 0.0f);
                }
                continue;
              }
              const E* res = xn + oc * hw + at3;
              for (int64_t k = 0; k < n; ++k) {  // bfloat16: rounded once, to nearest even
                const float z = (a[k] + bias) + static_cast<float>(res[k]);
                d[k] = E(z > 0.0f ? z : 0.0f);
              }
            }
          }
        }
      }
    }
  }
};

template <typename E>
void forward_io(const Bottleneck& B, int64_t batch, const BlockWeights& W, const E* x, E* y) {
  if (batch == 0) return;
  const int64_t img = B.c_in * B.h * B.w, img_out = B.c_out * B.h2 * B.w2;
  // Strips of output rows: one per image when the images share the threads out evenly; else
  // each image cut into one strip of equal rows per thread (conv1's rows of the halo computed
  // twice at each cut), at most one per row.
  const int64_t threads = omp_get_max_threads();
  const int64_t per_image = batch % threads == 0 ? 1 : std::min(threads, B.h2);
  const int64_t strip_rows = (B.h2 + per_image - 1) / per_image;
  const int64_t tasks = batch * per_image;
#pragma omp parallel
  {
    StripRunner run(B, W);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t n = t / per_image, k = t % per_image;
      const int64_t s0 = k * strip_rows, s1 = std::min(B.h2, s0 + strip_rows);
      if (s0 < s1) run.run(x + n * img, y + n * img_out, s0, s1);
    }
  }
}

}  // namespace

void bottleneck_forward(const Bottleneck& B, int64_t batch, const BlockWeights& W,
                        const float* x, float* y) {
  forward_io(B, batch, W, x, y);
}

void bottleneck_forward(const Bottleneck& B, int64_t batch, const BlockWeights& W,
                        const bf16* x, bf16* y) {
  forward_io(B, batch, W, x, y);
}

}  // namespace sparsejit::filter_conv
