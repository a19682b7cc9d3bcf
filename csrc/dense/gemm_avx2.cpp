// The built-in GEMM kernel compiled for AVX2 + FMA (CMake adds -mavx2 -mfma to this file
// only); gemm.cpp calls it when the CPU has both.
#include <cstdint>

#define SPARSEJIT_ISA_NS packed_avx2
#include "csrc/dense/gemm_packed.h"

namespace sparsejit::dense {

void packed_avx2_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                      const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  packed_avx2::packed_gemm(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace sparsejit::dense
