// The row-tile loops of the gather-GEMM-scatter core shared by RGMS (csrc/rgms/rgms_forward.cpp)
// and the point-cloud convolution (csrc/point_conv/point_conv_run.cpp), the part that is bound
// by the rows it gathers rather than by arithmetic. Compiled once generic (run-time row width)
// and, by the JIT (codegen/cpu_row_tile_spec), with the row width as a compile-time constant,
// so a row's accumulators stay in registers and the inner loops unroll; csrc/rgms/row_tiles.h
// picks. Both instantiations do the same element-wise operations in the same order: their
// results are bit-identical (tested).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cpu/common/vec.h"
#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

namespace sparsejit::cpu {

// One tile of (relation, target) groups [g0, g1).
//   kind 0, gather-reduce: out[t, 0:width] = sum over group g0 + t's entries q of
//           coef_q * in[src[q] * ld_in + c0 + 0:width]                      (out row stride width)
//   kind 2, fused forward (one relation's groups, w = W[r] [width, width2] row-major):
//           out[grp_dst[g] * ld_out + 0:width2] += (sum_q coef_q * in[src[q] * ld_in + 0:width]) @ w
//   kind 4, fused grad W (aux = dY [*, width2]; out = dW[r] rows c0 .. c0 + width, row stride
//           width2): out[c, :] += sum_g (sum_q coef_q * in[src[q] * ld_in + c0 + c]) * aux[grp_dst[g], :]
//   kind 5, gather rows (the point-cloud convolution's gather; RGMS's sink rows): t in [g0, g1)
//           out[(t - g0) * width + 0:width] = scale_t * in[idx[t] * ld_in + c0 + 0:width]
//           (scale_t = scale[t], or a plain copy without scale)
//   kind 6, scatter-add rows:  out[idx[t] * ld_out + 0:width] += in[(t - g0) * width + 0:width]
//           (kinds 5-6: idx = idx32, or idx64 when idx32 is null)
//   kind 7, kind 0 with `in` in bfloat16 (float kernels only; widened exactly)
//   kind 8, kind 2 with `in` in bfloat16 and w = W[r] in bfloat16 pairs (float kernels only;
//           w: [ceil(width / 2), ld_w, 2], dense::pack_bf16_vnni's layout): each group's
//           reduced row (the float32 sums of kind 7) is rounded to bfloat16 (to nearest
//           even) and multiplied by W[r] in AVX512-BF16's order: per output column a float32
//           sum from zero over the pairs in order, the odd element's product added before the
//           even one's (a bfloat16 product is exact in float32); that sum is added into Y. One
//           vdpbf16ps per pair and 16 columns where the compiler targets that extension (the
//           JIT's -march=native on such a CPU), a scalar emulation elsewhere (the same bits
//           but for subnormals, which the instruction and its rounding read as zero): callers
//           take this kind only with a JIT instantiation on a CPU that has the extension.
// (Kinds 1 and 3, the scatter and the fused grad X of the column-split dX pass, are retired:
// dX runs the forward's kinds on the transposed structure.) Kinds 2 and 4 replace gather ->
// small GEMM -> scatter by one pass over the groups with the product done row by row while the
// row is in registers (no tile buffers, no GEMM call per tile): what wins for narrow rows
// (csrc/rgms/rgms_forward.cpp picks them up to 64 columns).
// coef_q = values[perm[q]] (1 without values), divided by the group's size when mean.
struct RowTileLaunch {
  int32_t kind = 0;
  int32_t mean = 0;
  const int64_t* grp_ptr = nullptr;
  const int64_t* src = nullptr;
  const int64_t* perm = nullptr;
  const void* values = nullptr;  // T, or null
  const void* in = nullptr;      // T
  void* out = nullptr;           // T
  int64_t ld_in = 0, ld_out = 0, c0 = 0, width = 0;
  int64_t g0 = 0, g1 = 0;
  int64_t prefetch_end = 0;  // entries before this may be prefetched (kind 0)
  // Kinds 2-4.
  const int64_t* grp_dst = nullptr;
  const void* w = nullptr;    // T
  const void* aux = nullptr;  // T
  int64_t width2 = 0, ld_w = 0;
  // Kinds 5-6.
  const int32_t* idx32 = nullptr;
  const int64_t* idx64 = nullptr;  // when idx32 is null
  const void* scale = nullptr;  // T, or null
};

namespace row_tile_detail {

// W > 0: the width at compile time; W == 0: l.width. S: how X is stored (T, or bf16 for
// kind 7, widened exactly: the sums are those of its float32 copy).
template <typename T, int W, typename S = T>
inline void gather_reduce(const RowTileLaunch& l) {
  const int64_t w = W > 0 ? W : l.width;
  const S* x = static_cast<const S*>(l.in);
  const T* values = static_cast<const T*>(l.values);
  T* out = static_cast<T*>(l.out);
  // Rows of X are gathered at random: ask for the row a few entries ahead (the loop is
  // bound by the latency of these loads, not by arithmetic).
  constexpr int64_t kAhead = 6;
  for (int64_t g = l.g0; g < l.g1; ++g) {
    T* o = out + (g - l.g0) * w;
    const int64_t p0 = l.grp_ptr[g], p1 = l.grp_ptr[g + 1];
    const T inv = l.mean ? T(1) / T(p1 - p0) : T(1);
    for (int64_t j = 0; j < w; ++j) o[j] = T(0);
    for (int64_t q = p0; q < p1; ++q) {
      if (q + kAhead < l.prefetch_end) __builtin_prefetch(x + l.src[q + kAhead] * l.ld_in + l.c0);
      const T c = (values ? values[l.perm[q]] : T(1)) * inv;
      const S* row = x + l.src[q] * l.ld_in + l.c0;
      for (int64_t j = 0; j < w; ++j) o[j] += c * T(row[j]);
    }
  }
}

// Rows as the target's native vectors (kernels/cpu/common/vec.h: AVX under the JIT's
// -march=native, SSE in the baseline build). Each lane does the same multiply and add as the
// scalar tail, so results do not depend on the vector width.
template <typename T>
struct Lanes {
  static constexpr int64_t n = detail::VecOf<T>::kLanes;
  typedef typename detail::VecOf<T>::type v;
  // The same vector at T's alignment, allowed to alias T (unaligned loads and stores).
  typedef detail::VecU<T, detail::kVecBytes> u;
};
template <typename T>
inline typename Lanes<T>::v vload(const T* p) {
  return *reinterpret_cast<const typename Lanes<T>::u*>(p);
}
template <typename T>
inline void vstore(T* p, typename Lanes<T>::v x) {
  *reinterpret_cast<typename Lanes<T>::u*>(p) = x;
}
template <typename T>
inline typename Lanes<T>::v vsplat(T a) {
  typename Lanes<T>::v r = {};
  return r + a;
}

// y[0:n] += a * x[0:n] (N > 0: n at compile time).
template <typename T, int N>
inline void axpy(T* y, T a, const T* x, int64_t n_rt) {
  const int64_t n = N > 0 ? N : n_rt;
  constexpr int64_t L = Lanes<T>::n;
  const typename Lanes<T>::v av = vsplat(a);
  int64_t j = 0;
  for (; j + L <= n; j += L) vstore(y + j, vload(y + j) + av * vload(x + j));
  for (; j < n; ++j) y[j] += a * x[j];
}

// Sum over group g's entries of coef_q * in[src[q] * ld_in + c0 + 0:w] into agg[0:w] (S: how
// X is stored; bfloat16 rows are widened exactly, element by element).
template <typename T, int W, typename S = T>
inline void reduce_group(const RowTileLaunch& l, const S* x, const T* values, int64_t w,
                         int64_t g, T* agg) {
  const int64_t p0 = l.grp_ptr[g], p1 = l.grp_ptr[g + 1];
  const T inv = l.mean ? T(1) / T(p1 - p0) : T(1);
  for (int64_t j = 0; j < w; ++j) agg[j] = T(0);
  constexpr int64_t kAhead = 6;
  for (int64_t q = p0; q < p1; ++q) {
    if (q + kAhead < l.prefetch_end) __builtin_prefetch(x + l.src[q + kAhead] * l.ld_in + l.c0);
    const T c = (values ? values[l.perm[q]] : T(1)) * inv;
    if constexpr (std::is_same_v<S, T>) {
      axpy<T, W>(agg, c, x + l.src[q] * l.ld_in + l.c0, w);
    } else {
      const S* row = x + l.src[q] * l.ld_in + l.c0;
      for (int64_t j = 0; j < w; ++j) agg[j] += c * T(row[j]);
    }
  }
}

// The widest row a fused kind keeps on the stack (csrc/rgms/rgms_forward.cpp uses them up to 64).
constexpr int64_t kFusedMaxWidth = 256;

// Whether a constant width is whole vectors, few enough to stay in registers.
template <typename T, int N>
constexpr bool in_registers() {
  return N > 0 && N % Lanes<T>::n == 0 && N / Lanes<T>::n <= 8;
}

// out_r[0:CB*L] = (zero ? 0 : out_r) + sum_{k < kdim} a_r[k] * b[k * ldb + 0:CB*L] for the
// rows r < RB: RB x CB vector accumulators stay in registers, each loaded row of b serves RB
// rows. Per element the additions run in k order, as in the generic axpy loops.
template <typename T, int RB, int CB>
inline void block_product(const T* const* a, int64_t kdim, const T* b, int64_t ldb,
                          T* const* out, bool zero) {
  constexpr int64_t L = Lanes<T>::n;
  typename Lanes<T>::v acc[RB][CB];
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < CB; ++c) acc[r][c] = zero ? vsplat(T(0)) : vload(out[r] + c * L);
  for (int64_t k = 0; k < kdim; ++k) {
    typename Lanes<T>::v bk[CB];
    for (int c = 0; c < CB; ++c) bk[c] = vload(b + k * ldb + c * L);
    for (int r = 0; r < RB; ++r) {
      const auto ar = vsplat(a[r][k]);
      for (int c = 0; c < CB; ++c) acc[r][c] += ar * bk[c];
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < CB; ++c) vstore(out[r] + c * L, acc[r][c]);
}

// Rows [a_r] times a [kdim, N] matrix (row stride ldb) into rows [out_r] from column `col`
// on, NV vectors (compile time): a block of up to 4 vectors, several rows at a time (up to
// 12 accumulators), one row at a time for the rest; then the next block.
template <typename T, int NV>
inline void rows_product(const T* const* a, int64_t rows, int64_t kdim, const T* b,
                         int64_t ldb, T* const* out, bool zero, int64_t col = 0) {
  if constexpr (NV > 0) {
    constexpr int CB = NV >= 4 ? 4 : NV;
    constexpr int RB = CB == 4 ? 2 : CB == 3 ? 3 : CB == 2 ? 5 : 8;  // accumulators + loaded b + broadcast within 16 vector registers
    const T* bc = b + col;
    int64_t r = 0;
    for (; r + RB <= rows; r += RB) {
      T* o[RB];
      for (int i = 0; i < RB; ++i) o[i] = out[r + i] + col;
      block_product<T, RB, CB>(a + r, kdim, bc, ldb, o, zero);
    }
    for (; r < rows; ++r) {
      T* o[1] = {out[r] + col};
      block_product<T, 1, CB>(a + r, kdim, bc, ldb, o, zero);
    }
    rows_product<T, NV - CB>(a, rows, kdim, b, ldb, out, zero, col + CB * Lanes<T>::n);
  }
}

// Groups handled together by the fused kinds (their reduced rows on the stack).
constexpr int64_t kFusedBlock = 24;

template <typename T, int W, int W2>
inline void fused_forward(const RowTileLaunch& l) {
  const int64_t w = W > 0 ? W : l.width, w2 = W2 > 0 ? W2 : l.width2;
  const T* x = static_cast<const T*>(l.in);
  const T* values = static_cast<const T*>(l.values);
  const T* wr = static_cast<const T*>(l.w);
  T* y = static_cast<T*>(l.out);
  constexpr bool kVec = W > 0 && in_registers<T, W2>();
  T agg[kVec ? kFusedBlock * W : kFusedMaxWidth];
  for (int64_t g0 = l.g0; g0 < l.g1; g0 += kVec ? kFusedBlock : 1) {
    if constexpr (kVec) {  // several groups' target rows against each loaded row of W[r]
      const int64_t n = std::min<int64_t>(kFusedBlock, l.g1 - g0);
      const T* a[kFusedBlock];
      T* o[kFusedBlock];
      for (int64_t t = 0; t < n; ++t) {
        reduce_group<T, W>(l, x, values, W, g0 + t, agg + t * W);
        a[t] = agg + t * W;
        o[t] = y + l.grp_dst[g0 + t] * l.ld_out;
      }
      rows_product<T, W2 / Lanes<T>::n>(a, n, W, wr, W2, o, false);
    } else {
      reduce_group<T, W>(l, x, values, w, g0, agg);
      T* yrow = y + l.grp_dst[g0] * l.ld_out;
      for (int64_t k = 0; k < w; ++k) axpy<T, W2>(yrow, agg[k], wr + k * w2, w2);
    }
  }
}

template <typename T, int W, int W2>
inline void fused_grad_w(const RowTileLaunch& l) {
  const int64_t w = W > 0 ? W : l.width, w2 = W2 > 0 ? W2 : l.width2;
  const T* x = static_cast<const T*>(l.in);
  const T* dy = static_cast<const T*>(l.aux);
  const T* values = static_cast<const T*>(l.values);
  T* dw = static_cast<T*>(l.out);
  // The launch's products accumulate in a private block (L1), then add into dW once: the
  // same order of additions in both instantiations.
  T acc_fixed[(W > 0 && W2 > 0) ? W * W2 : 1];
  std::vector<T> acc_dyn((W > 0 && W2 > 0) ? 0 : std::size_t(w * w2));
  T* acc = (W > 0 && W2 > 0) ? acc_fixed : acc_dyn.data();
  for (int64_t i = 0; i < w * w2; ++i) acc[i] = T(0);
  constexpr bool kVec = W > 0 && in_registers<T, W2>();
  constexpr int64_t kRows = 4;  // groups whose rank-1 updates share one load of acc
  T agg[kVec ? kRows * W : kFusedMaxWidth];
  for (int64_t g0 = l.g0; g0 < l.g1; g0 += kVec ? kRows : 1) {
    if constexpr (kVec) {
      constexpr int64_t L = Lanes<T>::n, NV = W2 / L;
      const int64_t n = std::min<int64_t>(kRows, l.g1 - g0);
      typename Lanes<T>::v dv[kRows][NV];
      for (int64_t t = 0; t < n; ++t) {
        reduce_group<T, W>(l, x, values, W, g0 + t, agg + t * W);
        const T* d = dy + l.grp_dst[g0 + t] * W2;
        for (int64_t i = 0; i < NV; ++i) dv[t][i] = vload(d + i * L);
      }
      for (int64_t c = 0; c < W; ++c) {
        T* o = acc + c * W2;
        for (int64_t i = 0; i < NV; ++i) {
          auto a = vload(o + i * L);
          for (int64_t t = 0; t < n; ++t) a += vsplat(agg[t * W + c]) * dv[t][i];
          vstore(o + i * L, a);
        }
      }
    } else {
      reduce_group<T, W>(l, x, values, w, g0, agg);
      const T* d = dy + l.grp_dst[g0] * w2;
      for (int64_t c = 0; c < w; ++c) axpy<T, W2>(acc + c * w2, agg[c], d, w2);
    }
  }
  for (int64_t i = 0; i < w * w2; ++i) dw[i] += acc[i];
}

// Kind 8's product for RB reduced rows (pairs a[r][0:P]) against w [P, ldw, 2] into the rows
// o[r][0:NV * 16]: RB x NV accumulators from zero, one vdpbf16ps per pair, row and vector,
// then added into Y.
#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
template <int RB, int NV, int P>
inline void bf16_pairs_block(const uint32_t* const* a, const bf16* w, int64_t ldw,
                             float* const* o) {
  __m512 acc[RB][NV];
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int p = 0; p < P; ++p) {
    __m512i wv[NV];
    for (int c = 0; c < NV; ++c) wv[c] = _mm512_loadu_si512(w + (p * ldw + c * 16) * 2);
    for (int r = 0; r < RB; ++r) {
      const __m512i ar = _mm512_set1_epi32(static_cast<int32_t>(a[r][p]));
      for (int c = 0; c < NV; ++c)
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], reinterpret_cast<const __m512bh&>(ar),
                                     reinterpret_cast<const __m512bh&>(wv[c]));
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < NV; ++c)
      _mm512_storeu_ps(o[r] + c * 16, _mm512_add_ps(_mm512_loadu_ps(o[r] + c * 16), acc[r][c]));
}
#endif

