// Filter-sparse convolution kernels (csrc/filter_conv) against a direct float64 convolution, every
// tile variant forced, outputs poisoned with NaN beforehand so an unwritten pixel fails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "csrc/filter_conv/filter_conv_run.h"

namespace fs = sparsejit::filter_conv;

namespace {

struct Case {
  int64_t batch, c_in, h, w, c_out, groups, r, s, stride, pad, dil;
  double density;
};

std::vector<double> reference(const fs::Geometry& g, const std::vector<float>& wt,
                              const std::vector<float>& x, const std::vector<float>& bias,
                              bool relu) {
  const int64_t oh = g.out_h(), ow = g.out_w(), cin_g = g.c_in / g.groups;
  const int64_t cout_g = g.c_out / g.groups;
  std::vector<double> y(g.batch * g.c_out * oh * ow);
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t o = 0; o < g.c_out; ++o)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double a = bias.empty() ? 0.0 : bias[o];
          for (int64_t c = 0; c < cin_g; ++c)
            for (int64_t r = 0; r < g.r; ++r)
              for (int64_t s = 0; s < g.s; ++s) {
                const int64_t hi = i * g.stride_h - g.pad_h + r * g.dil_h;
                const int64_t wi = j * g.stride_w - g.pad_w + s * g.dil_w;
                if (hi < 0 || wi < 0 || hi >= g.h || wi >= g.w) continue;
                const int64_t ci = (o / cout_g) * cin_g + c;
                a += double(wt[((o * cin_g + c) * g.r + r) * g.s + s]) *
                     x[((n * g.c_in + ci) * g.h + hi) * g.w + wi];
              }
          if (relu && a < 0) a = 0;
          y[((n * g.c_out + o) * oh + i) * ow + j] = a;
        }
  return y;
}

fs::Geometry geometry(const Case& k) {
  fs::Geometry g;
  g.batch = k.batch; g.c_in = k.c_in; g.h = k.h; g.w = k.w; g.c_out = k.c_out;
  g.groups = k.groups; g.r = k.r; g.s = k.s;
  g.stride_h = g.stride_w = k.stride;
  g.pad_h = g.pad_w = k.pad;
  g.dil_h = g.dil_w = k.dil;
  return g;
}

// A random weight of the case's density, compressed; `p` points into the vectors.
struct RandomWeight {
  std::vector<float> wt, vals;
  std::vector<int64_t> rowptr, taps;
  fs::Pattern p;
  int64_t nnz = 0;
  RandomWeight(const fs::Geometry& g, double density, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const int64_t cols = g.taps_per_channel();
    wt.resize(g.c_out * cols);
    for (auto& v : wt) v = (u(rng) + 1.f) / 2.f < density ? u(rng) : 0.f;
    nnz = fs::count_kept(wt.data(), g.c_out, cols, 0.f);
    rowptr.resize(g.c_out + 1);
    taps.resize(nnz);
    vals.resize(nnz);
    fs::compress(wt.data(), g.c_out, cols, 0.f, rowptr.data(), taps.data(), vals.data());
    p = fs::Pattern{rowptr.data(), taps.data(), vals.data(), g.c_out, cols};
  }
  RandomWeight(const RandomWeight&) = delete;
};

