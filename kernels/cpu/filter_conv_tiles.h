// The inner loops of the filter-sparse convolution (csrc/filter_conv): one output channel's stored
// taps of one input-channel chunk, accumulated into a register tile of 8 * V output pixels,
// nonzeros interleaved U at a time so that U * V independent FMA chains hide the FMA latency;
// and the loop over a block of output channels and chunks around it.
//
// Compiled three ways: by the library once per instruction set (filter_conv_tiles_{generic,avx2}.cpp,
// each defining SPARSEJIT_ISA_NS, a namespace name, first, so the copies never meet at link time),
// and by the CPU JIT (codegen/cpu_filter_conv_spec.cpp; embedded in the library as text) with the
// layer's constants. Every copy adds the same products in the same order, and fma8 fuses
// explicitly where the target has FMA, so the JIT kernels and the AVX2 library loops give
// bit-identical results.
#pragma once

// The tiles pass GCC vectors between inline functions only; no ABI crosses a TU boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

#include <cstdint>

#include "kernels/cpu/common/vec.h"
#include "kernels/cpu/filter_conv_args.h"

#ifndef SPARSEJIT_ISA_NS
#error "define SPARSEJIT_ISA_NS before including filter_conv_tiles.h"
#endif

#define FILTER_CONV_INLINE inline __attribute__((always_inline))

// 1: 16-lane vectors where the target has AVX-512 (see accumulate_wide); 0: 8 lanes always.
#ifndef SPARSEJIT_FILTER_CONV_WIDE
#define SPARSEJIT_FILTER_CONV_WIDE 1
#endif

