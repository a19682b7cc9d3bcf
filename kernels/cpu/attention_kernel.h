// Fused sparse attention (Torch-free, raw pointers, OpenMP): a softmax per row and head on a
// CSR pattern. Rows are targets i, stored entries p = (i, j) are their sources.
//
//   z[p, h] = scale * <q[i, h, :], k[j, h, :]> + bias[p, h]        (dot mode, Transformer)
//   z[p, h] = q[i, h, 0] + k[j, h, 0] + bias[p, h]                 (additive mode, GAT), then
//   z[p, h] = sum_d att[h, d] LeakyReLU(q[i, h, d] + k[j, h, d]) + bias[p, h]   (GATv2 mode)
//   s[p, h] = LeakyReLU(z) in additive mode, z otherwise
//   P[p, h] = softmax over row i of s[., h];   out[i, h, :] = sum_p keep(p, h) P[p, h] v[j, h, :]
//
// keep(p, h) is attention dropout: 0 with probability `dropout`, else 1 / (1 - dropout), drawn
// from a counter-based hash of (seed, p, h) so the backward regenerates the same mask without
// storing it. The forward takes a row in three passes over a per-thread buffer of the row's
// [entries, H] scores: the scores and their max m per head; the weights exp(s - m), eight at
// a time; then l = the sum of the weights and the weighted rows of v, in entry order. No
// [nnz, H] tensor is written; it saves lse = m + log(l) per (i, h). When the JIT fixes the
// sizes (float or bfloat16 storage), an entry's H heads go through each pass as one vector
// and the row's accumulator stays in registers (kVectorScores, kRegisterAcc).
//
// The backward recomputes s and P = exp(s - lse) (FlashAttention-2's recipe) with
// D[i, h] = <dout[i, h], out[i, h]>, dP = keep <dout[i], v[j]>, dS = P (dP - D):
//   pass 1, row-parallel over targets:   dq, dbias (no write conflicts), and when pass 2
//   runs, each entry's dz and dropout-scaled P as [nnz, H] scratch (8 bytes per entry and
//   head in float32, only during the backward);
//   pass 2, row-parallel over the transpose (sources): dk, dv from that scratch. Two passes
//   need no atomics and give results independent of the thread count.
// Entries whose pre-activation score is -inf (a -inf bias) are masked out of the softmax.
// Rows without (unmasked) entries give out = 0 and lse = -inf.
//
// Every pass is templated on a `Fixed<kMode, kH, kD, kDv>` policy: a value > 0 (>= 0 for the
// mode) fixes that size at compile time, 0 (-1) reads it from the Shape. The generic build
// (torch_ext/ops/attention.cpp) fixes only common q/k widths; the JIT
// (codegen/cpu_attention_spec.h) fixes all four. The summation order never depends on what is
// fixed, so JIT and generic results are bit-identical.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/common/types.h"
#include "kernels/cpu/attention_args.h"
#include "kernels/cpu/attention_backward.h"
#include "kernels/cpu/attention_scores.h"

#ifdef _OPENMP
#include <omp.h>
#endif

