// csrc/rgms without Torch: the typed structure's plan (build_plan, check_plan) and the
// forward / backward of every product path (oneDNN or built-in GEMM tiles, fused rows; each
// dataflow) against a plain float64 reference, outputs poisoned first, on random, empty,
// one-entry and skewed structures.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "csrc/rgms/rgms_plan.h"
#include "csrc/rgms/rgms_run.h"

namespace sparsejit::rgms {
namespace {

struct Typed {
  int64_t n_src = 0, n_dst = 0, r = 0;
  std::vector<int64_t> src, dst, etype;
};

Typed make(const char* kind, uint32_t seed) {
  std::mt19937 g(seed);
  Typed t;
  t.n_src = 37;
  t.n_dst = 29;
  t.r = 4;
  int64_t e = 300;
  if (std::string(kind) == "empty") e = 0;
  if (std::string(kind) == "one") e = 1;
  for (int64_t i = 0; i < e; ++i) {
    t.src.push_back(std::uniform_int_distribution<int64_t>(0, t.n_src - 1)(g));
    // skewed: nearly every entry goes to target 3 in relation 1
    const bool hub = std::string(kind) == "skewed" && i % 10 != 0;
    t.dst.push_back(hub ? 3 : std::uniform_int_distribution<int64_t>(0, t.n_dst - 1)(g));
    t.etype.push_back(hub ? 1 : std::uniform_int_distribution<int64_t>(0, t.r - 1)(g));
  }
  return t;
}

struct Plan {
  std::vector<int64_t> rel_ptr, grp_ptr, grp_dst, src, perm;
  int64_t g = 0;
  PlanView view(int64_t r) const {
    return {rel_ptr.data(), grp_ptr.data(), grp_dst.data(), src.data(), perm.data(), r,
            int64_t(src.size())};
  }
};

Plan plan_of(const Typed& t) {
  const int64_t e = int64_t(t.src.size());
  Plan p;
  p.rel_ptr.assign(t.r + 1, -1);
  p.grp_ptr.assign(e + 1, -1);
  p.grp_dst.assign(e, -1);
  p.src.assign(e, -1);
  p.perm.assign(e, -1);
  p.g = build_plan(t.src.data(), t.dst.data(), t.etype.data(), e, t.n_dst, t.r,
                   p.rel_ptr.data(), p.grp_ptr.data(), p.grp_dst.data(), p.src.data(),
                   p.perm.data());
  return p;
}

CheckResult check(const Plan& p, const Typed& t) {
  return check_plan(p.rel_ptr.data(), t.r, p.grp_ptr.data(), p.grp_dst.data(), p.src.data(),
                    p.perm.data(), int64_t(p.src.size()), t.n_dst, t.n_src);
}

// Y = sum_r norm_r(A_r) X W_r in float64 (mean: 1 / the target's entries in relation r).
std::vector<double> reference(const Typed& t, const std::vector<double>& x,
                              const std::vector<double>& w, const std::vector<double>& v,
                              int64_t fi, int64_t fo, bool mean) {
  const int64_t e = int64_t(t.src.size());
  std::vector<double> cnt(t.r * t.n_dst, 0.0), y(t.n_dst * fo, 0.0);
  for (int64_t i = 0; i < e; ++i) cnt[t.etype[i] * t.n_dst + t.dst[i]] += 1;
  for (int64_t i = 0; i < e; ++i) {
    const double c = v[i] / (mean ? cnt[t.etype[i] * t.n_dst + t.dst[i]] : 1.0);
    for (int64_t o = 0; o < fo; ++o) {
      double s = 0;
      for (int64_t k = 0; k < fi; ++k) s += x[t.src[i] * fi + k] * w[(t.etype[i] * fi + k) * fo + o];
      y[t.dst[i] * fo + o] += c * s;
    }
  }
  return y;
}

std::vector<double> randoms(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<double> d;
  std::vector<double> out(n);
  for (auto& z : out) z = d(g);
  return out;
}

TEST(RgmsPlan, BuildsAPlanCheckPlanAccepts) {
  for (const char* kind : {"random", "empty", "one", "skewed"}) {
    const Typed t = make(kind, 7);
    ASSERT_TRUE(check_typed_edges(t.src.data(), t.dst.data(), t.etype.data(),
                                  int64_t(t.src.size()), t.n_src, t.n_dst, t.r).ok);
    const Plan p = plan_of(t);
    const CheckResult ok = check(p, t);
    EXPECT_TRUE(ok.ok) << kind << ": " << ok.message;
    // Every entry appears once, in its group's relation and target.
    std::vector<int> seen(t.src.size(), 0);
    for (int64_t rel = 0; rel < t.r; ++rel)
      for (int64_t gi = p.rel_ptr[rel]; gi < p.rel_ptr[rel + 1]; ++gi)
        for (int64_t k = p.grp_ptr[gi]; k < p.grp_ptr[gi + 1]; ++k) {
          const int64_t edge = p.perm[k];
          ++seen[edge];
          EXPECT_EQ(t.etype[edge], rel);
          EXPECT_EQ(t.dst[edge], p.grp_dst[gi]);
          EXPECT_EQ(t.src[edge], p.src[k]);
        }
    for (int s : seen) EXPECT_EQ(s, 1) << kind;
  }
}

TEST(RgmsPlan, CheckPlanNamesWhatIsWrong) {
  const Typed t = make("random", 3);
  Plan bad = plan_of(t);
  bad.grp_dst[0] = t.n_dst;  // a target out of range
  EXPECT_FALSE(check(bad, t).ok);
  bad = plan_of(t);
  bad.src[5] = -1;  // a source out of range
  EXPECT_FALSE(check(bad, t).ok);
  bad = plan_of(t);
  bad.rel_ptr[1] = bad.rel_ptr[2] + 1;  // relations out of order
  EXPECT_FALSE(check(bad, t).ok);
  const std::vector<int64_t> bad_type = {0, 9};
  const std::vector<int64_t> two = {0, 1};
  const CheckResult r = check_typed_edges(two.data(), two.data(), bad_type.data(), 2, 5, 5, 4);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("edge_type[1] = 9"), std::string::npos) << r.message;
}

template <typename T>
std::vector<T> as(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

template <typename T>
void check_forward_backward(const char* kind, Gemm gemm, Strategy strategy, bool mean,
                            int64_t fi, int64_t fo) {
  const Typed t = make(kind, 11);
  const Plan p = plan_of(t);
  const int64_t e = int64_t(t.src.size());
  const auto x = randoms(t.n_src * fi, 1), w = randoms(t.r * fi * fo, 2);
  auto v = randoms(e, 3);  // per edge, in edge order (the kernels read values[perm[q]])
  for (auto& z : v) z = std::abs(z) + 0.1;
  Problem pr;
  pr.plan = p.view(t.r);
  pr.num_rows = t.n_dst;
  pr.num_src = t.n_src;
  pr.f_in = fi;
  pr.f_out = fo;
  pr.mean = mean;
  pr.gemm = gemm;
  pr.strategy = strategy;
  pr.num_threads = 2;
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const auto xt = as<T>(x), wt = as<T>(w), vt = as<T>(v);
  std::vector<T> y(t.n_dst * fo, nan);
  forward<T>(pr, xt.data(), wt.data(), vt.data(), y.data());
  const auto want = reference(t, x, w, v, fi, fo, mean);
  const double tol = sizeof(T) == 4 ? 1e-4 : 1e-10;
  for (size_t i = 0; i < y.size(); ++i)
    ASSERT_NEAR(double(y[i]), want[i], tol * (1 + std::abs(want[i])))
        << kind << " gemm " << int(gemm) << " strategy " << int(strategy) << " at " << i;
  // dX and dW of sum(Y * dY) against the reference's own derivatives (Y is linear in each).
  const auto dy = randoms(t.n_dst * fo, 4);
  const auto dyt = as<T>(dy);
  std::vector<T> dx(t.n_src * fi, nan), dw(t.r * fi * fo, nan);
  backward<T>(pr, xt.data(), wt.data(), vt.data(), dyt.data(), dx.data(), dw.data(), nullptr);
  auto dot = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
    const auto yy = reference(t, xx, ww, v, fi, fo, mean);
    double s = 0;
    for (size_t i = 0; i < yy.size(); ++i) s += yy[i] * dy[i];
    return s;
  };
  const double base = dot(x, w);
  for (int64_t i : {int64_t(0), t.n_src * fi / 2, t.n_src * fi - 1}) {
    auto x2 = x;
    x2[i] += 1.0;  // linear: the difference is the derivative
    ASSERT_NEAR(double(dx[i]), dot(x2, w) - base, 1e3 * tol * (1 + std::abs(base))) << kind;
  }
  for (int64_t i : {int64_t(0), t.r * fi * fo / 3, t.r * fi * fo - 1}) {
    auto w2 = w;
    w2[i] += 1.0;
    ASSERT_NEAR(double(dw[i]), dot(x, w2) - base, 1e3 * tol * (1 + std::abs(base))) << kind;
  }
  for (T z : dx) ASSERT_FALSE(std::isnan(double(z))) << "dX not fully written: " << kind;
  for (T z : dw) ASSERT_FALSE(std::isnan(double(z))) << "dW not fully written: " << kind;
}

TEST(RgmsRun, ForwardAndBackwardMatchTheReference) {
  for (const char* kind : {"random", "empty", "one", "skewed"})
    for (Gemm gemm : {Gemm::kAuto, Gemm::kOneDnn, Gemm::kBuiltin, Gemm::kFused})
      for (Strategy s : {Strategy::kAuto, Strategy::kAggregateFirst, Strategy::kTransformFirst})
        for (bool mean : {false, true}) {
          check_forward_backward<float>(kind, gemm, s, mean, 12, 7);
          check_forward_backward<double>(kind, gemm, s, mean, 5, 16);
        }
}

}  // namespace
}  // namespace sparsejit::rgms
