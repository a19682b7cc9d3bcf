// SpMM on the GPU: Y[i] = epilogue(reduce_{p in row i} a_p * X[col[p]]), with the semantics of
// kernels/cpu/spmm_kernel.h (empty rows give 0, max / min record the first winning CSR
// position, -1 for empty rows; the epilogue is act(scale * r + bias)).
//
// Compile-time configuration C (emitted by codegen/cuda_spec.cpp):
//   T, I                scalar and index types
//   F, H                features per head and heads (a row of X has H * F scalars)
//   VMODE               0: no values, 1: values[nnz], 2: values[nnz, H]
//   REDUCE, ACT         reduce (kSum..kMin) and fused activation
//   G                   lanes working on one row (row-group) or one chunk (nnz-balanced)
//   GF                  of those, lanes spread over features; GN = G / GF split the entries
//   VEC                 scalars per load (VEC * sizeof(T) <= 16 bytes, F % VEC == 0)
//   CO                  vectors per lane per tile (feature coarsening)
//   BLOCK               threads per block
// A "tile" is GF * CO * VEC consecutive features; grid.y runs over the tiles of a row.
//
// Schedules:
//   spmm_rowgroup   one group of G lanes per row. Lane (ln, lf) takes entries ln, ln + GN, ...
//                   and the vectors lf, lf + GF, ... of the tile; the GN partial results are
//                   combined by xor shuffles (deterministic: every lane ends with the same bits).
//   spmm_chunks     nnz-balanced: worker c (GF lanes) takes stored entries
//                   [c * chunk, (c + 1) * chunk). Rows whole inside the chunk are written
//                   directly; a row cut by chunk boundaries leaves partials:
//     SEGMENT       each chunk stores at most a head (end of a row begun earlier) and a tail
//                   (start of a row that goes on); spmm_fixup then walks each split row's
//                   chunks in order (no atomics: deterministic, and max / min work).
//     ATOMIC        partials are added with atomicAdd into one accumulator per split row
//                   (slot = the chunk where the row starts); spmm_finalize writes them.
//                   Sum / mean only; not deterministic in the last bits.
#pragma once

#ifndef SJ_CUDA_AMALGAMATED
#include "kernels/cuda/common.cuh"
#endif

namespace sparsejit {
namespace cuda {

// Per-lane accumulators of one tile: CO vectors of VEC scalars (+ positions for max / min).
template <class C>
struct TileAcc {
  typedef typename AccOf<typename C::T>::type A;
  static constexpr bool kArg = C::REDUCE == kMax || C::REDUCE == kMin;
  A v[C::CO][C::VEC];
  i64 pos[kArg ? C::CO : 1][kArg ? C::VEC : 1];

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int c = 0; c < C::CO; ++c)
#pragma unroll
      for (int e = 0; e < C::VEC; ++e) {
        v[c][e] = reduce_identity<C::REDUCE, A>();
        if constexpr (kArg) pos[c][e] = -1;
      }
  }

  // Adds stored entry q (column j) to the accumulators. `f0` is this lane's first feature.
  __device__ __forceinline__ void add(const typename C::T* __restrict__ x,
                                      const typename C::T* __restrict__ values, i64 q, i64 j,
                                      int f0) {
    typedef typename C::T T;
    constexpr int HF = C::H * C::F;
    constexpr int kStride = C::GF * C::VEC;
    A a1 = A(1);
    if (C::VMODE == 1) a1 = to_acc(values[q]);
    const T* __restrict__ xr = x + j * HF;
#pragma unroll
    for (int c = 0; c < C::CO; ++c) {
      const int f = f0 + c * kStride;
      if (C::EXACT_TILES || f < HF) {
        const Vec<T, C::VEC> xv = load_vec<T, C::VEC>(xr + f);
        A a = a1;
        if (C::VMODE == 2) a = to_acc(values[q * C::H + f / C::F]);
#pragma unroll
        for (int e = 0; e < C::VEC; ++e) {
          const A m = C::VMODE == 0 ? to_acc(xv.v[e]) : a * to_acc(xv.v[e]);
          if constexpr (kArg) {
            const bool better = C::REDUCE == kMax ? m > v[c][e] : m < v[c][e];
            if (better) {
              v[c][e] = m;
              pos[c][e] = q;
            }
          } else {
            v[c][e] += m;
          }
        }
      }
    }
  }

  // Merges another partial of the same features (for max / min: `op` from any positions).
  __device__ __forceinline__ void merge(int c, int e, A o, i64 po) {
    if constexpr (kArg) {
      if (beats<C::REDUCE, A>(o, po, v[c][e], pos[c][e])) {
        v[c][e] = o;
        pos[c][e] = po;
      }
    } else {
      v[c][e] += o;
    }
  }

