// The reductions of the CPU kernels (sum, mean, max, min) on accumulators: identity, the
// per-entry fold on GCC vectors, and the merge of two partial results of one row. Shared by
// SpMM and the gather-GEMM-scatter kernels; standard library only (the JIT compiles it).
#pragma once

#include <cstdint>
#include <limits>

#include "kernels/common/types.h"

namespace sparsejit::cpu::detail {

template <Reduce R, typename A>
constexpr A reduce_identity() {
  if constexpr (R == Reduce::Max) return -std::numeric_limits<A>::infinity();
  if constexpr (R == Reduce::Min) return std::numeric_limits<A>::infinity();
  return A(0);
}

// acc <- reduce(acc, v) for sum / mean (add) and max / min (the select form of the scalar
// loop, so NaN and tie behaviour match it exactly: the accumulator is kept).
template <Reduce R, typename V>
inline V fold(V acc, V v) {
  if constexpr (R == Reduce::Max) {
    return acc < v ? v : acc;
  } else if constexpr (R == Reduce::Min) {
    return v < acc ? v : acc;
  } else {
    return acc + v;
  }
}

// Merges `other`, the partial result of a later part of the same row, into `acc` (HF
// elements; positions in argacc / other_arg for max / min, either may be null).
template <Reduce R, typename A>
inline void combine(A* __restrict acc, int64_t* __restrict argacc, const A* __restrict other,
                    const int64_t* __restrict other_arg, int64_t HF) {
  if constexpr (R == Reduce::Sum || R == Reduce::Mean) {
    for (int64_t f = 0; f < HF; ++f) acc[f] += other[f];
  } else {
    // `other` covers later positions: on ties the earlier position (already in acc) wins.
    for (int64_t f = 0; f < HF; ++f) {
      const bool better = (R == Reduce::Max) ? (other[f] > acc[f]) : (other[f] < acc[f]);
      if (better) {
        acc[f] = other[f];
        if (argacc != nullptr) argacc[f] = other_arg[f];
      }
    }
  }
}

}  // namespace sparsejit::cpu::detail
