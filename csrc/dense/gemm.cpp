// TEMPORARY built-in GEMM (replaced by main's oneDNN-backed csrc/dense at merge): row loop
// over C, i-p-j order so the innermost loop streams a row of B and C (vectorizes); parallel
// over rows of C outside an OpenMP region.
#include "csrc/dense/gemm.h"

#include <omp.h>

namespace sparsejit::dense {
namespace {

template <typename T>
inline __attribute__((always_inline)) void gemm_rows(bool ta, bool tb, int64_t r0, int64_t r1,
                                                     int64_t n, int64_t k, T alpha, const T* a,
                                                     int64_t lda, const T* b, int64_t ldb,
                                                     T beta, T* c, int64_t ldc) {
  for (int64_t i = r0; i < r1; ++i) {
    T* ci = c + i * ldc;
    if (beta == T(0)) {
      for (int64_t j = 0; j < n; ++j) ci[j] = T(0);
    } else if (beta != T(1)) {
      for (int64_t j = 0; j < n; ++j) ci[j] *= beta;
    }
    for (int64_t p = 0; p < k; ++p) {
      const T av = alpha * (ta ? a[p * lda + i] : a[i * lda + p]);
      if (!tb) {
        const T* bp = b + p * ldb;
        for (int64_t j = 0; j < n; ++j) ci[j] += av * bp[j];
      } else {
        for (int64_t j = 0; j < n; ++j) ci[j] += av * b[j * ldb + p];
      }
    }
  }
}

template <typename T>
inline __attribute__((always_inline)) void gemm(bool ta, bool tb, int64_t m, int64_t n,
                                                int64_t k, T alpha, const T* a, int64_t lda,
                                                const T* b, int64_t ldb, T beta, T* c,
                                                int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (omp_in_parallel() || m * n * k < (int64_t{1} << 16)) {
    gemm_rows<T>(ta, tb, 0, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t r0 = m * t / nt, r1 = m * (t + 1) / nt;
    gemm_rows<T>(ta, tb, r0, r1, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

}  // namespace

__attribute__((target_clones("arch=x86-64-v3", "default"))) void sgemm(
    bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm<float>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

__attribute__((target_clones("arch=x86-64-v3", "default"))) void dgemm(
    bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
    int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  gemm<double>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

const char* gemm_backend() { return "builtin"; }

}  // namespace sparsejit::dense
