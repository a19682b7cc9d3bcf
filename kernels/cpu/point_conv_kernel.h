// The output-stationary dataflow of the gather-GEMM-scatter core (csrc/point_conv): for a tile of
// output rows, every pair of each row (all kernel offsets) is accumulated while the row sits
// in vector registers, then the row is stored once (bias first, ReLU last). No [M, C]
// buffers, no scatter conflicts, a fixed order of additions.
//
// One template, instantiated two ways with the same operations in the same order (so the
// results are bit-identical; tested):
//   - by the JIT (codegen/cpu_point_conv_spec), with C_in and C_out as constants: the channel loop
//     unrolls into straight-line code per pair; also with bfloat16 features and output
//     (float weights, float accumulation: the same bits as the float32 rows run on the
//     widened features, then rounded; with bfloat16 weights and AVX512-BF16, two channels
//     per vdpbf16ps, still the same bits);
//   - ahead of time in csrc/point_conv/register_blocked.cpp for C_out = 16, 32, 64, 128 (C_in at run
//     time), for when the JIT is off or the pass is too small to pay for a compile.
// The row is cut into column blocks of at most 8 vectors (so a block's accumulators and the
// operands fit the 16 vector registers), and narrow blocks keep several accumulator sets
// (channel c feeds set c mod S) so that enough independent additions are in flight. When the
// caller asks (MaxRows: the weights outgrow L1) and the registers hold several rows'
// accumulators (AVX-512: 4 rows), rows are taken together and a kernel offset several of
// them use is applied to all from one load of its W rows (block_rows). Each row's additions
// keep their order, so the bits do not change.
// Standard library and kernels/ headers only: the JIT compiles this file with nothing else on
// the include path.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/common/vec.h"
// vdpbf16ps through inline assembly rather than <immintrin.h>, whose parsing alone would add
// a third of a second to every JIT compile of these rows.
#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__) && defined(__x86_64__)
#define SPARSEJIT_OS_BF16_PAIRS 1
#endif