void run_case(const Case& k, bool relu, bool with_bias, unsigned seed, bool jit) {
  const fs::Geometry g = geometry(k);
  ASSERT_EQ(fs::check_geometry(g), "");
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const RandomWeight rw(g, k.density, rng);
  const std::vector<float>& wt = rw.wt;
  const fs::Pattern& p = rw.p;
  const int64_t nnz = rw.nnz;
  std::vector<float> x(g.batch * g.c_in * g.h * g.w);
  for (auto& v : x) v = u(rng);
  std::vector<float> bias;
  if (with_bias) {
    bias.resize(g.c_out);
    for (auto& v : bias) v = u(rng);
  }
  ASSERT_EQ(fs::check_pattern(p, nnz), "");
  const auto want = reference(g, wt, x, bias, relu);
  for (int64_t v = 0; v < fs::kNumVariants; ++v) {
    if (!jit && (v == int64_t(fs::Variant::Jit) || v == int64_t(fs::Variant::JitBaked))) continue;
    std::vector<float> y(want.size(), NAN);
    fs::forward(g, p, x.data(), bias.empty() ? nullptr : bias.data(), relu,
                static_cast<fs::Variant>(v), y.data());
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_NEAR(y[i], want[i], 1e-4 * (1 + std::fabs(want[i])))
          << "variant " << fs::variant_name(static_cast<fs::Variant>(v)) << " at " << i;
    }
  }
  // A residual of the output's shape, added after the bias and before the ReLU: the
  // reference's pre-activation values plus the residual, every precompiled variant.
  {
    const auto pre = reference(g, wt, x, bias, false);
    std::vector<float> res(want.size());
    for (auto& v : res) v = u(rng);
    for (int64_t v = 1; v < fs::kNumVariants; ++v) {
      if (v == int64_t(fs::Variant::Jit) || v == int64_t(fs::Variant::JitBaked)) continue;
      std::vector<float> y(want.size(), NAN);
      fs::forward(g, p, x.data(), bias.empty() ? nullptr : bias.data(), relu,
                  static_cast<fs::Variant>(v), y.data(), res.data());
      for (size_t i = 0; i < y.size(); ++i) {
        double e = pre[i] + res[i];
        if (relu && e < 0) e = 0;
        ASSERT_NEAR(y[i], e, 1e-4 * (1 + std::fabs(e)))
            << "residual, variant " << fs::variant_name(static_cast<fs::Variant>(v)) << " at "
            << i;
      }
    }
  }
  // A batch runs as one set of tiles (a 1x1's tiles may span images): every image gets the
  // same bits as when it runs alone.
  if (g.batch > 1) {
    std::vector<float> all(want.size(), NAN);
    fs::forward(g, p, x.data(), bias.empty() ? nullptr : bias.data(), relu, fs::Variant::Generic,
                all.data());
    fs::Geometry one = g;
    one.batch = 1;
    const int64_t in_img = g.c_in * g.h * g.w, out_img = int64_t(want.size()) / g.batch;
    for (int64_t n = 0; n < g.batch; ++n) {
      std::vector<float> y(out_img, NAN);
      fs::forward(one, p, x.data() + n * in_img, bias.empty() ? nullptr : bias.data(), relu,
                  fs::Variant::Generic, y.data());
      ASSERT_EQ(std::memcmp(y.data(), all.data() + n * out_img, sizeof(float) * out_img), 0)
          << "image " << n << " differs from its batch's";
    }
  }
  if (!jit) return;  // (compiles cost ~0.3-2 s each: once per case)
  // The JIT variants add the same products in the same order as the precompiled loop of the
  // same tile (explicit FMA in both): bit-identical, and really compiled where they can be.
  const fs::Variant tile = fs::choose_variant(g, nnz);
  std::vector<float> base(want.size(), NAN);
  fs::forward(g, p, x.data(), bias.empty() ? nullptr : bias.data(), relu, fs::Variant::Generic,
              base.data());
  EXPECT_EQ(fs::prepare(g, p, fs::Variant::Generic)->block_fn, nullptr);
  for (fs::Variant v : {fs::Variant::Jit, fs::Variant::JitBaked, fs::Variant::Auto}) {
    const auto prepared = fs::prepare(g, p, v);
    EXPECT_EQ(prepared->variant, tile);
    if (nnz > 0 && fs::cpu_has_avx2_fma()) {
      EXPECT_NE(prepared->block_fn, nullptr) << fs::variant_name(v) << " was not compiled";
    }
    std::vector<float> y(want.size(), NAN);
    fs::forward(*prepared, g, p, x.data(), bias.empty() ? nullptr : bias.data(), relu, y.data());
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_EQ(std::memcmp(&y[i], &base[i], sizeof(float)), 0)
          << fs::variant_name(v) << " differs from " << fs::variant_name(tile) << " at " << i
          << ": " << y[i] << " vs " << base[i];
    }
  }
}

}  // namespace

