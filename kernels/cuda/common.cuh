// Device helpers shared by the CUDA kernel templates: scalar types and conversions, vector
// loads, warp-group shuffles, reductions and the fused epilogue.
//
// Compiled only by NVRTC, with no system or CUDA header: the generator (codegen/cuda_spec.cpp)
// pastes cuda_args.h, this file and one op file into a single source, defines
// SJ_CUDA_AMALGAMATED (which turns the #includes below off) and appends a configuration struct
// and an extern "C" __global__ entry point.
#pragma once

#ifndef SJ_CUDA_AMALGAMATED
#include "kernels/common/enums.h"
#include "kernels/cuda/cuda_args.h"
#endif

namespace sparsejit {
namespace cuda {

typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;

// Reduce and activation codes as the int template arguments of the kernels (the generated
// Config's REDUCE and ACT), numbered by kernels/common/enums.h.
enum {
  kSum = static_cast<int>(Reduce::Sum),
  kMean = static_cast<int>(Reduce::Mean),
  kMax = static_cast<int>(Reduce::Max),
  kMin = static_cast<int>(Reduce::Min)
};
enum {
  kActNone = static_cast<int>(Act::None),
  kActRelu = static_cast<int>(Act::Relu),
  kActLeakyRelu = static_cast<int>(Act::LeakyRelu),
  kActElu = static_cast<int>(Act::Elu),
  kActGelu = static_cast<int>(Act::Gelu)
};

// ---- Scalars -------------------------------------------------------------------------------
// 16-bit floats as raw bits: layout-compatible with at::Half / at::BFloat16.
struct half_t {
  u16 bits;
};
struct bf16_t {
  u16 bits;
};

template <typename T>
struct AccOf {
  typedef float type;
};
template <>
struct AccOf<double> {
  typedef double type;
};

__device__ __forceinline__ float to_acc(float v) {
  return v;
}
__device__ __forceinline__ double to_acc(double v) {
  return v;
}
__device__ __forceinline__ float to_acc(half_t v) {
#ifdef SJ_HOST_EMULATION  // tests/cpp/cuda_emulation.h runs these kernels on CPU threads
  return sj_emu_half_to_float(v.bits);
#else
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
#endif
}
__device__ __forceinline__ float to_acc(bf16_t v) {
  return __uint_as_float(u32(v.bits) << 16);
}

template <typename T>
struct FromAcc;
template <>
struct FromAcc<float> {
  static __device__ __forceinline__ float cvt(float v) { return v; }
};
template <>
struct FromAcc<double> {
  static __device__ __forceinline__ double cvt(double v) { return v; }
};
template <>
struct FromAcc<half_t> {
  static __device__ __forceinline__ half_t cvt(float v) {
    half_t h;
#ifdef SJ_HOST_EMULATION
    h.bits = sj_emu_float_to_half(v);
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
#endif
    return h;
  }
};
template <>
struct FromAcc<bf16_t> {
  // Round to nearest even, NaN kept quiet: the same bits as sparsejit::bf16 on the host.
  static __device__ __forceinline__ bf16_t cvt(float v) {
    u32 u = __float_as_uint(v);
    bf16_t b;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      b.bits = 0x7fc0;
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      b.bits = u16(u >> 16);
    }
    return b;
  }
};

template <typename T, typename A>
__device__ __forceinline__ T from_acc(A v) {
  return FromAcc<T>::cvt(v);
}

template <typename A>
__device__ __forceinline__ A acc_exp(A v);
template <>
__device__ __forceinline__ float acc_exp<float>(float v) {
  return expf(v);
}
template <>
__device__ __forceinline__ double acc_exp<double>(double v) {
  return exp(v);
}

template <typename A>
__device__ __forceinline__ A acc_log(A v);
template <>
__device__ __forceinline__ float acc_log<float>(float v) {
  return logf(v);
}
template <>
__device__ __forceinline__ double acc_log<double>(double v) {
  return log(v);
}

template <typename A>
__device__ __forceinline__ A acc_expm1(A v);
template <>
__device__ __forceinline__ float acc_expm1<float>(float v) {
  return expm1f(v);
}
template <>
__device__ __forceinline__ double acc_expm1<double>(double v) {
  return expm1(v);
}

template <typename A>
__device__ __forceinline__ A acc_erf(A v);
template <>
__device__ __forceinline__ float acc_erf<float>(float v) {
  return erff(v);
}
template <>
__device__ __forceinline__ double acc_erf<double>(double v) {
  return erf(v);
}

template <typename A>
__device__ __forceinline__ A acc_inf() {
  return A(__int_as_float(0x7f800000));
}

// ---- Vectors -------------------------------------------------------------------------------
// N consecutive scalars moved as one aligned access (N * sizeof(T) <= 16 bytes).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

// ---- Warp groups ---------------------------------------------------------------------------
// A group is G consecutive lanes of a warp (G a power of two <= 32). Shuffles stay inside it.
template <int G>
__device__ __forceinline__ u32 group_mask() {
  if constexpr (G >= 32) {
    return 0xffffffffu;
  } else {
    const u32 lane = threadIdx.x & 31u;
    return ((1u << G) - 1u) << (lane & ~u32(G - 1));
  }
}

template <int G, typename V>
__device__ __forceinline__ V shfl_xor(u32 mask, V v, int offset) {
  return __shfl_xor_sync(mask, v, offset, G);
}

// ---- Reductions ----------------------------------------------------------------------------
template <int R, typename A>
__device__ __forceinline__ A reduce_identity() {
  if (R == kMax) return -acc_inf<A>();
  if (R == kMin) return acc_inf<A>();
  return A(0);
}

// Merging two partial max / min results (v at CSR position pv into cur at pc): a strictly
// better value wins, and on equal values the earlier position, so every schedule reports the
// position the sequential CPU kernel reports. Within one lane's sequential scan the test is
// plain `v > cur` (later positions never win ties). A partial that saw nothing holds the
// identity (+-inf) with position -1 and never wins.
template <int R, typename A>
__device__ __forceinline__ bool beats(A v, i64 pv, A cur, i64 pc) {
  const bool better = R == kMax ? v > cur : v < cur;
  return better || (v == cur && pv >= 0 && pc >= 0 && pv < pc);
}

// ---- Epilogue ------------------------------------------------------------------------------
template <int ACT, typename A>
__device__ __forceinline__ A activate(A z, A param) {
  if (ACT == kActRelu) return z > A(0) ? z : A(0);
  if (ACT == kActLeakyRelu) return z > A(0) ? z : z * param;
  if (ACT == kActElu) return z > A(0) ? z : param * acc_expm1<A>(z);  // no cancellation near 0
  if (ACT == kActGelu) return A(0.5) * z * (A(1) + acc_erf<A>(z * A(0.70710678118654752440)));
  return z;
}

// Final value of one output element, as in kernels/cpu/spmm_kernel.h write_row: the mean
// divides by the degree, empty rows give 0, then act(scale * r + bias).
template <int R, int ACT, typename T, typename A>
__device__ __forceinline__ T finish_value(A acc, i64 degree, float scale, const T* bias, int f,
                                          float act_param) {
  A r;
  if (degree == 0) {
    r = A(0);
  } else if (R == kMean) {
    r = acc * (A(1) / A(degree));
  } else {
    r = acc;
  }
  r = r * A(scale);
  if (bias != nullptr) r += to_acc(bias[f]);
  return from_acc<T>(activate<ACT, A>(r, A(act_param)));
}

// ---- Index search --------------------------------------------------------------------------
// The row holding stored position p: the last r in [lo, hi) with rowptr[r] <= p, skipping
// empty rows (so rowptr[r + 1] > p). Requires rowptr[lo] <= p < rowptr[hi].
template <typename I>
__device__ __forceinline__ i64 row_of_position(const I* rowptr, i64 lo, i64 hi, i64 p) {
  // Invariant: rowptr[lo] <= p < rowptr[hi].
  while (hi - lo > 1) {
    const i64 mid = lo + ((hi - lo) >> 1);
    if (i64(rowptr[mid]) <= p) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The first row r in [0, rows] with rowptr[r + 1] >= p (rows when none).
template <typename I>
__device__ __forceinline__ i64 first_row_ending_at_or_after(const I* rowptr, i64 rows, i64 p) {
  i64 lo = 0, hi = rows;  // answer in [lo, hi]
  while (lo < hi) {
    const i64 mid = lo + ((hi - lo) >> 1);
    if (i64(rowptr[mid + 1]) >= p) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

}  // namespace cuda
}  // namespace sparsejit