namespace sparsejit::cpu {

struct ConvOsLaunch {
  const int64_t* row_ptr = nullptr;     // [num_out + 1] pairs of each out row
  const int32_t* row_pair = nullptr;    // [M] pair ids, by out row
  const int32_t* pair_group = nullptr;  // [M] kernel offset (weight) of each pair
  const int32_t* in_idx = nullptr;      // [M] in row of each pair
  const void* x = nullptr;              // S [num_in, c_in] (S: T, or bfloat16 bits)
  const void* w = nullptr;              // T [G, c_in, c_out]
  const void* bias = nullptr;           // T [c_out], or null
  const void* scale = nullptr;          // T [M] per-pair factor, or null (always null for the
                                        // JIT's rows, which do not read it)
  void* y = nullptr;                    // S [num_out, c_out]
  // bfloat16 storage only, optional: W as bfloat16 channel pairs [G, c_in / 2, c_out, 2]
  // (pair k: channel 2k + 1 in the even half, 2k in the odd one), given when `w` holds
  // bfloat16 values exactly. With AVX512-BF16 and no `scale` the rows then multiply pairs
  // with vdpbf16ps (same bits).
  const uint16_t* w_pairs = nullptr;
  int64_t c_in = 0, c_out = 0;
  int64_t r0 = 0, r1 = 0;  // the out rows of this call
  int32_t accumulate = 0;  // 1: y += ..., 0: y = bias + ...
  int32_t relu = 0;        // y = max(y, 0) on each finished row (not with accumulate)
};

namespace point_conv_detail {

// Accumulator sets for a block of NB vectors: about 8 independent vectors in flight.
template <int NB>
inline constexpr int kSets = NB >= 8 ? 1 : NB >= 4 ? 2 : 4;

// Storage of X and Y: T itself, or bfloat16 (uint16_t bits) with T = float: widened exactly
// on load, rounded to nearest even on store as PyTorch rounds (NaN -> 0x7fc0, c10's scalar
// rounding; its vectorized casts give 0xffff).
template <typename T, typename S>
inline T widen(S v) {
  if constexpr (sizeof(S) == sizeof(T)) {
    return v;
  } else {
    const uint32_t u = static_cast<uint32_t>(v) << 16;
    T f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
  }
}

template <typename V, typename S>
inline V load_row(const S* p) {
  V v;
  if constexpr (sizeof(S) == 2) {  // bfloat16: halves -> floats
    typedef detail::Vec<uint16_t, sizeof(V) / 2> H;
    typedef detail::Vec<uint32_t, sizeof(V)> U;
    H h;
    std::memcpy(&h, p, sizeof(h));
    const U u = __builtin_convertvector(h, U) << 16;
    std::memcpy(&v, &u, sizeof(v));
  } else {
    std::memcpy(&v, p, sizeof(v));
  }
  return v;
}

template <typename V, typename S>
inline void store_row(S* p, V v) {
  if constexpr (sizeof(S) == 2) {  // floats -> halves
    typedef detail::Vec<uint16_t, sizeof(V) / 2> H;
    typedef detail::Vec<uint32_t, sizeof(V)> U;
    typedef detail::Vec<int32_t, sizeof(V)> I;
    U u;
    std::memcpy(&u, &v, sizeof(u));
    const U rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const I is_nan = (u & 0x7fffffffu) > 0x7f800000u;
    const U bits = is_nan ? U{} + 0x7fc0u : rounded;
    const H h = __builtin_convertvector(bits, H);
    std::memcpy(p, &h, sizeof(h));
  } else {
    std::memcpy(p, &v, sizeof(v));
  }
}

// Vector registers of the target: 32 with AVX-512 (ymm16-31 through AVX512VL), 16 with AVX;
// without AVX a 32-byte vector takes two of the 16 SSE registers.
inline constexpr int kVecRegisters =
    detail::kVecBytes == 64 ? 32 : detail::kVecBytes == 32 ? 16 : 8;

// A column block of NB 32-byte vectors (NB counts 32-byte vectors whatever the registers):
// rows taken together (R > 1) with AVX-512 hold it as NB / 2 64-byte registers when NB is
// even. Lane-wise arithmetic, so the values do not depend on the choice.
template <int NB, int R>
inline constexpr int kBlockBytes = R > 1 && kVecRegisters == 32 && NB % 2 == 0 ? 64 : 32;

// Out rows taken together (block_rows): up to MaxRows (1 or 4), as many as the registers
// hold with the rows' accumulators, their broadcasts and one W vector. 4 on AVX-512; on AVX
// 1, or 2 for one-vector blocks.
template <int NB, int MaxRows>
inline constexpr int kRowsTogether = [] {
  for (int r = MaxRows; r > 1; r /= 2)
    if (r * kSets<NB> * NB * 32 / kBlockBytes<NB, 2> + r + 1 <= kVecRegisters) return r;
  return 1;
}();

// A row's column block starts as y (accumulate), the bias, or 0 in set 0, 0 in the others.
template <typename T, int NV, int NS, typename V, typename S>
inline __attribute__((always_inline)) void init_block(const ConvOsLaunch& l, const S* yr,
                                                      int v0, V (&acc)[NS][NV]) {
  constexpr int L = static_cast<int>(sizeof(V) / sizeof(T)), L32 = 32 / static_cast<int>(sizeof(T));
  const T* bias = static_cast<const T*>(l.bias);
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    if (l.accumulate)
      acc[0][v] = load_row<V>(yr + v * L);
    else if (bias != nullptr)
      std::memcpy(&acc[0][v], bias + v0 * L32 + v * L, sizeof(V));
    else
      acc[0][v] = V{};
#pragma GCC unroll 4
    for (int s = 1; s < NS; ++s) acc[s][v] = V{};
  }
}

// Sums the sets into set 0, applies the ReLU and stores the row's block.
template <typename T, int NV, int NS, typename V, typename S>
inline __attribute__((always_inline)) void finish_block(const ConvOsLaunch& l, S* yr,
                                                        V (&acc)[NS][NV]) {
  constexpr int L = static_cast<int>(sizeof(V) / sizeof(T));
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
#pragma GCC unroll 4
    for (int s = 1; s < NS; ++s) acc[0][v] += acc[s][v];
    if (l.relu) acc[0][v] = acc[0][v] > V{} ? acc[0][v] : V{};
    store_row(yr + v * L, acc[0][v]);
  }
}

// Channel c's contribution to the rows i in MASK: acc[i][s] += sc[i] * x[i][c] * W row c
// (kScaled false: no per-pair scale, sc all 1: x[i][c] itself, the same value).
template <typename T, int NV, int NS, int R, int MASK, bool kScaled, typename V, typename S>
inline __attribute__((always_inline)) void add_channel(V (&acc)[R][NS][NV],
                                                       const S* const (&x)[R],
                                                       const T (&sc)[R], const T* __restrict wg,
                                                       int64_t c, int s, int64_t co) {
  constexpr int L = static_cast<int>(sizeof(V) / sizeof(T));
  T xv[R];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
    if ((MASK >> i) & 1) xv[i] = kScaled ? sc[i] * widen<T>(x[i][c]) : widen<T>(x[i][c]);
  const T* wr = wg + c * co;
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    V wv;
    std::memcpy(&wv, wr + v * L, sizeof(V));
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i)
      if ((MASK >> i) & 1) acc[i][s][v] += xv[i] * wv;
  }
}

