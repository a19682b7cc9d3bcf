// The register-blocked kernels of the point-conv core (internal to csrc/point_conv): rows of
// the output or of dW held in vector registers across a stream of pairs, compiled for 16/32/64/128
// output channels, each in an AVX2 and a baseline clone picked at load time (the build
// has no -march). Called by point_conv_run.cpp inside its OpenMP regions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "csrc/point_conv/point_conv_run.h"
#include "kernels/cpu/point_conv_kernel.h"

namespace sparsejit::point_conv::detail {

// Rows [r0, r1) of Y set to the bias (or zero).
template <typename T>
void init_rows(const PointConvArgs<T>& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    T* yr = a.y + r * a.c_out;
    if (a.bias != nullptr)
      std::memcpy(yr, a.bias, sizeof(T) * a.c_out);
    else
      std::fill(yr, yr + a.c_out, T(0));
  }
}

// max(y, 0) over rows [r0, r1) (the fused ReLU of PointConvArgs::relu).
template <typename T>
void relu_rows(const PointConvArgs<T>& a, int64_t r0, int64_t r1) {
  T* y = a.y + r0 * a.c_out;
  for (int64_t i = 0; i < (r1 - r0) * a.c_out; ++i) y[i] = y[i] > T(0) ? y[i] : T(0);
}

// The launch of kernels/cpu/point_conv_kernel.h for out rows [r0, r1) (W as [G, c_in, c_out]).
template <typename T>
cpu::ConvOsLaunch os_launch(const Pairs& p, const PointConvArgs<T>& a, const T* w, int64_t r0,
                            int64_t r1) {
  cpu::ConvOsLaunch l;
  l.row_ptr = p.row_ptr;
  l.row_pair = p.row_pair;
  l.pair_group = p.pair_group;
  l.in_idx = p.in_idx;
  l.x = a.x;
  l.w = w;
  l.bias = a.bias;
  l.scale = a.scale;
  l.y = a.y;
  l.c_in = a.c_in;
  l.c_out = a.c_out;
  l.r0 = r0;
  l.r1 = r1;
  l.accumulate = a.accumulate;
  l.relu = a.relu;
  return l;
}

// Whether the JIT should compile the output-stationary rows for this pass: on, a width it
// takes (c_out a multiple of the vector length), and at least 2^20 multiply-adds.
bool os_jit_worth(const Pairs& p, int64_t c_in, int64_t c_out, int64_t elem_bytes);
// Whether the output-stationary rows run from vector registers: the ahead-of-time widths
// (c_out = 16, 32, 64, 128) or a pass the JIT compiles (os_jit_worth).
bool os_has_registers(const Pairs& p, int64_t c_in, int64_t c_out, int64_t elem_bytes);

// Output-stationary, ahead-of-time build: out rows [r0, r1), every pair of each row
// accumulated (all groups); register-resident for c_out = 16, 32, 64, 128.
void os_tile(const Pairs& p, const PointConvArgs<float>& a, const float* w, int64_t r0, int64_t r1);
void os_tile(const Pairs& p, const PointConvArgs<double>& a, const double* w, int64_t r0, int64_t r1);

// dW[g] += sum over group g's pairs of scale_p * X[in_p]^T dY[out_p] ([c_in, co]); false when
// co has no register-resident kernel (the caller then uses gathered tiles and a GEMM).
bool wgrad_group(const Pairs& p, const float* x, int64_t ci, const float* dy, int64_t co,
                 const float* scale, float* dwg, int64_t g);
bool wgrad_group(const Pairs& p, const double* x, int64_t ci, const double* dy, int64_t co,
                 const double* scale, double* dwg, int64_t g);

}  // namespace sparsejit::point_conv::detail
