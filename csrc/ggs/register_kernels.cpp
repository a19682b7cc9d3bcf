#include "csrc/ggs/register_kernels.h"

namespace sparsejit::ggs::detail {
namespace {

// One tile of out rows [r0, r1): row r's pairs are accumulated into a local row (CO > 0: a
// compile-time width, so the row lives in vector registers across the pairs), then stored.
template <typename T, int CO>
inline __attribute__((always_inline)) void os_rows_fixed(const Pairs& p, const GgsArgs<T>& a,
                                                         const T* __restrict w, int64_t r0,
                                                         int64_t r1) {
  // The row as CO / L vectors of 32 bytes (GCC vector extension): kept in registers.
  constexpr int L = 32 / sizeof(T), NV = CO / L;
  typedef T V __attribute__((vector_size(32), aligned(sizeof(T))));
  static_assert(CO % L == 0, "CO must be a multiple of the vector length");
  const int64_t ci = a.c_in, wstride = ci * CO;
  for (int64_t r = r0; r < r1; ++r) {
    T* yr = a.y + r * CO;
    V acc[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      if (a.accumulate) {
        std::memcpy(&acc[v], yr + v * L, sizeof(V));
      } else if (a.bias != nullptr) {
        std::memcpy(&acc[v], a.bias + v * L, sizeof(V));
      } else {
        acc[v] = V{} ;
      }
    }
    for (int64_t q = p.row_ptr[r]; q < p.row_ptr[r + 1]; ++q) {
      const int32_t pair = p.row_pair[q];
      const T* xi = a.x + static_cast<int64_t>(p.in_idx[pair]) * ci;
      const T* wg = w + static_cast<int64_t>(p.pair_group[pair]) * wstride;
      const T s = a.scale != nullptr ? a.scale[pair] : T(1);
      for (int64_t c = 0; c < ci; ++c) {
        const T xv = s * xi[c];
        const T* wr = wg + c * CO;
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) {
          V wv;
          std::memcpy(&wv, wr + v * L, sizeof(V));
          acc[v] += xv * wv;
        }
      }
    }
    if (a.relu) {  // the fused ReLU, on the row while it is in registers
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[v] = acc[v] > V{} ? acc[v] : V{};
    }
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) std::memcpy(yr + v * L, &acc[v], sizeof(V));
  }
}

// Any width: accumulates in the output row itself (in L1).
template <typename T>
inline __attribute__((always_inline)) void os_rows_any(const Pairs& p, const GgsArgs<T>& a,
                                                       const T* __restrict w, int64_t r0,
                                                       int64_t r1) {
  const int64_t ci = a.c_in, co = a.c_out, wstride = ci * co;
  for (int64_t r = r0; r < r1; ++r) {
    T* __restrict yr = a.y + r * co;
    if (!a.accumulate) init_rows(a, r, r + 1);
    for (int64_t q = p.row_ptr[r]; q < p.row_ptr[r + 1]; ++q) {
      const int32_t pair = p.row_pair[q];
      const T* __restrict xi = a.x + static_cast<int64_t>(p.in_idx[pair]) * ci;
      const T* __restrict wg = w + static_cast<int64_t>(p.pair_group[pair]) * wstride;
      const T s = a.scale != nullptr ? a.scale[pair] : T(1);
      for (int64_t c = 0; c < ci; ++c) {
        const T v = s * xi[c];
        const T* __restrict wr = wg + c * co;
        for (int64_t j = 0; j < co; ++j) yr[j] += v * wr[j];
      }
    }
    if (a.relu) relu_rows(a, r, r + 1);
  }
}

template <typename T>
inline __attribute__((always_inline)) void os_dispatch(const Pairs& p, const GgsArgs<T>& a,
                                                       const T* w, int64_t r0, int64_t r1) {
  switch (a.c_out) {
    case 16: os_rows_fixed<T, 16>(p, a, w, r0, r1); break;
    case 32: os_rows_fixed<T, 32>(p, a, w, r0, r1); break;
    case 64: os_rows_fixed<T, 64>(p, a, w, r0, r1); break;
    case 128: os_rows_fixed<T, 128>(p, a, w, r0, r1); break;
    default: os_rows_any<T>(p, a, w, r0, r1);
  }
}

