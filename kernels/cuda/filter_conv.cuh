// Filter-sparse convolution on the GPU (pruned Conv2d inference): a direct convolution whose
// weight is a CSR matrix [C_out, C_in/groups * R * S] of nonzero taps, column (tap) index
// t = (c * R + r) * S + s, values in float32 (filter_conv_plan), as csrc/filter_conv computes on
// the CPU:
//   y[n, oc, oy, ox] = act(bias[oc] + sum_{taps (c, r, s, w) of oc}
//                          w * x[n, g * C_in/groups + c, oy*SH + r*DH - PH, ox*SW + s*DW - PW]
//                          + residual[n, oc, oy, ox])   (residual optional)
// with g = oc / (C_out / groups) and zero padding outside the image; float accumulation
// (double for double), float16 / bfloat16 loads and stores.
//
// Compile-time configuration C (emitted by codegen/cuda_spec_filter_conv.cpp):
//   T              input / output scalar
//   R, S           kernel height and width;  SH, SW strides;  PH, PW padding;  DH, DW dilation
//   ACT            activation (0 none, 1 ReLU)
//   OCB            output channels per block (grid.y walks groups of OCB channels)
//   BLOCK          threads per block; each thread owns one output pixel of the flattened
//                  (n, oy, ox) grid, so neighbouring lanes read neighbouring input columns
//
// Each block walks its channels one after another; a channel's taps are staged through shared
// memory in chunks of BLOCK (decoded once: input-channel offset, row and column shift, value)
// and then read by every lane as broadcasts. Every lane of the block takes part in the staging
// (lanes past the last pixel only skip the arithmetic), so the barriers are uniform.
#pragma once

#ifndef SJ_CUDA_AMALGAMATED
#include "kernels/cuda/common.cuh"
#endif

namespace sparsejit {
namespace cuda {

template <class C>
__device__ __forceinline__ void filter_conv_kernel(const FilterConvParams& p) {
  typedef typename C::T T;
  typedef typename AccOf<T>::type A;
  constexpr int R = C::R, S = C::S, BLOCK = C::BLOCK;
  constexpr int RS = R * S;
  __shared__ i64 tap_chan[BLOCK];  // input-channel index inside the group
  __shared__ int tap_dy[BLOCK];    // r * DH - PH
  __shared__ int tap_dx[BLOCK];    // s * DW - PW
  __shared__ float tap_w[BLOCK];

  const i64* __restrict__ rowptr = static_cast<const i64*>(p.rowptr);
  const i64* __restrict__ taps = static_cast<const i64*>(p.taps);
  const float* __restrict__ values = static_cast<const float*>(p.values);
  const T* __restrict__ x = static_cast<const T*>(p.x);
  const float* __restrict__ bias = static_cast<const float*>(p.bias);
  T* __restrict__ out = static_cast<T*>(p.out);
  const T* __restrict__ residual = static_cast<const T*>(p.residual);

  const i64 plane = p.out_h * p.out_w;
  const i64 pixel = i64(blockIdx.x) * BLOCK + threadIdx.x;
  const bool active = pixel < p.batch * plane;
  i64 n = 0, oy = 0, ox = 0;
  if (active) {
    n = pixel / plane;
    const i64 rem = pixel - n * plane;
    oy = rem / p.out_w;
    ox = rem - oy * p.out_w;
  }
  const i64 iy0 = oy * C::SH, ix0 = ox * C::SW;
  const i64 in_plane = p.h * p.w;

  const i64 oc_first = i64(blockIdx.y) * C::OCB;
  for (int k = 0; k < C::OCB; ++k) {
    const i64 oc = oc_first + k;
    if (oc >= p.c_out) break;  // uniform over the block
    const i64 group = oc / p.cout_g;
    const T* __restrict__ xg = x + (n * p.c_in + group * p.cin_g) * in_plane;
    A acc = A(0);
    const i64 begin = rowptr[oc], end = rowptr[oc + 1];
    for (i64 base = begin; base < end; base += BLOCK) {
      const int count = end - base < BLOCK ? int(end - base) : BLOCK;
      __syncthreads();  // the previous chunk has been read
      if (int(threadIdx.x) < count) {
        const i64 t = taps[base + threadIdx.x];
        const i64 c = t / RS;
        const int rs = int(t - c * RS);
        const int r = rs / S, s = rs - (rs / S) * S;
        tap_chan[threadIdx.x] = c;
        tap_dy[threadIdx.x] = r * C::DH - C::PH;
        tap_dx[threadIdx.x] = s * C::DW - C::PW;
        tap_w[threadIdx.x] = values[base + threadIdx.x];
      }
      __syncthreads();
      if (active) {
        for (int j = 0; j < count; ++j) {
          const i64 iy = iy0 + tap_dy[j], ix = ix0 + tap_dx[j];
          if (iy >= 0 && iy < p.h && ix >= 0 && ix < p.w)
            acc += A(tap_w[j]) * to_acc(xg[tap_chan[j] * in_plane + iy * p.w + ix]);
        }
      }
    }
    if (active) {
      if (bias != nullptr) acc += A(bias[oc]);
      const i64 at = (n * p.c_out + oc) * plane + oy * p.out_w + ox;
      if (residual != nullptr) acc += to_acc(residual[at]);
      if (C::ACT == 1) acc = acc > A(0) ? acc : A(0);
      out[at] = from_acc<T>(acc);
    }
  }
}

}  // namespace cuda
}  // namespace sparsejit
