// The fused attention kernel's backward passes (kernels/cpu/attention_kernel.h describes the
// recipe): D = <dout, out> per row and head, pass 1 over the rows (dq, dbias, GATv2's datt,
// and the [nnz, H] dz / P scratch), pass 2 over the transpose (dk, dv). Standard library
// only: the JIT compiles it (embedded in the library as text).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/attention_scores.h"

namespace sparsejit::attention {

// Everything the backward needs about one entry (p = (i, j), head h): the derivative of the
// loss w.r.t. its pre-activation z, and its dropout-scaled probability (for dv).
template <class K, typename T>
inline void entry_grad(const Shape& s, const T* q, const T* k, const T* v, const T* bias,
                       const T* lse, const T* delta, const T* dout, int64_t i, int64_t j,
                       int64_t p, int64_t h, T* dz, T* pk) {
  const int64_t H = K::heads(s), Dv = K::v_width(s);
  const T z = pre_score<K>(s, q, k, bias, i, j, p, h);
  if (z == -std::numeric_limits<T>::infinity()) {  // masked: no weight, no gradient
    *dz = T(0);
    *pk = T(0);
    return;
  }
  const T prob = soft_exp(activate<K>(s, z) - lse[i * H + h]);
  const T keep = keep_factor<T>(s, p, h);
  T dp = 0;
  if (keep != T(0)) {
    const T* g = dout + (i * H + h) * Dv;
    const T* vj = v + (j * H + h) * Dv;
    dp = keep * lane_sum<K::v_fixed, T>(Dv, [&](int64_t d) { return g[d] * vj[d]; });
  }
  *dz = prob * (dp - delta[i * H + h]) * activation_grad<K>(s, z);
  *pk = prob * keep;
}

// delta[i, h] = <dout[i, h], out[i, h]>.
template <class K, typename T>
void row_delta(const Shape& s, const T* out, const T* dout, T* delta) {
  const int64_t n = s.rows * K::heads(s), Dv = K::v_width(s);
#pragma omp parallel for num_threads(s.threads) schedule(static) if (n * Dv > 32768)
  for (int64_t r = 0; r < n; ++r) {
    delta[r] = lane_sum<K::v_fixed, T>(
        Dv, [&](int64_t d) { return out[r * Dv + d] * dout[r * Dv + d]; });
  }
}

// d(score)/d(q[i]) (= d/d(k[j]) up to the scale) of entry (i, j), head h, times dz, added
// to g[0:D]; in GATv2 mode also dz * LeakyReLU(q + k) to datt[0:D] when datt is given.
// The gradient rows never alias the inputs (separate buffers): __restrict lets the
// compiler vectorize these loops (without it they ran as scalar load-add-store chains, ~55%
// of GATv2's backward).
template <class K, typename T>
inline void add_score_grad(const Shape& s, const T* __restrict other, const T* __restrict qi,
                           const T* __restrict kj, T dz, T* __restrict g,
                           T* __restrict datt, int64_t h) {
  const int64_t D = K::qk_width(s);
  const Mode mode = K::mode(s);
  if (mode == Mode::Dot) {
    const T c = dz * T(s.scale);
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) g[d] += c * other[d];
  } else if (mode == Mode::GATv2) {
    const T* a = static_cast<const T*>(s.att) + h * D;
    const T slope = T(s.negative_slope);
    if (g)
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) {
        const T u = qi[d] + kj[d];
        g[d] += dz * a[d] * leaky_grad<T>(u, slope);
      }
    if (datt)
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) datt[d] += dz * leaky_select<T>(qi[d] + kj[d], slope);
  } else {
    g[0] += dz;
  }
}

// Pass 1, over targets: dq [rows, H, D], dbias [nnz, H] and (GATv2) datt [H, D]; each may be
// null. datt is summed over every entry: one partial sum per block of kRowBlock rows (blocks
// are fixed, whatever the thread count or schedule), then the blocks in order, so datt is
// deterministic.
inline constexpr int64_t kRowBlock = 64;