template <typename T, int W, int W2>
inline void fused_forward_bf16(const RowTileLaunch& l) {
  if constexpr (!std::is_same_v<T, float>) {
    return;  // float kernels only
  } else {
    const int64_t w = W > 0 ? W : l.width, w2 = W2 > 0 ? W2 : l.width2;
    const int64_t pairs = (w + 1) / 2, ldw = l.ld_w;
    constexpr int64_t kMaxPairs = (W > 0 ? W + 1 : kFusedMaxWidth) / 2;
    const bf16* x = static_cast<const bf16*>(l.in);
    const float* values = static_cast<const float*>(l.values);
    const bf16* wp = static_cast<const bf16*>(l.w);
    float* y = static_cast<float*>(l.out);
    float agg[W > 0 ? W : kFusedMaxWidth];
    uint32_t a2[kFusedBlock][kMaxPairs];  // the reduced rows in bfloat16, one pair a word
    for (int64_t g0 = l.g0; g0 < l.g1; g0 += kFusedBlock) {
      const int64_t n = std::min<int64_t>(kFusedBlock, l.g1 - g0);
      for (int64_t t = 0; t < n; ++t) {
        reduce_group<float, W, bf16>(l, x, values, w, g0 + t, agg);
#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
        if constexpr (W > 0 && W % 16 == 0) {
          for (int64_t j = 0; j < W; j += 16) {
            const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(agg + j));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(a2[t] + j / 2),
                                reinterpret_cast<const __m256i&>(h));
          }
          continue;
        }
#endif
        for (int64_t p = 0; p < pairs; ++p) {
          const uint32_t lo = bf16(agg[2 * p]).bits;
          const uint32_t hi = 2 * p + 1 < w ? bf16(agg[2 * p + 1]).bits : 0u;
          a2[t][p] = lo | (hi << 16);
        }
      }
#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
      if constexpr (W > 0 && W2 > 0 && W2 % 16 == 0 && W2 / 16 <= 4) {
        constexpr int NV = W2 / 16, P = (W + 1) / 2;
        constexpr int RB = NV == 1 ? 8 : NV == 2 ? 4 : 2;  // RB x NV accumulators
        const uint32_t* a[kFusedBlock];
        float* o[kFusedBlock];
        for (int64_t t = 0; t < n; ++t) {
          a[t] = a2[t];
          o[t] = y + l.grp_dst[g0 + t] * l.ld_out;
        }
        int64_t t = 0;
        for (; t + RB <= n; t += RB) bf16_pairs_block<RB, NV, P>(a + t, wp, ldw, o + t);
        for (; t < n; ++t) bf16_pairs_block<1, NV, P>(a + t, wp, ldw, o + t);
        continue;
      }
#endif
      for (int64_t t = 0; t < n; ++t) {
        float* yrow = y + l.grp_dst[g0 + t] * l.ld_out;
        for (int64_t j = 0; j < w2; ++j) {
          float acc = 0.f;
          for (int64_t p = 0; p < pairs; ++p) {
            const bf16* wq = wp + (p * ldw + j) * 2;
            bf16 odd, even;
            odd.bits = static_cast<uint16_t>(a2[t][p] >> 16);
            even.bits = static_cast<uint16_t>(a2[t][p] & 0xffffu);
            acc = acc + float(odd) * float(wq[1]);
            acc = acc + float(even) * float(wq[0]);
          }
          yrow[j] += acc;
        }
      }
    }
  }
}

