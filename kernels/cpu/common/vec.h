// Vector types and loads shared by the CPU kernel templates (spmm_kernel.h, sddmm_kernel.h,
// and the gather-GEMM-scatter kernels to come): sizes that are compile-time constants in JIT
// instantiations, the target's native GCC vector, and loads into GCC vectors (bfloat16
// widened to float).
// Standard library only: the JIT compiles this file with nothing else on the include path.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/common/types.h"

namespace sparsejit::cpu::detail {

// GCC vectors by element type and size in bytes: every vector type of the CPU kernels
// (kernels/cpu, csrc's precompiled loops) is one of these. Vec<T, B> lives in registers
// (memory through memcpy or load_lanes); VecU<T, B> has T's alignment and may alias T, so a
// pointer to it loads and stores at any T-aligned address.
template <typename T, int Bytes>
struct VecBytes {
  typedef T type __attribute__((vector_size(Bytes)));
  typedef T unaligned __attribute__((vector_size(Bytes), aligned(sizeof(T)), may_alias));
};
template <typename T, int Bytes>
using Vec = typename VecBytes<T, Bytes>::type;
template <typename T, int Bytes>
using VecU = typename VecBytes<T, Bytes>::unaligned;

// Compile-time size when K > 0, else the run-time value.
template <int64_t K>
inline int64_t size_or(int64_t runtime) {
  return K > 0 ? K : runtime;
}

// Integer vectors for widening N bfloat16 values.
template <int N>
struct Bf16Lanes {
  typedef Vec<uint16_t, 2 * N> narrow;
  typedef Vec<uint32_t, 4 * N> wide;
};

// Loads one GCC vector V of A from p (T == A, or bfloat16 widened to float: the 16 bits go
// to the high half of each 32-bit lane).
template <typename V, typename A, typename T>
inline V load_lanes(const T* p) {
  V v;
  if constexpr (std::is_same_v<T, A>) {
    __builtin_memcpy(&v, p, sizeof(v));
  } else {
    using L = Bf16Lanes<static_cast<int>(sizeof(V) / sizeof(A))>;
    typename L::narrow h;
    __builtin_memcpy(&h, p, sizeof(h));
    typename L::wide w = __builtin_convertvector(h, typename L::wide) << 16;
    __builtin_memcpy(&v, &w, sizeof(v));
  }
  return v;
}

// The target's native vector width (64 bytes with AVX-512, 32 with AVX, else 16): wider GCC
// vectors than the target has are split through memory, which made register-blocked loops
// slower than plain ones.
#if defined(__AVX512F__)
inline constexpr int kVecBytes = 64;
#elif defined(__AVX__)
inline constexpr int kVecBytes = 32;
#else
inline constexpr int kVecBytes = 16;
#endif

template <typename A>
struct VecOf {
  static constexpr int kLanes = kVecBytes / static_cast<int>(sizeof(A));
  typedef Vec<A, kVecBytes> type;
};

template <typename T, typename A>
inline typename VecOf<A>::type load_vec(const T* p) {
  return load_lanes<typename VecOf<A>::type, A>(p);
}

}  // namespace sparsejit::cpu::detail