// (The pieces: attention_scores.h, the policy, scores, exp and vectors every pass shares;
// the forward below; attention_backward.h, the backward passes; run(), the entry, last.)
namespace sparsejit::attention {

// S: the storage of q, k, v and out (T, or bfloat16 with T = float: widened on load, the
// output rounded to nearest even once per element); bias, att and lse are T.
template <class K, typename T, typename I, typename S = T>
void forward(const Shape& shape, const I* rowptr, const I* col, const S* q, const S* k,
             const S* v, const T* bias, S* out, T* lse) {
  // A local copy: the stores of the score loop cannot alias it, so its fields stay in
  // registers instead of being reloaded per entry.
  const Shape s = shape;
  const int64_t H = K::heads(s), Dv = K::v_width(s);
  const T neg_inf = -std::numeric_limits<T>::infinity();
#pragma omp parallel num_threads(s.threads) if (s.rows * H > 256)
  {
    // m (the row's max per head), l (the sum of its weights) and the row's accumulator: on the
    // stack when small, so that with H and Dv fixed they can stay in registers.
    T m_st[kStackHeads], l_st[kStackHeads];
    alignas(64) T acc_st[kStackAcc];
    std::vector<T> heap(H > kStackHeads ? 2 * H : 0);
    T* m = H > kStackHeads ? heap.data() : m_st;
    T* l = H > kStackHeads ? heap.data() + H : l_st;
    const bool acc_on_stack = H * Dv <= kStackAcc;
    // A wide row accumulates in place in out when out holds T, else in a T buffer.
    constexpr bool same = std::is_same_v<S, T>;
    std::vector<T> acc_heap(!same && !acc_on_stack ? H * Dv : 0);
    std::vector<T> row;  // one row's [entries, H] scores, then its weights
    const int64_t nnz = rowptr[s.rows], Dk = K::qk_width(s);
#pragma omp for schedule(dynamic, 64)
    for (int64_t i = 0; i < s.rows; ++i) {
      T* acc;
      if constexpr (same)
        acc = acc_on_stack ? acc_st : out + i * H * Dv;
      else
        acc = acc_on_stack ? acc_st : acc_heap.data();
      std::fill(acc, acc + H * Dv, T(0));
      std::fill(m, m + H, neg_inf);
      std::fill(l, l + H, T(0));
      // Three passes over a per-thread buffer of the row's [entries, H] scores. An online
      // softmax (one pass, the accumulator rescaled when the max grows) put an exp and a
      // rescale check on every entry's critical path; here the exps are independent and
      // eight wide, and each pass gathers one tensor's rows (k, then v). Measured against
      // the online forward: GAT 1.31x, dot and GATv2 1.3-1.9x.
      const int64_t p0 = rowptr[i], len = rowptr[i + 1] - p0;
      if (static_cast<int64_t>(row.size()) < len * H) row.resize(len * H);
      T* __restrict w = row.data();
      // Pass 1: every entry's score and the row's max per head (a masked entry, score -inf,
      // stays out of the softmax; a NaN score does not move the max).
      bool done = false;
      if constexpr (kVectorScores<K, T, S> && kLaneWidth<K>) {
        if (scores_on_lanes<K>(s)) {
          // H fixed (the JIT): an entry's H scores as one H-lane vector, the same operations
          // per lane as the scalar loop below (score, bias, activation, the -inf mask).
          constexpr int64_t kH = K::heads_fixed, kD = K::qk_fixed;
          using VH = F32Lanes<kH>;
          VH mv = VH{} + neg_inf;
          const S* qi = q + i * kH * kD;
          for (int64_t t = 0; t < len; ++t) {
            const int64_t p = p0 + t;
            prefetch_ahead(k, col, p, nnz, kH * kD);
            VH z = entry_scores<K, S>(s, qi, k + col[p] * kH * kD);
            if (bias) {
              VH bv;
              std::memcpy(&bv, bias + p * kH, sizeof(bv));
              z = z + bv;
            }
            VH sc = z * activation_grad_lanes<K>(s, z);
            sc = z == neg_inf ? VH{} + neg_inf : sc;
            std::memcpy(w + t * kH, &sc, sizeof(sc));
            mv = sc > mv ? sc : mv;
          }
          for (int64_t h = 0; h < kH; ++h) m[h] = mv[h];
          done = true;
        }
      } else if constexpr (std::is_same_v<T, float>) {
        if (H <= 8) {  // the max on vector lanes (registers), one lane per head
          exp_f8 mv, scv;
          for (int u = 0; u < 8; ++u) mv[u] = neg_inf;
          for (int64_t t = 0; t < len; ++t) {
            const int64_t p = p0 + t, j = col[p];
            prefetch_ahead(k, col, p, nnz, H * Dk);
            for (int u = 0; u < 8; ++u) scv[u] = neg_inf;
            for (int64_t h = 0; h < H; ++h) {
              const T z = pre_score<K, T, S>(s, q, k, bias, i, j, p, h);
              const T sc = z == neg_inf ? neg_inf : activate<K>(s, z);
              w[t * H + h] = sc;
              scv[h] = sc;
            }
            mv = scv > mv ? scv : mv;
          }
          for (int64_t h = 0; h < H; ++h) m[h] = mv[h];
          done = true;
        }
      }
      for (int64_t t = 0; t < len && !done; ++t) {
        const int64_t p = p0 + t, j = col[p];
        prefetch_ahead(k, col, p, nnz, H * Dk);
        for (int64_t h = 0; h < H; ++h) {
          const T z = pre_score<K, T, S>(s, q, k, bias, i, j, p, h);
          const T sc = z == neg_inf ? neg_inf : activate<K>(s, z);
          w[t * H + h] = sc;
          m[h] = sc > m[h] ? sc : m[h];
        }
      }
      // Pass 2: the weights exp(score - max), eight at a time.
      row_weights(w, len * H, m, H);
      // Pass 3: the sums and the weighted rows of v, in entry order (with H and Dv fixed
      // and small, in registers: see kRegisterAcc).
      if constexpr (kRegisterAcc<K, T, S>) {
        constexpr int64_t kH = K::heads_fixed, kDv = K::v_fixed, kW = kAccWidth<kDv>;
        constexpr int64_t kN = kH * kDv / kW;  // vectors in the accumulator
        using VW = F32Lanes<kW>;
        VW a[kN];
        for (int64_t r = 0; r < kN; ++r) a[r] = VW{};
        T lr[kH] = {};
        for (int64_t t = 0; t < len; ++t) {
          const int64_t p = p0 + t;
          prefetch_ahead(v, col, p, nnz, kH * kDv);
          const S* vj = v + col[p] * kH * kDv;
#pragma GCC unroll 8
          for (int64_t h = 0; h < kH; ++h) {
            const T wt = w[t * kH + h];
            lr[h] += wt;
            const T wk = wt * keep_factor<T>(s, p, h);
            if (wk != T(0)) {
#pragma GCC unroll 64
              for (int64_t r = 0; r < kDv / kW; ++r) {
                VW x;
                x = load_lanes<VW, float>(vj + h * kDv + r * kW);
                a[h * (kDv / kW) + r] += wk * x;
              }
            }
          }
        }
        std::memcpy(acc, a, sizeof(a));
        std::memcpy(l, lr, sizeof(lr));
      } else {
        for (int64_t t = 0; t < len; ++t) {
          const int64_t p = p0 + t;
          prefetch_ahead(v, col, p, nnz, H * Dv);
          const S* vj = v + col[p] * H * Dv;
          for (int64_t h = 0; h < H; ++h) {
            const T wt = w[t * H + h];
            l[h] += wt;
            const T wk = wt * keep_factor<T>(s, p, h);
            if (wk != T(0)) {
              T* a = acc + h * Dv;
              for (int64_t d = 0; d < Dv; ++d) a[d] += wk * T(vj[h * Dv + d]);
            }
          }
        }
      }
      S* o = out + i * H * Dv;
      for (int64_t h = 0; h < H; ++h) {
        if (l[h] != T(0)) {  // > 0, or NaN from a NaN score: the NaN reaches out and lse
          const T inv = T(1) / l[h];
          for (int64_t d = 0; d < Dv; ++d) o[h * Dv + d] = S(acc[h * Dv + d] * inv);
          lse[i * H + h] = m[h] + std::log(l[h]);
        } else {
          for (int64_t d = 0; d < Dv; ++d) o[h * Dv + d] = S(T(0));
          lse[i * H + h] = neg_inf;
        }
      }
    }
  }
}
// Runs the launch's phase (the JIT's entry point and the generic path both come here). With
// S = bfloat16 (T = float) only the forward exists: q, k, v and out in bfloat16, bias, att and
// lse in float (the backward runs in float32 on converted tensors).
template <class K, typename T, typename I, typename S = T>
void run(AttentionLaunch& l) {
  const Shape& s = l.shape;
  auto ix = [](const void* p) { return static_cast<const I*>(p); };
  if constexpr (!std::is_same_v<S, T>) {
    static_assert(std::is_same_v<T, float> && std::is_same_v<S, sparsejit::bf16>,
                  "narrow storage is bfloat16 with float computation");
    if (l.phase == Phase::Forward)
      forward<K, T, I, S>(s, ix(l.rowptr), ix(l.col), static_cast<const S*>(l.q),
                          static_cast<const S*>(l.k), static_cast<const S*>(l.v),
                          static_cast<const T*>(l.bias), static_cast<S*>(l.out),
                          static_cast<T*>(l.lse_out));
    return;
  } else {
    auto c = [](const void* p) { return static_cast<const T*>(p); };
    auto w = [](void* p) { return static_cast<T*>(p); };
    switch (l.phase) {
      case Phase::Forward:
        forward<K, T, I>(s, ix(l.rowptr), ix(l.col), c(l.q), c(l.k), c(l.v), c(l.bias),
                         w(l.out), w(l.lse_out));
        return;
      case Phase::RowDelta:
        row_delta<K, T>(s, c(l.out), c(l.dout), w(l.delta_out));
        return;
      case Phase::BackwardRows:
        backward_rows<K, T, I>(s, ix(l.rowptr), ix(l.col), c(l.q), c(l.k), c(l.v), c(l.bias),
                               c(l.lse), c(l.delta), c(l.dout), w(l.dq), w(l.dbias), w(l.datt),
                               w(l.dz), w(l.pk));
        return;
      case Phase::BackwardCols:
        l.bad_perm = backward_cols<K, T, I>(s, ix(l.t_rowptr), ix(l.t_col), ix(l.t_perm), l.nnz,
                                            c(l.q), c(l.k), c(l.v), c(l.bias), c(l.lse),
                                            c(l.delta), c(l.dout), w(l.dk), w(l.dv), c(l.dz),
                                            c(l.pk));
        return;
    }
  }
}

}  // namespace sparsejit::attention
