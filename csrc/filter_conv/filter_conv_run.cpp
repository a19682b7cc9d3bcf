// Filter-sparse convolution: weight compression, the planner's choice and the forward pass
// (phase-plane layout, work split, dispatch to the tile loops). See filter_conv_run.h for the scheme.
#include "csrc/filter_conv/filter_conv_run.h"

#include <omp.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "codegen/cpu_filter_conv_spec.h"
#include "codegen/cpu_jit.h"
#include "csrc/plan/plan_header.h"
#include "kernels/cpu/common/prefetch.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace sparsejit::filter_conv {

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::Auto: return "auto";
    case Variant::Scalar: return "scalar";
    case Variant::Vec8x1: return "vec8x1";
    case Variant::Vec8x2: return "vec8x2";
    case Variant::Vec8x4: return "vec8x4";
    case Variant::Vec8x8: return "vec8x8";
    case Variant::Jit: return "jit";
    case Variant::JitBaked: return "jit_baked";
    case Variant::Generic: return "generic";
  }
  return "?";
}

std::string check_geometry(const Geometry& g) {
  auto msg = [](const char* name, int64_t v, const char* want) {
    return std::string(name) + " must be " + want + "; got " + std::to_string(v);
  };
  if (g.batch < 0) return msg("batch", g.batch, ">= 0");
  if (g.h < 0 || g.w < 0) return "input height and width must be >= 0";
  if (g.groups < 1) return msg("groups", g.groups, ">= 1");
  if (g.c_in < 1) return msg("in_channels", g.c_in, ">= 1");
  if (g.c_in % g.groups != 0)
    return "groups (" + std::to_string(g.groups) + ") must divide in_channels (" +
           std::to_string(g.c_in) + ")";
  if (g.c_out % g.groups != 0)
    return "groups (" + std::to_string(g.groups) + ") must divide out_channels (" +
           std::to_string(g.c_out) + ")";
  if (g.r < 1 || g.s < 1) return "kernel_size must be >= 1";
  if (g.stride_h < 1 || g.stride_w < 1) return "stride must be >= 1";
  if (g.pad_h < 0 || g.pad_w < 0) return "padding must be >= 0";
  if (g.dil_h < 1 || g.dil_w < 1) return "dilation must be >= 1";
  // Bounds before any arithmetic on them (int64 products and sums below must not wrap): tap
  // offsets are int32 anyway, so nothing larger can run.
  constexpr int64_t kMax = int64_t{1} << 30;
  if (g.stride_h > kMax || g.stride_w > kMax) return "stride must be <= 2^30";
  if (g.pad_h > kMax || g.pad_w > kMax) return "padding must be <= 2^30";
  if (g.dil_h > kMax || g.dil_w > kMax) return "dilation must be <= 2^30";
  if (g.r > kMax || g.s > kMax) return "kernel_size must be <= 2^30";
  if (g.h > kMax || g.w > kMax) return "input height and width must be <= 2^30";
  if (g.h + 2 * g.pad_h < g.dil_h * (g.r - 1) + 1 || g.w + 2 * g.pad_w < g.dil_w * (g.s - 1) + 1)
    return "input (" + std::to_string(g.h) + "x" + std::to_string(g.w) +
           ", padded) is smaller than the dilated kernel";
  // Tap offsets are int32: the padded, phase-split planes of one image must fit.
  const int64_t hq = (g.h + 2 * g.pad_h + g.stride_h - 1) / g.stride_h;
  const int64_t wq = (g.w + 2 * g.pad_w + g.stride_w - 1) / g.stride_w;
  const double img = double(g.c_in) * hq * wq * g.stride_h * g.stride_w;
  if (img > double(std::numeric_limits<int32_t>::max() / 2))
    return "input is too large: one image's padded planes exceed 2^30 floats";
  return "";
}

namespace {
// Zeros are dropped, and entries whose magnitude is at most the threshold (NaN is kept, so a
// broken weight shows up in the output instead of vanishing).
bool keep(float v, float threshold) { return v != 0.0f && !(std::fabs(v) <= threshold); }
}  // namespace

