// Kernel-level checks of the CUDA filter-sparse convolution (kernels/cuda/filter_conv.cuh),
// shared by the host emulation and the GPU run (cuda_kernel_checks.h, check_spec): random
// pruned weights at several densities (with an all-zero output channel, an all-zero weight,
// a dense one), groups, batch > 1, images from the smallest the kernel allows to a few tiles,
// bias and no bias, with and without a residual added before the activation; outputs poisoned with guard bands and compared with a plain float64
// direct convolution.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "codegen/cuda_filter_conv.h"

namespace sparsejit::codegen::checks {

struct FilterConvCase {
  const char* name;
  int64_t batch, c_in, c_out, groups, h, w;  // h / w < 0: the smallest image the kernel allows
  double density;
  bool bias;
  int64_t zero_channel;  // an output channel with no taps, or -1
  bool residual = false;  // a residual of the output's shape, added before the activation
};

inline void check_filter_conv_case(Runner& r, const CudaFilterConvSpec& s, const FilterConvCase& fc,
                                   uint64_t seed) {
  SCOPED_TRACE(s.name() + " on " + fc.name);
  r.reset();
  const auto& k = s.conv;
  const int64_t min_h = std::max<int64_t>(1, int64_t(k.dil_h) * (k.r - 1) + 1 - 2 * k.pad_h);
  const int64_t min_w = std::max<int64_t>(1, int64_t(k.dil_w) * (k.s - 1) + 1 - 2 * k.pad_w);
  const int64_t H = fc.h < 0 ? min_h : std::max(fc.h, min_h);
  const int64_t W = fc.w < 0 ? min_w : std::max(fc.w, min_w);
  const int64_t OH = (H + 2 * k.pad_h - int64_t(k.dil_h) * (k.r - 1) - 1) / k.stride_h + 1;
  const int64_t OW = (W + 2 * k.pad_w - int64_t(k.dil_w) * (k.s - 1) - 1) / k.stride_w + 1;
  const int64_t cin_g = fc.c_in / fc.groups, cout_g = fc.c_out / fc.groups;
  const int64_t cols = cin_g * k.r * k.s;

  // The pruned weight, compressed per output channel (taps increasing, as filter_conv_plan).
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1), v(-1, 1);
  std::vector<int64_t> rowptr{0}, taps;
  std::vector<float> values;
  for (int64_t oc = 0; oc < fc.c_out; ++oc) {
    for (int64_t t = 0; t < cols; ++t) {
      if (oc == fc.zero_channel || u(rng) >= fc.density) continue;
      taps.push_back(t);
      values.push_back(float(v(rng)));
    }
    rowptr.push_back(int64_t(taps.size()));
  }
  const int64_t nnz = int64_t(taps.size());
  Typed<int64_t> d_rowptr(fc.c_out + 1), d_taps(nnz);
  Typed<float> d_values(nnz), d_bias(fc.c_out);
  for (int64_t i = 0; i <= fc.c_out; ++i) d_rowptr.set(i, rowptr[i]);
  for (int64_t e = 0; e < nnz; ++e) {
    d_taps.set(e, taps[e]);
    d_values.set(e, values[e]);
  }
  for (int64_t oc = 0; oc < fc.c_out; ++oc) d_bias.set(oc, float(v(rng)));
  Buffer x(s.dtype, fc.batch * fc.c_in * H * W), out(s.dtype, fc.batch * fc.c_out * OH * OW);
  Buffer res(s.dtype, fc.residual ? fc.batch * fc.c_out * OH * OW : 1);
  fill_random(&x, seed + 1);
  fill_random(&res, seed + 2);
  d_rowptr.upload(r);
  d_taps.upload(r);
  d_values.upload(r);
  d_bias.upload(r);
  x.upload(r);
  out.upload(r);
  res.upload(r);
  cuda::FilterConvParams p{d_rowptr.dev(), d_taps.dev(), d_values.dev(), x.dev(),
                           fc.bias ? d_bias.dev() : nullptr, out.dev(),
                           fc.batch, fc.c_in, H, W, fc.c_out, OH, OW, cin_g, cout_g,
                           fc.residual ? res.dev() : nullptr};
  const auto launches = plan_filter_conv_launch(s, fc.batch * OH * OW, fc.c_out);
  ASSERT_EQ(r.run(s, launches, &p), "");
  out.download(r);

  int bad = 0;
  for (int64_t n = 0; n < fc.batch; ++n)
    for (int64_t oc = 0; oc < fc.c_out; ++oc)
      for (int64_t oy = 0; oy < OH; ++oy)
        for (int64_t ox = 0; ox < OW && bad < 5; ++ox) {
          double ref = fc.bias ? double(d_bias.get(oc)) : 0.0, mag = std::abs(ref);
          const int64_t g = oc / cout_g;
          for (int64_t e = rowptr[oc]; e < rowptr[oc + 1]; ++e) {
            const int64_t c = taps[e] / (k.r * k.s), ky = taps[e] / k.s % k.r, kx = taps[e] % k.s;
            const int64_t iy = oy * k.stride_h + ky * k.dil_h - k.pad_h;
            const int64_t ix = ox * k.stride_w + kx * k.dil_w - k.pad_w;
            if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
            const double term = double(values[e]) * x.get(((n * fc.c_in + g * cin_g + c) * H + iy) * W + ix);
            ref += term;
            mag += std::abs(term);
          }
          if (fc.residual) {
            const double rv = res.get(((n * fc.c_out + oc) * OH + oy) * OW + ox);
            ref += rv;
            mag += std::abs(rv);
          }
          if (s.act == Act::Relu) ref = std::max(ref, 0.0);
          const double got = out.get(((n * fc.c_out + oc) * OH + oy) * OW + ox);
          if (!(std::abs(got - ref) <= tolerance(s.dtype) * (1 + mag))) {
            ADD_FAILURE() << "y[" << n << ", " << oc << ", " << oy << ", " << ox << "] = " << got
                          << ", expected " << ref;
            ++bad;
          }
        }
  EXPECT_TRUE(out.guards_intact());
}

inline void check_filter_conv(Runner& r, const CudaFilterConvSpec& s) {
  const FilterConvCase cases[] = {
      {"batch 2, 30% dense, a zero channel", 2, 5, 7, 1, 9, 11, 0.3, true, 2},
      {"groups 2, dense, tiny image", 1, 4, 6, 2, -1, -1, 1.0, false, -1},
      {"all-zero weight", 3, 3, 3, 1, 6, 5, 0.0, true, -1},
      {"5% dense, many channels, 1x1 image", 2, 16, 20, 1, 1, 1, 0.05, false, 0},
      {"depthwise, 60% dense", 2, 6, 6, 6, 8, 7, 0.6, true, -1},
      {"wide channels, 50% dense (taps in several chunks)", 1, 24, 9, 1, 10, 12, 0.5, true, 4},
      {"residual, bias, 30% dense", 2, 8, 6, 1, 7, 9, 0.3, true, 1, true},
      {"residual, no bias, groups 2", 1, 4, 6, 2, 5, 5, 0.5, false, -1, true},
  };
  uint64_t seed = 71;
  for (const auto& fc : cases) check_filter_conv_case(r, s, fc, seed += 10);
}

}  // namespace sparsejit::codegen::checks
