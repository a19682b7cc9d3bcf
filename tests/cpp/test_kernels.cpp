// Generic CPU kernels against a plain double-precision reference, outputs poisoned first.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <limits>

#include "csrc/spmm/spmm_plan.h"
#include "kernels/cpu/attention_kernel.h"
#include "kernels/cpu/kernels.h"
#include "tests/cpp/test_util.h"

namespace sparsejit {
namespace {

// Exercise the multi-threaded partitions even on tiny inputs.
struct ParallelEverywhere : ::testing::Environment {
  void SetUp() override { cpu::set_min_parallel_work(0); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new ParallelEverywhere);

using testing::Csr;
using testing::random_csr;
using testing::random_vec;

struct SpmmRef {
  std::vector<double> out;
  std::vector<int64_t> arg;
};

SpmmRef spmm_reference(const Csr<int64_t>& a, const std::vector<double>& vals, int64_t vh,
                       const std::vector<double>& x, int64_t H, int64_t F, Reduce r) {
  SpmmRef ref;
  const int64_t HF = H * F;
  ref.out.assign(a.rows * HF, 0.0);
  ref.arg.assign(a.rows * HF, -1);
  for (int64_t i = 0; i < a.rows; ++i) {
    const int64_t deg = a.rowptr[i + 1] - a.rowptr[i];
    for (int64_t h = 0; h < H; ++h)
      for (int64_t f = 0; f < F; ++f) {
        double acc = r == Reduce::Max ? -INFINITY : (r == Reduce::Min ? INFINITY : 0.0);
        int64_t best = -1;
        for (int64_t p = a.rowptr[i]; p < a.rowptr[i + 1]; ++p) {
          const double v = (vh == 0 ? 1.0 : vals[p * vh + (vh > 1 ? h : 0)]) *
                           x[a.col[p] * HF + h * F + f];
          if (r == Reduce::Sum || r == Reduce::Mean) acc += v;
          if ((r == Reduce::Max && v > acc) || (r == Reduce::Min && v < acc)) {
            acc = v;
            best = p;
          }
        }
        if (r == Reduce::Mean && deg > 0) acc /= static_cast<double>(deg);
        if ((r == Reduce::Max || r == Reduce::Min) && deg == 0) acc = 0.0;
        ref.out[i * HF + h * F + f] = acc;
        ref.arg[i * HF + h * F + f] = best;
      }
  }
  return ref;
}

template <typename T>
std::vector<T> cast(const std::vector<double>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = T(static_cast<float>(v[i]));
  if constexpr (std::is_same_v<T, double>)
    for (size_t i = 0; i < v.size(); ++i) out[i] = v[i];
  return out;
}

template <typename T>
double tol() {
  if constexpr (std::is_same_v<T, double>) return 1e-10;
  if constexpr (std::is_same_v<T, float>) return 1e-4;
  return 3e-2;
}

template <typename T, typename I>
void check_spmm(const Csr<int64_t>& a64, int64_t H, int64_t F, int64_t vh, Reduce r, int threads,
                uint64_t seed) {
  Csr<I> a;
  a.rows = a64.rows;
  a.cols = a64.cols;
  a.rowptr.assign(a64.rowptr.begin(), a64.rowptr.end());
  a.col.assign(a64.col.begin(), a64.col.end());
  auto xd = random_vec(a.cols * H * F, seed);
  auto vd = random_vec(a.nnz() * std::max<int64_t>(vh, 1), seed + 1);
  if constexpr (std::is_same_v<T, bf16>) {  // compare against what the kernel really sees
    for (auto& v : xd) v = static_cast<float>(bf16(static_cast<float>(v)));
    for (auto& v : vd) v = static_cast<float>(bf16(static_cast<float>(v)));
  }
  auto x = cast<T>(xd);
  auto vals = cast<T>(vd);
  // Poison the output and leave a guard band behind it.
  const size_t n_out = a.rows * H * F, guard = 16;
  std::vector<T> out(n_out + guard, T(std::numeric_limits<float>::quiet_NaN()));
  std::vector<int64_t> arg(n_out + guard, 777777);
  cpu::SpmmArgs args;
  args.rows = a.rows;
  args.heads = H;
  args.features = F;
  args.value_heads = vh;
  args.reduce = r;
  args.num_threads = threads;
  args.min_parallel_work = cpu::min_parallel_work();
  cpu::spmm<T, I>(args, a.rowptr.data(), a.col.data(), vh ? vals.data() : nullptr, x.data(),
                  out.data(), arg.data());
  auto ref = spmm_reference(a64, vd, vh, xd, H, F, r);
  double scale = 1.0;
  for (double v : ref.out) scale = std::max(scale, std::abs(v));
  for (size_t k = 0; k < n_out; ++k) {
    const double got = static_cast<double>(out[k]);
    ASSERT_FALSE(std::isnan(got)) << "unwritten output " << k << " reduce " << reduce_name(r);
    ASSERT_NEAR(got, ref.out[k], tol<T>() * scale) << "at " << k << " reduce " << reduce_name(r);
    if ((r == Reduce::Max || r == Reduce::Min) && !std::is_same_v<T, bf16>)
      ASSERT_EQ(arg[k], ref.arg[k]) << "arg at " << k;
  }
  for (size_t k = n_out; k < n_out + guard; ++k) {
    ASSERT_TRUE(std::isnan(static_cast<double>(out[k]))) << "wrote past the end";
    ASSERT_EQ(arg[k], 777777) << "wrote past the end of arg";
  }
}

struct Shape {
  int64_t rows, cols;
  double avg;
  bool power_law;
};

class SpmmKernel : public ::testing::TestWithParam<Shape> {};

TEST_P(SpmmKernel, AllReducesValueModesAndThreads) {
  const Shape s = GetParam();
  uint64_t seed = 11;
  for (Reduce r : {Reduce::Sum, Reduce::Mean, Reduce::Max, Reduce::Min}) {
    auto a = random_csr<int64_t>(s.rows, s.cols, s.avg, s.power_law, seed++);
    for (int threads : {1, 2, 5}) {
      for (int64_t F : {1, 7, 32}) {
        check_spmm<float, int32_t>(a, 1, F, 0, r, threads, seed++);
        check_spmm<float, int64_t>(a, 1, F, 1, r, threads, seed++);
        check_spmm<double, int64_t>(a, 2, F, 2, r, threads, seed++);
        check_spmm<double, int32_t>(a, 3, F, 1, r, threads, seed++);
        check_spmm<bf16, int32_t>(a, 1, F, 1, r, threads, seed++);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SpmmKernel,
                         ::testing::Values(Shape{0, 0, 0, false}, Shape{1, 1, 1, false},
                                           Shape{1, 300, 200, false}, Shape{300, 1, 0.5, false},
                                           Shape{40, 30, 0.3, false},  // mostly empty rows
                                           Shape{200, 150, 6, false}, Shape{500, 400, 8, true}));

// One row holds almost every entry: the pieces must share it and combine correctly.
TEST(SpmmKernel, OneHugeRowIsShared) {
  Csr<int64_t> a;
  a.rows = 6;
  a.cols = 50;
  a.rowptr = {0, 1, 1, 20001, 20002, 20002, 20005};
  a.col.resize(20005);
  for (size_t p = 0; p < a.col.size(); ++p) a.col[p] = static_cast<int64_t>((p * 7) % 50);
  for (Reduce r : {Reduce::Sum, Reduce::Mean, Reduce::Max, Reduce::Min})
    for (int threads : {2, 3, 8}) check_spmm<double, int64_t>(a, 1, 4, 1, r, threads, 5);
}

TEST(SpmmKernel, ZeroFeatures) {
  auto a = random_csr<int64_t>(20, 20, 3, false, 3);
  check_spmm<float, int64_t>(a, 1, 0, 1, Reduce::Sum, 2, 1);
  check_spmm<float, int64_t>(a, 1, 0, 1, Reduce::Max, 2, 1);
}

// A bucketed plan (rows regrouped by length) run by the generic kernel through its row map:
// every output row written exactly once (poisoned output, guard band), the reference's
// values, and extremum positions that map back to the reference's CSR positions.
void check_bucketed(const Csr<int64_t>& a, int max_log2, int64_t F, Reduce r, int threads,
                    uint64_t seed) {
  const int64_t nnz = a.nnz();
  std::vector<int64_t> words(plan::bucketed_plan_words(a.rows, nnz));
  plan::build_bucketed_plan<int64_t>(a.rowptr.data(), a.col.data(), a.rows, a.cols, max_log2,
                                     0, words.data());
  plan::SpmmPlan p;
  std::string err;
  const auto stamp = plan::stamp_structure(a.rowptr.data(), a.col.data(), a.rows, a.cols);
  ASSERT_TRUE(plan::decode(words.data(), static_cast<int64_t>(words.size()), stamp, &p, &err))
      << err;
  // Rows come bucket by bucket: non-decreasing length up to the cap, each output row once.
  std::vector<int> seen(a.rows, 0);
  for (int64_t k = 0; k < a.rows; ++k) ++seen[p.row_map[k]];
  for (int64_t i = 0; i < a.rows; ++i) ASSERT_EQ(seen[i], 1);
  auto x = random_vec(a.cols * F, seed);
  auto vals = random_vec(nnz, seed + 1);
  std::vector<double> pvals(nnz);
  for (int64_t q = 0; q < nnz; ++q) pvals[q] = vals[p.pos[q]];
  const size_t n_out = a.rows * F, guard = 16;
  std::vector<double> out(n_out + guard, NAN);
  std::vector<int64_t> arg(n_out + guard, 777777);
  cpu::SpmmArgs args;
  args.rows = a.rows;
  args.features = F;
  args.value_heads = 1;
  args.reduce = r;
  args.num_threads = threads;
  args.min_parallel_work = 0;
  args.out_rows = p.row_map;
  cpu::spmm<double, int64_t>(args, p.rowptr, p.col, pvals.data(), x.data(), out.data(),
                             arg.data());
  auto ref = spmm_reference(a, vals, 1, x, 1, F, r);
  for (size_t k = 0; k < n_out; ++k) {
    ASSERT_FALSE(std::isnan(out[k])) << "unwritten output " << k;
    ASSERT_NEAR(out[k], ref.out[k], 1e-10) << "at " << k << " reduce " << reduce_name(r);
    if (r == Reduce::Max || r == Reduce::Min)
      ASSERT_EQ(arg[k] < 0 ? -1 : p.pos[arg[k]], ref.arg[k]) << "arg at " << k;
  }
  for (size_t k = n_out; k < n_out + guard; ++k) ASSERT_TRUE(std::isnan(out[k]));
}

TEST(SpmmKernel, BucketedPlanThroughRowMap) {
  uint64_t seed = 21;
  for (auto s : {Shape{0, 0, 0, false}, Shape{1, 1, 1, false}, Shape{40, 30, 0.3, false},
                 Shape{300, 200, 5, true}, Shape{200, 150, 12, false}}) {
    auto a = random_csr<int64_t>(s.rows, s.cols, s.avg, s.power_law, seed++);
    for (int max_log2 : {0, 2, 5})
      for (Reduce r : {Reduce::Sum, Reduce::Mean, Reduce::Max, Reduce::Min})
        for (int threads : {1, 3}) check_bucketed(a, max_log2, 9, r, threads, seed++);
  }
}

template <typename T>
void check_sddmm(const Csr<int64_t>& a, int64_t H, int64_t F, int threads, uint64_t seed) {
  auto qd = random_vec(a.rows * H * F, seed), kd = random_vec(a.cols * H * F, seed + 1);
  auto q = cast<T>(qd), k = cast<T>(kd);
  std::vector<T> s(a.nnz() * H + 8, T(NAN));
  cpu::sddmm<T, int64_t>(a.rows, H, F, a.rowptr.data(), a.col.data(), q.data(), k.data(),
                         s.data(), threads);
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t p = a.rowptr[i]; p < a.rowptr[i + 1]; ++p)
      for (int64_t h = 0; h < H; ++h) {
        double ref = 0;
        for (int64_t f = 0; f < F; ++f)
          ref += static_cast<double>(q[i * H * F + h * F + f]) *
                 static_cast<double>(k[a.col[p] * H * F + h * F + f]);
        ASSERT_NEAR(static_cast<double>(s[p * H + h]), ref, tol<T>() * (1 + std::abs(ref)) * 4);
      }
  for (int64_t g = a.nnz() * H; g < a.nnz() * H + 8; ++g)
    ASSERT_TRUE(std::isnan(static_cast<double>(s[g])));
}

TEST(SddmmKernel, MatchesReference) {
  for (auto s : {Shape{0, 0, 0, false}, Shape{1, 1, 1, false}, Shape{100, 80, 5, false},
                 Shape{400, 300, 10, true}}) {
    auto a = random_csr<int64_t>(s.rows, s.cols, s.avg, s.power_law, 7);
    for (int threads : {1, 2, 5}) {
      check_sddmm<float>(a, 1, 16, threads, 1);
      check_sddmm<double>(a, 4, 3, threads, 2);
      check_sddmm<bf16>(a, 2, 8, threads, 3);
    }
  }
}

TEST(EdgeSoftmaxKernel, RowsSumToOneAndBackwardMatchesFormula) {
  auto a = random_csr<int64_t>(300, 200, 6, true, 9);
  const int64_t H = 3;
  auto s = random_vec(a.nnz() * H, 4), g = random_vec(a.nnz() * H, 5);
  std::vector<double> y(a.nnz() * H, NAN), gs(a.nnz() * H, NAN);
  cpu::edge_softmax<double, int64_t>(a.rows, H, a.rowptr.data(), s.data(), y.data(), 2);
  cpu::edge_softmax_backward<double, int64_t>(a.rows, H, a.rowptr.data(), y.data(), g.data(),
                                              gs.data(), 2);
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t h = 0; h < H; ++h) {
      double m = -INFINITY, z = 0, dot = 0;
      for (int64_t p = a.rowptr[i]; p < a.rowptr[i + 1]; ++p) m = std::max(m, s[p * H + h]);
      for (int64_t p = a.rowptr[i]; p < a.rowptr[i + 1]; ++p) z += std::exp(s[p * H + h] - m);
      for (int64_t p = a.rowptr[i]; p < a.rowptr[i + 1]; ++p) {
        const double ref = std::exp(s[p * H + h] - m) / z;
        ASSERT_NEAR(y[p * H + h], ref, 1e-12);
        dot += ref * g[p * H + h];
      }
      for (int64_t p = a.rowptr[i]; p < a.rowptr[i + 1]; ++p)
        ASSERT_NEAR(gs[p * H + h], y[p * H + h] * (g[p * H + h] - dot), 1e-12);
    }
}

}  // namespace
}  // namespace sparsejit

// The eight-lane exp of the attention softmax (attention_kernel.h) gives the scalar
// soft_exp's bits in every lane: random arguments over the whole range, both cut-offs and
// their neighbours, the subnormal results, zeros, infinities and NaN.
TEST(AttentionSoftExp, EightLanesMatchTheScalar) {
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, 88.72283f, 88.7228f, 88.72284f, 89.0f,
                           -103.9f, -103.89f, -103.91f, -87.3f, -100.0f, -150.0f, 1e-30f,
                           -1e-30f, std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-110.0f, 95.0f), small(-2.0f, 2.0f);
  for (int r = 0; r < 20000; ++r) xs.push_back(r % 2 ? u(rng) : small(rng));
  for (float x = -104.0f; x < 89.0f; x += 0.3711f) xs.push_back(x);
  while (xs.size() % 8) xs.push_back(0.5f);
  for (size_t t = 0; t < xs.size(); t += 8) {
    sparsejit::attention::exp_f8 in, out;
    for (int l = 0; l < 8; ++l) in[l] = xs[t + l];
    sparsejit::attention::soft_exp8(in, out);
    for (int l = 0; l < 8; ++l) {
      const float want = sparsejit::attention::soft_exp(xs[t + l]);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(out[l])) << xs[t + l];
      } else {
        uint32_t a, b;
        const float got = out[l];
        std::memcpy(&a, &got, 4);
        std::memcpy(&b, &want, 4);
        EXPECT_EQ(a, b) << "x = " << xs[t + l];
      }
    }
  }
}

