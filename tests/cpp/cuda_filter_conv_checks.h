// Kernel-level checks of the filter-sparse convolution's CUDA kernel
// (kernels/cuda/filter_conv.cuh), included by cuda_kernel_checks.h: random images and pruned
// weights (several densities, an all-zero output channel, an all-zero weight, groups), the
// spec's geometry, poisoned outputs with guard bands, and a float64 direct-convolution
// reference.
#pragma once

#include <cstdint>
#include <random>

namespace sparsejit::codegen::checks {

inline void check_filter_conv(Runner& r, const CudaKernelSpec& s) {
  struct Case {
    int64_t batch, c_in, h, w, c_out, groups;
    double density;
    bool bias, relu;
  };
  const Case cases[] = {{2, 6, 9, 11, 5, 1, 0.3, true, false},
                        {1, 4, 1, 1, 3, 1, 0.8, false, true},    // a 1x1 image
                        {3, 8, 7, 6, 4, 2, 0.5, true, true},     // groups
                        {1, 3, 5, 5, 2, 1, 0.0, true, false},    // every weight pruned
                        {2, 5, 13, 4, 6, 1, 0.05, false, false}};  // very sparse
  const int64_t R = s.conv_r, S = s.conv_s;
  int round = 0;
  for (const Case& k : cases) {
    SCOPED_TRACE(s.name() + " case " + std::to_string(round));
    r.reset();
    const int64_t oh = (k.h + 2 * s.conv_ph - s.conv_dh * (R - 1) - 1) / s.conv_sh + 1;
    const int64_t ow = (k.w + 2 * s.conv_pw - s.conv_dw * (S - 1) - 1) / s.conv_sw + 1;
    ++round;
    if (oh < 1 || ow < 1) continue;  // the geometry does not fit this image
    const int64_t cin_g = k.c_in / k.groups, cout_g = k.c_out / k.groups, cols = cin_g * R * S;
    std::mt19937_64 rng(100 + round);
    std::uniform_real_distribution<double> u(-1, 1), keep(0, 1);
    std::vector<double> wd(k.c_out * cols, 0.0);
    for (auto& v : wd)
      if (keep(rng) < k.density) v = u(rng);
    for (int64_t t = 0; t < cols; ++t) wd[1 % k.c_out * cols + t] = 0;  // an empty channel
    Typed<int64_t> rowptr(k.c_out + 1);
    std::vector<int64_t> taps;
    std::vector<float> vals;
    rowptr.set(0, 0);
    for (int64_t oc = 0; oc < k.c_out; ++oc) {
      for (int64_t t = 0; t < cols; ++t)
        if (wd[oc * cols + t] != 0) {
          taps.push_back(t);
          vals.push_back(float(wd[oc * cols + t]));
          wd[oc * cols + t] = double(float(wd[oc * cols + t]));
        }
      rowptr.set(oc + 1, int64_t(taps.size()));
    }
    const int64_t nnz = int64_t(taps.size());
    Typed<int64_t> tp(nnz);
    Buffer vb(CudaScalar::F32, nnz), x(CudaScalar::F32, k.batch * k.c_in * k.h * k.w),
        bias(CudaScalar::F32, k.c_out), y(CudaScalar::F32, k.batch * k.c_out * oh * ow);
    for (int64_t e = 0; e < nnz; ++e) {
      tp.set(e, taps[e]);
      vb.set(e, vals[e]);
    }
    fill_random(&x, 7 + round);
    fill_random(&bias, 9 + round);
    for (Bytes* b : std::initializer_list<Bytes*>{&rowptr, &tp, &vb, &x, &bias, &y}) b->upload(r);
    cuda::FilterConvParams p{};
    p.rowptr = rowptr.dev();
    p.taps = tp.dev();
    p.values = vb.dev();
    p.x = x.dev();
    p.bias = k.bias ? bias.dev() : nullptr;
    p.y = y.dev();
    p.batch = k.batch, p.c_in = k.c_in, p.h = k.h, p.w = k.w, p.c_out = k.c_out;
    p.cin_g = cin_g, p.cout_g = cout_g, p.out_h = oh, p.out_w = ow, p.relu = k.relu;
    ASSERT_EQ(r.run(s, {plan_filter_conv_launch(s, k.batch, k.c_out, oh * ow)}, &p), "");
    y.download(r);
    int bad = 0;
    for (int64_t n = 0; n < k.batch; ++n)
      for (int64_t oc = 0; oc < k.c_out; ++oc)
        for (int64_t i = 0; i < oh; ++i)
          for (int64_t j = 0; j < ow && bad < 5; ++j) {
            double acc = k.bias ? bias.get(oc) : 0.0;
            const int64_t g = oc / cout_g;
            for (int64_t c = 0; c < cin_g; ++c)
              for (int64_t a = 0; a < R; ++a)
                for (int64_t b = 0; b < S; ++b) {
                  const int64_t iy = i * s.conv_sh - s.conv_ph + a * s.conv_dh;
                  const int64_t ix = j * s.conv_sw - s.conv_pw + b * s.conv_dw;
                  if (iy < 0 || iy >= k.h || ix < 0 || ix >= k.w) continue;
                  acc += wd[oc * cols + (c * R + a) * S + b] *
                         x.get(((n * k.c_in + g * cin_g + c) * k.h + iy) * k.w + ix);
                }
            if (k.relu && acc < 0) acc = 0;
            const double got = y.get(((n * k.c_out + oc) * oh + i) * ow + j);
            if (!(std::abs(got - acc) <= 1e-4 * (1 + std::abs(acc)))) {
              ADD_FAILURE() << "y[" << n << ", " << oc << ", " << i << ", " << j << "] = " << got
                            << ", expected " << acc;
              ++bad;
            }
          }
    EXPECT_TRUE(y.guards_intact());
  }
}

}  // namespace sparsejit::codegen::checks