// add_score_grad on one vector of lanes of head h: dz times d(score)/d(q) (= d/d(k) up to
// the scale) added to g when want_g, and in GATv2 mode dz * LeakyReLU(q + k) to da when
// want_da; `other` is k's lanes for dq, q's for dk. The same operations per lane, in the
// same order, as the scalar function. (References, not pointers: the sums stay registers.)
template <typename VD, typename T>
inline void score_grad_lanes(Mode mode, T dz, T scale, const T* other, const T* qi,
                             const T* kj, const T* att, const VD& slope, const VD& one, VD& g,
                             bool want_g, VD& da, bool want_da) {
  if (mode == Mode::Dot) {
    VD o;
    std::memcpy(&o, other, sizeof(o));
    g += (dz * scale) * o;
    return;
  }
  VD qv, kv;
  std::memcpy(&qv, qi, sizeof(qv));
  std::memcpy(&kv, kj, sizeof(kv));
  const VD u = qv + kv;
  if (want_g) {
    VD av;
    std::memcpy(&av, att, sizeof(av));
    const VD lg = (u >= T(0) ? one : VD{}) + slope * (u < T(0) ? one : VD{});  // leaky_grad
    g += dz * av * lg;
  }
  if (want_da) da += dz * (u * (u < T(0) ? slope : one));  // leaky_select
}

// Pass 1 with H fixed to 1, 2, 4 or 8 and the q/k width fixed (kLaneWidth), float: an
// entry's heads on vectors (score, weight through soft_exp_lanes, dp, dz), dq's row summed in
// registers (and in GATv2 mode with datt wanted, datt's block sum): per lane and element the
// same operations, in the same order, as entry_grad and add_score_grad. Per head and entry,
// a scalar exp with its branches and dq's add through memory had made this pass ~45% of a
// GAT layer's attention time.
template <class K, typename T, typename I>
void backward_rows_lanes(const Shape& s, const I* rowptr, const I* col, const T* q, const T* k,
                         const T* v, const T* bias, const T* lse, const T* delta,
                         const T* dout, T* dq, T* dbias, T* datt, T* dz_out, T* pk_out) {
  constexpr int64_t kH = K::heads_fixed, kD = K::qk_fixed;
  // dq's row and datt's block: one lane per head in additive mode (D = 1, in dqa), else
  // [H, D] as vectors of kWd lanes.
  constexpr int64_t kWd = kD == 1 ? 1 : kAccWidth<kD>, kRd = kD / kWd;
  constexpr int64_t kNd = kD == 1 ? 1 : kH * kRd;
  using VH = F32Lanes<kH>;
  using VI = I32Lanes<kH>;
  using VD = F32Lanes<kWd>;
  const Mode mode = K::mode(s);
  const int64_t Dv = K::v_width(s), nnz = rowptr[s.rows];
  const int64_t blocks = (s.rows + kRowBlock - 1) / kRowBlock;
  std::vector<T> datt_blocks(datt ? blocks * kH * kD : 0, T(0));
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const T scale = T(s.scale);
  const VH one = VH{} + T(1);
  const VD slope_d = VD{} + T(s.negative_slope), one_d = VD{} + T(1);
  const T* att = static_cast<const T*>(s.att);
  const bool drop = s.dropout > 0.0;
#pragma omp parallel for num_threads(s.threads) schedule(dynamic, 1) if (s.rows * kH > 256)
  for (int64_t b = 0; b < blocks; ++b) {
    VD da[kNd];
    for (int64_t r = 0; r < kNd; ++r) da[r] = VD{};
    for (int64_t i = b * kRowBlock; i < std::min(s.rows, (b + 1) * kRowBlock); ++i) {
      VD g[kNd];
      for (int64_t r = 0; r < kNd; ++r) g[r] = VD{};
      VH dqa = VH{}, lv, dl;
      std::memcpy(&lv, lse + i * kH, sizeof(lv));
      std::memcpy(&dl, delta + i * kH, sizeof(dl));
      const T* qi = q + i * kH * kD;
      const T* gi = dout + i * kH * Dv;
      for (int64_t p = rowptr[i]; p < rowptr[i + 1]; ++p) {
        const int64_t j = col[p];
        prefetch_ahead(k, col, p, nnz, kH * kD, v, kH * Dv);
        const T* kj = k + j * kH * kD;
        VH z = entry_scores<K, T>(s, qi, kj);
        if (bias) {
          VH bv;
          std::memcpy(&bv, bias + p * kH, sizeof(bv));
          z = z + bv;
        }
        const VI masked = z == neg_inf;
        const VH ag = activation_grad_lanes<K>(s, z);
        VH prob;
        soft_exp_lanes<VH, VI>(z * ag - lv, prob);  // activate: z * ag
        VH keep = one, dp;
        if (drop)
          for (int64_t h = 0; h < kH; ++h) keep[h] = keep_factor<T>(s, p, h);
        const T* vj = v + j * kH * Dv;
        if constexpr (K::v_fixed > 0 && K::v_fixed % 8 == 0) {
          dp = keep * head_dots<kH, K::v_fixed>(gi, vj);
          dp = keep != T(0) ? dp : VH{};
        } else {
          for (int64_t h = 0; h < kH; ++h)
            dp[h] = keep[h] != T(0) ? keep[h] * lane_sum<K::v_fixed, T>(Dv, [&](int64_t d) {
              return gi[h * Dv + d] * vj[h * Dv + d];
            })
                                    : T(0);
        }
        VH dz = prob * (dp - dl) * ag;
        VH pk = prob * keep;
        dz = masked != 0 ? VH{} : dz;
        pk = masked != 0 ? VH{} : pk;
        if (dbias) std::memcpy(dbias + p * kH, &dz, sizeof(dz));
        if (dz_out) {
          std::memcpy(dz_out + p * kH, &dz, sizeof(dz));
          std::memcpy(pk_out + p * kH, &pk, sizeof(pk));
        }
        if constexpr (kD == 1) {
          dqa += dz;  // additive: d(score)/d(q) = 1
        } else {
          if (!dq && !datt) continue;
#pragma GCC unroll 8
          for (int64_t h = 0; h < kH; ++h)
#pragma GCC unroll 16
            for (int64_t r = 0; r < kRd; ++r) {
              const int64_t o = h * kD + r * kWd;
              score_grad_lanes(mode, dz[h], scale, kj + o, qi + o, kj + o, att + o, slope_d,
                               one_d, g[h * kRd + r], dq != nullptr, da[h * kRd + r],
                               datt != nullptr);
            }
        }
      }
      if (dq) {
        if constexpr (kD == 1)
          std::memcpy(dq + i * kH, &dqa, sizeof(dqa));
        else
          std::memcpy(dq + i * kH * kD, g, sizeof(g));
      }
    }
    if (datt && kD > 1) std::memcpy(datt_blocks.data() + b * kH * kD, da, sizeof(da));
  }
  if (datt) {
    std::fill(datt, datt + kH * kD, T(0));
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t t = 0; t < kH * kD; ++t) datt[t] += datt_blocks[b * kH * kD + t];
  }
}