#ifdef SPARSEJIT_OS_BF16_PAIRS
// Channel pair k (channels 2k, 2k + 1) of bfloat16 rows with bfloat16 weights: one vdpbf16ps
// per W vector. Per float lane the instruction adds the product of its odd halves, then of its
// even halves (each product exact in float32, each add rounded to nearest even); with the X
// word's halves swapped and W packed swapped (ConvOsLaunch::w_pairs) that is add_channel for
// 2k, then 2k + 1, except that subnormal inputs and results are taken as zero. `wp` is W[g]'s
// pairs at the block's columns: [c_in / 2, c_out, 2].
template <int NV, int NS, int R, int MASK, typename V>
inline __attribute__((always_inline)) void add_pair_bf16(V (&acc)[R][NS][NV],
                                                         const uint16_t* const (&x)[R],
                                                         const uint16_t* __restrict wp, int64_t k,
                                                         int s, int64_t co) {
  constexpr int L = static_cast<int>(sizeof(V) / sizeof(float));
  typedef detail::Vec<uint32_t, sizeof(V)> U;
  U xb[R];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    if ((MASK >> i) & 1) {
      uint32_t word;
      std::memcpy(&word, x[i] + 2 * k, sizeof(word));
      xb[i] = U{} + ((word >> 16) | (word << 16));
    }
  }
  const uint16_t* wr = wp + k * co * 2;
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    U wv;
    std::memcpy(&wv, wr + v * L * 2, sizeof(U));
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      if ((MASK >> i) & 1)  // acc += pairs of xb . wv (ymm or zmm by the operands' size)
        asm("vdpbf16ps %2, %1, %0" : "+v"(acc[i][s][v]) : "v"(xb[i]), "v"(wv));
    }
  }
}
#endif

// For the rows i in MASK: acc[i] += sc[i] * x[i] @ wg (wg at the block's columns). Channels
// in increasing order, in pairs (2k, 2k + 1): pair k goes to set k mod NS (so that bfloat16
// rows with bfloat16 weights, `wp`, can take a pair in one vdpbf16ps where the target has it,
// with the same bits), an odd last channel alone to the next set. Each W vector is loaded
// once for all the rows; per row these are the same operations in the same order whatever
// MASK is.
template <typename T, int CI, int NV, int NS, int R, int MASK, bool kScaled, typename V,
          typename S>
inline __attribute__((always_inline)) void add_rows(V (&acc)[R][NS][NV],
                                                    const S* const (&x)[R],
                                                    const T (&sc)[R], const T* __restrict wg,
                                                    const uint16_t* __restrict wp, int64_t ci,
                                                    int64_t co) {
#ifdef SPARSEJIT_OS_BF16_PAIRS
  if constexpr (sizeof(S) == 2) {
    if (wp != nullptr) {  // (the JIT's rows: no per-pair scale)
      int64_t k = 0;
      const int64_t pairs = ci / 2;
      for (; k + NS <= pairs; k += NS) {
#pragma GCC unroll 4
        for (int s = 0; s < NS; ++s) add_pair_bf16<NV, NS, R, MASK>(acc, x, wp, k + s, s, co);
      }
      // the rest (fewer than NS pairs) to sets 0, 1, ..., an odd last channel alone to the next
#pragma GCC unroll 4
      for (int s = 0; s < NS; ++s) {
        if (k < pairs) {
          add_pair_bf16<NV, NS, R, MASK>(acc, x, wp, k++, s, co);
        } else {
          if (ci % 2 != 0) add_channel<T, NV, NS, R, MASK, kScaled>(acc, x, sc, wg, ci - 1, s, co);
          break;
        }
      }
      return;
    }
  }
#endif
  (void)wp;
  int64_t c = 0;
  for (; c + 2 * NS <= ci; c += 2 * NS) {
#pragma GCC unroll 4
    for (int s = 0; s < NS; ++s) {
      add_channel<T, NV, NS, R, MASK, kScaled>(acc, x, sc, wg, c + 2 * s, s, co);
      add_channel<T, NV, NS, R, MASK, kScaled>(acc, x, sc, wg, c + 2 * s + 1, s, co);
    }
  }
  // the rest (fewer than 2 NS channels): pairs to sets 0, 1, ..., an odd last channel alone to
  // the next (each set a constant of its unrolled copy, so the accumulators stay in registers)
#pragma GCC unroll 4
  for (int s = 0; s < NS; ++s) {
    if (c + 2 <= ci) {
      add_channel<T, NV, NS, R, MASK, kScaled>(acc, x, sc, wg, c, s, co);
      add_channel<T, NV, NS, R, MASK, kScaled>(acc, x, sc, wg, c + 1, s, co);
      c += 2;
    } else {
      if (c < ci) add_channel<T, NV, NS, R, MASK, kScaled>(acc, x, sc, wg, c, s, co);
      break;
    }
  }
}

