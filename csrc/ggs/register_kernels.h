// The register-resident kernels of the ggs core (internal to csrc/ggs): rows of the output
// or of dW held in vector registers across a stream of pairs, compiled for 16/32/64/128
// output channels, each in an AVX2/FMA and a baseline clone picked at load time (the build
// has no -march). Called by ggs.cpp inside its OpenMP regions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "csrc/ggs/ggs.h"

namespace sparsejit::ggs::detail {

// Rows [r0, r1) of Y set to the bias (or zero).
template <typename T>
void init_rows(const GgsArgs<T>& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    T* yr = a.y + r * a.c_out;
    if (a.bias != nullptr)
      std::memcpy(yr, a.bias, sizeof(T) * a.c_out);
    else
      std::fill(yr, yr + a.c_out, T(0));
  }
}

// max(y, 0) over rows [r0, r1) (the fused ReLU of GgsArgs::relu).
template <typename T>
void relu_rows(const GgsArgs<T>& a, int64_t r0, int64_t r1) {
  T* y = a.y + r0 * a.c_out;
  for (int64_t i = 0; i < (r1 - r0) * a.c_out; ++i) y[i] = y[i] > T(0) ? y[i] : T(0);
}

// Output-stationary: out rows [r0, r1), every pair of each row accumulated (all groups).
void os_tile(const Pairs& p, const GgsArgs<float>& a, const float* w, int64_t r0, int64_t r1);
void os_tile(const Pairs& p, const GgsArgs<double>& a, const double* w, int64_t r0, int64_t r1);

// dW[g] += sum over group g's pairs of scale_p * X[in_p]^T dY[out_p] ([c_in, co]); false when
// co has no register-resident kernel (the caller then uses gathered tiles and a GEMM).
bool wgrad_group(const Pairs& p, const float* x, int64_t ci, const float* dy, int64_t co,
                 const float* scale, float* dwg, int64_t g);
bool wgrad_group(const Pairs& p, const double* x, int64_t ci, const double* dy, int64_t co,
                 const double* scale, double* dwg, int64_t g);

}  // namespace sparsejit::ggs::detail