template <class K, typename T, typename I>
void backward_rows(const Shape& s, const I* rowptr, const I* col, const T* q, const T* k,
                   const T* v, const T* bias, const T* lse, const T* delta, const T* dout,
                   T* dq, T* dbias, T* datt, T* dz_out = nullptr, T* pk_out = nullptr) {
  const int64_t H = K::heads(s), D = K::qk_width(s);
  const Mode mode = K::mode(s);
  if constexpr (kVectorScores<K, T, T> && kLaneWidth<K>) {
    // dq's row in registers (with datt in GATv2 mode, datt's block sum too): it must fit.
    const int64_t sums = (mode == Mode::GATv2 && datt ? 2 : 1) * K::heads_fixed * K::qk_fixed;
    if (scores_on_lanes<K>(s) && sums <= kRegisterFloats) {
      backward_rows_lanes<K, T, I>(s, rowptr, col, q, k, v, bias, lse, delta, dout, dq, dbias,
                                   datt, dz_out, pk_out);
      return;
    }
  }
  const int64_t blocks = (s.rows + kRowBlock - 1) / kRowBlock;
  std::vector<T> datt_blocks(datt ? blocks * H * D : 0, T(0));
  const int64_t nnz = rowptr[s.rows], Dv = K::v_width(s);
#pragma omp parallel for num_threads(s.threads) schedule(dynamic, 1) if (s.rows * H > 256)
  for (int64_t b = 0; b < blocks; ++b) {
    T* dal = datt ? datt_blocks.data() + b * H * D : nullptr;
    for (int64_t i = b * kRowBlock; i < std::min(s.rows, (b + 1) * kRowBlock); ++i) {
      T* dqi = dq ? dq + i * H * D : nullptr;
      if (dqi) std::fill(dqi, dqi + H * D, T(0));
      for (int64_t p = rowptr[i]; p < rowptr[i + 1]; ++p) {
        const int64_t j = col[p];
        prefetch_ahead(k, col, p, nnz, H * D, v, H * Dv);
        for (int64_t h = 0; h < H; ++h) {
          T dz, pk;
          entry_grad<K>(s, q, k, v, bias, lse, delta, dout, i, j, p, h, &dz, &pk);
          if (dbias) dbias[p * H + h] = dz;
          if (dz_out) {
            dz_out[p * H + h] = dz;
            pk_out[p * H + h] = pk;
          }
          if (!dqi && !dal) continue;
          if (mode == Mode::Additive) {
            dqi[h] += dz;
            continue;
          }
          const T* qi = q + (i * H + h) * D;
          const T* kj = k + (j * H + h) * D;
          add_score_grad<K>(s, kj, qi, kj, dz, dqi ? dqi + h * D : nullptr,
                            dal ? dal + h * D : nullptr, h);
        }
      }
    }
  }
  if (datt) {
    std::fill(datt, datt + H * D, T(0));
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t t = 0; t < H * D; ++t) datt[t] += datt_blocks[b * H * D + t];
  }
}