namespace sparsejit::filter_conv::SPARSEJIT_ISA_NS {

typedef cpu::detail::Vec<float, 32> vf8;

FILTER_CONV_INLINE vf8 load8(const float* p) {
  vf8 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

FILTER_CONV_INLINE void store8(float* p, vf8 v) { __builtin_memcpy(p, &v, sizeof(v)); }

// acc + w * x, fused where the target has FMA (one rounding), whatever -ffp-contract says.
FILTER_CONV_INLINE vf8 fma8(float w, vf8 x, vf8 acc) {
#ifdef __FMA__
  return __builtin_ia32_vfmaddps256(x, vf8{w, w, w, w, w, w, w, w}, acc);
#else
  return acc + vf8{w, w, w, w, w, w, w, w} * x;
#endif
}

#if defined(__AVX512F__)
// Where the compiler targets AVX-512 (the JIT's -march=native on such a CPU), tiles of 16 or
// more pixels run on 16-lane vectors: half the FMA and load instructions for the same tile.
// Each pixel's lane sees the same products in the same order, so the results are the same
// bits as the 8-lane loop's.
typedef cpu::detail::Vec<float, 64> vf16;

FILTER_CONV_INLINE vf16 fma_lanes(float w, vf16 x, vf16 acc) {
  const vf16 wv = {w, w, w, w, w, w, w, w, w, w, w, w, w, w, w, w};
  return __builtin_ia32_vfmaddps512_mask(x, wv, acc, static_cast<unsigned short>(0xFFFF),
                                         4 /* _MM_FROUND_CUR_DIRECTION */);
}
#endif

FILTER_CONV_INLINE vf8 fma_lanes(float w, vf8 x, vf8 acc) { return fma8(w, x, acc); }

// acc[0, L * NV) (+)= sum_e val[e] * x[off[e] + (0, L * NV)] on NV vectors of type VT (L
// lanes each); = for the first chunk.
template <typename VT, int NV, int U>
FILTER_CONV_INLINE void accumulate_vectors(const TileJob& j) {
  constexpr int L = static_cast<int>(sizeof(VT) / sizeof(float));
  auto load = [](const float* p) {
    VT v;
    __builtin_memcpy(&v, p, sizeof(v));
    return v;
  };
  VT acc[U][NV];
  for (int v = 0; v < NV; ++v) acc[0][v] = j.first ? VT{} : load(j.acc + L * v);
  for (int u = 1; u < U; ++u)
    for (int v = 0; v < NV; ++v) acc[u][v] = VT{};
  const float* __restrict x = j.x;
  const int32_t* __restrict off = j.off;
  const float* __restrict val = j.val;
  int64_t e = 0;
  for (; e + U <= j.nnz; e += U) {
    for (int u = 0; u < U; ++u) {
      const float* p = x + off[e + u];
      const float w = val[e + u];
      for (int v = 0; v < NV; ++v) acc[u][v] = fma_lanes(w, load(p + L * v), acc[u][v]);
    }
  }
  for (; e < j.nnz; ++e) {
    const float* p = x + off[e];
    const float w = val[e];
    for (int v = 0; v < NV; ++v) acc[0][v] = fma_lanes(w, load(p + L * v), acc[0][v]);
  }
  for (int v = 0; v < NV; ++v) {
    VT a = acc[0][v];
    for (int u = 1; u < U; ++u) a += acc[u][v];
    __builtin_memcpy(j.acc + L * v, &a, sizeof(a));
  }
}

// acc[0, 8V) (+)= sum_e val[e] * x[off[e] + (0, 8V)]  (= for the first chunk)
template <int V, int U>
FILTER_CONV_INLINE void accumulate(const TileJob& j) {
#if defined(__AVX512F__)
  if constexpr (V % 2 == 0 && SPARSEJIT_FILTER_CONV_WIDE) {
    accumulate_vectors<vf16, V / 2, U>(j);
    return;
  }
#endif
  accumulate_vectors<vf8, V, U>(j);
}

inline void accumulate_scalar(const TileJob& j, int64_t pixels) {
  for (int64_t q = 0; q < pixels; ++q) {
    float a = j.first ? 0.0f : j.acc[q];
    for (int64_t e = 0; e < j.nnz; ++e) a += j.val[e] * j.x[j.off[e] + q];
    j.acc[q] = a;
  }
}

// One output-channel block of one tile: chunk-major (a chunk's input stays in L1 while every
// channel of the block reads it). A zero template constant takes the value from the launch;
// the JIT passes the layer's values, so the loop bounds and group offsets are immediates.
template <int V, int U, int64_t CHUNKS = 0, int64_t COUT_G = 0, int64_t GROUP_STRIDE = 0>
FILTER_CONV_INLINE void run_block(const BlockLaunch& L) {
  constexpr int64_t T = 8 * V;
  const int64_t chunks = CHUNKS ? CHUNKS : L.chunks;
  const int64_t cout_g = COUT_G ? COUT_G : L.cout_g;
  const int64_t group_stride = GROUP_STRIDE ? GROUP_STRIDE : L.group_stride;
  for (int64_t k = 0; k < chunks; ++k) {
    for (int64_t oc = L.oc0; oc < L.oc1; ++oc) {
      const int64_t e0 = L.cp[oc * (chunks + 1) + k], e1 = L.cp[oc * (chunks + 1) + k + 1];
      float* acc = L.acc + (oc - L.oc0) * T;
      if (e0 == e1) {
        if (k == 0)
          for (int64_t q = 0; q < T; ++q) acc[q] = 0.0f;
        continue;
      }
      TileJob j;
      j.first = k == 0;
      j.x = L.x + (oc / cout_g) * group_stride;
      j.off = L.off + e0;
      j.val = L.val + e0;
      j.nnz = e1 - e0;
      j.acc = acc;
      accumulate<V, U>(j);
    }
  }
}

inline void run_block_scalar(const BlockLaunch& L, int64_t pixels) {
  for (int64_t k = 0; k < L.chunks; ++k) {
    for (int64_t oc = L.oc0; oc < L.oc1; ++oc) {
      const int64_t e0 = L.cp[oc * (L.chunks + 1) + k], e1 = L.cp[oc * (L.chunks + 1) + k + 1];
      TileJob j{L.x + (oc / L.cout_g) * L.group_stride, L.off + e0, L.val + e0, e1 - e0,
                L.acc + (oc - L.oc0) * pixels, k == 0};
      accumulate_scalar(j, pixels);
    }
  }
}

inline void run_block(const BlockLaunch& L, Variant v) {
  switch (v) {
    case Variant::Vec8x1: return run_block<1, 2>(L);
    case Variant::Vec8x2: return run_block<2, 2>(L);
    case Variant::Vec8x4: return run_block<4, 2>(L);
    case Variant::Vec8x8: return run_block<8, 1>(L);
    default: return run_block_scalar(L, tile_pixels(v));
  }
}

}  // namespace sparsejit::filter_conv::SPARSEJIT_ISA_NS