TEST(FilterConv, GeometriesAndVariants) {
  const Case cases[] = {
      {1, 4, 9, 9, 5, 1, 1, 1, 1, 0, 1, 0.5},      // 1x1 in place, partial last tile
      {2, 16, 8, 8, 8, 1, 1, 1, 1, 0, 1, 0.3},     // 1x1, 64 pixels (whole tiles)
      {2, 5, 11, 11, 7, 1, 3, 3, 2, 1, 1, 0.3},    // 3x3 stride 2
      {1, 6, 13, 10, 5, 1, 3, 3, 1, 1, 1, 0.5},    // 3x3 pad 1, non-square
      {3, 8, 7, 7, 9, 1, 3, 3, 1, 1, 1, 0.2},      // 7x7 planes
      {1, 3, 20, 20, 4, 1, 7, 7, 2, 3, 1, 0.4},    // stem-like 7x7 stride 2
      {1, 6, 12, 12, 6, 3, 3, 3, 1, 2, 2, 0.6},    // groups 3, dilation 2
      {2, 8, 9, 9, 8, 8, 3, 3, 1, 1, 1, 0.9},      // depthwise
      {1, 10, 6, 6, 12, 2, 1, 1, 2, 0, 1, 0.4},    // 1x1 stride 2 (downsample), groups 2
      {1, 1, 5, 5, 3, 1, 3, 3, 1, 0, 1, 1.0},      // single input channel, dense
      {1, 4, 5, 5, 3, 1, 3, 3, 1, 1, 1, 0.0},      // all-zero weight: bias only
      {1, 3, 1, 1, 2, 1, 1, 1, 1, 0, 1, 0.7},      // one pixel
      {1, 64, 10, 10, 40, 1, 3, 3, 1, 1, 1, 0.1},  // several input-channel chunks
      {3, 12, 7, 7, 10, 1, 1, 1, 1, 0, 1, 0.3},    // 1x1, 49 pixels: tiles span images
      {5, 8, 6, 6, 6, 2, 1, 1, 2, 0, 1, 0.5},      // strided 1x1, 9 pixels, groups: spans
      {4, 300, 9, 9, 20, 1, 1, 1, 1, 0, 1, 0.05},  // 1x1, 81 pixels, chunks, spans images
      {2, 6, 7, 7, 4, 1, 1, 1, 1, 1, 1, 0.5},      // padded 1x1 (dropped columns): no span
  };
  unsigned seed = 1;
  for (const auto& k : cases) {
    SCOPED_TRACE(::testing::Message() << "case c_in=" << k.c_in << " h=" << k.h << " r=" << k.r
                                      << " stride=" << k.stride << " groups=" << k.groups);
    run_case(k, false, false, seed++, false);
    run_case(k, true, true, seed++, true);
  }
}

// Outputs written with non-temporal stores (every output when the threshold is 1) hold the
// same bits as with plain stores, for tiles within one image, across images, partial tiles,
// residual and ReLU, and rows that do not start on a cache line.
TEST(FilterConv, StreamedOutputsMatchPlainStores) {
  const Case cases[] = {
      {3, 12, 7, 7, 10, 1, 1, 1, 1, 0, 1, 0.3},     // 49 pixels: tiles span images
      {2, 16, 9, 9, 24, 1, 1, 1, 1, 0, 1, 0.4},     // 81 pixels: rows off the line
      {2, 32, 16, 16, 40, 1, 1, 1, 1, 0, 1, 0.2},   // whole 64-pixel tiles
      {2, 8, 10, 10, 16, 2, 1, 1, 2, 0, 1, 0.5},    // strided, groups
  };
  unsigned seed = 77;
  for (const auto& k : cases) {
    const fs::Geometry g = geometry(k);
    std::mt19937 rng(seed++);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const RandomWeight rw(g, k.density, rng);
    const fs::Pattern& p = rw.p;
    std::vector<float> x(g.batch * g.c_in * g.h * g.w), bias(g.c_out);
    for (auto& v : x) v = u(rng);
    for (auto& v : bias) v = u(rng);
    const int64_t n_out = g.batch * g.c_out * g.out_h() * g.out_w();
    std::vector<float> res(n_out);
    for (auto& v : res) v = u(rng);
    const float* no_residual = nullptr;
    for (const float* r : {no_residual, static_cast<const float*>(res.data())}) {
      for (bool relu : {false, true}) {
        const int64_t before = fs::set_stream_output_bytes(std::numeric_limits<int64_t>::max());
        std::vector<float> plain(n_out, NAN), streamed(n_out + 3, NAN);
        fs::forward(g, p, x.data(), bias.data(), relu, fs::Variant::Generic, plain.data(), r);
        fs::set_stream_output_bytes(1);
        EXPECT_EQ(fs::stream_output_bytes(), 1);
        // one float past a line start, so that rows begin inside cache lines
        float* out = streamed.data() + 1;
        fs::forward(g, p, x.data(), bias.data(), relu, fs::Variant::Generic, out, r);
        fs::set_stream_output_bytes(before);
        ASSERT_EQ(std::memcmp(plain.data(), out, sizeof(float) * n_out), 0)
            << "c_in=" << k.c_in << " h=" << k.h << " relu=" << relu
            << " residual=" << (r != nullptr);
        EXPECT_TRUE(std::isnan(streamed[0]) && std::isnan(streamed[n_out + 1]));
      }
    }
  }
}