// dW[g] += scale_p * X[in_p]^T dY[out_p] over one group's pairs. Pairs in tiles of 256 (their
// X and dY rows stay in L2); per tile, CB rows of dW[g] at a time are held in vector registers
// (CB * CO / L accumulators) while the tile's pairs stream by: one dY row load feeds CB
// rows of FMAs, and dW is loaded / stored once per tile instead of once per pair.
template <typename T, int CO, int CB>
inline __attribute__((always_inline)) void wgrad_rows(const Pairs& p, const T* x, int64_t ci,
                                                      const T* dy, const T* scale, T* dwg,
                                                      int64_t q0, int64_t q1, int64_t c0) {
  constexpr int L = 32 / sizeof(T), NV = CO / L;
  typedef T V __attribute__((vector_size(32), aligned(sizeof(T))));
  V acc[CB][NV];
#pragma GCC unroll 16
  for (int b = 0; b < CB; ++b)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) std::memcpy(&acc[b][v], dwg + (c0 + b) * CO + v * L, sizeof(V));
  for (int64_t q = q0; q < q1; ++q) {
    const T* xi = x + static_cast<int64_t>(p.in_idx[q]) * ci + c0;
    const T* dyo = dy + static_cast<int64_t>(p.out_idx[q]) * CO;
    const T s = scale != nullptr ? scale[q] : T(1);
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      V d;
      std::memcpy(&d, dyo + v * L, sizeof(V));
#pragma GCC unroll 16
      for (int b = 0; b < CB; ++b) acc[b][v] += (s * xi[b]) * d;
    }
  }
#pragma GCC unroll 16
  for (int b = 0; b < CB; ++b)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) std::memcpy(dwg + (c0 + b) * CO + v * L, &acc[b][v], sizeof(V));
}

template <typename T, int CO>
inline __attribute__((always_inline)) void wgrad_group_fixed(const Pairs& p, const T* x,
                                                             int64_t ci, const T* dy,
                                                             const T* scale, T* dwg, int64_t g) {
  constexpr int L = 32 / sizeof(T), NV = CO / L;
  // Rows of dW held per pass: up to 16 accumulators (measured best for 16, 32, 64 channels).
  constexpr int CB = NV >= 16 ? 1 : NV >= 8 ? 2 : 8 / NV;
  constexpr int64_t kTile = 256;
  const int64_t p0 = p.group_ptr[g], p1 = p.group_ptr[g + 1];
  for (int64_t q0 = p0; q0 < p1; q0 += kTile) {
    const int64_t q1 = std::min(p1, q0 + kTile);
    int64_t c0 = 0;
    for (; c0 + CB <= ci; c0 += CB) wgrad_rows<T, CO, CB>(p, x, ci, dy, scale, dwg, q0, q1, c0);
    for (; c0 < ci; ++c0) wgrad_rows<T, CO, 1>(p, x, ci, dy, scale, dwg, q0, q1, c0);
  }
}

template <typename T>
inline __attribute__((always_inline)) bool wgrad_dispatch(const Pairs& p, const T* x,
                                                          int64_t ci, const T* dy, int64_t co,
                                                          const T* scale, T* dwg, int64_t g) {
  switch (co) {
    case 16: wgrad_group_fixed<T, 16>(p, x, ci, dy, scale, dwg, g); return true;
    case 32: wgrad_group_fixed<T, 32>(p, x, ci, dy, scale, dwg, g); return true;
    case 64: wgrad_group_fixed<T, 64>(p, x, ci, dy, scale, dwg, g); return true;
    case 128: wgrad_group_fixed<T, 128>(p, x, ci, dy, scale, dwg, g); return true;
    default: return false;
  }
}

}  // namespace

__attribute__((target_clones("arch=x86-64-v3", "default"))) void os_tile(
    const Pairs& p, const GgsArgs<float>& a, const float* w, int64_t r0, int64_t r1) {
  os_dispatch<float>(p, a, w, r0, r1);
}
__attribute__((target_clones("arch=x86-64-v3", "default"))) void os_tile(
    const Pairs& p, const GgsArgs<double>& a, const double* w, int64_t r0, int64_t r1) {
  os_dispatch<double>(p, a, w, r0, r1);
}


__attribute__((target_clones("arch=x86-64-v3", "default"))) bool wgrad_group(
    const Pairs& p, const float* x, int64_t ci, const float* dy, int64_t co, const float* scale,
    float* dwg, int64_t g) {
  return wgrad_dispatch<float>(p, x, ci, dy, co, scale, dwg, g);
}
__attribute__((target_clones("arch=x86-64-v3", "default"))) bool wgrad_group(
    const Pairs& p, const double* x, int64_t ci, const double* dy, int64_t co,
    const double* scale, double* dwg, int64_t g) {
  return wgrad_dispatch<double>(p, x, ci, dy, co, scale, dwg, g);
}


}  // namespace sparsejit::ggs::detail