int64_t count_kept(const float* w, int64_t rows, int64_t cols, float threshold) {
  int64_t n = 0;
  for (int64_t i = 0; i < rows * cols; ++i) n += keep(w[i], threshold);
  return n;
}

void compress(const float* w, int64_t rows, int64_t cols, float threshold, int64_t* rowptr,
              int64_t* taps, float* values) {
  int64_t n = 0;
  rowptr[0] = 0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t k = 0; k < cols; ++k) {
      const float v = w[i * cols + k];
      if (keep(v, threshold)) {
        taps[n] = k;
        values[n] = v;
        ++n;
      }
    }
    rowptr[i + 1] = n;
  }
}

void write_plan(int64_t* words, int64_t variant, const int64_t* rowptr, const int64_t* taps,
                int64_t c_out, int64_t cin_g, int64_t r, int64_t s) {
  const auto stamp = plan::stamp_structure<int64_t>(rowptr, taps, c_out, cin_g * r * s);
  plan::write_header(words, OpKind::FilterConv, variant, 0, 0, stamp);
  words[plan::kHeaderWords + 0] = c_out;
  words[plan::kHeaderWords + 1] = cin_g;
  words[plan::kHeaderWords + 2] = r;
  words[plan::kHeaderWords + 3] = s;
}

std::string check_pattern(const Pattern& p, int64_t nnz) {
  if (p.rowptr[0] != 0) return "rowptr[0] must be 0; got " + std::to_string(p.rowptr[0]);
  for (int64_t i = 0; i < p.c_out; ++i) {
    if (p.rowptr[i + 1] < p.rowptr[i])
      return "rowptr must not decrease (rowptr[" + std::to_string(i + 1) + "] < rowptr[" +
             std::to_string(i) + "])";
  }
  if (p.rowptr[p.c_out] != nnz)
    return "rowptr[-1] = " + std::to_string(p.rowptr[p.c_out]) + " must equal the " +
           std::to_string(nnz) + " stored taps";
  for (int64_t i = 0; i < p.c_out; ++i) {
    for (int64_t e = p.rowptr[i] + 1; e < p.rowptr[i + 1]; ++e) {
      if (p.taps[e] <= p.taps[e - 1])
        return "taps must increase within each output channel (taps[" + std::to_string(e) +
               "] = " + std::to_string(p.taps[e]) + " after " + std::to_string(p.taps[e - 1]) +
               ")";
    }
  }
  for (int64_t e = 0; e < nnz; ++e) {
    if (p.taps[e] < 0 || p.taps[e] >= p.cols)
      return "taps[" + std::to_string(e) + "] = " + std::to_string(p.taps[e]) +
             " is out of range for " + std::to_string(p.cols) + " (c, r, s) positions";
  }
  return "";
}

Variant choose_variant(const Geometry& g, int64_t nnz) {
  // The widest tile the output fills: more FMAs per loaded tap, fewer tiles to stream the
  // taps through (measured on ResNet-50 layers: 64 pixels beat 32 from 7x7 up).
  const int64_t pixels = g.out_h() * g.out_w();
  if (pixels >= 48) return Variant::Vec8x8;
  if (pixels >= 24) return Variant::Vec8x4;
  if (pixels >= 12) return Variant::Vec8x2;
  return Variant::Vec8x1;
}

