// The output write of the CPU kernels, fused: out[i] = act(scale * finish_R(acc) + bias),
// where finish_R divides by the degree for mean and zeroes empty rows for max / min (whose
// positions go to `arg`, -1 for empty rows). Shared by SpMM and the gather-GEMM-scatter
// kernels; standard library only (the JIT compiles it).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/types.h"
#include "kernels/cpu/common/vec.h"

namespace sparsejit::cpu::detail {

// The epilogue's run-time parameters (an op's args struct carries them).
struct Epilogue {
  Act act = Act::None;
  float act_param = 0.01f;  // negative slope (leaky_relu) or alpha (elu)
  float scale = 1.0f;
  const void* bias = nullptr;  // [row width] of the output type, or null

  // False when the write is a plain copy (after the reduce's own finalisation).
  bool active() const { return act != Act::None || bias != nullptr || scale != 1.0f; }
};

template <typename A>
inline A activate(Act act, A z, A param) {
  switch (act) {
    case Act::None: return z;
    case Act::Relu: return z > A(0) ? z : A(0);
    case Act::LeakyRelu: return z > A(0) ? z : z * param;
    // expm1, not exp(z) - 1: near 0 the subtraction cancels (float32: 0.4% off at z = -8e-6)
    case Act::Elu: return z > A(0) ? z : param * std::expm1(z);
    case Act::Gelu: return A(0.5) * z * (A(1) + std::erf(z * A(0.70710678118654752440)));
    default: return z;  // unreachable: cpu::spmm and the JIT spec reject unknown values first
  }
}

// Writes one finished row: reduce finalisation, then scale, bias and activation.
// kAct == Act::Runtime reads the activation from `e`; kEpilogue false skips scale, bias and
// activation (the caller checked e.active()).
template <Reduce R, Act kAct, bool kEpilogue, int64_t kHF, typename T>
inline void write_row(const Epilogue& e, int64_t i, int64_t degree, const acc_t<T>* __restrict acc,
                      const int64_t* __restrict argacc, int64_t HF_rt, T* __restrict out,
                      int64_t* __restrict arg) {
  using A = acc_t<T>;
  const int64_t HF = size_or<kHF>(HF_rt);
  T* __restrict o = out + i * HF;
  A scale = A(1);
  if constexpr (R == Reduce::Mean) scale = degree > 0 ? A(1) / A(degree) : A(0);
  if constexpr (R == Reduce::Max || R == Reduce::Min) {
    if (arg != nullptr) {
      int64_t* __restrict g = arg + i * HF;
      for (int64_t f = 0; f < HF; ++f) g[f] = degree > 0 ? argacc[f] : int64_t(-1);
    }
    if (degree == 0) scale = A(0);
  }
  if constexpr (!kEpilogue) {
    if constexpr (R == Reduce::Sum) {
      for (int64_t f = 0; f < HF; ++f) o[f] = T(acc[f]);
    } else {
      // scale is 0 for empty max / min rows, whose accumulators still hold +-inf.
      for (int64_t f = 0; f < HF; ++f) o[f] = T(scale == A(0) ? A(0) : acc[f] * scale);
    }
  } else {
    const Act act = kAct == Act::Runtime ? e.act : kAct;
    const A param = A(e.act_param);
    const A post = A(e.scale);
    const T* __restrict bias = static_cast<const T*>(e.bias);
    for (int64_t f = 0; f < HF; ++f) {
      A z = scale == A(0) ? A(0) : acc[f] * scale;
      z = z * post;
      if (bias) z += A(bias[f]);
      o[f] = T(activate<A>(act, z, param));
    }
  }
}

}  // namespace sparsejit::cpu::detail
