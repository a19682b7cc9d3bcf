// The gather-GEMM-scatter core (csrc/point_conv) against a plain loop over pairs, both dataflows,
// float and double, with poisoned outputs, per-pair scales, bias, transposed weights,
// repeated out rows (RGMS-like), identity groups and empty / skewed structures.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "csrc/point_conv/point_conv_run.h"
#include "codegen/cpu_point_conv_spec.h"
#include "codegen/cpu_jit.h"
#include "csrc/core/isa.h"

namespace pc = sparsejit::point_conv;

namespace {

struct Structure {
  int64_t groups = 0, n_in = 0, n_out = 0, identity = -1;
  bool unique = true;
  std::vector<int64_t> group_ptr;
  std::vector<int32_t> in_idx, out_idx;
  std::vector<int64_t> row_ptr;
  std::vector<int32_t> row_pair, pair_group;

  pc::Pairs pairs() {
    row_ptr.resize(n_out + 1);
    row_pair.resize(in_idx.size());
    pair_group.resize(in_idx.size());
    pc::index_by_row(group_ptr.data(), groups, out_idx.data(), n_out, row_ptr.data(),
                      row_pair.data(), pair_group.data());
    pc::Pairs p;
    p.num_groups = groups;
    p.group_ptr = group_ptr.data();
    p.in_idx = in_idx.data();
    p.out_idx = out_idx.data();
    p.num_in = n_in;
    p.num_out = n_out;
    p.identity_group = identity;
    p.unique_out_per_group = unique;
    p.row_ptr = row_ptr.data();
    p.row_pair = row_pair.data();
    p.pair_group = pair_group.data();
    return p;
  }
};

// No pairs yet: group_ptr holds its leading 0.
Structure empty_structure(int64_t groups, int64_t n_in, int64_t n_out, bool unique) {
  Structure s;
  s.groups = groups;
  s.n_in = n_in;
  s.n_out = n_out;
  s.unique = unique;
  s.group_ptr.push_back(0);
  return s;
}

// Random groups; with `unique` each group's out rows are distinct (a random injection).
Structure random_structure(std::mt19937& rng, int64_t groups, int64_t n_in, int64_t n_out,
                           double density, bool unique, bool with_identity) {
  Structure s = empty_structure(groups, n_in, n_out, unique);
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t g = 0; g < groups; ++g) {
    if (with_identity && g == groups / 2) {
      s.identity = g;
      for (int64_t r = 0; r < n_in; ++r) s.in_idx.push_back(r), s.out_idx.push_back(r);
    } else if (n_in > 0) {
      std::uniform_int_distribution<int32_t> pick_in(0, static_cast<int32_t>(n_in - 1));
      for (int64_t o = 0; o < n_out; ++o) {
        const int reps = unique ? 1 : 3;
        for (int k = 0; k < reps; ++k)
          if (u(rng) < density) s.in_idx.push_back(pick_in(rng)), s.out_idx.push_back(o);
      }
    }
    s.group_ptr.push_back(static_cast<int64_t>(s.in_idx.size()));
  }
  return s;
}

template <typename T>
std::vector<T> random_vec(std::mt19937& rng, int64_t n) {
  std::normal_distribution<double> d(0, 1);
  std::vector<T> v(n);
  for (auto& e : v) e = static_cast<T>(d(rng));
  return v;
}

template <typename T>
std::vector<double> reference(const Structure& s, const std::vector<T>& x, int64_t ci,
                              const std::vector<T>& w, bool trans_w, int64_t co,
                              const std::vector<T>* scale, const std::vector<T>* bias) {
  std::vector<double> y(s.n_out * co, 0.0);
  for (int64_t o = 0; o < s.n_out && bias; ++o)
    for (int64_t j = 0; j < co; ++j) y[o * co + j] = (*bias)[j];
  for (int64_t g = 0; g < s.groups; ++g)
    for (int64_t p = s.group_ptr[g]; p < s.group_ptr[g + 1]; ++p)
      for (int64_t j = 0; j < co; ++j) {
        double acc = 0;
        for (int64_t c = 0; c < ci; ++c) {
          const double wv = trans_w ? w[(g * co + j) * ci + c] : w[(g * ci + c) * co + j];
          acc += static_cast<double>(x[s.in_idx[p] * ci + c]) * wv;
        }
        y[s.out_idx[p] * co + j] += acc * (scale ? static_cast<double>((*scale)[p]) : 1.0);
      }
  return y;
}