  // Writes vector c of row `row` (features f .. f + VEC) through the epilogue.
  __device__ __forceinline__ void write(const SpmmParams& p, i64 row, i64 degree, int c,
                                        int f) const {
    typedef typename C::T T;
    constexpr int HF = C::H * C::F;
    const T* bias = static_cast<const T*>(p.bias);
    Vec<T, C::VEC> ov;
#pragma unroll
    for (int e = 0; e < C::VEC; ++e)
      ov.v[e] =
          finish_value<C::REDUCE, C::ACT, T, A>(v[c][e], degree, p.scale, bias, f + e, p.act_param);
    store_vec<T, C::VEC>(static_cast<T*>(p.out) + row * HF + f, ov);
    if constexpr (kArg) {
#pragma unroll
      for (int e = 0; e < C::VEC; ++e) p.arg[row * HF + f + e] = degree > 0 ? pos[c][e] : i64(-1);
    }
  }
};

template <class C>
__device__ __forceinline__ void spmm_rowgroup(const SpmmParams& p) {
  typedef typename C::T T;
  typedef typename C::I I;
  constexpr int G = C::G, GF = C::GF, GN = C::G / C::GF;
  constexpr int HF = C::H * C::F;
  constexpr int kTile = GF * C::CO * C::VEC;
  const i64 row = (i64(blockIdx.x) * C::BLOCK + threadIdx.x) / G;
  if (row >= p.rows) return;  // the whole group leaves together
  const int glane = threadIdx.x % G;
  const int lf = glane % GF, ln = glane / GF;
  const int f0 = int(blockIdx.y) * kTile + lf * C::VEC;
  const I* __restrict__ rowptr = static_cast<const I*>(p.rowptr);
  const I* __restrict__ col = static_cast<const I*>(p.col);
  const T* __restrict__ x = static_cast<const T*>(p.x);
  const T* __restrict__ values = static_cast<const T*>(p.values);
  const i64 lo = rowptr[row], hi = rowptr[row + 1];

  TileAcc<C> acc;
  acc.reset();
  for (i64 q = lo + ln; q < hi; q += GN) acc.add(x, values, q, i64(col[q]), f0);

  if (GN > 1) {
    const u32 mask = group_mask<G>();
#pragma unroll
    for (int off = GF; off < G; off <<= 1) {
#pragma unroll
      for (int c = 0; c < C::CO; ++c)
#pragma unroll
        for (int e = 0; e < C::VEC; ++e) {
          const auto o = shfl_xor<G>(mask, acc.v[c][e], off);
          i64 po = -1;
          if constexpr (TileAcc<C>::kArg) po = shfl_xor<G>(mask, acc.pos[c][e], off);
          acc.merge(c, e, o, po);
        }
    }
  }
  // Every lane of the group holds the result; they share the stores.
#pragma unroll
  for (int c = 0; c < C::CO; ++c) {
    const int f = f0 + c * GF * C::VEC;
    if ((c % GN) == ln && (C::EXACT_TILES || f < HF)) acc.write(p, row, hi - lo, c, f);
  }
}

// Stores / loads one partial (head or tail) of a chunk for the segment strategy.
template <class C>
__device__ __forceinline__ void store_partial(const SpmmParams& p, i64 slot, const TileAcc<C>& acc,
                                              int f0) {
  typedef typename AccOf<typename C::T>::type A;
  constexpr int HF = C::H * C::F;
  A* dst = static_cast<A*>(p.partial) + slot * HF;
#pragma unroll
  for (int c = 0; c < C::CO; ++c) {
    const int f = f0 + c * C::GF * C::VEC;
    if (C::EXACT_TILES || f < HF) {
#pragma unroll
      for (int e = 0; e < C::VEC; ++e) {
        dst[f + e] = acc.v[c][e];
        if constexpr (TileAcc<C>::kArg) p.partial_arg[slot * HF + f + e] = acc.pos[c][e];
      }
    }
  }
}

template <class C>
__device__ __forceinline__ void atomic_add_partial(const SpmmParams& p, i64 slot,
                                                   const TileAcc<C>& acc, int f0) {
  typedef typename AccOf<typename C::T>::type A;
  constexpr int HF = C::H * C::F;
  A* dst = static_cast<A*>(p.partial) + slot * HF;
#pragma unroll
  for (int c = 0; c < C::CO; ++c) {
    const int f = f0 + c * C::GF * C::VEC;
    if (C::EXACT_TILES || f < HF) {
#pragma unroll
      for (int e = 0; e < C::VEC; ++e) atomicAdd(dst + f + e, acc.v[c][e]);
    }
  }
}

