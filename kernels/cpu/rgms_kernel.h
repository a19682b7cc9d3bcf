// RGMS's per-tile gather loops (csrc/rgms/rgms_run.cpp), the part that is bound by the rows
// it gathers rather than by arithmetic: compiled once generic (run-time row width) and, by
// the JIT (codegen/cpu_rgms_spec), with the row width as a compile-time constant, so a row's
// accumulators stay in registers and the inner loops unroll. Both instantiations do the same
// element-wise operations in the same order: their results are bit-identical (tested).
#pragma once

#include <cstdint>

namespace sparsejit::cpu {

// One tile of (relation, target) groups [g0, g1).
//   kind 0, gather-reduce: out[t, 0:width] = sum over group g0 + t's entries q of
//           coef_q * in[src[q] * ld_in + c0 + 0:width]                      (out row stride width)
//   kind 1, scatter:       out[src[q] * ld_out + c0 + 0:width] += coef_q * in[(g - g0) * width + 0:width]
// coef_q = values[perm[q]] (1 without values), divided by the group's size when mean.
struct RgmsTileLaunch {
  int32_t kind = 0;
  int32_t mean = 0;
  const int64_t* grp_ptr = nullptr;
  const int64_t* src = nullptr;
  const int64_t* perm = nullptr;
  const void* values = nullptr;  // T, or null
  const void* in = nullptr;      // T
  void* out = nullptr;           // T
  int64_t ld_in = 0, ld_out = 0, c0 = 0, width = 0;
  int64_t g0 = 0, g1 = 0;
  int64_t prefetch_end = 0;  // entries before this may be prefetched (kind 0)
};

namespace rgms_detail {

// W > 0: the width at compile time; W == 0: l.width.
template <typename T, int W>
inline void gather_reduce(const RgmsTileLaunch& l) {
  const int64_t w = W > 0 ? W : l.width;
  const T* x = static_cast<const T*>(l.in);
  const T* values = static_cast<const T*>(l.values);
  T* out = static_cast<T*>(l.out);
  // Rows of X are gathered at random: ask for the row a few entries ahead (the loop is
  // bound by the latency of these loads, not by arithmetic).
  constexpr int64_t kAhead = 6;
  for (int64_t g = l.g0; g < l.g1; ++g) {
    T* o = out + (g - l.g0) * w;
    const int64_t p0 = l.grp_ptr[g], p1 = l.grp_ptr[g + 1];
    const T inv = l.mean ? T(1) / T(p1 - p0) : T(1);
    for (int64_t j = 0; j < w; ++j) o[j] = T(0);
    for (int64_t q = p0; q < p1; ++q) {
      if (q + kAhead < l.prefetch_end) __builtin_prefetch(x + l.src[q + kAhead] * l.ld_in + l.c0);
      const T c = (values ? values[l.perm[q]] : T(1)) * inv;
      const T* row = x + l.src[q] * l.ld_in + l.c0;
      for (int64_t j = 0; j < w; ++j) o[j] += c * row[j];
    }
  }
}

template <typename T, int W>
inline void scatter(const RgmsTileLaunch& l) {
  const int64_t w = W > 0 ? W : l.width;
  const T* d_all = static_cast<const T*>(l.in);
  const T* values = static_cast<const T*>(l.values);
  T* dx = static_cast<T*>(l.out);
  for (int64_t g = l.g0; g < l.g1; ++g) {
    const T* d = d_all + (g - l.g0) * w;
    const int64_t p0 = l.grp_ptr[g], p1 = l.grp_ptr[g + 1];
    for (int64_t q = p0; q < p1; ++q) {
      T c = values ? values[l.perm[q]] : T(1);
      if (l.mean) c /= T(p1 - p0);
      T* o = dx + l.src[q] * l.ld_out + l.c0;
      for (int64_t j = 0; j < w; ++j) o[j] += c * d[j];
    }
  }
}

template <typename T, int W>
inline void run(const RgmsTileLaunch& l) {
  if (l.kind == 0) {
    gather_reduce<T, W>(l);
  } else {
    scatter<T, W>(l);
  }
}

}  // namespace rgms_detail
}  // namespace sparsejit::cpu