template <typename T>
void check_forward(Structure s, int64_t ci, int64_t co, bool trans_w, bool scaled, bool biased,
                   std::mt19937& rng) {
  auto p = s.pairs();
  ASSERT_EQ(pc::check_pairs(p), "");
  const auto x = random_vec<T>(rng, s.n_in * ci);
  const auto w = random_vec<T>(rng, s.groups * ci * co);
  const auto scale = random_vec<T>(rng, static_cast<int64_t>(s.in_idx.size()));
  const auto bias = random_vec<T>(rng, co);
  const auto ref = reference<T>(s, x, ci, w, trans_w, co, scaled ? &scale : nullptr,
                                biased ? &bias : nullptr);
  const double tol = std::is_same<T, float>::value ? 1e-4 : 1e-10;
  // Gather-GEMM-scatter runs two ways: with the row index (products buffered, then summed
  // per row) and without it (per-group scatter, the RGMS case without an index).
  pc::Pairs unindexed = p;
  unindexed.row_ptr = nullptr;
  unindexed.row_pair = nullptr;
  unindexed.pair_group = nullptr;
  for (int variant = 0; variant < 4; ++variant) {
    const pc::Dataflow d = variant == 1 ? pc::Dataflow::OutputStationary
                            : variant == 2 ? pc::Dataflow::Auto
                                           : pc::Dataflow::GatherGemmScatter;
    const pc::Pairs& pv = variant == 3 ? unindexed : p;
    std::vector<T> y(s.n_out * co, std::numeric_limits<T>::quiet_NaN());
    pc::PointConvArgs<T> a;
    a.x = x.data();
    a.c_in = ci;
    a.w = w.data();
    a.trans_w = trans_w;
    a.c_out = co;
    a.scale = scaled ? scale.data() : nullptr;
    a.bias = biased ? bias.data() : nullptr;
    a.y = y.data();
    const auto ran = pc::gather_gemm_scatter<T>(pv, a, d);
    if (d != pc::Dataflow::Auto) EXPECT_EQ(ran, d);
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_NEAR(y[i], ref[i], tol * (1 + std::abs(ref[i]) + ci))
          << pc::dataflow_name(d) << " variant " << variant << " entry " << i << " ci " << ci << " co " << co;
    // accumulate: Y += the same sum again
    a.accumulate = true;
    a.bias = nullptr;
    pc::gather_gemm_scatter<T>(pv, a, d);
    const double b0 = biased ? 1.0 : 0.0;
    for (size_t i = 0; i < y.size(); ++i) {
      const double twice = 2 * ref[i] - b0 * bias[i % co];
      ASSERT_NEAR(y[i], twice, 2 * tol * (1 + std::abs(twice) + ci)) << "accumulate " << i;
    }
  }
}

template <typename T>
void check_weight_grad(Structure s, int64_t ci, int64_t co, bool scaled, std::mt19937& rng,
                       pc::WgradPath path = pc::WgradPath::Auto) {
  auto p = s.pairs();
  const auto x = random_vec<T>(rng, s.n_in * ci);
  const auto dy = random_vec<T>(rng, s.n_out * co);
  const auto scale = random_vec<T>(rng, static_cast<int64_t>(s.in_idx.size()));
  std::vector<T> dw(s.groups * ci * co, std::numeric_limits<T>::quiet_NaN());
  pc::weight_grad<T>(p, x.data(), ci, dy.data(), co, scaled ? scale.data() : nullptr,
                      dw.data(), path);
  const double tol = std::is_same<T, float>::value ? 1e-4 : 1e-10;
  for (int64_t g = 0; g < s.groups; ++g)
    for (int64_t c = 0; c < ci; ++c)
      for (int64_t j = 0; j < co; ++j) {
        double ref = 0;
        for (int64_t q = s.group_ptr[g]; q < s.group_ptr[g + 1]; ++q)
          ref += static_cast<double>(x[s.in_idx[q] * ci + c]) * dy[s.out_idx[q] * co + j] *
                 (scaled ? static_cast<double>(scale[q]) : 1.0);
        const double got = dw[(g * ci + c) * co + j];
        ASSERT_NEAR(got, ref, tol * (1 + std::abs(ref)) * 10) << g << " " << c << " " << j;
      }
}

}  // namespace