template <class C>
__device__ __forceinline__ void spmm_chunks(const SpmmParams& p) {
  typedef typename C::T T;
  typedef typename C::I I;
  constexpr int GF = C::GF;
  constexpr int kTile = GF * C::CO * C::VEC;
  static_assert(C::G == C::GF, "nnz-balanced workers spread all their lanes over features");
  static_assert(!(C::ATOMIC && TileAcc<C>::kArg), "atomic partials support sum and mean only");
  static_assert(!(C::ATOMIC && C::DETERMINISTIC), "deterministic mode uses no float atomics");
  const i64 chunk_id = (i64(blockIdx.x) * C::BLOCK + threadIdx.x) / GF;
  if (chunk_id >= p.num_chunks) return;
  const int lf = threadIdx.x % GF;
  const int f0 = int(blockIdx.y) * kTile + lf * C::VEC;
  const I* __restrict__ rowptr = static_cast<const I*>(p.rowptr);
  const I* __restrict__ col = static_cast<const I*>(p.col);
  const T* __restrict__ x = static_cast<const T*>(p.x);
  const T* __restrict__ values = static_cast<const T*>(p.values);
  const i64 p0 = chunk_id * p.chunk;
  const i64 p1 = p0 + p.chunk < p.nnz ? p0 + p.chunk : p.nnz;
  const bool last = chunk_id == p.num_chunks - 1;

  // Rows owned by this chunk: those whose entries end inside it, and the empty rows at
  // positions [p0, p1) (the last chunk also takes the trailing empty rows).
  i64 r = first_row_ending_at_or_after(rowptr, p.rows, p0);
  if (r < p.rows && i64(rowptr[r + 1]) == p0 && i64(rowptr[r]) < p0) ++r;
  i64 tail = -1;
  TileAcc<C> acc;
  for (; r < p.rows; ++r) {
    const i64 rs = rowptr[r], re = rowptr[r + 1];
    if (!last && rs >= p1) break;
    const i64 lo = rs > p0 ? rs : p0;
    const i64 hi = re < p1 ? re : p1;
    acc.reset();
    for (i64 q = lo; q < hi; ++q) acc.add(x, values, q, i64(col[q]), f0);
    const bool begun_before = rs<p0, goes_on = re> p1;
    if (!begun_before && !goes_on) {
#pragma unroll
      for (int c = 0; c < C::CO; ++c) {
        const int f = f0 + c * GF * C::VEC;
        if (C::EXACT_TILES || f < C::H * C::F) acc.write(p, r, re - rs, c, f);
      }
      continue;
    }
    if (goes_on && !begun_before) tail = r;
    if constexpr (C::ATOMIC) {
      atomic_add_partial<C>(p, rs / p.chunk, acc, f0);
    } else {
      store_partial<C>(p, 2 * chunk_id + (begun_before ? 0 : 1), acc, f0);
    }
    if (goes_on) break;  // the last row of this chunk
  }
  if (blockIdx.y == 0 && lf == 0) p.tail_row[chunk_id] = tail;
}

// Finishes the split rows: worker c handles the row that starts in chunk c and goes on.
template <class C>
__device__ __forceinline__ void spmm_fixup(const SpmmParams& p) {
  typedef typename C::I I;
  typedef typename AccOf<typename C::T>::type A;
  constexpr int GF = C::GF;
  constexpr int HF = C::H * C::F;
  constexpr int kTile = GF * C::CO * C::VEC;
  const i64 chunk_id = (i64(blockIdx.x) * C::BLOCK + threadIdx.x) / GF;
  if (chunk_id >= p.num_chunks) return;
  const i64 r = p.tail_row[chunk_id];
  if (r < 0) return;
  const int lf = threadIdx.x % GF;
  const int f0 = int(blockIdx.y) * kTile + lf * C::VEC;
  const I* __restrict__ rowptr = static_cast<const I*>(p.rowptr);
  const i64 rs = rowptr[r], re = rowptr[r + 1];
  const A* part = static_cast<const A*>(p.partial);
  TileAcc<C> acc;
  const i64 first = C::ATOMIC ? chunk_id : 2 * chunk_id + 1;
#pragma unroll
  for (int c = 0; c < C::CO; ++c) {
    const int f = f0 + c * GF * C::VEC;
#pragma unroll
    for (int e = 0; e < C::VEC; ++e) {
      if (C::EXACT_TILES || f < HF) {
        acc.v[c][e] = part[first * HF + f + e];
        if constexpr (TileAcc<C>::kArg) acc.pos[c][e] = p.partial_arg[first * HF + f + e];
      }
    }
  }
  if constexpr (!C::ATOMIC) {
    // Heads of the following chunks, in order (later positions: ties keep the earlier one).
    for (i64 c2 = chunk_id + 1; c2 * p.chunk < re; ++c2) {
      const i64 slot = 2 * c2;
#pragma unroll
      for (int c = 0; c < C::CO; ++c) {
        const int f = f0 + c * GF * C::VEC;
        if (C::EXACT_TILES || f < HF) {
#pragma unroll
          for (int e = 0; e < C::VEC; ++e) {
            i64 po = -1;
            if constexpr (TileAcc<C>::kArg) po = p.partial_arg[slot * HF + f + e];
            acc.merge(c, e, part[slot * HF + f + e], po);
          }
        }
      }
    }
  }
#pragma unroll
  for (int c = 0; c < C::CO; ++c) {
    const int f = f0 + c * GF * C::VEC;
    if (C::EXACT_TILES || f < HF) acc.write(p, r, re - rs, c, f);
  }
}

}  // namespace cuda
}  // namespace sparsejit
