// Filter-sparse convolution on the GPU (inference), as csrc/filter_conv's CPU kernels compute
// it: y[n, oc] = sum over the output channel's stored taps (c, r, s) of value * x[n, group's
// c, oy * SH - PH + r * DH, ox * SW - PW + s * DW] (zero outside the image), + bias, ReLU.
//
// A block takes BLOCK consecutive output pixels of one (image n, output channel oc): grid.x =
// n * C_out + oc, grid.y = pixel block. Every thread walks the same taps (broadcast loads),
// decoded with the layer's kernel size compiled in; the x loads of a warp are consecutive
// along the output row (stride 1) or strided. float32 accumulation in tap order.
//
// Compile-time configuration C (codegen/cuda_spec_filter_conv.cpp): R, S, SH, SW, PH, PW, DH,
// DW, BLOCK (T is float).
#pragma once

#ifndef SJ_CUDA_AMALGAMATED
#include "kernels/cuda/common.cuh"
#endif

namespace sparsejit {
namespace cuda {

template <class C>
__device__ __forceinline__ void filter_conv_kernel(const FilterConvParams& p) {
  constexpr int R = C::R, S = C::S;
  const i64 no = blockIdx.x;  // n * c_out + oc
  const i64 n = no / p.c_out, oc = no % p.c_out;
  const i64 q = i64(blockIdx.y) * C::BLOCK + threadIdx.x;
  if (q >= p.out_h * p.out_w) return;
  const i64 oy = q / p.out_w, ox = q % p.out_w;
  const i64* __restrict__ rowptr = static_cast<const i64*>(p.rowptr);
  const i64* __restrict__ taps = static_cast<const i64*>(p.taps);
  const float* __restrict__ vals = static_cast<const float*>(p.values);
  const float* __restrict__ xg =
      static_cast<const float*>(p.x) + (n * p.c_in + (oc / p.cout_g) * p.cin_g) * p.h * p.w;
  const i64 y0 = oy * C::SH - C::PH, x0 = ox * C::SW - C::PW;
  float acc = 0.0f;
  for (i64 e = rowptr[oc]; e < rowptr[oc + 1]; ++e) {
    const i64 t = taps[e];
    const i64 c = t / (R * S);
    const int rs = int(t - c * (R * S));
    const int r = rs / S, s = rs - (rs / S) * S;
    const i64 iy = y0 + r * C::DH, ix = x0 + s * C::DW;
    if (iy >= 0 && iy < p.h && ix >= 0 && ix < p.w)
      acc += vals[e] * xg[(c * p.h + iy) * p.w + ix];
  }
  if (p.bias != nullptr) acc += static_cast<const float*>(p.bias)[oc];
  if (p.relu && acc < 0.0f) acc = 0.0f;
  static_cast<float*>(p.y)[no * p.out_h * p.out_w + q] = acc;
}

}  // namespace cuda
}  // namespace sparsejit