TEST(PointConvRun, ForwardBothDataflowsFloatAndDouble) {
  std::mt19937 rng(1);
  for (int64_t co : {16, 32, 7, 64, 128}) {
    const int64_t ci = co == 7 ? 5 : co / 2 + 3;
    auto s = random_structure(rng, 27, 300, 300, 0.3, true, true);
    check_forward<float>(s, ci, co, false, false, true, rng);
    check_forward<double>(s, ci, co, false, false, false, rng);
  }
}

// Output-stationary rows JIT-compiled for (c_in, c_out): passes of at least 2^20
// multiply-adds load them. Checked against the reference (every variant of check_forward),
// and, at the ahead-of-time widths (c_out 16, 32, 64, 128), bit for bit against the
// ahead-of-time rows (JIT off).
template <typename T>
void check_os_jit_on(Structure s, int64_t ci, int64_t co, std::mt19937& rng) {
  namespace cg = sparsejit::codegen;
  auto& jit = cg::CpuJit::instance();
  if (!jit.enabled()) GTEST_SKIP() << "SPARSEJIT_JIT=0";
  auto p = s.pairs();
  ASSERT_GE(static_cast<int64_t>(s.in_idx.size()) * ci * co, int64_t(1) << 20);
  // With a per-pair scale the ahead-of-time rows run (the JIT's take none); without, the JIT's.
  check_forward<T>(s, ci, co, false, true, true, rng);
  check_forward<T>(s, ci, co, false, false, true, rng);
  cg::CpuPointConvSpec spec;
  spec.dtype = sizeof(T) == 4 ? sparsejit::ScalarKind::F32 : sparsejit::ScalarKind::F64;
  spec.c_in = ci;
  spec.c_out = co;
  spec.rows = pc::os_rows_together(p.num_groups, ci, co, sizeof(T));
  cg::JitInfo info;
  ASSERT_NE(jit.lookup(spec, &info), nullptr) << info.error;
  EXPECT_TRUE(info.memory_hit) << "the forward did not load " << spec.name();
  const auto x = random_vec<T>(rng, s.n_in * ci);
  const auto w = random_vec<T>(rng, s.groups * ci * co);
  const auto bias = random_vec<T>(rng, co);
  auto run = [&](bool relu) {
    std::vector<T> y(s.n_out * co, std::numeric_limits<T>::quiet_NaN());
    pc::PointConvArgs<T> a;
    a.x = x.data();
    a.c_in = ci;
    a.w = w.data();
    a.c_out = co;
    a.bias = bias.data();
    a.relu = relu;
    a.y = y.data();
    pc::gather_gemm_scatter<T>(p, a, pc::Dataflow::OutputStationary);
    return y;
  };
  for (bool relu : {false, true}) {
    const auto jitted = run(relu);
    setenv("SPARSEJIT_JIT", "0", 1);
    jit.refresh_env();
    const auto aot = run(relu);
    unsetenv("SPARSEJIT_JIT");
    jit.refresh_env();
    if (co == 16 || co == 32 || co == 64 || co == 128) {
      for (size_t i = 0; i < jitted.size(); ++i)
        ASSERT_EQ(jitted[i], aot[i]) << spec.name() << " relu " << relu << " entry " << i;
    } else {
      const double tol = std::is_same<T, float>::value ? 1e-4 : 1e-10;
      for (size_t i = 0; i < jitted.size(); ++i)
        ASSERT_NEAR(jitted[i], aot[i], tol * (1 + std::abs(aot[i]) + ci))
            << spec.name() << " " << i;
    }
    for (size_t i = 0; i < jitted.size(); ++i)
      if (relu) ASSERT_GE(jitted[i], T(0)) << i;
  }
}

