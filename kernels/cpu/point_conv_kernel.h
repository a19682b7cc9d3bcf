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
//     widened features, then rounded);
//   - ahead of time in csrc/point_conv/register_kernels.cpp for C_out = 16, 32, 64, 128 (C_in at run
//     time), for when the JIT is off or the pass is too small to pay for a compile.
// The row is cut into column blocks of at most 8 vectors (so a block's accumulators and the
// operands fit the 16 vector registers), and narrow blocks keep several accumulator sets
// (channel c feeds set c mod S) so that enough independent additions are in flight.
// Standard library and kernels/ headers only: the JIT compiles this file with nothing else on
// the include path.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/common/vec.h"

namespace sparsejit::cpu {

struct ConvOsLaunch {
  const int64_t* row_ptr = nullptr;     // [num_out + 1] pairs of each out row
  const int32_t* row_pair = nullptr;    // [M] pair ids, by out row
  const int32_t* pair_group = nullptr;  // [M] kernel offset (weight) of each pair
  const int32_t* in_idx = nullptr;      // [M] in row of each pair
  const void* x = nullptr;              // S [num_in, c_in] (S: T, or bfloat16 bits)
  const void* w = nullptr;              // T [G, c_in, c_out]
  const void* bias = nullptr;           // T [c_out], or null
  const void* scale = nullptr;          // T [M] per-pair factor, or null
  void* y = nullptr;                    // S [num_out, c_out]
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
  if constexpr (sizeof(S) * 8 == sizeof(V) / 2) {  // bfloat16: 8 halves -> 8 floats
    typedef detail::Vec<uint16_t, 16> H;
    typedef detail::Vec<uint32_t, 32> U;
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
  if constexpr (sizeof(S) * 8 == sizeof(V) / 2) {  // 8 floats -> 8 halves
    typedef detail::Vec<uint16_t, 16> H;
    typedef detail::Vec<uint32_t, 32> U;
    typedef detail::Vec<int32_t, 32> I;
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

// Columns [v0 * L, (v0 + NB) * L) of out row r. CI > 0: c_in at compile time. X and Y are
// stored as S, W, bias and scale as T; the row accumulates in T.
template <typename T, int CI, int NB, typename S>
inline __attribute__((always_inline)) void block(const ConvOsLaunch& l, int64_t r, int v0) {
  constexpr int L = 32 / static_cast<int>(sizeof(T)), NS = kSets<NB>;
  typedef detail::Vec<T, 32> V;  // registers; memory through memcpy
  const int64_t ci = CI > 0 ? CI : l.c_in, co = l.c_out, wstride = ci * co;
  const S* __restrict x = static_cast<const S*>(l.x);
  const T* __restrict w = static_cast<const T*>(l.w) + v0 * L;
  const T* scale = static_cast<const T*>(l.scale);
  const T* bias = static_cast<const T*>(l.bias);
  // The X row of the pair kAhead places on is asked for early (rows are gathered at random).
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(S)), kAhead = 2;
  S* yr = static_cast<S*>(l.y) + r * co + v0 * L;
  V acc[NS][NB];
#pragma GCC unroll 8
  for (int v = 0; v < NB; ++v) {
    if (l.accumulate)
      acc[0][v] = load_row<V>(yr + v * L);
    else if (bias != nullptr)
      std::memcpy(&acc[0][v], bias + v0 * L + v * L, sizeof(V));
    else
      acc[0][v] = V{};
#pragma GCC unroll 4
    for (int s = 1; s < NS; ++s) acc[s][v] = V{};
  }
  const int64_t q0 = l.row_ptr[r], q1 = l.row_ptr[r + 1];
  for (int64_t q = q0; q < q1; ++q) {
    const int32_t pair = l.row_pair[q];
    if (v0 == 0 && q + kAhead < q1) {
      const S* nx = x + static_cast<int64_t>(l.in_idx[l.row_pair[q + kAhead]]) * ci;
      for (int64_t c = 0; c < ci; c += kLine) __builtin_prefetch(nx + c);
    }
    const S* xi = x + static_cast<int64_t>(l.in_idx[pair]) * ci;
    const T* wg = w + static_cast<int64_t>(l.pair_group[pair]) * wstride;
    const T sc = scale != nullptr ? scale[pair] : T(1);
    int64_t c = 0;
    for (; c + NS <= ci; c += NS) {
#pragma GCC unroll 4
      for (int s = 0; s < NS; ++s) {
        const T xv = sc * widen<T>(xi[c + s]);
        const T* wr = wg + (c + s) * co;
#pragma GCC unroll 8
        for (int v = 0; v < NB; ++v) {
          V wv;
          std::memcpy(&wv, wr + v * L, sizeof(V));
          acc[s][v] += xv * wv;
        }
      }
    }
    for (; c < ci; ++c) {
      const T xv = sc * widen<T>(xi[c]);
      const T* wr = wg + c * co;
#pragma GCC unroll 8
      for (int v = 0; v < NB; ++v) {
        V wv;
        std::memcpy(&wv, wr + v * L, sizeof(V));
        acc[0][v] += xv * wv;
      }
    }
  }
#pragma GCC unroll 8
  for (int v = 0; v < NB; ++v) {
#pragma GCC unroll 4
    for (int s = 1; s < NS; ++s) acc[0][v] += acc[s][v];
    if (l.relu) acc[0][v] = acc[0][v] > V{} ? acc[0][v] : V{};
    store_row(yr + v * L, acc[0][v]);
  }
}

// Out rows [l.r0, l.r1) with c_out = CO (a multiple of the vector length); a row's column
// blocks one after the other (its X rows are still in L1 for the second).
template <typename T, int CI, int CO, typename S = T>
inline __attribute__((always_inline)) void rows(const ConvOsLaunch& l) {
  static_assert(std::is_same_v<S, T> || (std::is_same_v<T, float> && std::is_same_v<S, uint16_t>),
                "storage is T itself or bfloat16 bits with float");
  constexpr int L = 32 / static_cast<int>(sizeof(T)), NV = CO / L;
  static_assert(CO % L == 0 && NV >= 1, "C_out must be a multiple of the vector length");
  for (int64_t r = l.r0; r < l.r1; ++r) {
    int v0 = 0;
    for (; v0 + 8 <= NV; v0 += 8) block<T, CI, 8, S>(l, r, v0);
    if constexpr (NV % 8 != 0) block<T, CI, NV % 8, S>(l, r, v0);
  }
}

}  // namespace point_conv_detail
}  // namespace sparsejit::cpu
