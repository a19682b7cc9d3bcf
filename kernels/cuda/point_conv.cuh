// Point-cloud sparse convolution on the GPU: the two data-movement halves of the
// gather-GEMM-scatter dataflow (the GEMM per kernel offset runs on cuBLAS through ATen, see
// torch_ext/ops/point_conv.cpp):
//   gather  dst[q, :] = src[index[q], :]                       q < n (every pair of the plan)
//   rows    dst[r, :] = act(bias + sum_{e in row_ptr[r] .. row_ptr[r + 1]} src[index[e], :])
// `rows` reduces the per-pair GEMM products [M, C] into the output rows through the plan's
// row index (csrc/point_conv/plan_layout.h: out_row_ptr / out_row_pair, or the in_* pair for
// the transposed direction), pairs in increasing pair order: a fixed summation order, so the
// result is the same bits on every run without floating-point atomics. Rows without pairs get
// act(bias) (or 0), as the CPU core.
//
// Compile-time configuration C: T, I, CH (channels), VEC (scalars per access, divides CH),
// ACT (None or Relu, rows only), BLOCK. One thread moves VEC channels of one row.
#pragma once

#ifndef SJ_CUDA_AMALGAMATED
#include "kernels/cuda/common.cuh"
#endif

namespace sparsejit {
namespace cuda {

template <typename C>
__device__ __forceinline__ void pconv_gather(const PointConvParams& p) {
  typedef typename C::T T;
  typedef typename C::I I;
  constexpr int NV = C::CH / C::VEC;
  const long long t = (long long)blockIdx.x * C::BLOCK + threadIdx.x;
  if (t >= p.n * NV) return;
  const long long q = t / NV;
  const int v = (int)(t - q * NV);
  const long long r = (long long)static_cast<const I*>(p.index)[q];
  const T* src = static_cast<const T*>(p.src) + r * C::CH + v * C::VEC;
  T* dst = static_cast<T*>(p.dst) + q * C::CH + v * C::VEC;
  store_vec<T, C::VEC>(dst, load_vec<T, C::VEC>(src));
}

template <typename C>
__device__ __forceinline__ void pconv_rows(const PointConvParams& p) {
  typedef typename C::T T;
  typedef typename C::I I;
  typedef typename AccOf<T>::type A;
  constexpr int NV = C::CH / C::VEC;
  const long long t = (long long)blockIdx.x * C::BLOCK + threadIdx.x;
  if (t >= p.n * NV) return;
  const long long r = t / NV;
  const int v = (int)(t - r * NV);
  const I* pair = static_cast<const I*>(p.index);
  const T* src = static_cast<const T*>(p.src) + v * C::VEC;
  A acc[C::VEC];
#pragma unroll
  for (int j = 0; j < C::VEC; ++j) acc[j] = A(0);
  const long long lo = p.row_ptr[r], hi = p.row_ptr[r + 1];
  for (long long e = lo; e < hi; ++e) {
    const Vec<T, C::VEC> x = load_vec<T, C::VEC>(src + (long long)pair[e] * C::CH);
#pragma unroll
    for (int j = 0; j < C::VEC; ++j) acc[j] += to_acc(x.v[j]);
  }
  const T* bias = static_cast<const T*>(p.bias);
  Vec<T, C::VEC> out;
#pragma unroll
  for (int j = 0; j < C::VEC; ++j) {
    A z = acc[j];
    if (bias) z += to_acc(bias[v * C::VEC + j]);
    if (C::ACT == 1 && z < A(0)) z = A(0);
    out.v[j] = from_acc<T>(z);
  }
  store_vec<T, C::VEC>(static_cast<T*>(p.dst) + r * C::CH + v * C::VEC, out);
}

// Kernel-map search (OpKind::PointConvMap): for offset k and query q, the position of
// query[q] + delta[k] (unsigned, wrapping as KeyLayout::offset) in the ascending keys, or -1:
// found[k * n_query + q]. One thread per (k, q), a binary search each; the caller compacts the
// hits in (k, q) order, which is the CPU merge's order (csrc/point_conv/kernel_map.cpp).
template <typename C>
__device__ __forceinline__ void pconv_map_search(const PointMapParams& p) {
  typedef typename C::I I;
  const long long t = (long long)blockIdx.x * C::BLOCK + threadIdx.x;
  if (t >= p.k * p.n_query) return;
  const long long k = t / p.n_query, q = t - k * p.n_query;
  const unsigned long long target = p.query[q] + p.delta[k];
  long long lo = 0, hi = p.n_keys;  // first key >= target
  while (lo < hi) {
    const long long mid = lo + ((hi - lo) >> 1);
    if (p.keys[mid] < target) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  static_cast<I*>(p.found)[t] = (I)(lo < p.n_keys && p.keys[lo] == target ? lo : -1);
}

}  // namespace cuda
}  // namespace sparsejit