template <typename T>
void check_os_jit(int64_t ci, int64_t co, std::mt19937& rng) {
  // About 1.5 x 2^20 multiply-adds: half the 26 non-centre offsets hit, plus the centre.
  const int64_t n = std::max<int64_t>(1000, 3 * (int64_t(1) << 20) / (28 * ci * co));
  check_os_jit_on<T>(random_structure(rng, 27, n, n, 0.5, true, true), ci, co, rng);
}

// Rows in twos whose groups match fully, alternate, repeat within a row (RGMS), or are
// empty on one side, and an odd last row: the rows taken together (AVX-512 JIT, weights
// well beyond L1) merge their groups; every outcome of the merge against the reference and, bit
// for bit, the one-row ahead-of-time rows.
Structure row_pair_structure(std::mt19937& rng, int64_t row_pairs) {
  const int64_t groups = 27, n = 2 * row_pairs + 1;
  std::vector<std::vector<int>> of_row(static_cast<size_t>(n));
  for (int64_t k = 0; k < row_pairs; ++k) {
    auto& a = of_row[size_t(2 * k)];
    auto& b = of_row[size_t(2 * k + 1)];
    // Seven kinds (two of them alike), so that blocks of four rows see every pair of kinds,
    // all four rows with every group among them.
    switch (k % 7) {
      case 0:
      case 6: for (int g = 0; g < groups; ++g) a.push_back(g), b.push_back(g); break;
      case 1: for (int g = 0; g < groups; ++g) (g % 2 ? b : a).push_back(g); break;
      case 2: b = {3, 13, 26}; break;
      case 3: a = {5, 5, 9}, b = {5, 9, 9, 9}; break;
      case 4: a = {1, 13}; break;
      case 5: a = {0, 4, 8, 26}, b = {2, 4, 6, 8, 10}; break;
      default: break;
    }
  }
  of_row[size_t(n - 1)] = {0, 13, 26};
  Structure s = empty_structure(groups, n, n, false);
  std::uniform_int_distribution<int32_t> pick_in(0, static_cast<int32_t>(n - 1));
  for (int g = 0; g < groups; ++g) {
    for (int64_t r = 0; r < n; ++r)
      for (int h : of_row[size_t(r)])
        if (h == g) s.in_idx.push_back(pick_in(rng)), s.out_idx.push_back(int32_t(r));
    s.group_ptr.push_back(static_cast<int64_t>(s.in_idx.size()));
  }
  return s;
}

TEST(PointConvRun, OutputStationaryRowsTogether) {
  std::mt19937 rng(12);
  for (auto [ci, co] : {std::pair<int64_t, int64_t>{64, 64}, {16, 16}, {9, 32}, {32, 128}}) {
    // At least 2^20 multiply-adds (the JIT's threshold): about 8 pairs per row.
    const int64_t row_pairs = std::max<int64_t>(600, (int64_t(1) << 21) / (16 * ci * co));
    auto s = row_pair_structure(rng, row_pairs);
    // 27 x 64 x 64 floats (432 KiB) are over four times any L1: rows are taken in fours.
    if (ci * co >= 64 * 64) EXPECT_EQ(pc::os_rows_together(s.groups, ci, co, 4), 4);
    check_os_jit_on<float>(s, ci, co, rng);
  }
  check_os_jit_on<double>(row_pair_structure(rng, 600), 32, 64, rng);
  check_os_jit_on<double>(row_pair_structure(rng, 2000), 16, 32, rng);
}

TEST(PointConvRun, OutputStationaryJit) {
  std::mt19937 rng(11);
  for (auto [ci, co] : {std::pair<int64_t, int64_t>{16, 16}, {4, 16}, {24, 40}, {64, 64},
                        {3, 8}, {5, 128}, {100, 24}})
    check_os_jit<float>(ci, co, rng);
  for (auto [ci, co] : {std::pair<int64_t, int64_t>{16, 16}, {7, 12}, {32, 32}})
    check_os_jit<double>(ci, co, rng);
}

