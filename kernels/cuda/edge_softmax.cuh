// Edge softmax and its backward on the GPU, one warp per row, as kernels/cpu/sddmm_cpu.cpp:
//   forward   out[p, h] = exp(s[p, h] - max_h) / sum_row exp(s[., h] - max_h)
//   backward  out[p, h] = y[p, h] * (g[p, h] - sum_row g[., h] * y[., h])
// Empty rows write nothing. Scores are [nnz, H] (H = 1 for [nnz]), so a row's scores are the
// contiguous range [rowptr[i] * H, rowptr[i + 1] * H).
//
// Compile-time configuration C: T, I, H, BACKWARD, BLOCK.
// H <= 32: the warp's first (32 / H) * H lanes stride over the row's range by that many
// scalars, so each lane keeps one head (lane % H); lanes of the same head combine through a
// shuffle tree (offsets that are multiples of H). H > 32: lane l takes heads l, l + 32, ...
// and walks the row alone. The forward pass keeps an online (max, sum) pair: two reads.
#pragma once

#ifndef SJ_CUDA_AMALGAMATED
#include "kernels/cuda/common.cuh"
#endif

namespace sparsejit {
namespace cuda {

template <typename A>
struct MaxSum {
  A m;
  A s;
  // -inf scores (masked entries) add nothing, as exp(-inf - max) = 0 in the CPU kernel.
  __device__ __forceinline__ void add(A x) {
    if (x > m) {
      s = s * acc_exp<A>(m - x) + A(1);
      m = x;
    } else if (x > -acc_inf<A>()) {
      s += acc_exp<A>(x - m);
    }
  }
  __device__ __forceinline__ void merge(A om, A os) {
    if (os == A(0)) return;  // the other side saw nothing
    if (s == A(0)) {
      m = om;
      s = os;
    } else if (om > m) {
      s = s * acc_exp<A>(m - om) + os;
      m = om;
    } else {
      s += os * acc_exp<A>(om - m);
    }
  }
};

// Combines, over the lanes holding the same head (lane % H), values with `op`; every lane
// ends with its head's total. H <= 32.
template <int H, typename V, typename Op>
__device__ __forceinline__ V head_allreduce(V v, Op op) {
  constexpr int kTeams = 32 / H;
  const int lane = threadIdx.x & 31;
  const int team = lane / H;
#pragma unroll
  for (int s = 1; s < kTeams; s <<= 1) {
    const V other = __shfl_down_sync(0xffffffffu, v, s * H);
    if ((team & (2 * s - 1)) == 0 && team + s < kTeams) v = op(v, other);
  }
  return __shfl_sync(0xffffffffu, v, lane % H);
}

template <class C>
__device__ __forceinline__ void edge_softmax_kernel(const SoftmaxParams& p) {
  typedef typename C::T T;
  typedef typename C::I I;
  typedef typename AccOf<T>::type A;
  constexpr int H = C::H;
  const i64 row = (i64(blockIdx.x) * C::BLOCK + threadIdx.x) / 32;
  if (row >= p.rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x & 31;
  const I* __restrict__ rowptr = static_cast<const I*>(p.rowptr);
  const T* __restrict__ y = static_cast<const T*>(p.y);
  const T* __restrict__ g = static_cast<const T*>(p.grad);
  T* __restrict__ out = static_cast<T*>(p.out);
  const i64 lo = i64(rowptr[row]) * H, hi = i64(rowptr[row + 1]) * H;
  if (lo == hi) return;

  if constexpr (H <= 32) {
    constexpr int kLanes = (32 / H) * H;
    const bool active = lane < kLanes;
    if constexpr (C::BACKWARD) {
      A dot = A(0);
      if (active)
        for (i64 e = lo + lane; e < hi; e += kLanes) dot += to_acc(g[e]) * to_acc(y[e]);
      dot = head_allreduce<H>(dot, [](A a, A b) { return a + b; });
      if (active)
        for (i64 e = lo + lane; e < hi; e += kLanes)
          out[e] = from_acc<T>(to_acc(y[e]) * (to_acc(g[e]) - dot));
    } else {
      MaxSum<A> ms{-acc_inf<A>(), A(0)};
      if (active)
        for (i64 e = lo + lane; e < hi; e += kLanes) ms.add(to_acc(y[e]));
      // Merge (max, sum) pairs over the lanes of each head.
      constexpr int kTeams = 32 / H;
      const int team = lane / H;
#pragma unroll
      for (int s = 1; s < kTeams; s <<= 1) {
        const A om = __shfl_down_sync(0xffffffffu, ms.m, s * H);
        const A os = __shfl_down_sync(0xffffffffu, ms.s, s * H);
        if ((team & (2 * s - 1)) == 0 && team + s < kTeams) ms.merge(om, os);
      }
      const A m = __shfl_sync(0xffffffffu, ms.m, lane % H);
      const A sum = __shfl_sync(0xffffffffu, ms.s, lane % H);
      const A inv = sum > A(0) ? A(1) / sum : A(0);
      if (active)
        for (i64 e = lo + lane; e < hi; e += kLanes)
          out[e] = from_acc<T>(acc_exp<A>(to_acc(y[e]) - m) * inv);
    }
  } else {
    for (int h = lane; h < H; h += 32) {
      if constexpr (C::BACKWARD) {
        A dot = A(0);
        for (i64 e = lo + h; e < hi; e += H) dot += to_acc(g[e]) * to_acc(y[e]);
        for (i64 e = lo + h; e < hi; e += H)
          out[e] = from_acc<T>(to_acc(y[e]) * (to_acc(g[e]) - dot));
      } else {
        MaxSum<A> ms{-acc_inf<A>(), A(0)};
        for (i64 e = lo + h; e < hi; e += H) ms.add(to_acc(y[e]));
        const A inv = ms.s > A(0) ? A(1) / ms.s : A(0);
        for (i64 e = lo + h; e < hi; e += H)
          out[e] = from_acc<T>(acc_exp<A>(to_acc(y[e]) - ms.m) * inv);
      }
    }
  }
}

}  // namespace cuda
}  // namespace sparsejit