// Pass 2, over sources through the transpose (t_rowptr over sources, t_col = target of each
// transposed entry, t_perm = its position in the forward CSR): dk and dv (either may be null).
// With dz_in / pk_in (written by backward_rows) each entry's dz and probability are read,
// not recomputed. Returns true when t_perm held a position outside [0, nnz) (those entries
// are skipped).
// Pass 2's prefetch: the rows (dout's, and q's when given) and the scratch (dz_in, pk_in:
// when given) of the transposed entry kPrefetchAhead positions after t; indices out of
// range are left alone (the pass reports them).
template <typename T, typename I>
inline void prefetch_transposed(int64_t t, int64_t nnz, const I* t_col, const I* t_perm,
                                int64_t rows, const T* dout, int64_t dout_row, const T* q,
                                int64_t q_row, const T* dz_in, const T* pk_in, int64_t H) {
  if (t + kPrefetchAhead >= nnz) return;
  const int64_t in = t_col[t + kPrefetchAhead], pn = t_perm[t + kPrefetchAhead];
  if (in >= 0 && in < rows) {
    prefetch_span(dout + in * dout_row, dout_row);
    if (q) prefetch_span(q + in * q_row, q_row);
  }
  if (dz_in && pn >= 0 && pn < nnz) {
    prefetch_line(dz_in + pn * H);
    prefetch_line(pk_in + pn * H);
  }
}

// Pass 2 from pass 1's scratch with H and Dv fixed (and in dot and GATv2 mode D) and the
// source's dv [H, Dv] and dk (additive: [H]; else [H, D]) in registers, in entry order as
// below, instead of through memory where every entry waited on the previous one's store.
template <class K, typename T, typename I>
inline constexpr bool kVectorCols =
    kVectorScores<K, T, T> && kRegisterAcc<K, T, T> && kLaneWidth<K> &&
    (K::qk_fixed == 1 || K::heads_fixed * (K::qk_fixed + K::v_fixed) <= kRegisterFloats);

template <class K, typename T, typename I>
bool backward_cols_vector(const Shape& s, const I* t_rowptr, const I* t_col, const I* t_perm,
                          int64_t nnz, const T* q, const T* k, const T* dout, T* dk, T* dv,
                          const T* dz_in, const T* pk_in) {
  constexpr int64_t kH = K::heads_fixed, kDv = K::v_fixed, kW = kAccWidth<kDv>;
  constexpr int64_t kN = kH * kDv / kW;
  // dk's rows: one lane per head in additive mode (D = 1), else D per head.
  constexpr int64_t kD = K::qk_fixed, kWd = kD == 1 ? 1 : kAccWidth<kD>, kRd = kD / kWd;
  constexpr int64_t kNd = kD == 1 ? 1 : kH * kRd;
  using VH = F32Lanes<kH>;
  using VW = F32Lanes<kW>;
  using VD = F32Lanes<kWd>;
  const Mode mode = K::mode(s);
  const T scale = T(s.scale);
  const VD slope_d = VD{} + T(s.negative_slope), one_d = VD{} + T(1);
  const T* att = static_cast<const T*>(s.att);
  bool bad = false;
#pragma omp parallel for num_threads(s.threads) schedule(dynamic, 64) if (s.cols * kH > 256) \
    reduction(|| : bad)
  for (int64_t j = 0; j < s.cols; ++j) {
    VW a[kN];
    for (int64_t r = 0; r < kN; ++r) a[r] = VW{};
    VD dkr[kNd];
    for (int64_t r = 0; r < kNd; ++r) dkr[r] = VD{};
    VH dka = VH{};
    const T* kj = k + j * kH * kD;
    for (int64_t t = t_rowptr[j]; t < t_rowptr[j + 1]; ++t) {
      const int64_t i = t_col[t], p = t_perm[t];
      prefetch_transposed(t, nnz, t_col, t_perm, s.rows, dout, kH * kDv, dk ? q : nullptr,
                          kH * kD, dz_in, pk_in, kH);
      if (p < 0 || p >= nnz) {
        bad = true;
        continue;
      }
      VH dz, pk;
      std::memcpy(&dz, dz_in + p * kH, sizeof(dz));
      std::memcpy(&pk, pk_in + p * kH, sizeof(pk));
      if (dv) {
        const T* g = dout + i * kH * kDv;
#pragma GCC unroll 8
        for (int64_t h = 0; h < kH; ++h) {
          if (pk[h] == T(0)) continue;
#pragma GCC unroll 64
          for (int64_t r = 0; r < kDv / kW; ++r) {
            VW x;
            std::memcpy(&x, g + h * kDv + r * kW, sizeof(x));
            a[h * (kDv / kW) + r] += pk[h] * x;
          }
        }
      }
      if (!dk) continue;
      if constexpr (kD == 1) {
        dka += dz;
      } else {
        const T* qi = q + i * kH * kD;
#pragma GCC unroll 8
        for (int64_t h = 0; h < kH; ++h)
#pragma GCC unroll 16
          for (int64_t r = 0; r < kRd; ++r) {
            const int64_t o = h * kD + r * kWd;
            VD unused;
            score_grad_lanes(mode, dz[h], scale, qi + o, qi + o, kj + o, att + o, slope_d, one_d,
                             dkr[h * kRd + r], true, unused, false);
          }
      }
    }
    if (dv) std::memcpy(dv + j * kH * kDv, a, sizeof(a));
    if (dk) {
      if constexpr (kD == 1)
        std::memcpy(dk + j * kH, &dka, sizeof(dka));
      else
        std::memcpy(dk + j * kH * kD, dkr, sizeof(dkr));
    }
  }
  return bad;
}