// bfloat16 bits of a float, rounded to nearest even (NaN is not used here).
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// bfloat16 features through output_stationary_bf16, forward and (W transposed) the feature
// gradient's form: bit for bit the float32 rows on the widened features, rounded, whether the
// weights are declared bfloat16 (channel pairs on vdpbf16ps where the CPU has AVX512-BF16:
// rows alone and four together, an odd C_in) or not (float32 weights that bfloat16 cannot
// hold, which must not be rounded).
void check_os_bf16(Structure s, int64_t ci, int64_t co, std::mt19937& rng) {
  namespace cg = sparsejit::codegen;
  if (!cg::CpuJit::instance().enabled()) GTEST_SKIP() << "SPARSEJIT_JIT=0";
  auto p = s.pairs();
  ASSERT_GE(static_cast<int64_t>(s.in_idx.size()) * ci * co, int64_t(1) << 20);
  std::vector<uint16_t> xb(s.n_in * ci);
  for (auto& h : xb) h = to_bf16(random_vec<float>(rng, 1)[0]);
  std::vector<float> xw(xb.size());
  for (size_t i = 0; i < xb.size(); ++i) xw[i] = from_bf16(xb[i]);
  const auto bias = random_vec<float>(rng, co);
  for (bool trans : {false, true}) {
    for (bool exact : {true, false}) {
      auto w = random_vec<float>(rng, s.groups * ci * co);
      for (auto& v : w) v = exact ? from_bf16(to_bf16(v)) : v * (1.0f + 0x1p-12f);
      std::vector<float> wide(s.n_out * co, std::numeric_limits<float>::quiet_NaN());
      pc::PointConvArgs<float> a;
      a.x = xw.data();
      a.c_in = ci;
      a.w = w.data();
      a.trans_w = trans;
      a.c_out = co;
      a.bias = bias.data();
      a.y = wide.data();
      pc::gather_gemm_scatter<float>(p, a, pc::Dataflow::OutputStationary);
      std::vector<uint16_t> y(s.n_out * co, 0xffff);
      a.x = reinterpret_cast<const float*>(xb.data());
      a.y = reinterpret_cast<float*>(y.data());
      ASSERT_TRUE(pc::output_stationary_bf16(p, a, pc::Dataflow::OutputStationary, exact))
          << ci << " x " << co;
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_EQ(y[i], to_bf16(wide[i])) << ci << " x " << co << " trans " << trans
                                          << " bf16 weights " << exact << " entry " << i;
    }
  }
}

TEST(PointConvRun, OutputStationaryBfloat16Pairs) {
  std::mt19937 rng(21);
  if (!sparsejit::cpu_has_bf16_dot())
    std::printf("(no AVX512-BF16 here: the rows widen every channel; same bits expected)\n");
  for (auto [ci, co] : {std::pair<int64_t, int64_t>{64, 64}, {16, 16}, {5, 16}, {33, 32}}) {
    const int64_t row_pairs = std::max<int64_t>(600, (int64_t(1) << 21) / (16 * ci * co));
    check_os_bf16(row_pair_structure(rng, row_pairs), ci, co, rng);
  }
  const int64_t n = 3 * (int64_t(1) << 20) / (28 * 24 * 40);
  check_os_bf16(random_structure(rng, 27, n, n, 0.5, true, true), 24, 40, rng);
}