// add_rows for the MASK known only at run time (1 .. 2^R - 1): a chain of tests from all R
// rows down (every row of a submanifold convolution has the centre offset), each arm inlined
// so that the accumulators stay in registers.
template <typename T, int CI, int NV, int NS, int R, bool kScaled, int M = (1 << R) - 1,
          typename V, typename S>
inline __attribute__((always_inline)) void add_rows_masked(int mask, V (&acc)[R][NS][NV],
                                                           const S* const (&x)[R],
                                                           const T (&sc)[R], const T* wg,
                                                           const uint16_t* wp, int64_t ci,
                                                           int64_t co) {
  if constexpr (M >= 1) {
    if (mask == M)
      add_rows<T, CI, NV, NS, R, M, kScaled>(acc, x, sc, wg, wp, ci, co);
    else
      add_rows_masked<T, CI, NV, NS, R, kScaled, M - 1>(mask, acc, x, sc, wg, wp, ci, co);
  }
}

// The X row of pair q's in row, asked for early (rows are gathered at random): every line
// of it, from the first column block only.
template <typename S>
inline __attribute__((always_inline)) void prefetch_x(const ConvOsLaunch& l, const S* x,
                                                      int64_t ci, int64_t q) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(S));
  const S* nx = x + static_cast<int64_t>(l.in_idx[l.row_pair[q]]) * ci;
  for (int64_t c = 0; c < ci; c += kLine) __builtin_prefetch(nx + c);
}

