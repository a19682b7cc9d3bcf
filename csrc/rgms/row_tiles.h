// The row loops shared by the gather-GEMM-scatter passes of RGMS (csrc/rgms) and of the
// point-cloud convolution (csrc/point_conv): one kernel family
// (kernels/cpu/row_tile_kernel.h, launched through a cpu::RowTileLaunch), JIT-compiled with the row widths as constants when the JIT
// is on and the pass moves enough rows to pay for a first compile, else the generic
// instantiation (the same bits). Torch-free.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cpu/row_tile_kernel.h"

namespace sparsejit::rows {

using TileFn = void (*)(const void*);

// The generic instantiation (run-time widths).
template <typename T>
TileFn generic_fn();

// The loops for rows of `width` (and `width2` > 0: the fused RGMS kinds for that pair), or
// the generic ones: JIT only when `work` (elements the pass touches) reaches 2^16.
template <typename T>
TileFn tile_fn(int64_t width, int64_t work, int64_t width2 = 0);

// Rows t < n of a kind 5 / 6 launch through idx (int32_t or int64_t).
template <typename I>
inline cpu::RowTileLaunch row_launch(int32_t kind, const void* in, void* out, int64_t w,
                                      const I* idx, int64_t n) {
  static_assert(std::is_same_v<I, int32_t> || std::is_same_v<I, int64_t>);
  cpu::RowTileLaunch l;
  l.kind = kind;
  l.in = in;
  l.out = out;
  l.width = w;
  if constexpr (std::is_same_v<I, int32_t>) {
    l.idx32 = idx;
  } else {
    l.idx64 = idx;
  }
  l.g0 = 0;
  l.g1 = n;
  return l;
}

// out[r, 0:w] = (scale ? scale[r] : 1) * x[idx[r] * ld + c0 + 0:w], r < n   (kind 5)
template <typename T, typename I>
void gather_rows(TileFn fn, const T* x, int64_t ld, int64_t c0, int64_t w, const I* idx,
                 const T* scale, int64_t n, T* out) {
  auto l = row_launch(5, x, out, w, idx, n);
  l.ld_in = ld;
  l.c0 = c0;
  l.scale = scale;
  fn(&l);
}

// y[idx[r] * ld + 0:w] += in[r, 0:w], r < n   (kind 6)
template <typename T, typename I>
void scatter_add_rows(TileFn fn, const T* in, int64_t w, const I* idx, int64_t n, T* y,
                      int64_t ld) {
  auto l = row_launch(6, in, y, w, idx, n);
  l.ld_out = ld;
  fn(&l);
}

}  // namespace sparsejit::rows
