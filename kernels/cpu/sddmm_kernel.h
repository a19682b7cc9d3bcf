// SDDMM loop nest, written once and instantiated twice (like spmm_kernel.h): with run-time
// H and F for the precompiled generic kernel (sddmm_cpu.cpp), and with compile-time H and F by
// the JIT (codegen/), where the dot products unroll completely and vectorize for the host.
//
// S[p, h] = <Q[row(p), h, :], K[col(p), h, :]>. Work is one dot product per stored entry, so
// the entries are split into equal contiguous ranges; each thread finds the row of its first
// entry by binary search.
//
// Summation order is fixed, independent of F being known at compile time and of the target:
// 32 partial sums (element f goes to lane f % 32, in order of f), held as four 8-lane
// vectors, then a fixed pairwise tree: vectors (0+2)+(1+3), then lanes
// ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)). The compiler maps the lanes onto vector registers of
// whatever width the target has, and generic and JIT results stay bit-identical (with
// -ffp-contract=off on both).
//
// bfloat16 rows of 32 or more elements sum in another fixed order, AVX512-BF16's
// (dot_bf16_pairs, kernels/cpu/common/bf16_dot.h), so that a build for a CPU with that extension (the JIT's
// -march=native) runs one vdpbf16ps per 32 element pairs and every other build emulates it:
// the same bits on normal-range values.
//
// Only the standard library and sparsejit's Torch-free headers are included: the JIT
// compiles this file with nothing else on the include path.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/common/bf16_dot.h"
#include "kernels/cpu/common/partition.h"
#include "kernels/cpu/sddmm_args.h"
#include "kernels/cpu/common/vec.h"

namespace sparsejit::cpu::detail {

inline constexpr int64_t kSddmmLanes = 32;

// Eight lanes of the accumulator type as one GCC vector (one AVX2 register for float).
template <typename A>
using Lanes8 = Vec<A, 8 * sizeof(A)>;

template <typename T, typename A>
inline Lanes8<A> load8(const T* p) {
  return load_lanes<Lanes8<A>, A>(p);
}

// <q[0:F], k[0:F]> in the fixed order described above, with explicit 8-lane vectors (the
// scalar form of the same order was left unvectorized by GCC: 5-10x slower). Four vectors
// give four independent add chains per dot product.
template <int64_t kF, typename T>
inline acc_t<T> dot_fixed_order(const T* __restrict q, const T* __restrict k, int64_t F_rt) {
  if constexpr (std::is_same_v<T, bf16>) {
    // Rows of 32 or more: AVX512-BF16's order; narrower rows keep the lane order below (a
    // padded 32-pair step and the 16-lane fold cost more than they save there).
    if (size_or<kF>(F_rt) >= 32) return dot_bf16_pairs<kF>(q, k, F_rt);
  }
  using A = acc_t<T>;
  using V = Lanes8<A>;
  const int64_t F = size_or<kF>(F_rt);
  constexpr int64_t L = kSddmmLanes;  // 32 = 4 vectors of 8
  V p[4] = {};
  const int64_t full = F - F % L;
#pragma GCC unroll 8
  for (int64_t f0 = 0; f0 < full; f0 += L) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) p[v] += load8<T, A>(q + f0 + 8 * v) * load8<T, A>(k + f0 + 8 * v);
  }
  // The tail: whole vectors, then single elements, each into lane (f - full).
  const int64_t tail_vectors = (F - full) / 8;
  for (int64_t v = 0; v < tail_vectors; ++v)
    p[v] += load8<T, A>(q + full + 8 * v) * load8<T, A>(k + full + 8 * v);
  for (int64_t f = full + 8 * tail_vectors; f < F; ++f)
    p[tail_vectors][f - full - 8 * tail_vectors] += A(q[f]) * A(k[f]);
  // Fixed tree: vectors pairwise, then the 8 lanes pairwise (shuffles, no memory round trip).
  const V s8 = (p[0] + p[2]) + (p[1] + p[3]);
  typedef Vec<A, 4 * sizeof(A)> V4;
  typedef Vec<A, 2 * sizeof(A)> V2;
  const V4 s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  const V2 s2 = __builtin_shufflevector(s4, s4, 0, 1) + __builtin_shufflevector(s4, s4, 2, 3);
  return s2[0] + s2[1];
}

template <typename T, typename I, int64_t kH, int64_t kF>
void sddmm_run(const SddmmArgs& a, const I* rowptr, const I* col, const T* q, const T* k, T* s) {
  const int64_t rows = a.rows;
  if (rows == 0) return;
  const int64_t nnz = rowptr[rows];
  if (nnz == 0) return;
  const int64_t H = size_or<kH>(a.heads), F = size_or<kF>(a.features);
  const int64_t HF = H * F;
  int nt = std::max(1, a.num_threads);
  if (nnz * std::max<int64_t>(HF, 1) < a.min_parallel_work) nt = 1;
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    const int parts = omp_get_num_threads();
    const int64_t per = (nnz + parts - 1) / parts;
    const int64_t p0 = std::min<int64_t>(per * t, nnz);
    const int64_t p1 = std::min<int64_t>(p0 + per, nnz);
    if (p0 < p1) {
      int64_t i = row_of_position(rowptr, rows, p0);
      int64_t row_end = static_cast<int64_t>(rowptr[i + 1]);
      for (int64_t p = p0; p < p1; ++p) {
        while (row_end <= p) row_end = static_cast<int64_t>(rowptr[++i + 1]);
        // K rows are gathered at random: ask for the one six entries on (as the attention
        // kernels do) so large graphs do not wait on each gather.
        if (p + 6 < nnz) {
          const char* next = reinterpret_cast<const char*>(k + static_cast<int64_t>(col[p + 6]) * HF);
          for (int64_t b = 0; b < HF * int64_t(sizeof(T)); b += 64) __builtin_prefetch(next + b);
        }
        const T* __restrict qr = q + i * HF;
        const T* __restrict kr = k + static_cast<int64_t>(col[p]) * HF;
        for (int64_t h = 0; h < H; ++h) {
          s[p * H + h] = T(dot_fixed_order<kF>(qr + h * F, kr + h * F, F));
        }
      }
    }
  }
}

}  // namespace sparsejit::cpu::detail
