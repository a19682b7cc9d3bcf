// The built-in float GEMM kernel, included by gemm.cpp (baseline ISA) and gemm_avx2.cpp
// (-mavx2 -mfma) inside a namespace named by SPARSEJIT_ISA_NS, so the two compilations
// never merge. op(A) packed row-major (m x k), op(B) packed k x n16 (n rounded up to 16, zero
// columns); 4 rows x 16 columns of C stay in eight 8-float accumulators over the k loop.
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/common/vec.h"

namespace sparsejit::dense::SPARSEJIT_ISA_NS {

typedef cpu::detail::Vec<float, 32> v8f;

template <int MR>
inline void micro_tile(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                       float* acc /* MR x 16 */) {
  v8f c[MR][2];
  for (int i = 0; i < MR; ++i) c[i][0] = c[i][1] = v8f{};
  for (int64_t p = 0; p < k; ++p) {
    v8f b0, b1;
    __builtin_memcpy(&b0, b + p * ldb, 32);
    __builtin_memcpy(&b1, b + p * ldb + 8, 32);
    for (int i = 0; i < MR; ++i) {
      const float av = a[i * lda + p];
      c[i][0] += av * b0;
      c[i][1] += av * b1;
    }
  }
  for (int i = 0; i < MR; ++i) {
    __builtin_memcpy(acc + i * 16, &c[i][0], 32);
    __builtin_memcpy(acc + i * 16 + 8, &c[i][1], 32);
  }
}

inline void store_tile(int64_t rows, int64_t cols, const float* acc, float alpha, float beta,
                       float* c, int64_t ldc) {
  for (int64_t i = 0; i < rows; ++i) {
    float* crow = c + i * ldc;
    if (beta == 0.f) {
      for (int64_t j = 0; j < cols; ++j) crow[j] = alpha * acc[i * 16 + j];
    } else {
      for (int64_t j = 0; j < cols; ++j) crow[j] = alpha * acc[i * 16 + j] + beta * crow[j];
    }
  }
}

// a: m x k row-major (lda); b: k x n16 row-major (ldb a multiple of 16).
inline void packed_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                        int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                        int64_t ldc) {
  alignas(32) float acc[4 * 16];
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const int64_t nb = std::min<int64_t>(16, n - j0);
    int64_t i0 = 0;
    for (; i0 + 4 <= m; i0 += 4) {
      micro_tile<4>(k, a + i0 * lda, lda, b + j0, ldb, acc);
      store_tile(4, nb, acc, alpha, beta, c + i0 * ldc + j0, ldc);
    }
    for (; i0 < m; ++i0) {
      micro_tile<1>(k, a + i0 * lda, lda, b + j0, ldb, acc);
      store_tile(1, nb, acc, alpha, beta, c + i0 * ldc + j0, ldc);
    }
  }
}

}  // namespace sparsejit::dense::SPARSEJIT_ISA_NS
