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
                             const Pattern& p3, int64_t cin3) {
  auto n = [](int64_t v) { return std::to_string(v); };
  if (h < 1 || w < 1) return "x must have at least one row and column; got " + n(h) + "x" + n(w);
  if (cin1 != c_in)
    return "conv1 takes " + n(cin1) + " channels but x has " + n(c_in);
  if (p1.cols != cin1) return "conv1 must be 1x1";
  if (r < 1 || s < 1 || r % 2 == 0 || s % 2 == 0)
    return "conv2's kernel must be odd in both dimensions; got " + n(r) + "x" + n(s);
  if (cin2 != p1.c_out)
    return "conv2 takes " + n(cin2) + " channels but conv1 gives " + n(p1.c_out);
  if (p2.cols != cin2 * r * s) return "conv2's pattern does not match its kernel";
  if (cin3 != p2.c_out)
    return "conv3 takes " + n(cin3) + " channels but conv2 gives " + n(p2.c_out);
  if (p3.cols != cin3) return "conv3 must be 1x1";
  if (p3.c_out != c_in)
    return "conv3 gives " + n(p3.c_out) + " channels; the identity residual needs " + n(c_in);
  if (double(c_in) * h * w > double(1 << 30)) return "x's image is too large (over 2^30 floats)";
  return "";
}

int64_t choose_band(int64_t h, int64_t w, int64_t m1, int64_t m2, int64_t r, int64_t s) {
  // Alternated on ResNet-50's identity blocks (benchmarks/bench_fused_cnn.py --bands): a
  // quarter of L2 for the two buffers; larger bands gained nothing, and smaller ones split
  // the 1x1s' tiles into more partial ones.
  const double budget = double(cpu_l2_bytes()) / 4;
  const double per_row = 4.0 * (double(m1) * (w + s - 1) + double(m2) * w);
  const int64_t fit = static_cast<int64_t>(budget / std::max(per_row, 1.0)) - (r - 1);
  return std::clamp<int64_t>(fit, std::min<int64_t>(r, h), h);
}