TEST(PointConvRun, TransposedWeightsScalesAndRepeatedOutRows) {
  std::mt19937 rng(2);
  auto s = random_structure(rng, 5, 200, 150, 0.5, false, false);  // RGMS-like
  check_forward<float>(s, 12, 16, true, true, false, rng);
  check_forward<double>(s, 9, 33, false, true, true, rng);
  // Swapped view (the backward pass for the features) of a conv-like structure.
  auto c = random_structure(rng, 8, 120, 90, 0.4, true, false);
  std::vector<int64_t> in_ptr(c.n_in + 1);
  std::vector<int32_t> in_pair(c.in_idx.size());
  Structure sw;
  sw.groups = c.groups;
  sw.n_in = c.n_out;
  sw.n_out = c.n_in;
  sw.unique = false;  // a random injection out -> in is not injective in -> out
  sw.group_ptr = c.group_ptr;
  sw.in_idx = c.out_idx;
  sw.out_idx = c.in_idx;
  check_forward<double>(sw, 6, 10, true, false, false, rng);
  auto fwd = c.pairs();
  pc::index_by_row(c.group_ptr.data(), c.groups, c.in_idx.data(), c.n_in, in_ptr.data(),
                    in_pair.data(), nullptr);
  const auto back = pc::swapped(fwd, in_ptr.data(), in_pair.data(), false);
  EXPECT_EQ(back.num_in, c.n_out);
  EXPECT_EQ(back.in_idx, c.out_idx.data());
  EXPECT_EQ(pc::check_pairs(back), "");
}

TEST(PointConvRun, EmptyOneElementAndSkewed) {
  std::mt19937 rng(3);
  check_forward<float>(random_structure(rng, 27, 0, 0, 0.5, true, false), 4, 16, false, false, true, rng);
  check_forward<float>(random_structure(rng, 27, 5, 7, 0.0, true, false), 4, 16, false, false, true, rng);
  check_forward<float>(random_structure(rng, 1, 1, 1, 1.0, true, true), 3, 2, false, false, true, rng);
  // skewed: one group holds nearly every pair, out rows 0 and 1 take most of the rest
  Structure s = random_structure(rng, 4, 3000, 3000, 0.0, true, false);
  for (int r = 0; r < 3000; ++r) s.in_idx.push_back(r), s.out_idx.push_back(r % 2999);
  s.unique = false;
  s.group_ptr = {0, 0, 3000, 3000, 3000};
  check_forward<float>(s, 16, 16, false, true, true, rng);
  check_forward<double>(s, 3, 5, true, false, false, rng);
  // skewed at 27 offsets of 64 x 64 (rows taken together in the JIT): row 0 holds 2000 pairs
  // of one offset, rows 1-2 a few, the other rows none
  Structure k = empty_structure(27, 600, 600, false);
  for (int64_t g = 0; g < 27; ++g) {
    const int reps = g == 13 ? 2000 : 3;
    for (int i = 0; i < reps; ++i) {
      k.in_idx.push_back(int32_t((g * 37 + i) % 600));
      k.out_idx.push_back(g == 13 ? 0 : 1 + i % 2);
    }
    k.group_ptr.push_back(static_cast<int64_t>(k.in_idx.size()));
  }
  check_forward<float>(k, 64, 64, false, true, true, rng);
}

TEST(PointConvRun, WeightGrad) {
  std::mt19937 rng(4);
  check_weight_grad<float>(random_structure(rng, 27, 200, 200, 0.3, true, true), 16, 16, false, rng);
  check_weight_grad<double>(random_structure(rng, 5, 100, 80, 0.5, false, false), 7, 9, true, rng);
  check_weight_grad<double>(random_structure(rng, 3, 0, 0, 0.5, true, false), 7, 9, false, rng);
  // Both paths, register-kernel widths and others, with and without the identity group.
  for (auto path : {pc::WgradPath::Registers, pc::WgradPath::Gemm})
    for (int64_t co : {16, 64, 9}) {
      check_weight_grad<float>(random_structure(rng, 27, 300, 300, 0.2, true, true), 24, co,
                               false, rng, path);
      check_weight_grad<double>(random_structure(rng, 8, 150, 120, 0.4, false, false), 32, co,
                                true, rng, path);
    }
}

// The cost model: output-stationary while the weights stay in L2; beyond that (128 -> 128
// channels, 27 offsets) gather-GEMM-scatter, unless its [M, c_out] products buffer is over
// twice the L3 cache.
// 27 offsets' group sizes and a row index, for the cost models (which read only the sizes).
struct SizesOnly {
  std::vector<int64_t> group_ptr = std::vector<int64_t>(28), row_ptr = {0, 0};
  std::vector<int32_t> dummy = {0};
  pc::Pairs with_pairs(int64_t m) {
    for (int64_t g = 0; g <= 27; ++g) group_ptr[size_t(g)] = m * g / 27;
    pc::Pairs p;
    p.num_groups = 27;
    p.group_ptr = group_ptr.data();
    p.row_ptr = row_ptr.data();
    p.row_pair = dummy.data();
    p.pair_group = dummy.data();
    return p;
  }
};