// The vector helpers of the JIT's attention passes against the scalar code they replace:
// soft_exp_lanes on four lanes gives soft_exp's bits; head_sums / head_dots give lane_sum's
// bits per head (its order: eight partial sums, a fixed tree, "+ 0"), for 1, 2, 4 and 8 heads,
// with -0, infinities, NaN and large cancelling terms among the products.
namespace {
template <int64_t kH, int64_t kD>
void check_head_dots(std::mt19937& rng) {
  namespace at = sparsejit::attention;
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  const float special[] = {-0.0f, 0.0f, 1e30f, -1e30f, std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x(kH * kD), y(kH * kD);
    for (auto& v : x) v = u(rng);
    for (auto& v : y) v = u(rng);
    if (trial % 4 == 1) {  // a few special products
      for (int s = 0; s < 3; ++s) x[rng() % x.size()] = special[rng() % 6];
    } else if (trial % 4 == 2) {  // every product -0: the sum must come out +0
      for (int64_t t = 0; t < kH * kD; ++t) {
        x[t] = -0.0f;
        y[t] = 1.0f;
      }
    }
    const auto got = at::head_dots<kH, kD>(x.data(), y.data());
    for (int64_t h = 0; h < kH; ++h) {
      const float want = at::lane_sum<kD, float>(
          kD, [&](int64_t d) { return x[h * kD + d] * y[h * kD + d]; });
      const float g = got[h];
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(g)) << "H " << kH << " D " << kD << " head " << h;
        continue;
      }
      uint32_t a, b;
      std::memcpy(&a, &g, 4);
      std::memcpy(&b, &want, 4);
      EXPECT_EQ(a, b) << "H " << kH << " D " << kD << " head " << h << ": " << g << " vs "
                      << want;
    }
  }
}
}  // namespace

