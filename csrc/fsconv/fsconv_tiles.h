// The inner loop of the filter-sparse convolution: one output channel's stored taps of one
// input-channel chunk, accumulated into a register tile of 8 * V output pixels, nonzeros
// interleaved U at a time so that U * V independent FMA chains hide the FMA latency.
// Included by one .cpp per instruction set, each of which defines FSCONV_ISA (a namespace
// name) first, so the copies never meet at link time.
#pragma once

// The tiles pass GCC vectors between inline functions only; no ABI crosses a TU boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

#include <cstdint>

#include "csrc/fsconv/fsconv.h"

#ifndef FSCONV_ISA
#error "define FSCONV_ISA before including fsconv_tiles.h"
#endif

namespace sparsejit::fsconv::FSCONV_ISA {

typedef float vf8 __attribute__((vector_size(32)));

inline vf8 load8(const float* p) {
  vf8 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

inline void store8(float* p, vf8 v) { __builtin_memcpy(p, &v, sizeof(v)); }

// acc[0, 8V) (+)= sum_e val[e] * x[off[e] + (0, 8V)]  (= for the first chunk)
template <int V, int U>
inline void accumulate(const TileJob& j) {
  vf8 acc[U][V];
  for (int v = 0; v < V; ++v) acc[0][v] = j.first ? vf8{} : load8(j.acc + 8 * v);
  for (int u = 1; u < U; ++u)
    for (int v = 0; v < V; ++v) acc[u][v] = vf8{};
  const float* __restrict x = j.x;
  const int32_t* __restrict off = j.off;
  const float* __restrict val = j.val;
  int64_t e = 0;
  for (; e + U <= j.nnz; e += U) {
    for (int u = 0; u < U; ++u) {
      const float* p = x + off[e + u];
      const float w = val[e + u];
      for (int v = 0; v < V; ++v) acc[u][v] += w * load8(p + 8 * v);
    }
  }
  for (; e < j.nnz; ++e) {
    const float* p = x + off[e];
    const float w = val[e];
    for (int v = 0; v < V; ++v) acc[0][v] += w * load8(p + 8 * v);
  }
  for (int v = 0; v < V; ++v) {
    vf8 a = acc[0][v];
    for (int u = 1; u < U; ++u) a += acc[u][v];
    store8(j.acc + 8 * v, a);
  }
}

inline void accumulate_scalar(const TileJob& j, int64_t pixels) {
  for (int64_t q = 0; q < pixels; ++q) {
    float a = j.first ? 0.0f : j.acc[q];
    for (int64_t e = 0; e < j.nnz; ++e) a += j.val[e] * j.x[j.off[e] + q];
    j.acc[q] = a;
  }
}

inline void accumulate(const TileJob& j, Variant v) {
  switch (v) {
    case Variant::Vec8x1: return accumulate<1, 2>(j);
    case Variant::Vec8x2: return accumulate<2, 2>(j);
    case Variant::Vec8x4: return accumulate<4, 2>(j);
    case Variant::Vec8x8: return accumulate<8, 1>(j);
    default: return accumulate_scalar(j, tile_pixels(v));
  }
}

}  // namespace sparsejit::fsconv::FSCONV_ISA
