// Fused sparse attention on the GPU, as kernels/cpu/attention_kernel.h (same scores, masking,
// dropout mask, online softmax and saved lse; see that header for the formulas):
//
//   attention_forward   a group of G lanes per (target row i, head h) walks the row's entries
//                       once: score (the lanes split the head width D and sum by shuffles),
//                       online softmax (running max m and sum l, identical on every lane),
//                       the lanes' slices of the Dv accumulator; writes out and lse. No
//                       [nnz, H] tensor.
//   attention_rows      backward pass 1, the same groups: recomputes each entry's probability
//                       from lse, dz = P (keep <dout_i, v_j> - delta_i) act'(z), writes dbias
//                       and the [nnz, H] scratch (dz, keep * P), accumulates dq and GATv2's
//                       per-row datt partials in registers.
//   attention_cols      backward pass 2, a group per (source j, head h) over the transpose:
//                       dk and dv from the scratch. Both passes own their outputs: no atomics,
//                       results do not depend on the schedule.
//
// Compile-time configuration C (codegen/cuda_spec_attention.cpp): T (float or double), I,
// H, D (q/k width; 1 in additive mode), DV, MODE (0 dot, 1 additive, 2 GATv2), BIAS, G, BLOCK.
#pragma once

#ifndef SJ_CUDA_AMALGAMATED
#include "kernels/cuda/common.cuh"
#endif