TEST(PointConvRun, DataflowFollowsWeightsAndProductsBuffer) {
  SizesOnly sizes;
  auto with_pairs = [&](int64_t m) { return sizes.with_pairs(m); };
  const int64_t l2 = sparsejit::cpu_l2_bytes(), l3 = sparsejit::cpu_l3_bytes();
  // 16 channels: output-stationary (the weights fit in any L2 the rule accepts)
  EXPECT_EQ(pc::choose_dataflow(with_pairs(50000), 16, 16, 4), pc::Dataflow::OutputStationary);
  // weights beyond half of L2 (and a buffer below 2 x L3): gather-GEMM-scatter
  const int64_t wide = 27 * 128 * 128 * 4 > l2 / 2 ? 128 : 512;
  EXPECT_EQ(pc::choose_dataflow(with_pairs(1000), wide, wide, 4), pc::Dataflow::GatherGemmScatter);
  if (l3 <= 0) GTEST_SKIP() << "the OS does not report an L3 cache";
  // weights in half of L2 at 32 and 64 channels: gather-GEMM-scatter while the [pairs, c_out]
  // products fit in L3, output-stationary beyond
  for (int64_t c : {int64_t(32), int64_t(64)}) {
    if (27 * c * c * 4 > l2 / 2) continue;
    const int64_t fit = l3 / (c * 4);  // pairs whose products just fit in L3
    EXPECT_EQ(pc::choose_dataflow(with_pairs(fit), c, c, 4), pc::Dataflow::GatherGemmScatter)
        << c;
    EXPECT_EQ(pc::choose_dataflow(with_pairs(fit + 1), c, c, 4), pc::Dataflow::OutputStationary)
        << c;
    // one side below 32 channels: output-stationary
    EXPECT_EQ(pc::choose_dataflow(with_pairs(fit), 16, c, 4), pc::Dataflow::OutputStationary);
  }
  if (27 * 128 * 128 * 4 <= l2 / 2) return;
  const int64_t over = 2 * l3 / (128 * 4) + 1;  // pairs whose products pass 2 x L3
  EXPECT_EQ(pc::choose_dataflow(with_pairs(over), 128, 128, 4), pc::Dataflow::OutputStationary);
  EXPECT_EQ(pc::choose_dataflow(with_pairs(over - 2), 128, 128, 4),
            pc::Dataflow::GatherGemmScatter);
}

// bfloat16: output-stationary where the float32 weights alone pick it (half of L2; no carve-out
// for gather-GEMM-scatter at 32 / 64 channels), and with bfloat16 weights also while those fit
// in L2 on a CPU with AVX512-BF16 (channel pairs).
TEST(PointConvRun, DataflowBfloat16PairsWhileWeightsFitL2) {
  SizesOnly sizes;
  pc::Pairs p = sizes.with_pairs(50000);
  const int64_t l2 = sparsejit::cpu_l2_bytes(), l3 = sparsejit::cpu_l3_bytes();
  for (int64_t c : {int64_t(32), int64_t(64), int64_t(128), int64_t(256)}) {
    const bool dram = l3 > 0 && 50000 * c * 4 > 2 * l3;
    const pc::Dataflow f32 = 27 * c * c * 4 <= l2 / 2 || dram ? pc::Dataflow::OutputStationary
                                                               : pc::Dataflow::GatherGemmScatter;
    EXPECT_EQ(pc::choose_dataflow_bf16(p, c, c, false), f32) << c;
    const bool pairs_fit = sparsejit::cpu_has_bf16_dot() &&
                           27 * c * c * 2 <= sparsejit::cpu_l2_bytes();
    EXPECT_EQ(pc::choose_dataflow_bf16(p, c, c, true),
              pairs_fit ? pc::Dataflow::OutputStationary : f32)
        << c << " channels, L2 " << sparsejit::cpu_l2_bytes();
  }
  // 256 channels (3.4 MiB of bfloat16 weights) stay with the float32 choice below a 4 MiB L2
  if (sparsejit::cpu_l2_bytes() < (4 << 20))
    EXPECT_EQ(pc::choose_dataflow_bf16(p, 256, 256, true), pc::Dataflow::GatherGemmScatter);
  // without a row index there are no output-stationary rows
  p.row_ptr = nullptr;
  EXPECT_EQ(pc::choose_dataflow_bf16(p, 64, 64, true), pc::Dataflow::GatherGemmScatter);
}

