// Torch-free scalar types shared by the core, the kernels and the adapters (the enums
// and their names are in kernels/common/, included here).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/common/enum_names.h"

namespace sparsejit {

// bfloat16 stored as its upper 16 bits of an IEEE float32. Layout-compatible with
// c10::BFloat16, so the Torch adapter can hand its data pointer straight to the kernels.
struct bf16 {
  uint16_t bits;
  bf16() = default;
  explicit bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = 0x7fc0;  // quiet NaN
    } else {
      // round to nearest even
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<uint16_t>(u >> 16);
    }
  }
  operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// The type a kernel accumulates in: float for float and bfloat16, double for double.
template <typename T>
struct AccType {
  using type = float;
};
template <>
struct AccType<double> {
  using type = double;
};
template <typename T>
using acc_t = typename AccType<T>::type;

}  // namespace sparsejit