std::shared_ptr<const Bottleneck> prepare_bottleneck(int64_t c_in, int64_t h, int64_t w,
                                                     const Pattern& p1, const Pattern& p2,
                                                     int64_t r, int64_t s, const Pattern& p3,
                                                     int64_t band, Variant v) {
  auto out = std::make_shared<Bottleneck>();
  Bottleneck& B = *out;
  B.c_in = c_in;
  B.m1 = p1.c_out;
  B.m2 = p2.c_out;
  B.h = h;
  B.w = w;
  B.r = r;
  B.s = s;
  B.band = band > 0 ? std::min(band, h) : choose_band(h, w, B.m1, B.m2, r, s);
  // Each layer prepared on one band: its tap offsets index the per-thread buffers.
  Geometry g1;
  g1.batch = 1;
  g1.c_in = c_in;
  g1.h = B.band;
  g1.w = w;
  g1.c_out = B.m1;
  Geometry g2 = g1;
  g2.c_in = B.m1;
  g2.c_out = B.m2;
  g2.r = r;
  g2.s = s;
  g2.pad_h = r / 2;
  g2.pad_w = s / 2;
  Geometry g3 = g1;
  g3.c_in = B.m2;
  g3.c_out = c_in;
  B.P1 = prepare(g1, p1, v);
  B.P2 = prepare(g2, p2, v);
  B.P3 = prepare(g3, p3, v);
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
struct StripRunner {
  const Bottleneck& B;
  const Pattern &p1, &p2, &p3;
  const float *b1, *b2, *b3;
  int64_t T1, T2, T3, hh, pw, wq, plane1, rows1, tiles3;
  std::vector<float> buf1, buf2, panel_store, acc;
  float* panel;

  StripRunner(const Bottleneck& b, const Pattern& q1, const Pattern& q2, const Pattern& q3,
              const float* c1, const float* c2, const float* c3)
      : B(b), p1(q1), p2(q2), p3(q3), b1(c1), b2(c2), b3(c3) {
    T1 = tile_pixels(B.P1->variant);
    T2 = tile_pixels(B.P2->variant);
    T3 = tile_pixels(B.P3->variant);
    hh = B.r / 2;
    pw = B.s / 2;
    wq = B.w + 2 * pw;
    rows1 = B.band + 2 * hh;
    plane1 = rows1 * wq;
    tiles3 = (B.band * B.w + T3 - 1) / T3;
    // Zeroed once: the padding columns of buf1 are never written, and the tails of the last
    // panel of buf2 are only read into discarded outputs.
    buf1.assign(B.m1 * plane1 + kSlack, 0.0f);
    buf2.assign(tiles3 * B.m2 * T3 + kSlack, 0.0f);
    panel_store.assign(B.c_in * T1 + 16, 0.0f);
    panel = aligned(panel_store);
    acc.assign(std::max({block_of(T1, B.m1) * T1, block_of(T2, B.m2) * T2,
                         block_of(T3, B.c_in) * T3}), 0.0f);
  }

  // conv1 on image rows [ra, rb) of image xn into buf1, whose row 0 is image row `base`.
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
          float* dst = buf1.data() + oc * plane1;
          for (int64_t i = 0; i < n;) {  // runs within one image row
            const int64_t pix = p0 + i, row = pix / W, col = pix % W;
            const int64_t run = std::min(n - i, W - col);
            float* d = dst + (row - base) * wq + pw + col;
            for (int64_t k = 0; k < run; ++k) {
              const float z = a[i + k] + bias;
              d[k] = z > 0.0f ? z : 0.0f;
            }
            i += run;
          }
        }
      }
    }
  }

  void zero_rows(int64_t first, int64_t count) {
    for (int64_t c = 0; c < B.m1; ++c)
      std::fill_n(buf1.data() + c * plane1 + first * wq, count * wq, 0.0f);
  }

  // Output rows [s0, s1) of image xn (its output yn), band by band.
  template <typename E>
  void run(const E* xn, E* yn, int64_t s0, int64_t s1) {
    const int64_t H = B.h, W = B.w, hw = H * W;
    // conv1 rows up to this image row (excl.) sit in buf1's tail; none before the first band
    int64_t have_hi = std::numeric_limits<int64_t>::min();
    for (int64_t r0 = s0; r0 < s1; r0 += B.band) {
      const int64_t r1 = std::min(s1, r0 + B.band), rows = r1 - r0;
      const int64_t base = r0 - hh;  // image row of buf1's row 0
      // The rows this band needs: [base, r1 + hh). Keep what the last band computed.
      int64_t from = base;
      if (have_hi > base) {
        const int64_t keep = have_hi - base, shift = B.band;  // the last band's base + band
        for (int64_t c = 0; c < B.m1; ++c) {
          float* p = buf1.data() + c * plane1;
          std::memmove(p, p + shift * wq, sizeof(float) * keep * wq);
        }
        from = have_hi;
      }
      const int64_t need_hi = r1 + hh;
      // rows outside the image are the padding: zeros
      if (from < 0) {
        zero_rows(from - base, std::min<int64_t>(0, need_hi) - from);
        from = 0;
      }
      const int64_t comp_hi = std::min(need_hi, H);
      if (comp_hi > from) conv1_rows(xn, from, comp_hi, base);
      if (need_hi > std::max(comp_hi, from))
        zero_rows(std::max(comp_hi, from) - base, need_hi - std::max(comp_hi, from));
      have_hi = need_hi;  // buf1 holds image rows [base, need_hi), padding rows included

      // conv2 over the band's flattened rows (columns past W dropped) into conv3's panels
      {
        const Prepared& P = *B.P2;
        const int64_t ocb = block_of(T2, B.m2);
        const int64_t len = (rows - 1) * wq + W;
        for (int64_t q0 = 0; q0 < len; q0 += T2) {
          const int64_t n = std::min(T2, len - q0);
          for (int64_t oc0 = 0; oc0 < B.m2; oc0 += ocb) {
            const int64_t oc1 = std::min(B.m2, oc0 + ocb);
            const BlockLaunch bl{buf1.data() + q0, P.off.data(), p2.values, P.cp.data(),
                                 acc.data(), oc0, oc1, P.chunks, B.m2, B.m1 * plane1};
            run_tile(P, bl);
            for (int64_t oc = oc0; oc < oc1; ++oc) {
              const float bias = b2 != nullptr ? b2[oc] : 0.0f;
              const float* a = acc.data() + (oc - oc0) * T2;
              for (int64_t i = 0; i < n;) {
                const int64_t q = q0 + i, row = q / wq, col = q % wq;
                const int64_t run = std::min(n - i, wq - col);
                // the run's pixels, split where conv3's panels split them
                int64_t pix = row * W + col, k = i;
                for (int64_t left = std::max<int64_t>(0, std::min(run, W - col)); left > 0;) {
                  const int64_t o = pix % T3, len = std::min(left, T3 - o);
                  float* d = buf2.data() + (pix / T3) * B.m2 * T3 + oc * T3 + o;
                  for (int64_t j = 0; j < len; ++j) {
                    const float z = a[k + j] + bias;
                    d[j] = z > 0.0f ? z : 0.0f;
                  }
                  pix += len;
                  k += len;
                  left -= len;
                }
                i += run;
              }
            }
          }
        }
      }
      // conv3 + bias + identity + ReLU to the output rows
      {
        const Prepared& P = *B.P3;
        const int64_t ocb = block_of(T3, B.c_in);
        const int64_t npix = rows * W;
        for (int64_t t = 0; t * T3 < npix; ++t) {
          const int64_t n = std::min(T3, npix - t * T3);
          const int64_t at = r0 * W + t * T3;
          for (int64_t oc0 = 0; oc0 < B.c_in; oc0 += ocb) {
            const int64_t oc1 = std::min(B.c_in, oc0 + ocb);
            const BlockLaunch bl{buf2.data() + t * B.m2 * T3, P.off_packed.data(), p3.values,
                                 P.cp.data(), acc.data(), oc0, oc1, P.chunks, B.c_in,
                                 B.m2 * T3};
            run_tile(P, bl);
            for (int64_t oc = oc0; oc < oc1; ++oc) {
              const float bias = b3 != nullptr ? b3[oc] : 0.0f;
              const float* a = acc.data() + (oc - oc0) * T3;
              const E* res = xn + oc * hw + at;
              E* d = yn + oc * hw + at;
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

}  // namespace

namespace {
template <typename E>
void forward_io(const Bottleneck& B, int64_t batch, const Pattern& p1, const Pattern& p2,
                const Pattern& p3, const E* x, const float* b1, const float* b2, const float* b3,
                E* y) {
  if (batch == 0) return;
  const int64_t img = B.c_in * B.h * B.w;
  // Strips: one per image when the images share the threads out evenly; else each image cut
  // into one strip per thread (R - 1 conv1 rows computed twice at each cut), at most one per
  // band.
  const int64_t threads = omp_get_max_threads();
  const int64_t bands = (B.h + B.band - 1) / B.band;
  const int64_t per_image = batch % threads == 0 ? 1 : std::min(threads, bands);
  const int64_t strip_rows = ((bands + per_image - 1) / per_image) * B.band;
  const int64_t tasks = batch * per_image;
#pragma omp parallel
  {
    StripRunner run(B, p1, p2, p3, b1, b2, b3);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t n = t / per_image, k = t % per_image;
      const int64_t s0 = k * strip_rows, s1 = std::min(B.h, s0 + strip_rows);
      if (s0 < s1) run.run(x + n * img, y + n * img, s0, s1);
    }
  }
}
}  // namespace

void bottleneck_forward(const Bottleneck& B, int64_t batch, const Pattern& p1, const Pattern& p2,
                        const Pattern& p3, const float* x, const float* b1, const float* b2,
                        const float* b3, float* y) {
  forward_io(B, batch, p1, p2, p3, x, b1, b2, b3, y);
}

void bottleneck_forward(const Bottleneck& B, int64_t batch, const Pattern& p1, const Pattern& p2,
                        const Pattern& p3, const bf16* x, const float* b1, const float* b2,
                        const float* b3, bf16* y) {
  forward_io(B, batch, p1, p2, p3, x, b1, b2, b3, y);
}

}  // namespace sparsejit::filter_conv
