// bfloat16 dot products in AVX512-BF16's summation order (SDDMM's bfloat16 rows): one
// vdpbf16ps per 32 element pairs where the compiler targets that extension (the JIT's
// -march=native), a bit-exact emulation on every other target. (The fused attention keeps
// its lane order: its bfloat16 forward is defined as the float32 kernel on the widened
// inputs, bit for bit, and the float32 backward recomputes those scores.)
//
// Only the standard library, the compiler's intrinsics header and sparsejit's Torch-free
// headers: the JIT compiles this file with nothing else on the include path.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/common/types.h"
#include "kernels/cpu/common/vec.h"
#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

namespace sparsejit::cpu::detail {

// bfloat16 dot product in AVX512-BF16's order: per block of 64 elements, element f goes to
// vector (f % 64) / 32 and lane (f % 32) / 2 of two 16-lane float accumulators; a lane adds its
// odd element's product, then its even one's (a bfloat16 product is exact in float32; each
// add rounds to nearest even); elements past F are zeros (masked loads). Then the two vectors
// are added and the 16 lanes folded pairwise (8, 4, 2, 1). With __AVX512BF16__ a block half is one
// vdpbf16ps; elsewhere the halves of each 32-bit word are widened in place (odd: the word's
// high half, masked; even: the low half, shifted). The instruction also treats subnormal
// inputs and results as zero, which the emulation does not: only subnormals tell them apart.
using Lanes16f = Vec<float, 64>;
using Lanes16u = Vec<uint32_t, 64>;

// One block half: 32 element pairs, or the first n (< 32) of them with the rest as zeros.
template <bool kFull>
inline void bf16_pairs_step(Lanes16f& acc, const bf16* a, const bf16* b, int64_t n) {
#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
  __m512i va, vb;
  if constexpr (kFull) {
    va = _mm512_loadu_si512(a);
    vb = _mm512_loadu_si512(b);
  } else {
    const __mmask32 m = static_cast<__mmask32>((uint64_t{1} << n) - 1);
    va = _mm512_maskz_loadu_epi16(m, a);
    vb = _mm512_maskz_loadu_epi16(m, b);
  }
  acc = reinterpret_cast<Lanes16f>(
      _mm512_dpbf16_ps(reinterpret_cast<__m512>(acc), reinterpret_cast<__m512bh>(va),
                       reinterpret_cast<__m512bh>(vb)));
#else
  Lanes16u wa = {}, wb = {};
  __builtin_memcpy(&wa, a, (kFull ? 32 : n) * sizeof(bf16));
  __builtin_memcpy(&wb, b, (kFull ? 32 : n) * sizeof(bf16));
  const Lanes16u hi = wa & 0xffff0000u, hj = wb & 0xffff0000u;
  const Lanes16u lo = wa << 16, lj = wb << 16;
  Lanes16f ao, bo, ae, be;
  __builtin_memcpy(&ao, &hi, sizeof(ao));
  __builtin_memcpy(&bo, &hj, sizeof(bo));
  __builtin_memcpy(&ae, &lo, sizeof(ae));
  __builtin_memcpy(&be, &lj, sizeof(be));
  acc = (acc + ao * bo) + ae * be;
#endif
}

template <int64_t kF>
inline float dot_bf16_pairs(const bf16* __restrict q, const bf16* __restrict k, int64_t F_rt) {
  const int64_t F = size_or<kF>(F_rt);
  Lanes16f p[2] = {};
  int64_t f0 = 0;
#pragma GCC unroll 4
  for (; f0 + 64 <= F; f0 += 64) {
    bf16_pairs_step<true>(p[0], q + f0, k + f0, 32);
    bf16_pairs_step<true>(p[1], q + f0 + 32, k + f0 + 32, 32);
  }
  const int64_t rest = F - f0;  // < 64: zero-padded halves
  if (rest >= 32) {
    bf16_pairs_step<true>(p[0], q + f0, k + f0, 32);
    if (rest > 32) bf16_pairs_step<false>(p[1], q + f0 + 32, k + f0 + 32, rest - 32);
  } else if (rest > 0) {
    bf16_pairs_step<false>(p[0], q + f0, k + f0, rest);
  }
  typedef Vec<float, 32> V8;
  typedef Vec<float, 16> V4;
  typedef Vec<float, 8> V2;
  const Lanes16f s16 = p[0] + p[1];
  const V8 s8 = __builtin_shufflevector(s16, s16, 0, 1, 2, 3, 4, 5, 6, 7) +
                __builtin_shufflevector(s16, s16, 8, 9, 10, 11, 12, 13, 14, 15);
  const V4 s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  const V2 s2 = __builtin_shufflevector(s4, s4, 0, 1) + __builtin_shufflevector(s4, s4, 2, 3);
  return s2[0] + s2[1];
}

}  // namespace sparsejit::cpu::detail
