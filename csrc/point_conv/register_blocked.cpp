#include "csrc/point_conv/register_blocked.h"

#include "codegen/cpu_point_conv_spec.h"
#include "codegen/cpu_jit.h"
#include "codegen/jit_policy.h"
#include "csrc/core/isa.h"
#include "kernels/cpu/common/vec.h"

namespace sparsejit::point_conv::detail {
namespace {

// Any width: accumulates in the output row itself (in L1).
template <typename T>
inline __attribute__((always_inline)) void os_rows_any(const Pairs& p, const PointConvArgs<T>& a,
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

// The register-resident rows of kernels/cpu/point_conv_kernel.h with C_in at run time (the JIT
// compiles the same template with both widths fixed).
template <typename T>
inline __attribute__((always_inline)) void os_dispatch(const Pairs& p, const PointConvArgs<T>& a,
                                                       const T* w, int64_t r0, int64_t r1) {
  const cpu::ConvOsLaunch l = os_launch(p, a, w, r0, r1);
  switch (a.c_out) {
    case 16: cpu::point_conv_detail::rows<T, 0, 16>(l); break;
    case 32: cpu::point_conv_detail::rows<T, 0, 32>(l); break;
    case 64: cpu::point_conv_detail::rows<T, 0, 64>(l); break;
    case 128: cpu::point_conv_detail::rows<T, 0, 128>(l); break;
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
  typedef cpu::detail::Vec<T, 32> V;  // registers; memory through memcpy
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

bool os_jit_worth(const Pairs& p, int64_t c_in, int64_t c_out, int64_t elem_bytes) {
  const int64_t lanes = 32 / elem_bytes;
  return c_out % lanes == 0 && c_in >= 1 && c_in <= codegen::CpuPointConvSpec::kMaxChannels &&
         c_out <= codegen::CpuPointConvSpec::kMaxChannels &&
         codegen::worth_jit(OpKind::PointConv, p.size() * c_in * c_out);
}

bool os_has_registers(const Pairs& p, int64_t c_in, int64_t c_out, int64_t elem_bytes) {
  return c_out == 16 || c_out == 32 || c_out == 64 || c_out == 128 ||
         os_jit_worth(p, c_in, c_out, elem_bytes);
}

// os_tile and wgrad_group in an AVX2 copy and a baseline one, picked by isa_tier() (the
// AVX-512 tier takes the AVX2 copy too).
template <typename T>
SJ_TARGET_V3 void os_tile_v3(const Pairs& p, const PointConvArgs<T>& a, const T* w, int64_t r0,
                             int64_t r1) {
  os_dispatch<T>(p, a, w, r0, r1);
}
template <typename T>
void os_tile_base(const Pairs& p, const PointConvArgs<T>& a, const T* w, int64_t r0,
                  int64_t r1) {
  os_dispatch<T>(p, a, w, r0, r1);
}
template <typename T>
void os_tile_any(const Pairs& p, const PointConvArgs<T>& a, const T* w, int64_t r0,
                 int64_t r1) {
  if (isa_tier() >= IsaTier::kAvx2) return os_tile_v3<T>(p, a, w, r0, r1);
  os_tile_base<T>(p, a, w, r0, r1);
}
void os_tile(const Pairs& p, const PointConvArgs<float>& a, const float* w, int64_t r0,
             int64_t r1) {
  os_tile_any<float>(p, a, w, r0, r1);
}
void os_tile(const Pairs& p, const PointConvArgs<double>& a, const double* w, int64_t r0,
             int64_t r1) {
  os_tile_any<double>(p, a, w, r0, r1);
}

template <typename T>
SJ_TARGET_V3 bool wgrad_group_v3(const Pairs& p, const T* x, int64_t ci, const T* dy,
                                 int64_t co, const T* scale, T* dwg, int64_t g) {
  return wgrad_dispatch<T>(p, x, ci, dy, co, scale, dwg, g);
}
template <typename T>
bool wgrad_group_base(const Pairs& p, const T* x, int64_t ci, const T* dy, int64_t co,
                      const T* scale, T* dwg, int64_t g) {
  return wgrad_dispatch<T>(p, x, ci, dy, co, scale, dwg, g);
}
template <typename T>
bool wgrad_group_any(const Pairs& p, const T* x, int64_t ci, const T* dy, int64_t co,
                     const T* scale, T* dwg, int64_t g) {
  if (isa_tier() >= IsaTier::kAvx2) return wgrad_group_v3<T>(p, x, ci, dy, co, scale, dwg, g);
  return wgrad_group_base<T>(p, x, ci, dy, co, scale, dwg, g);
}
bool wgrad_group(const Pairs& p, const float* x, int64_t ci, const float* dy, int64_t co,
                 const float* scale, float* dwg, int64_t g) {
  return wgrad_group_any<float>(p, x, ci, dy, co, scale, dwg, g);
}
bool wgrad_group(const Pairs& p, const double* x, int64_t ci, const double* dy, int64_t co,
                 const double* scale, double* dwg, int64_t g) {
  return wgrad_group_any<double>(p, x, ci, dy, co, scale, dwg, g);
}

}  // namespace sparsejit::point_conv::detail
