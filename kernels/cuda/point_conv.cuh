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

// ---- Output-stationary implicit GEMM (OpKind::PointConvImplicit) ----------------------------
// The other dataflow: no [M, C] gathered or product buffers. The plan's pairs are first written
// into a dense neighbour map nbr[r * K + k] = the source row that offset k brings to output row
// r, or -1 (`pconv_nbr`, one thread per pair, into a map the caller filled with -1; a valid
// plan has at most one pair per (row, offset)). `pconv_implicit` then computes
//   out[r, :] = act(bias + sum_k x[nbr[r, k], :] @ W[k])      (W[k] [CI, CO], or W[k]^T when
//                                                                TRANS_W: W is [K, CO, CI])
// as a tiled GEMM whose A rows are gathered on the fly: a block owns BM output rows x BN output
// channels; for each offset it stages the BM gathered rows (zeros where a row has no pair) and
// W[k] in BK-channel slices in shared memory; each thread accumulates TM x TN outputs. Offsets
// that none of the block's rows uses are skipped (one __syncthreads_or). Every output is
// summed in the same order (offsets ascending, channels ascending): the same bits on every run.
//
// Compile-time configuration C: T, CI, CO (channels in / out), TN (outputs per thread along
// the channels: BN = 16 * TN), TRANS_W, ACT (None or Relu), BLOCK (a multiple of 16:
// BLOCK / 16 row threads of TM = 4 rows each, so BM = BLOCK / 4). Grid: (ceil(n / BM),
// ceil(CO / BN)).
template <typename C>
__device__ __forceinline__ void pconv_nbr(const PointConvImplicitParams& p) {
  const long long t = (long long)blockIdx.x * C::BLOCK + threadIdx.x;
  if (t >= p.n_pairs) return;
  p.nbr[(long long)p.dst_idx[t] * p.k + p.group[t]] = p.src_idx[t];
}

template <typename C>
__device__ __forceinline__ void pconv_implicit(const PointConvImplicitParams& p) {
  typedef typename C::T T;
  typedef typename AccOf<T>::type A;
  constexpr int TM = 4, TN = C::TN, BK = 16;
  constexpr int BN = 16 * TN, RT = C::BLOCK / 16, BM = RT * TM;
  __shared__ A a_tile[BK][BM + 1];  // gathered rows, channel-major
  __shared__ A b_tile[BK][BN];      // W[k] slice
  __shared__ int src_row[BM];
  const int t = threadIdx.x, tx = t % 16, ty = t / 16;
  const long long row0 = (long long)blockIdx.x * BM;
  const int col0 = blockIdx.y * BN;
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);
  A acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = A(0);
  for (long long k = 0; k < p.k; ++k) {
    int hit = 0;
    if (t < BM) {
      const long long r = row0 + t;
      const int s = r < p.n ? p.nbr[r * p.k + k] : -1;
      src_row[t] = s;
      hit = s >= 0;
    }
    if (!__syncthreads_or(hit)) continue;  // uniform: no row of this block uses offset k
    const T* wk = w + k * (long long)C::CI * C::CO;
    for (int c0 = 0; c0 < C::CI; c0 += BK) {
      for (int e = t; e < BM * BK; e += C::BLOCK) {
        const int m = e / BK, kk = e % BK;
        const int s = src_row[m];
        a_tile[kk][m] = (s >= 0 && c0 + kk < C::CI) ? to_acc(x[(long long)s * C::CI + c0 + kk])
                                                    : A(0);
      }
      for (int e = t; e < BK * BN; e += C::BLOCK) {
        const int kk = e / BN, n = e % BN;
        const int ci = c0 + kk, co = col0 + n;
        A v = A(0);
        if (ci < C::CI && co < C::CO)
          v = to_acc(C::TRANS_W ? wk[(long long)co * C::CI + ci] : wk[(long long)ci * C::CO + co]);
        b_tile[kk][n] = v;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < BK; ++kk) {
        A a[TM], b[TN];
#pragma unroll
        for (int i = 0; i < TM; ++i) a[i] = a_tile[kk][ty + i * RT];
#pragma unroll
        for (int j = 0; j < TN; ++j) b[j] = b_tile[kk][tx + j * 16];
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
          for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
      }
      __syncthreads();  // the tiles have been read
    }
  }
  const T* bias = static_cast<const T*>(p.bias);
  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const long long r = row0 + ty + i * RT;
    if (r >= p.n) continue;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int co = col0 + tx + j * 16;
      if (co >= C::CO) continue;
      A z = acc[i][j];
      if (bias) z += to_acc(bias[co]);
      if (C::ACT == 1 && z < A(0)) z = A(0);
      out[r * C::CO + co] = from_acc<T>(z);
    }
  }
}

}  // namespace cuda
}  // namespace sparsejit
