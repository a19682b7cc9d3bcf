// SDDMM on the GPU: S[p, h] = <Q[row(p), h, :], K[col[p], h, :]> for every stored entry p,
// accumulated in float (double for double), as kernels/cpu/sddmm_cpu.cpp.
//
// Compile-time configuration C (emitted by codegen/cuda_spec.cpp):
//   T, I, F, H    scalar and index types, features per head, heads
//   G             lanes per group; a group's lanes split one head's features
//   S             groups per stored entry (1: one group per entry)
//   VEC           scalars per load (F % VEC == 0)
//   M             vectors per lane per head: ceil(F / VEC / (G * S))
//   BLOCK         threads per block; a block takes BLOCK / (G * S) consecutive entries
//
// Two-stage reduction of each dot product: stage 1 sums a group's lanes with xor shuffles;
// stage 2 (S > 1) sums the S group results through shared memory, in group order (no atomics,
// deterministic). The row of each entry is found by binary search inside the row range of the
// block's entries, which the block looks up once.
#pragma once

#ifndef SJ_CUDA_AMALGAMATED
#include "kernels/cuda/common.cuh"
#endif

namespace sparsejit {
namespace cuda {

template <class C>
__device__ __forceinline__ void sddmm_kernel(const SddmmParams& p) {
  typedef typename C::T T;
  typedef typename C::I I;
  typedef typename AccOf<T>::type A;
  constexpr int G = C::G, S = C::S, VEC = C::VEC, F = C::F, H = C::H;
  constexpr int kTeam = G * S;
  constexpr int kEntries = C::BLOCK / kTeam;  // entries per block
  constexpr int kVecs = F / VEC;              // vectors per head
  static_assert(C::BLOCK % kTeam == 0, "a block holds whole teams");
  __shared__ i64 row_range[2];
  __shared__ A stage2[S > 1 ? kEntries * S * H : 1];

  const I* __restrict__ rowptr = static_cast<const I*>(p.rowptr);
  const I* __restrict__ col = static_cast<const I*>(p.col);
  const T* __restrict__ q = static_cast<const T*>(p.q);
  const T* __restrict__ k = static_cast<const T*>(p.k);
  T* __restrict__ out = static_cast<T*>(p.s);

  const i64 first = i64(blockIdx.x) * kEntries;
  if (threadIdx.x == 0) {
    const i64 last = (first + kEntries < p.nnz ? first + kEntries : p.nnz) - 1;
    const i64 r0 = row_of_position(rowptr, 0, p.rows, first);
    row_range[0] = r0;
    row_range[1] = row_of_position(rowptr, r0, p.rows, last) + 1;
  }
  __syncthreads();

  const int member = threadIdx.x % kTeam;  // lane within the entry's team
  const int group = member / G;            // which of the S groups
  const int glane = member % G;
  const i64 pe = first + threadIdx.x / kTeam;
  const bool valid = pe < p.nnz;
  const u32 mask = group_mask<G>();
  if (valid) {
    const i64 row = row_of_position(rowptr, row_range[0], row_range[1], pe);
    const T* __restrict__ qr = q + row * (H * F);
    const T* __restrict__ kr = k + i64(col[pe]) * (H * F);
#pragma unroll
    for (int h = 0; h < H; ++h) {
      A dot = A(0);
#pragma unroll
      for (int m = 0; m < C::M; ++m) {
        const int v = member + m * kTeam;  // vector index inside the head
        if (kVecs % kTeam == 0 || v < kVecs) {
          const Vec<T, VEC> qv = load_vec<T, VEC>(qr + h * F + v * VEC);
          const Vec<T, VEC> kv = load_vec<T, VEC>(kr + h * F + v * VEC);
#pragma unroll
          for (int e = 0; e < VEC; ++e) dot += to_acc(qv.v[e]) * to_acc(kv.v[e]);
        }
      }
      // Stage 1: inside the group.
#pragma unroll
      for (int off = G / 2; off > 0; off >>= 1) dot += shfl_xor<G>(mask, dot, off);
      if (S == 1) {
        if (glane == h % G) out[pe * H + h] = from_acc<T>(dot);
      } else if (glane == 0) {
        stage2[((threadIdx.x / kTeam) * S + group) * H + h] = dot;
      }
    }
  }
  if (S > 1) {
    // Stage 2: across the groups of each entry, in group order.
    __syncthreads();
    for (int t = threadIdx.x; t < kEntries * H; t += C::BLOCK) {
      const int e = t / H, h = t % H;
      if (first + e < p.nnz) {
        A dot = A(0);
#pragma unroll
        for (int g = 0; g < S; ++g) dot += stage2[(e * S + g) * H + h];
        out[(first + e) * H + h] = from_acc<T>(dot);
      }
    }
  }
}

}  // namespace cuda
}  // namespace sparsejit