// Columns [v0 * L32, (v0 + NB) * L32) of the R out rows r .. r + R - 1 (L32: lanes of a
// 32-byte vector). CI > 0: c_in at compile time. X and Y are stored as S, W, bias and scale
// as T; the rows accumulate in T. The rows' pairs come in group order (index_by_row): a
// merge takes the smallest group any row has next, and one pass over that W[g] serves every
// row that uses it (a wide row is bound by loading W, one vector per multiply-add, from L2:
// 27 offsets of 64 x 64 floats are 432 KiB). Each row still adds its own pairs in its own
// order, so its values do not depend on R.
template <typename T, int CI, int NB, int R, typename S, bool kScaled>
inline __attribute__((always_inline)) void block_rows(const ConvOsLaunch& l, int64_t r,
                                                      int v0) {
  constexpr int VB = kBlockBytes<NB, R>, NV = NB * 32 / VB, NS = kSets<NB>;
  constexpr int L32 = 32 / static_cast<int>(sizeof(T));
  typedef detail::Vec<T, VB> V;  // registers; memory through memcpy
  const int64_t ci = CI > 0 ? CI : l.c_in, co = l.c_out, wstride = ci * co;
  const S* __restrict x = static_cast<const S*>(l.x);
  const T* __restrict w = static_cast<const T*>(l.w) + v0 * L32;
  const T* scale = static_cast<const T*>(l.scale);
  // bfloat16 weight pairs at the block's columns (only without a per-pair scale)
  const uint16_t* wp = l.w_pairs != nullptr && scale == nullptr ? l.w_pairs + v0 * L32 * 2
                                                                 : nullptr;
  const int64_t pstride = ci / 2 * co * 2;
  constexpr int64_t kAhead = 2;
  V acc[R][NS][NV];
  int64_t q[R], end[R];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    init_block<T, NV, NS>(l, static_cast<S*>(l.y) + (r + i) * co + v0 * L32, v0, acc[i]);
    q[i] = l.row_ptr[r + i];
    end[i] = l.row_ptr[r + i + 1];
    if (R > 1 && v0 == 0)  // the rows' first X rows; then each pair asks for the one kAhead on
      for (int64_t k = q[i]; k < end[i] && k < q[i] + kAhead; ++k) prefetch_x(l, x, ci, k);
  }
  if constexpr (R == 1) {  // one row: its pairs in order, no merge
    for (; q[0] < end[0]; ++q[0]) {
      const int32_t pair = l.row_pair[q[0]];
      if (v0 == 0 && q[0] + kAhead < end[0]) prefetch_x(l, x, ci, q[0] + kAhead);
      const S* xr[1] = {x + static_cast<int64_t>(l.in_idx[pair]) * ci};
      const T sc[1] = {scale != nullptr ? scale[pair] : T(1)};
      const int64_t g = l.pair_group[pair];
      add_rows<T, CI, NV, NS, 1, 1, kScaled>(acc, xr, sc, w + g * wstride,
                                    wp != nullptr ? wp + g * pstride : nullptr, ci, co);
    }
  } else {  // merge: the smallest next group among the rows, for every row that has it
    for (;;) {
      int32_t g[R], first = INT32_MAX;
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
        g[i] = q[i] < end[i] ? l.pair_group[l.row_pair[q[i]]] : INT32_MAX;
        first = g[i] < first ? g[i] : first;
      }
      if (first == INT32_MAX) break;
      int mask = 0;
      const S* xr[R];
      T sc[R];
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
        xr[i] = x;
        sc[i] = T(1);
        if (g[i] != first) continue;
        mask |= 1 << i;
        const int32_t pair = l.row_pair[q[i]];
        xr[i] = x + static_cast<int64_t>(l.in_idx[pair]) * ci;
        if (scale != nullptr) sc[i] = scale[pair];
        if (v0 == 0 && q[i] + kAhead < end[i]) prefetch_x(l, x, ci, q[i] + kAhead);
        ++q[i];
      }
      add_rows_masked<T, CI, NV, NS, R, kScaled>(mask, acc, xr, sc,
                                        w + static_cast<int64_t>(first) * wstride,
                                        wp != nullptr ? wp + first * pstride : nullptr, ci, co);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
    finish_block<T, NV, NS>(l, static_cast<S*>(l.y) + (r + i) * co + v0 * L32, acc[i]);
}

// Every column block of the R out rows from r (blocks of 8 vectors, then the NV % 8 left).
template <typename T, int CI, int NV, int R, typename S, bool kScaled>
inline __attribute__((always_inline)) void row_blocks(const ConvOsLaunch& l, int64_t r) {
  int v0 = 0;
  for (; v0 + 8 <= NV; v0 += 8) block_rows<T, CI, 8, R, S, kScaled>(l, r, v0);
  if constexpr (NV % 8 != 0) block_rows<T, CI, NV % 8, R, S, kScaled>(l, r, v0);
}

// Out rows [l.r0, l.r1) with c_out = CO (a multiple of the vector length), up to MaxRows of
// them together; a row's column blocks one after the other (its X rows are still in L1 for
// the second).
template <typename T, int CI, int CO, typename S = T, int MaxRows = 1>
inline __attribute__((always_inline)) void rows(const ConvOsLaunch& l) {
  static_assert(std::is_same_v<S, T> || (std::is_same_v<T, float> && std::is_same_v<S, uint16_t>),
                "storage is T itself or bfloat16 bits with float");
  constexpr int L = 32 / static_cast<int>(sizeof(T)), NV = CO / L;
  static_assert(CO % L == 0 && NV >= 1, "C_out must be a multiple of the vector length");
  constexpr int NT = NV % 8;  // the last block's width (0: none)
  constexpr int R8 = NV >= 8 ? kRowsTogether<8, MaxRows> : MaxRows;
  constexpr int RT = NT != 0 ? kRowsTogether<NT, MaxRows> : MaxRows;
  constexpr int R = R8 < RT ? R8 : RT;
  // The JIT's rows (CI > 0) take no per-pair scale (its callers run the ahead-of-time rows
  // when there is one): each channel's X value is then broadcast as it is, a load with no
  // multiply by 1 (the same values).
  constexpr bool kScaled = CI == 0;
  int64_t r = l.r0;
  if constexpr (R > 1)
    for (; r + R <= l.r1; r += R) row_blocks<T, CI, NV, R, S, kScaled>(l, r);
  for (; r < l.r1; ++r) row_blocks<T, CI, NV, 1, S, kScaled>(l, r);
}

}  // namespace point_conv_detail
}  // namespace sparsejit::cpu