namespace {

// Writes len floats to dst: whole 64-byte lines with non-temporal stores, the rest plainly
// (a partial line written non-temporally costs a read-modify-write in memory). Plain stores
// where the target has no SSE streaming store.
inline void stream_run(float* dst, const float* v, int64_t len) {
  int64_t i = 0;
#if defined(__SSE__)
  const int64_t head = ((64 - (reinterpret_cast<uintptr_t>(dst) & 63)) & 63) / 4;
  for (; i < std::min(head, len); ++i) dst[i] = v[i];
  for (; i + 16 <= len; i += 16)
    for (int k = 0; k < 16; k += 4) _mm_stream_ps(dst + i + k, _mm_loadu_ps(v + i + k));
#endif
  for (; i < len; ++i) dst[i] = v[i];
}

inline void stream_fence() {
#if defined(__SSE__)
  _mm_sfence();
#endif
}

std::atomic<int64_t>& stream_slot() {
  static std::atomic<int64_t> bytes{[] {
    const char* e = std::getenv("SPARSEJIT_FILTER_CONV_STREAM");
    if (e != nullptr && std::string(e) == "0") return std::numeric_limits<int64_t>::max();
    const long l3 = cpu_l3_bytes();
    return l3 > 0 ? int64_t(l3) / 4 : std::numeric_limits<int64_t>::max();
  }()};
  return bytes;
}

constexpr int64_t kSlack = 128;  // floats after the phase planes (vector overrun, >= 64)
// Cache budgets. A tile's input slice of one chunk: the core's L1 data cache (the OS's size;
// a macro so a tuning build can fix it), twice that for a 1x1, whose packed, aligned panel
// is read in whole cache lines: half the chunks, so half the accumulator reloads. Alternated
// in one process, 90%, AMD EPYC with AVX-512 (32 KiB L1), 64 KiB against 32 KiB on
// ResNet-50's 1x1 shapes: geomean 0.97x the time at batch 8 and 0.93x at batch 1 (0.85-1.0x
// per layer); on its 3x3 layers a larger chunk was slower (1.04-1.11x), so they keep L1.
// Accumulators of one output-channel block: 4 KiB (best among 4..16 KiB on ResNet-50
// layers, benchmarks/bench_filter_conv.py).
#ifdef FILTER_CONV_CHUNK_BYTES
int64_t chunk_budget(bool one_by_one) { return FILTER_CONV_CHUNK_BYTES * (one_by_one ? 2 : 1); }
#else
int64_t chunk_budget(bool one_by_one) { return cpu_l1d_bytes() * (one_by_one ? 2 : 1); }
#endif
#ifndef FILTER_CONV_ACC_BYTES
#define FILTER_CONV_ACC_BYTES (4 * 1024)
#endif
constexpr int64_t kAccBytes = FILTER_CONV_ACC_BYTES;  // accumulators of one output-channel block

// The run-time layout of one call: where each tap reads, where each output pixel goes.
struct Layout {
  bool in_place;   // 1x1 stride-1 unpadded: read x directly
  bool out_direct; // planes are OW wide: flattened pixel q is output pixel q
  int64_t hq, wq;  // phase-plane size
  int64_t plane;   // hq * wq
  int64_t plane_c; // floats per input channel (the phases some tap reads)
  std::vector<int64_t> slot;  // phase (ph * stride_w + pw) -> its plane's index, -1 if unread
  int64_t img;     // floats per image
  int64_t len;     // flattened output pixels per channel: (OH - 1) * wq + OW
};

Layout make_layout(const Geometry& g) {
  Layout L{};
  const int64_t oh = g.out_h(), ow = g.out_w();
  L.in_place = g.r == 1 && g.s == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_h == 0 &&
               g.pad_w == 0;
  if (L.in_place) {
    L.hq = g.h;
    L.wq = g.w;
    L.plane_c = L.plane = g.h * g.w;
  } else {
    L.hq = (g.h + 2 * g.pad_h + g.stride_h - 1) / g.stride_h;
    L.wq = (g.w + 2 * g.pad_w + g.stride_w - 1) / g.stride_w;
    L.plane = L.hq * L.wq;
    // Only the phases some tap reads get a plane (a strided 1x1 reads one of s * s).
    L.slot.assign(g.stride_h * g.stride_w, -1);
    int64_t used = 0;
    for (int64_t r = 0; r < g.r; ++r) {
      for (int64_t s = 0; s < g.s; ++s) {
        const int64_t phase =
            ((r * g.dil_h) % g.stride_h) * g.stride_w + (s * g.dil_w) % g.stride_w;
        int64_t& sl = L.slot[phase];
        if (sl < 0) sl = used++;
      }
    }
    L.plane_c = L.plane * used;
  }
  L.img = g.c_in * L.plane_c;
  L.out_direct = L.wq == ow;
  L.len = (oh - 1) * L.wq + ow;
  return L;
}

// Padded, phase-split copy of the input (the phases some tap reads). Rows are short (16 to
// 58 floats on ResNet-50), so the zeros and the copy are plain loops: GCC would otherwise turn
// each into a memset / memcpy call, three calls a row, 7% of a 14x14 3x3 layer (perf).
template <typename T>
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-distribute-patterns")))
#endif
void fill_planes(const Geometry& g, const Layout& L, const T* x, float* planes) {
#pragma omp parallel for schedule(static)
  for (int64_t nc = 0; nc < g.batch * g.c_in; ++nc) {
    const T* src = x + nc * g.h * g.w;
    float* dst = planes + nc * L.plane_c;
    for (int64_t ph = 0; ph < g.stride_h; ++ph) {
      for (int64_t pw = 0; pw < g.stride_w; ++pw) {
        const int64_t slot = L.slot[ph * g.stride_w + pw];
        if (slot < 0) continue;
        float* pl = dst + slot * L.plane;
        for (int64_t i = 0; i < L.hq; ++i) {
          const int64_t hi = ph + i * g.stride_h - g.pad_h;
          float* out = pl + i * L.wq;
          if (hi < 0 || hi >= g.h) {
            for (int64_t j = 0; j < L.wq; ++j) out[j] = 0.0f;
            continue;
          }
          const T* in = src + hi * g.w;
          if (g.stride_w == 1) {  // a padded row: zeros, the row, zeros
            const int64_t lead = std::min(L.wq, g.pad_w);
            const int64_t n = std::max<int64_t>(0, std::min(g.w, L.wq - lead));
            for (int64_t j = 0; j < lead; ++j) out[j] = 0.0f;
            for (int64_t j = 0; j < n; ++j) out[lead + j] = static_cast<float>(in[j]);
            for (int64_t j = lead + n; j < L.wq; ++j) out[j] = 0.0f;
            continue;
          }
          for (int64_t j = 0; j < L.wq; ++j) {
            const int64_t wi = pw + j * g.stride_w - g.pad_w;
            out[j] = (wi >= 0 && wi < g.w) ? static_cast<float>(in[wi]) : 0.0f;
          }
        }
      }
    }
  }
}

// Offset of every stored tap into its group's phase planes.
std::vector<int32_t> tap_offsets(const Geometry& g, const Layout& L, const Pattern& p,
                                 int64_t nnz) {
  std::vector<int32_t> off(nnz);
  const int64_t rs = g.r * g.s;
  for (int64_t e = 0; e < nnz; ++e) {
    const int64_t t = p.taps[e];
    const int64_t c = t / rs, r = (t % rs) / g.s, s = t % g.s;
    const int64_t dr = r * g.dil_h, ds = s * g.dil_w;
    const int64_t phase = L.in_place ? 0 : L.slot[(dr % g.stride_h) * g.stride_w + ds % g.stride_w];
    off[e] = static_cast<int32_t>(c * L.plane_c + phase * L.plane + (dr / g.stride_h) * L.wq +
                                  ds / g.stride_w);
  }
  return off;
}

// Input channels per chunk: a tile's reads of one chunk (every distinct plane row a tap
// starts in, the tile's width plus the widest column shift) stay within chunk_budget().
int64_t chunk_channels(const Geometry& g, int64_t tile) {
  std::vector<int64_t> rows;
  int64_t max_col = 0;
  for (int64_t r = 0; r < g.r; ++r) {
    for (int64_t s = 0; s < g.s; ++s) {
      const int64_t dr = r * g.dil_h, ds = s * g.dil_w;
      const int64_t key = ((dr % g.stride_h) * g.stride_w + ds % g.stride_w) * 1000000 +
                          dr / g.stride_h;
      if (std::find(rows.begin(), rows.end(), key) == rows.end()) rows.push_back(key);
      max_col = std::max(max_col, ds / g.stride_w);
    }
  }
  const int64_t per_channel = int64_t(rows.size()) * (tile + max_col) * 4;
  return std::clamp<int64_t>(chunk_budget(g.r == 1 && g.s == 1) / per_channel, 1,
                             g.c_in / g.groups);
}

// Compiles (or finds in the JIT's caches) the layer's block loop; on failure (JIT off, no
// compiler) the JIT has warned once and the precompiled loop runs (same results).
void attach_jit(const Geometry& g, Prepared& P, bool baked) {
  codegen::CpuFilterConvSpec spec;
  spec.vec = static_cast<int32_t>(tile_pixels(P.variant) / 8);
  spec.unroll = P.variant == Variant::Vec8x8 ? 1 : 2;  // as run_block(l, v) instantiates
  spec.chunks = P.chunks;
  spec.cout_g = g.c_out / g.groups;
  spec.group_stride = (g.c_in / g.groups) * (P.packed ? tile_pixels(P.variant) : P.plane_c);
  spec.baked = baked;
  // SPARSEJIT_FILTER_CONV_WIDE=0: 8-lane vectors even on AVX-512 (A/B runs; read when a
  // layer is prepared, so one process can hold both).
  const char* wide = std::getenv("SPARSEJIT_FILTER_CONV_WIDE");
  spec.wide = !(wide && std::string(wide) == "0");
  if (baked) {
    spec.cp = P.cp;
    spec.off = P.packed ? P.off_packed : P.off;
  }
  codegen::JitInfo info;
  P.block_fn = codegen::CpuJit::instance().lookup(spec, &info);
  P.jit_compile_ms = info.compile_ms;
}

}  // namespace