// Row t's index for kinds 5-6.
inline int64_t row_index(const RowTileLaunch& l, int64_t t) {
  return l.idx32 != nullptr ? int64_t(l.idx32[t]) : l.idx64[t];
}

template <typename T, int W>
inline void gather_rows(const RowTileLaunch& l) {
  const int64_t w = W > 0 ? W : l.width;
  const T* x = static_cast<const T*>(l.in);
  const T* scale = static_cast<const T*>(l.scale);
  T* out = static_cast<T*>(l.out);
  for (int64_t t = l.g0; t < l.g1; ++t) {
    if (t + 6 < l.g1) __builtin_prefetch(x + row_index(l, t + 6) * l.ld_in + l.c0);
    const T* row = x + row_index(l, t) * l.ld_in + l.c0;
    T* o = out + (t - l.g0) * w;
    if (scale) {
      const T s = scale[t];
      for (int64_t j = 0; j < w; ++j) o[j] = s * row[j];
    } else {
      for (int64_t j = 0; j < w; ++j) o[j] = row[j];
    }
  }
}

template <typename T, int W>
inline void scatter_add_rows(const RowTileLaunch& l) {
  const int64_t w = W > 0 ? W : l.width;
  const T* in = static_cast<const T*>(l.in);
  T* y = static_cast<T*>(l.out);
  for (int64_t t = l.g0; t < l.g1; ++t) {
    if (t + 6 < l.g1) __builtin_prefetch(y + row_index(l, t + 6) * l.ld_out, 1);
    T* o = y + row_index(l, t) * l.ld_out;
    const T* row = in + (t - l.g0) * w;
    for (int64_t j = 0; j < w; ++j) o[j] += row[j];
  }
}

template <typename T, int W, int W2 = 0>
inline void run(const RowTileLaunch& l) {
  switch (l.kind) {
    case 0: gather_reduce<T, W>(l); break;
    case 7:  // kind 0 from bfloat16 rows (float only)
      if constexpr (std::is_same_v<T, float>) gather_reduce<T, W, bf16>(l);
      break;
    case 2: fused_forward<T, W, W2>(l); break;
    case 4: fused_grad_w<T, W, W2>(l); break;
    case 8: fused_forward_bf16<T, W, W2>(l); break;
    case 5: gather_rows<T, W>(l); break;
    default: scatter_add_rows<T, W>(l); break;
  }
}

}  // namespace row_tile_detail
}  // namespace sparsejit::cpu
