// csrc/dense/gemm.h against a plain triple loop in double, every transpose combination,
// leading dimensions wider than the matrices, beta = 0 over a NaN-poisoned C, empty shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "csrc/dense/gemm.h"

namespace dn = sparsejit::dense;

namespace {

struct Case {
  int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
};

template <typename T, typename Fn>
void check_case(const Case& cs, Fn gemm, double tol, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  const int64_t pad = 3;
  const int64_t a_rows = cs.ta ? cs.k : cs.m, a_cols = cs.ta ? cs.m : cs.k;
  const int64_t b_rows = cs.tb ? cs.n : cs.k, b_cols = cs.tb ? cs.k : cs.n;
  const int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = cs.n + pad;
  std::vector<T> a(std::max<int64_t>(1, a_rows * lda)), b(std::max<int64_t>(1, b_rows * ldb));
  std::vector<T> c(std::max<int64_t>(1, cs.m * ldc));
  for (auto& v : a) v = T(u(rng));
  for (auto& v : b) v = T(u(rng));
  for (auto& v : c) v = cs.beta == 0 ? std::numeric_limits<T>::quiet_NaN() : T(u(rng));
  const std::vector<T> c0 = c;
  gemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, T(cs.alpha), a.data(), lda, b.data(), ldb, T(cs.beta),
       c.data(), ldc);
  for (int64_t i = 0; i < cs.m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const T got = c[i * ldc + j];
      if (j >= cs.n) {  // padding columns must be untouched
        const T was = c0[i * ldc + j];
        ASSERT_TRUE((std::isnan(got) && std::isnan(was)) || got == was) << i << "," << j;
        continue;
      }
      double ref = 0;
      for (int64_t p = 0; p < cs.k; ++p) {
        const double av = cs.ta ? a[p * lda + i] : a[i * lda + p];
        const double bv = cs.tb ? b[j * ldb + p] : b[p * ldb + j];
        ref += av * bv;
      }
      ref = cs.alpha * ref + (cs.beta == 0 ? 0.0 : cs.beta * double(c0[i * ldc + j]));
      ASSERT_NEAR(double(got), ref, tol * (1 + std::abs(ref)))
          << "m=" << cs.m << " n=" << cs.n << " k=" << cs.k << " ta=" << cs.ta << " tb=" << cs.tb
          << " at (" << i << "," << j << ")";
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const int64_t shapes[][3] = {{0, 5, 3}, {4, 0, 3}, {3, 4, 0}, {1, 1, 1},  {7, 13, 5},
                               {16, 16, 16}, {33, 70, 19}, {128, 64, 32}, {5, 130, 257}};
  for (auto& s : shapes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        out.push_back({s[0], s[1], s[2], bool(ta), bool(tb), 1.0f, 0.0f});
        out.push_back({s[0], s[1], s[2], bool(ta), bool(tb), -0.5f, 1.0f});
        out.push_back({s[0], s[1], s[2], bool(ta), bool(tb), 2.0f, 0.25f});
      }
  return out;
}

}  // namespace

TEST(DenseGemm, SgemmMatchesReference) {
  std::mt19937 rng(1);
  for (const Case& cs : cases()) check_case<float>(cs, dn::sgemm, 2e-5, rng);
}

TEST(DenseGemm, BuiltinSgemmMatchesReference) {
  std::mt19937 rng(2);
  for (const Case& cs : cases()) check_case<float>(cs, dn::sgemm_builtin, 2e-5, rng);
}

TEST(DenseGemm, DgemmMatchesReference) {
  std::mt19937 rng(3);
  for (const Case& cs : cases()) check_case<double>(cs, dn::dgemm, 1e-12, rng);
}

TEST(DenseGemm, BadArgumentsThrow) {
  float x[4] = {0, 0, 0, 0};
  EXPECT_THROW(dn::sgemm(false, false, -1, 1, 1, 1.f, x, 1, x, 1, 0.f, x, 1), std::invalid_argument);
  EXPECT_THROW(dn::sgemm(false, false, 2, 2, 2, 1.f, x, 1, x, 2, 0.f, x, 2), std::invalid_argument);
  EXPECT_THROW(dn::sgemm(false, false, 2, 2, 2, 1.f, x, 2, x, 2, 0.f, x, 1), std::invalid_argument);
  EXPECT_THROW(dn::dgemm(false, true, 1, 3, 2, 1.0, nullptr, 2, nullptr, 1, 0.0, nullptr, 3),
               std::invalid_argument);
}

TEST(DenseGemm, BackendIsNamed) {
  const std::string name = dn::gemm_backend();
#ifdef SPARSEJIT_EXPECT_ONEDNN
  EXPECT_EQ(name.rfind("onednn", 0), 0u) << name;
#endif
  EXPECT_FALSE(name.empty());
}

// oneDNN's bfloat16 GEMM (where it runs natively): bfloat16 operands, float32 accumulation,
// against a double loop over the same bfloat16 values, every transpose and beta, padded
// leading dimensions, a NaN-poisoned C under beta = 0, and the padding left untouched.
TEST(DenseGemm, Bf16GemmMatchesReference) {
  if (!dn::gemm_bf16_native()) GTEST_SKIP() << "no native bfloat16 GEMM here";
  std::mt19937 rng(4);
  for (const Case& cs : cases()) {
    // check_case's reference reads its float a and b: round them to bfloat16 in place
    // first, so both sides multiply the same values.
    auto rounded = [](bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                      float* c, int64_t ldc) {
      const int64_t a_len = (ta ? k : m) * lda, b_len = (tb ? n : k) * ldb;
      std::vector<sparsejit::bf16> ab(std::max<int64_t>(1, a_len)), bb(std::max<int64_t>(1, b_len));
      for (int64_t i = 0; i < a_len; ++i) {
        ab[i] = sparsejit::bf16(a[i]);
        const_cast<float*>(a)[i] = float(ab[i]);
      }
      for (int64_t i = 0; i < b_len; ++i) {
        bb[i] = sparsejit::bf16(b[i]);
        const_cast<float*>(b)[i] = float(bb[i]);
      }
      dn::gemm_bf16(ta, tb, m, n, k, alpha, ab.data(), lda, bb.data(), ldb, beta, c, ldc);
    };
    check_case<float>(cs, rounded, 2e-5, rng);
  }
  float x[4] = {0, 0, 0, 0};
  sparsejit::bf16 h[4] = {};
  EXPECT_THROW(dn::gemm_bf16(false, false, 2, 2, 2, 1.f, h, 1, h, 2, 0.f, x, 2),
               std::invalid_argument);
}