int64_t stream_output_bytes() { return stream_slot().load(std::memory_order_relaxed); }

int64_t set_stream_output_bytes(int64_t bytes) {
  return stream_slot().exchange(bytes < 1 ? int64_t{1} : bytes);
}

std::shared_ptr<const Prepared> prepare(const Geometry& g, const Pattern& p, Variant v,
                                        Variant tile) {
  auto out = std::make_shared<Prepared>();
  Prepared& P = *out;
  const int64_t nnz = p.rowptr[p.c_out];
  P.requested = v;
  const bool jit = v == Variant::Jit || v == Variant::JitBaked ||
                   (v == Variant::Auto && codegen::CpuJit::instance().enabled());
  const Variant planned = tile != Variant::Auto ? tile : choose_variant(g, nnz);
  P.variant = v == Variant::Auto || v == Variant::Generic || jit ? planned : v;
  const Layout L = make_layout(g);
  P.in_place = L.in_place;
  P.out_direct = L.out_direct;
  P.wq = L.wq;
  P.plane_c = L.plane_c;
  P.hq = L.hq;
  P.plane = L.plane;
  P.slot = L.slot;
  P.img = L.img;
  P.len = L.len;
  const int64_t cin_g = g.c_in / g.groups;
  const int64_t T = tile_pixels(P.variant);
  P.off = tap_offsets(g, L, p, nnz);
  // A 1x1 reads each tile's input through an aligned, zero-padded [c_in, T] panel (offsets
  // c * T): no load crosses a cache line, channels a power of two apart do not collide in the
  // cache, and in place a last partial tile does not read past the input.
  P.packed = g.r == 1 && g.s == 1;
  if (P.packed) {
    P.off_packed.resize(nnz);
    for (int64_t e = 0; e < nnz; ++e)
      P.off_packed[e] = static_cast<int32_t>(P.off[e] / L.plane_c * T);
  }
  // Each output channel's taps split by input-channel chunk (taps ascend, so by c):
  // cp[oc * (chunks + 1) + k] is the first entry of chunk k.
  const int64_t chunk_c = chunk_channels(g, T);
  P.chunks = (cin_g + chunk_c - 1) / chunk_c;
  P.cp.resize(g.c_out * (P.chunks + 1));
  const int64_t per_chunk_taps = chunk_c * g.r * g.s;
  for (int64_t oc = 0; oc < g.c_out; ++oc) {
    int64_t e = p.rowptr[oc];
    for (int64_t k = 0; k < P.chunks; ++k) {
      P.cp[oc * (P.chunks + 1) + k] = e;
      while (e < p.rowptr[oc + 1] && p.taps[e] < (k + 1) * per_chunk_taps) ++e;
    }
    P.cp[oc * (P.chunks + 1) + P.chunks] = p.rowptr[oc + 1];
  }
  if (jit && nnz > 0 && cpu_has_avx2_fma()) attach_jit(g, P, v == Variant::JitBaked);
  return out;
}

