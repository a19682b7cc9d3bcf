// Dense GEMM entry points (TEMPORARY local copy on branch `conv`: main's csrc/dense/gemm.h,
// oneDNN-backed, replaces this file at merge; same names and signatures).
#pragma once

#include <cstdint>

namespace sparsejit::dense {

// Row-major C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C (like cblas_sgemm RowMajor).
// Runs single-threaded when called inside an OpenMP parallel region.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc);
void dgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
           const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
           int64_t ldc);
const char* gemm_backend();  // "onednn" or "builtin"

}  // namespace sparsejit::dense