TEST(PointConvRun, CheckPairsRejectsBadStructures) {
  std::mt19937 rng(5);
  auto s = random_structure(rng, 4, 50, 50, 0.5, true, true);
  auto p = s.pairs();
  EXPECT_EQ(pc::check_pairs(p), "");
  s.in_idx[0] = 50;
  EXPECT_NE(pc::check_pairs(p).find("input index"), std::string::npos);
  s.in_idx[0] = 0;
  s.out_idx.back() = -1;
  EXPECT_NE(pc::check_pairs(p).find("output index"), std::string::npos);
  s.out_idx.back() = 0;
  s.group_ptr[2] = s.group_ptr[1] - 1;
  EXPECT_NE(pc::check_pairs(p).find("decreases"), std::string::npos);
}

// The ops' per-call check of both directions in one pass agrees with check_pairs run on each
// direction: valid structures (small and past the parallel threshold) pass, and every single
// corruption of an array either direction reads is reported.
TEST(PointConvRun, CheckPairsBothWaysMatchesEachDirection) {
  std::mt19937 rng(6);
  for (int64_t n : {int64_t(60), int64_t(40000)}) {
    auto s = random_structure(rng, 27, n, n, 0.1, true, true);
    auto p = s.pairs();
    std::vector<int64_t> in_ptr(n + 1);
    std::vector<int32_t> in_pair(s.in_idx.size());
    pc::index_by_row(s.group_ptr.data(), s.groups, s.in_idx.data(), n, in_ptr.data(),
                     in_pair.data(), nullptr);
    auto both = [&] { return pc::check_pairs_both_ways(p, in_ptr.data(), in_pair.data()); };
    auto each = [&] {
      const std::string a = pc::check_pairs(p, false);
      return a.empty() ? pc::check_pairs(pc::swapped(p, in_ptr.data(), in_pair.data(), true),
                                         false)
                       : a;
    };
    ASSERT_EQ(both(), "");
    ASSERT_EQ(each(), "");
    const int64_t m = static_cast<int64_t>(s.in_idx.size());
    std::uniform_int_distribution<int64_t> at(0, m - 1);
    // (array, bad value) for each array: out of range after the last valid value
    std::vector<std::pair<int32_t*, int32_t>> cases = {
        {&s.in_idx[at(rng)], int32_t(n)},       {&s.out_idx[at(rng)], -1},
        {&s.row_pair[at(rng)], int32_t(m)},     {&in_pair[at(rng)], -7},
        {&s.pair_group[at(rng)], int32_t(27)}};
    for (auto [slot, value] : cases) {
      const int32_t keep = *slot;
      *slot = value;
      EXPECT_NE(both(), "") << "n " << n << " value " << value;
      EXPECT_NE(each(), "") << "n " << n << " value " << value;
      *slot = keep;
    }
    for (auto* ptr : {&s.row_ptr, &in_ptr}) {
      const int64_t r = 1 + at(rng) % (n - 1);
      const int64_t keep = (*ptr)[r];
      (*ptr)[r] = (*ptr)[r + 1] + 1;  // decreasing
      EXPECT_NE(both(), "") << "n " << n << " row " << r;
      (*ptr)[r] = keep;
    }
    in_ptr[n] = m - 1;
    EXPECT_NE(both(), "");
    in_ptr[n] = m;
    ASSERT_EQ(both(), "");
  }
}