// bfloat16 x, residual and y: the float32 forward on the widened values, each output rounded
// once (the same bits), every variant, tiles within and across images, residual and ReLU;
// y poisoned beforehand, one guard element past its end.
TEST(FilterConv, Bfloat16IoMatchesFloat32Rounded) {
  using sparsejit::bf16;
  const Case cases[] = {
      {1, 4, 9, 9, 5, 1, 1, 1, 1, 0, 1, 0.5},      // 1x1 in place, partial last tile
      {3, 12, 7, 7, 10, 1, 1, 1, 1, 0, 1, 0.3},    // 1x1, tiles span images
      {5, 8, 6, 6, 6, 2, 1, 1, 2, 0, 1, 0.5},      // strided 1x1, groups
      {2, 5, 11, 11, 7, 1, 3, 3, 2, 1, 1, 0.3},    // 3x3 stride 2
      {1, 6, 12, 12, 6, 3, 3, 3, 1, 2, 2, 0.6},    // groups 3, dilation 2
      {1, 64, 10, 10, 40, 1, 3, 3, 1, 1, 1, 0.1},  // several input-channel chunks
      {1, 3, 1, 1, 2, 1, 1, 1, 1, 0, 1, 0.7},      // one pixel
      {1, 4, 5, 5, 3, 1, 3, 3, 1, 1, 1, 0.0},      // all-zero weight
  };
  unsigned seed = 301;
  for (const auto& k : cases) {
    const fs::Geometry g = geometry(k);
    std::mt19937 rng(seed++);
    std::uniform_real_distribution<float> u(-4.f, 4.f);
    const RandomWeight rw(g, k.density, rng);
    const int64_t n_in = g.batch * g.c_in * g.h * g.w;
    const int64_t n_out = g.batch * g.c_out * g.out_h() * g.out_w();
    std::vector<bf16> xb(n_in), rb(n_out);
    std::vector<float> xf(n_in), rf(n_out), bias(g.c_out);
    for (int64_t i = 0; i < n_in; ++i) xf[i] = float(xb[i] = bf16(u(rng)));
    for (int64_t i = 0; i < n_out; ++i) rf[i] = float(rb[i] = bf16(u(rng)));
    for (auto& v : bias) v = u(rng);
    for (int64_t v = 0; v < fs::kNumVariants; ++v) {
      if (v == int64_t(fs::Variant::Auto)) continue;
      const auto P = fs::prepare(g, rw.p, static_cast<fs::Variant>(v));
      for (bool res : {false, true}) {
        for (bool relu : {false, true}) {
          std::vector<float> yf(n_out, NAN);
          fs::forward(*P, g, rw.p, xf.data(), bias.data(), relu, yf.data(),
                      res ? rf.data() : nullptr);
          std::vector<uint16_t> yb(n_out + 1, 0xffff);  // bfloat16 NaN poison, a guard
          fs::forward(*P, g, rw.p, xb.data(), bias.data(), relu,
                      reinterpret_cast<bf16*>(yb.data()), res ? rb.data() : nullptr);
          for (int64_t i = 0; i < n_out; ++i)
            ASSERT_EQ(yb[i], bf16(yf[i]).bits)
                << "c_in=" << k.c_in << " r=" << k.r << " variant=" << fs::variant_name(
                       static_cast<fs::Variant>(v)) << " residual=" << res << " relu=" << relu
                << " at " << i;
          EXPECT_EQ(yb[n_out], 0xffff);
        }
      }
    }
  }
}

TEST(FilterConv, PatternAndGeometryErrors) {
  fs::Geometry g;
  g.batch = 1; g.c_in = 6; g.h = g.w = 5; g.c_out = 4; g.groups = 4;
  EXPECT_NE(fs::check_geometry(g).find("groups"), std::string::npos);
  g.groups = 1; g.r = g.s = 7;
  EXPECT_NE(fs::check_geometry(g).find("smaller than the dilated kernel"), std::string::npos);
  int64_t rowptr[3] = {0, 2, 1};
  int64_t taps[2] = {0, 1};
  float vals[2] = {1, 1};
  fs::Pattern p{rowptr, taps, vals, 2, 4};
  EXPECT_NE(fs::check_pattern(p, 2).find("decrease"), std::string::npos);
  int64_t rowptr2[3] = {0, 2, 2};
  int64_t taps2[2] = {3, 1};
  fs::Pattern p2{rowptr2, taps2, vals, 2, 4};
  EXPECT_NE(fs::check_pattern(p2, 2).find("increase"), std::string::npos);
  int64_t taps3[2] = {1, 9};
  fs::Pattern p3{rowptr2, taps3, vals, 2, 4};
  EXPECT_NE(fs::check_pattern(p3, 2).find("out of range"), std::string::npos);
}