namespace sparsejit {
namespace cuda {

template <typename A>
__device__ __forceinline__ A leaky(A u, A slope) {
  return u * (u < A(0) ? slope : A(1));
}

// The CPU kernel's counter-based dropout draw (splitmix64 of (seed, p, h)): the same mask.
template <typename A>
__device__ __forceinline__ A keep_factor(const AttentionParams& p, i64 e, int h, int heads) {
  if (p.dropout <= 0.0) return A(1);
  unsigned long long z = p.seed + 0x9E3779B97F4A7C15ull * ((unsigned long long)(e) *
                                                             (unsigned long long)(heads) +
                                                         (unsigned long long)(h) + 1ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const double u = double(z >> 11) * (1.0 / 9007199254740992.0);
  return u < p.dropout ? A(0) : A(1.0 / (1.0 - p.dropout));
}

template <int G, typename A>
__device__ __forceinline__ A group_sum(u32 mask, A v) {
#pragma unroll
  for (int off = G / 2; off > 0; off >>= 1) v += shfl_xor<G>(mask, v, off);
  return v;  // xor butterflies add the same pairs on every lane: identical totals
}

// Per-lane slices: lane l of a group holds elements l, l + G, l + 2G, ... of a head's width.
template <class C>
struct AttLanes {
  static constexpr int QPL = (C::D + C::G - 1) / C::G;
  static constexpr int VPL = (C::DV + C::G - 1) / C::G;
};

// The pre-activation score of entry e = (i, j) for head h: the lanes' partial sums, reduced.
// qr / ar: this lane's slices of q[i, h] and att[h] (GATv2).
template <class C>
__device__ __forceinline__ typename C::T att_score(const AttentionParams& p, u32 mask, int lane,
                                                   const typename C::T* qr,
                                                   const typename C::T* ar, i64 j, int h,
                                                   i64 e) {
  typedef typename C::T T;
  constexpr int G = C::G, D = C::D, H = C::H, QPL = AttLanes<C>::QPL;
  const T* __restrict__ kj = static_cast<const T*>(p.k) + (j * H + h) * D;
  T part = T(0);
#pragma unroll
  for (int t = 0; t < QPL; ++t) {
    const int d = lane + t * G;
    if (D % G == 0 || d < D) {
      if (C::MODE == 0) {
        part += qr[t] * kj[d];
      } else if (C::MODE == 2) {
        part += ar[t] * leaky<T>(qr[t] + kj[d], T(p.negative_slope));
      } else {
        part += qr[t] + kj[d];
      }
    }
  }
  T z = group_sum<G>(mask, part);
  if (C::MODE == 0) z *= T(p.scale);
  if (C::BIAS) z += static_cast<const T*>(p.bias)[e * H + h];
  return z;
}

template <class C>
__device__ __forceinline__ void load_q(const AttentionParams& p, const typename C::T* src,
                                       int lane, int h, typename C::T* qr, typename C::T* ar) {
  typedef typename C::T T;
  constexpr int G = C::G, D = C::D;
#pragma unroll
  for (int t = 0; t < AttLanes<C>::QPL; ++t) {
    const int d = lane + t * G;
    const bool in = D % G == 0 || d < D;
    qr[t] = in ? src[d] : T(0);
    ar[t] = (C::MODE == 2 && in) ? static_cast<const T*>(p.att)[h * D + d] : T(0);
  }
}

template <class C>
__device__ __forceinline__ void attention_forward(const AttentionParams& p) {
  typedef typename C::T T;
  typedef typename C::I I;
  constexpr int G = C::G, D = C::D, DV = C::DV, H = C::H;
  constexpr int QPL = AttLanes<C>::QPL, VPL = AttLanes<C>::VPL;
  const i64 gid = (i64(blockIdx.x) * C::BLOCK + threadIdx.x) / G;
  if (gid >= p.rows * H) return;  // the whole group leaves together
  const int lane = threadIdx.x % G;
  const u32 mask = group_mask<G>();
  const i64 i = gid / H;
  const int h = int(gid % H);
  const I* __restrict__ rowptr = static_cast<const I*>(p.rowptr);
  const I* __restrict__ col = static_cast<const I*>(p.col);
  const T* __restrict__ v = static_cast<const T*>(p.v);
  T qr[QPL], ar[QPL], acc[VPL];
  load_q<C>(p, static_cast<const T*>(p.q) + (i * H + h) * D, lane, h, qr, ar);
#pragma unroll
  for (int t = 0; t < VPL; ++t) acc[t] = T(0);
  const T neg_inf = -acc_inf<T>();
  T m = neg_inf, l = T(0);
  for (i64 e = rowptr[i]; e < i64(rowptr[i + 1]); ++e) {
    const i64 j = col[e];
    const T z = att_score<C>(p, mask, lane, qr, ar, j, h, e);
    if (z == neg_inf) continue;  // masked by a -inf bias (the same on every lane)
    const T sc = C::MODE == 1 ? leaky<T>(z, T(p.negative_slope)) : z;
    if (sc > m) {  // a new running max: rescale what was summed
      const T c = m == neg_inf ? T(0) : acc_exp<T>(m - sc);
      l *= c;
#pragma unroll
      for (int t = 0; t < VPL; ++t) acc[t] *= c;
      m = sc;
    }
    const T w = acc_exp<T>(sc - m);
    l += w;
    const T wk = w * keep_factor<T>(p, e, h, H);
    if (wk != T(0)) {
      const T* __restrict__ vj = v + (j * H + h) * DV;
#pragma unroll
      for (int t = 0; t < VPL; ++t) {
        const int d = lane + t * G;
        if (DV % G == 0 || d < DV) acc[t] += wk * vj[d];
      }
    }
  }
  T* __restrict__ o = static_cast<T*>(p.out) + (i * H + h) * DV;
  const bool any = l != T(0);  // > 0, or NaN from a NaN score (kept, as on the CPU)
  const T inv = any ? T(1) / l : T(0);
#pragma unroll
  for (int t = 0; t < VPL; ++t) {
    const int d = lane + t * G;
    if (DV % G == 0 || d < DV) o[d] = any ? acc[t] * inv : T(0);
  }
  if (lane == 0) static_cast<T*>(p.lse)[i * H + h] = any ? m + acc_log<T>(l) : neg_inf;
}

template <class C>
__device__ __forceinline__ void attention_rows(const AttentionParams& p) {
  typedef typename C::T T;
  typedef typename C::I I;
  constexpr int G = C::G, D = C::D, DV = C::DV, H = C::H;
  constexpr int QPL = AttLanes<C>::QPL, VPL = AttLanes<C>::VPL;
  const i64 gid = (i64(blockIdx.x) * C::BLOCK + threadIdx.x) / G;
  if (gid >= p.rows * H) return;
  const int lane = threadIdx.x % G;
  const u32 mask = group_mask<G>();
  const i64 i = gid / H;
  const int h = int(gid % H);
  const I* __restrict__ rowptr = static_cast<const I*>(p.rowptr);
  const I* __restrict__ col = static_cast<const I*>(p.col);
  const T* __restrict__ k = static_cast<const T*>(p.k);
  const T* __restrict__ v = static_cast<const T*>(p.v);
  T qr[QPL], ar[QPL], g[VPL], dq[QPL], da[QPL];
  load_q<C>(p, static_cast<const T*>(p.q) + (i * H + h) * D, lane, h, qr, ar);
  const T* __restrict__ go = static_cast<const T*>(p.dout) + (i * H + h) * DV;
#pragma unroll
  for (int t = 0; t < VPL; ++t) {
    const int d = lane + t * G;
    g[t] = (DV % G == 0 || d < DV) ? go[d] : T(0);
  }
#pragma unroll
  for (int t = 0; t < QPL; ++t) dq[t] = da[t] = T(0);
  const T lse = static_cast<const T*>(p.lse_in)[i * H + h];
  const T delta = static_cast<const T*>(p.delta)[i * H + h];
  const T neg_inf = -acc_inf<T>();
  const T slope = T(p.negative_slope);
  for (i64 e = rowptr[i]; e < i64(rowptr[i + 1]); ++e) {
    const i64 j = col[e];
    const T z = att_score<C>(p, mask, lane, qr, ar, j, h, e);
    T dz = T(0), pk = T(0);
    if (z != neg_inf) {
      const T sc = C::MODE == 1 ? leaky<T>(z, slope) : z;
      const T prob = acc_exp<T>(sc - lse);
      const T keep = keep_factor<T>(p, e, h, H);
      T dp = T(0);
      if (keep != T(0)) {
        const T* __restrict__ vj = v + (j * H + h) * DV;
        T part = T(0);
#pragma unroll
        for (int t = 0; t < VPL; ++t) {
          const int d = lane + t * G;
          if (DV % G == 0 || d < DV) part += g[t] * vj[d];
        }
        dp = keep * group_sum<G>(mask, part);
      }
      const T act_grad = (C::MODE == 1 && z < T(0)) ? slope : T(1);
      dz = prob * (dp - delta) * act_grad;
      pk = prob * keep;
    }
    if (lane == 0) {
      if (p.dbias != nullptr) static_cast<T*>(p.dbias)[e * H + h] = dz;
      static_cast<T*>(p.dz)[e * H + h] = dz;
      static_cast<T*>(p.pk)[e * H + h] = pk;
    }
    const T* __restrict__ kj = k + (j * H + h) * D;
#pragma unroll
    for (int t = 0; t < QPL; ++t) {
      const int d = lane + t * G;
      if (D % G == 0 || d < D) {
        if (C::MODE == 0) {
          dq[t] += dz * T(p.scale) * kj[d];
        } else if (C::MODE == 2) {
          const T u = qr[t] + kj[d];
          dq[t] += dz * ar[t] * (u >= T(0) ? T(1) : slope);
          da[t] += dz * leaky<T>(u, slope);
        } else {
          dq[t] += dz;
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < QPL; ++t) {
    const int d = lane + t * G;
    if (D % G == 0 || d < D) {
      if (p.dq != nullptr) static_cast<T*>(p.dq)[(i * H + h) * D + d] = dq[t];
      if (C::MODE == 2 && p.datt_rows != nullptr)
        static_cast<T*>(p.datt_rows)[(i * H + h) * D + d] = da[t];
    }
  }
}

template <class C>
__device__ __forceinline__ void attention_cols(const AttentionParams& p) {
  typedef typename C::T T;
  typedef typename C::I I;
  constexpr int G = C::G, D = C::D, DV = C::DV, H = C::H;
  constexpr int QPL = AttLanes<C>::QPL, VPL = AttLanes<C>::VPL;
  const i64 gid = (i64(blockIdx.x) * C::BLOCK + threadIdx.x) / G;
  if (gid >= p.cols * H) return;
  const int lane = threadIdx.x % G;
  const i64 j = gid / H;
  const int h = int(gid % H);
  const I* __restrict__ t_rowptr = static_cast<const I*>(p.t_rowptr);
  const I* __restrict__ t_col = static_cast<const I*>(p.t_col);
  const I* __restrict__ t_perm = static_cast<const I*>(p.t_perm);
  const T* __restrict__ q = static_cast<const T*>(p.q);
  const T* __restrict__ dout = static_cast<const T*>(p.dout);
  const T* __restrict__ dzs = static_cast<const T*>(p.dz);
  const T* __restrict__ pks = static_cast<const T*>(p.pk);
  T kr[QPL], ar[QPL], dk[QPL], dv[VPL];
  load_q<C>(p, static_cast<const T*>(p.k) + (j * H + h) * D, lane, h, kr, ar);
#pragma unroll
  for (int t = 0; t < QPL; ++t) dk[t] = T(0);
#pragma unroll
  for (int t = 0; t < VPL; ++t) dv[t] = T(0);
  const T slope = T(p.negative_slope);
  for (i64 s = t_rowptr[j]; s < i64(t_rowptr[j + 1]); ++s) {
    const i64 i = t_col[s], e = t_perm[s];
    if (e < 0 || e >= p.nnz || i < 0 || i >= p.rows) {
      if (lane == 0) *p.bad_perm = 1;  // reported by the adapter; the entry is skipped
      continue;
    }
    const T dz = dzs[e * H + h], pk = pks[e * H + h];
    if (pk != T(0)) {
      const T* __restrict__ g = dout + (i * H + h) * DV;
#pragma unroll
      for (int t = 0; t < VPL; ++t) {
        const int d = lane + t * G;
        if (DV % G == 0 || d < DV) dv[t] += pk * g[d];
      }
    }
    const T* __restrict__ qi = q + (i * H + h) * D;
#pragma unroll
    for (int t = 0; t < QPL; ++t) {
      const int d = lane + t * G;
      if (D % G == 0 || d < D) {
        if (C::MODE == 0) {
          dk[t] += dz * T(p.scale) * qi[d];
        } else if (C::MODE == 2) {
          const T u = qi[d] + kr[t];
          dk[t] += dz * ar[t] * (u >= T(0) ? T(1) : slope);
        } else {
          dk[t] += dz;
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < QPL; ++t) {
    const int d = lane + t * G;
    if (p.dk != nullptr && (D % G == 0 || d < D))
      static_cast<T*>(p.dk)[(j * H + h) * D + d] = dk[t];
  }
#pragma unroll
  for (int t = 0; t < VPL; ++t) {
    const int d = lane + t * G;
    if (p.dv != nullptr && (DV % G == 0 || d < DV))
      static_cast<T*>(p.dv)[(j * H + h) * DV + d] = dv[t];
  }
}

}  // namespace cuda
}  // namespace sparsejit