TEST(AttentionLanes, HeadDotsAndFourLaneExpMatchTheScalar) {
  std::mt19937 rng(11);
  check_head_dots<1, 8>(rng);
  check_head_dots<2, 16>(rng);
  check_head_dots<4, 16>(rng);
  check_head_dots<4, 32>(rng);
  check_head_dots<8, 8>(rng);
  check_head_dots<8, 64>(rng);
  namespace at = sparsejit::attention;
  using V4 = at::F32Lanes<4>;
  using I4 = at::I32Lanes<4>;
  std::uniform_real_distribution<float> u(-110.0f, 95.0f);
  std::vector<float> xs = {0.0f, -0.0f, 88.72284f, -103.91f, -150.0f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
  for (int r = 0; r < 4000; ++r) xs.push_back(u(rng));
  for (size_t t = 0; t + 4 <= xs.size(); t += 4) {
    V4 in, out;
    for (int l = 0; l < 4; ++l) in[l] = xs[t + l];
    at::soft_exp_lanes<V4, I4>(in, out);
    for (int l = 0; l < 4; ++l) {
      const float want = at::soft_exp(xs[t + l]), got = out[l];
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << xs[t + l];
        continue;
      }
      uint32_t a, b;
      std::memcpy(&a, &got, 4);
      std::memcpy(&b, &want, 4);
      EXPECT_EQ(a, b) << "x = " << xs[t + l];
    }
  }
}