void forward(const Geometry& g, const Pattern& p, const float* x, const float* bias, bool relu,
             Variant v, float* y, const float* residual) {
  if (g.batch == 0 || g.c_out == 0 || g.out_h() * g.out_w() == 0) return;
  forward(*prepare(g, p, v), g, p, x, bias, relu, y, residual);
}

namespace {

// n input elements widened to float32 (exact); a plain copy for float32.
template <typename T>
inline void copy_widen(float* dst, const T* src, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, sizeof(float) * n);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
  }
}

// The forward for input, residual and output elements of type E (float, or bf16: read and
// widened where the input is staged into the planes or the 1x1 panel, the residual widened
// in the epilogue, each output rounded once to nearest even from the float32 sum). Every
// bfloat16 value widens exactly, so a bfloat16 call gives the bits of the float32 call on
// the widened tensors, rounded, without the float32 copies of x, the residual and y.
template <typename E>
void forward_io(const Prepared& P, const Geometry& g, const Pattern& p, const E* x,
                const float* bias, bool relu, E* y, const E* residual) {
  constexpr bool kFloat = std::is_same_v<E, float>;
  const int64_t oh = g.out_h(), ow = g.out_w();
  if (g.batch == 0 || g.c_out == 0 || oh * ow == 0) return;
  const Variant v = P.variant;
  const int64_t cin_g = g.c_in / g.groups, cout_g = g.c_out / g.groups;
  const int64_t T = tile_pixels(v);
  const int64_t chunks = P.chunks;
  const Layout L = make_layout(g);
  std::unique_ptr<float[]> planes;  // every element written by fill_planes or zeroed here
  const float* xin = nullptr;  // the planes; a 1x1 in place reads x through its panel
  if (!P.in_place) {
    planes.reset(new float[g.batch * L.img + kSlack]);
    std::fill(planes.get() + g.batch * L.img, planes.get() + g.batch * L.img + kSlack, 0.0f);
    fill_planes(g, L, x, planes.get());
    xin = planes.get();
  }
  const std::vector<int32_t>& off = P.off;
  const std::vector<int32_t>& off_packed = P.off_packed;
  const std::vector<int64_t>& cp = P.cp;
  const bool pack = P.packed;

  // A 1x1 whose flattened grid is the output itself (no dropped columns) numbers its pixels
  // across the batch, image after image: a tile may end in one image and go on in the next
  // (the packed panel gathers both runs), so a 14x14 layer at batch 8 runs 25 tiles of 64
  // pixels instead of 8 x 4 with one quarter of them empty. Every pixel still sees the same
  // products in the same order, so the results do not change.
  const bool span = pack && L.out_direct && g.batch > 1;
  const int64_t tiles_per_image = (L.len + T - 1) / T;
  const int64_t tiles = span ? (g.batch * L.len + T - 1) / T : g.batch * tiles_per_image;
  // Tasks: (pixel tile, part), a part being a run of output-channel blocks (one block unless
  // the tile's input is packed: then a task packs it once for its blocks).
  int64_t ocb = std::clamp<int64_t>(kAccBytes / (T * 4), 8, g.c_out);
  const int64_t want_tasks = 4 * omp_get_max_threads();  // enough to balance the threads
  while (ocb > 8 && tiles * ((g.c_out + ocb - 1) / ocb) < want_tasks) ocb /= 2;
  const int64_t blocks = (g.c_out + ocb - 1) / ocb;
  const int64_t parts =
      pack ? std::clamp<int64_t>((want_tasks + tiles - 1) / tiles, 1, blocks) : blocks;
  const int64_t blocks_per_part = (blocks + parts - 1) / parts;
  const int64_t tasks = tiles * parts;
  // Task order: part-major (a run of output-channel blocks sweeps every tile, so its taps
  // stay in cache, and the input is streamed once per part) or tile-major (a tile sweeps
  // every part, so its input stays in cache, and the taps are streamed once per tile),
  // whichever streams fewer bytes.
  const bool block_major = parts * g.batch * L.img * 4 < tiles * p.rowptr[p.c_out] * 8;
  const bool avx2 = v != Variant::Scalar && cpu_has_avx2_fma();
  const int64_t ohw = oh * ow;
  // A 1x1's output of at least a quarter of the L3 cache (stream_output_bytes()) is written
  // with non-temporal stores: no line is read for ownership before it is overwritten, and the
  // lines do not push the layer's input and weights out of the caches. Alternated in one
  // process, ResNet-50 at batch 8 (AMD EPYC, 32 MiB L3): 0.94-0.97x the time of the whole
  // network in four runs; the 3x3 layers (rows of the phase grid, partial lines) and outputs
  // of 6.4 MB and less were as often slower as faster, so they keep plain stores.
  // bfloat16 outputs are stored plainly: streamed, they were slower (a 1x1 64 -> 256 at 56 x
  // 56, batch 8, 1 thread: 6.0-7.0 ms against 5.4 ms plainly).
  const bool nt = kFloat && pack && T <= 64 &&  // (pack: a 1x1; the epilogue's tmp: 64 floats)
                  g.batch * g.c_out * ohw * int64_t(sizeof(float)) >= stream_output_bytes();

#pragma omp parallel
  {
    std::vector<float> acc(ocb * T);
    std::vector<float> panel_store(pack ? g.c_in * T + 16 : 0);
    float* panel = panel_store.empty() ? nullptr
        : reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(panel_store.data()) + 63) &
                                   ~uintptr_t(63));
    // The tile's pixels as runs within one image and one output row: (tile offset, image,
    // output pixel, length), computed once per tile for the epilogue (and the panel).
    std::vector<int64_t> seg;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t tile = block_major ? t % tiles : t / parts;
      const int64_t part = block_major ? t / tiles : t % parts;
      seg.clear();
      int64_t valid;
      const float* ximg;
      int64_t ibase = 0;  // the tile's first input element (planes, or x in place)
      if (span) {
        const int64_t g0 = tile * T;
        valid = std::min(T, g.batch * L.len - g0);
        for (int64_t i = 0; i < valid;) {
          const int64_t n = (g0 + i) / L.len, q = (g0 + i) % L.len;
          const int64_t run = std::min(valid - i, L.len - q);
          seg.insert(seg.end(), {i, n, q, run});
          i += run;
        }
        ximg = nullptr;  // packed below, run by run
      } else {
        const int64_t n = tile / tiles_per_image, q0 = (tile % tiles_per_image) * T;
        valid = std::min(T, L.len - q0);
        ibase = n * L.img + q0;
        ximg = xin != nullptr ? xin + ibase : nullptr;
        if (L.out_direct) {
          seg.insert(seg.end(), {0, n, q0, valid});
        } else {
          int64_t row = q0 / L.wq, col = q0 % L.wq;
          for (int64_t i = 0; i < valid;) {
            const int64_t run = std::min(valid - i, L.wq - col);
            if (col < ow) seg.insert(seg.end(), {i, n, row * ow + col, std::min(run, ow - col)});
            i += run;
            ++row;
            col = 0;
          }
        }
      }
      const int32_t* offs = off.data();
      int64_t group_stride = cin_g * L.plane_c;
      if (pack) {
        // n input elements at `at` (image-major) into the panel: from the planes, or, for a
        // 1x1 in place (no planes), from x, widened
        auto copy = [&](float* d, int64_t at, int64_t n) {
          if (xin != nullptr) {
            std::memcpy(d, xin + at, sizeof(float) * n);
          } else {
            copy_widen(d, x + at, n);
          }
        };
        for (int64_t c = 0; c < g.c_in; ++c) {
          float* dst = panel + c * T;
          if (span) {
            for (size_t sg = 0; sg < seg.size(); sg += 4)
              copy(dst + seg[sg], seg[sg + 1] * L.img + c * L.plane_c + seg[sg + 2], seg[sg + 3]);
          } else {
            copy(dst, ibase + c * L.plane_c, valid);
          }
          std::fill(dst + valid, dst + T, 0.0f);
        }
        ximg = panel;
        offs = off_packed.data();
        group_stride = cin_g * T;
      }
      const int64_t b_end = std::min(blocks, (part + 1) * blocks_per_part);
      for (int64_t block = part * blocks_per_part; block < b_end; ++block) {
        const int64_t oc0 = block * ocb, oc1 = std::min(g.c_out, oc0 + ocb);
        // The residual's rows (runs of at most one tile: a new stream every 256 bytes, which
        // the hardware prefetcher does not follow) are fetched while the block computes.
        // Alternated in one process at batch 8, 90%: 0.89-0.95x the time on ResNet-50's 1x1
        // layers with a residual (1.0x on 7x7); also prefetching the output's lines for
        // writing gained nothing measurable over this.
        if (residual != nullptr) {
          for (int64_t oc = oc0; oc < oc1; ++oc)
            for (size_t sg = 0; sg < seg.size(); sg += 4)
              cpu::prefetch_span(residual + (seg[sg + 1] * g.c_out + oc) * ohw + seg[sg + 2],
                                 seg[sg + 3]);
        }
        BlockLaunch bl{ximg, offs, p.values, cp.data(), acc.data(), oc0, oc1, chunks, cout_g,
                       group_stride};
        if (P.block_fn != nullptr) {
          P.block_fn(&bl);
        } else if (avx2) {
          run_block_avx2(bl, v);
        } else {
          run_block_generic(bl, v);
        }
        // Epilogue: bias, ReLU, residual, and the tile's runs to their output pixels.
        alignas(64) float tmp[64];
        for (int64_t oc = oc0; oc < oc1; ++oc) {
          const float b = bias != nullptr ? bias[oc] : 0.0f;
          const float* a = acc.data() + (oc - oc0) * T;
          for (size_t sg = 0; sg < seg.size(); sg += 4) {
            const float* src = a + seg[sg];
            const int64_t yi = (seg[sg + 1] * g.c_out + oc) * ohw + seg[sg + 2];
            const int64_t len = seg[sg + 3];
            // float32 output straight to y unless streamed; bfloat16 through tmp, rounded
            // once below (len <= T <= 64)
            float* dst = kFloat && !nt ? reinterpret_cast<float*>(y + yi) : tmp;
            if (residual != nullptr) {
              // (acc + bias) + residual, then ReLU: the sums of an unfused conv, add, relu.
              const E* res = residual + yi;
              for (int64_t i = 0; i < len; ++i) {
                const float z = (src[i] + b) + static_cast<float>(res[i]);
                dst[i] = relu ? (z > 0.0f ? z : 0.0f) : z;
              }
            } else if (relu) {
              for (int64_t i = 0; i < len; ++i) {
                const float z = src[i] + b;
                dst[i] = z > 0.0f ? z : 0.0f;
              }
            } else {
              for (int64_t i = 0; i < len; ++i) dst[i] = src[i] + b;
            }
            if constexpr (kFloat) {
              if (nt) stream_run(y + yi, tmp, len);
            } else {
              for (int64_t i = 0; i < len; ++i) y[yi + i] = E(tmp[i]);
            }
          }
        }
      }
      if (nt) stream_fence();
    }
  }
}

}  // namespace

void forward(const Prepared& P, const Geometry& g, const Pattern& p, const float* x,
             const float* bias, bool relu, float* y, const float* residual) {
  forward_io(P, g, p, x, bias, relu, y, residual);
}

void forward(const Prepared& P, const Geometry& g, const Pattern& p, const bf16* x,
             const float* bias, bool relu, bf16* y, const bf16* residual) {
  forward_io(P, g, p, x, bias, relu, y, residual);
}

}  // namespace sparsejit::filter_conv