template <class K, typename T, typename I>
bool backward_cols(const Shape& s, const I* t_rowptr, const I* t_col, const I* t_perm,
                   int64_t nnz, const T* q, const T* k, const T* v, const T* bias, const T* lse,
                   const T* delta, const T* dout, T* dk, T* dv, const T* dz_in = nullptr,
                   const T* pk_in = nullptr) {
  const int64_t H = K::heads(s), D = K::qk_width(s), Dv = K::v_width(s);
  const Mode mode = K::mode(s);
  if constexpr (kVectorCols<K, T, I>) {
    if (dz_in && scores_on_lanes<K>(s))
      return backward_cols_vector<K, T, I>(s, t_rowptr, t_col, t_perm, nnz, q, k, dout, dk, dv,
                                           dz_in, pk_in);
  }
  bool bad = false;
#pragma omp parallel for num_threads(s.threads) schedule(dynamic, 64) if (s.cols * H > 256) \
    reduction(|| : bad)
  for (int64_t j = 0; j < s.cols; ++j) {
    T* dkj = dk ? dk + j * H * D : nullptr;
    T* dvj = dv ? dv + j * H * Dv : nullptr;
    if (dkj) std::fill(dkj, dkj + H * D, T(0));
    if (dvj) std::fill(dvj, dvj + H * Dv, T(0));
    for (int64_t t = t_rowptr[j]; t < t_rowptr[j + 1]; ++t) {
      const int64_t i = t_col[t], p = t_perm[t];
      prefetch_transposed(t, nnz, t_col, t_perm, s.rows, dout, H * Dv, dk ? q : nullptr, H * D,
                          dz_in, pk_in, H);
      if (p < 0 || p >= nnz) {
        bad = true;
        continue;
      }
      for (int64_t h = 0; h < H; ++h) {
        T dz, pk;
        if (dz_in) {
          dz = dz_in[p * H + h];
          pk = pk_in[p * H + h];
        } else {
          entry_grad<K>(s, q, k, v, bias, lse, delta, dout, i, j, p, h, &dz, &pk);
        }
        if (dvj && pk != T(0)) {
          const T* __restrict g = dout + (i * H + h) * Dv;
          T* __restrict dvh = dvj + h * Dv;
#pragma omp simd
          for (int64_t d = 0; d < Dv; ++d) dvh[d] += pk * g[d];
        }
        if (!dkj) continue;
        if (mode == Mode::Additive) {
          dkj[h] += dz;
          continue;
        }
        const T* qi = q + (i * H + h) * D;
        const T* kj = k + (j * H + h) * D;
        add_score_grad<K>(s, qi, qi, kj, dz, dkj + h * D, static_cast<T*>(nullptr), h);
      }
    }
  }
  return bad;
}

}  // namespace sparsejit::attention
