// Dense matrix products for the sparse op families (Torch-free).
//
// The gather-GEMM-scatter core (RGMS, point-cloud convolution) and the filter-sparse dense
// fallback multiply small gathered tiles by per-group weights. These entry points hide where
// the product runs: small single-threaded tiles on oneDNN's brgemm micro-kernel as the
// process's PyTorch exports it (gemm_ukernel below), else oneDNN's sgemm when the build found
// oneDNN (SPARSEJIT_WITH_ONEDNN), else a built-in register-blocked kernel. All are row-major,
// like cblas_?gemm(CblasRowMajor, ...).
#pragma once

#include <cstdint>

#include "kernels/common/types.h"

namespace sparsejit::dense {

// C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C, row-major with leading dimensions.
// op(A) = A (m x k, lda >= k) or A^T (A stored k x m, lda >= m); likewise B.
// Runs single-threaded when called inside an OpenMP parallel region (oneDNN's OpenMP build
// checks omp_in_parallel; the built-in kernel is serial); outside one it may use all threads.
// Throws std::invalid_argument for negative sizes or leading dimensions that are too small.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc);

// The same for float64 (always the built-in kernel: oneDNN has no double-precision gemm).
void dgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
           const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
           int64_t ldc);

// The built-in kernel, always available (tests compare it with oneDNN; tiny shapes may
// prefer it: no library dispatch).
void sgemm_builtin(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                   float* c, int64_t ldc);

// C[m, n] (float32) = alpha * op(A) op(B) + beta * C with A and B in bfloat16 (row-major
// like sgemm), products accumulated in float32: oneDNN's dnnl_gemm_bf16bf16f32.
// gemm_bf16_native() says whether it can run at full speed here: oneDNN loaded and the CPU
// multiplies bfloat16 pairs (AVX512-BF16 / AMX); gemm_bf16 throws std::runtime_error when
// oneDNN or its entry point is missing.
bool gemm_bf16_native();
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const bf16* a, int64_t lda, const bf16* b, int64_t ldb, float beta, float* c,
               int64_t ldc);

// "onednn <version>" or "builtin".
const char* gemm_backend();

// Whether sgemm runs its small single-threaded products (inside a parallel region, or with
// one thread; no transposes, alpha 1, beta 0 or 1, N <= 128, K <= 64) on oneDNN's brgemm
// micro-kernel as the PyTorch in this process exports it (at::native::cpublas::brgemm, found
// at run time; gemm.cpp). False without torch or with SPARSEJIT_GEMM_UKERNEL=0.
bool gemm_ukernel();
// Turns that on or off for the process (it stays off where torch lacks the entry); returns
// the previous state.
bool set_gemm_ukernel(bool on);
// Whether sgemm would run a single-threaded, untransposed product of these widths (N columns,
// K inner) on that micro-kernel: callers whose B is transposed can copy it out untransposed
// once and multiply their tiles that way.
bool gemm_ukernel_takes(int64_t n, int64_t k);
// bfloat16 products on the same micro-kernel (its bfloat16 entry, float32 accumulation), B in
// oneDNN's VNNI layout: gemm_bf16_ukernel_takes(n) says whether it runs N columns here (the
// entry found and switched on, N <= 64, a CPU with AVX512-BF16 and without AMX: AMX kernels
// want their own tile set-up, not tried here); bf16_vnni_ld(n) is the packed leading
// dimension (n rounded up to 16); pack_bf16_vnni writes B [k, n] (row-major, ldb) as
// [ceil(k / 2), ld, 2] (rows 2i and 2i + 1 interleaved, zero padding), bf16_vnni_size(k, n)
// values; gemm_bf16_vnni computes C[m, n] (+)= A[m, k] B single-threaded from that packing and
// returns true, or returns false without touching C where the micro-kernel does not take it
// (gemm_bf16_ukernel_takes false, or torch's entry refused the call: its oneDNN held below
// AVX-512, or torch.backends.mkldnn disabled; refused once, never tried again): the caller
// then multiplies another way (gemm_bf16).
bool gemm_bf16_ukernel_takes(int64_t n);
int64_t bf16_vnni_ld(int64_t n);
int64_t bf16_vnni_size(int64_t k, int64_t n);
void pack_bf16_vnni(const bf16* b, int64_t k, int64_t n, int64_t ldb, bf16* out);
bool gemm_bf16_vnni(int64_t m, int64_t n, int64_t k, const bf16* a, int64_t lda,
                    const bf16* b_packed, float* c, int64_t ldc, bool add_c);

}  // namespace sparsejit::dense

namespace sparsejit::dense {

// pyg-lib's segment_matmul on raw pointers (float32): rows ptr[k]:ptr[k+1] of x times w[k]
// (+ bias[f_out] on every row where bias is not null, added to each block of rows right after
// its product, while it is in cache). y[N, f_out] is fully written, or with `accumulate` added
// to (y += x_k w[k] (+ bias): a root term summed onto an aggregation in place). Work items
// are (segment, block of <= 256 rows), spread over `num_threads` in one parallel region, so
// many small segments cost no dispatch each, and one large segment (a Linear) runs its row
// blocks on every thread.
void segment_sgemm(const int64_t* ptr, int64_t segments, const float* x, int64_t f_in,
                   const float* w, int64_t f_out, float* y, int num_threads,
                   const float* bias = nullptr, bool accumulate = false);

// Its weight gradient: dw[k] = x_k^T dy_k ([segments, f_in, f_out], fully written). Parallel
// over segments; with fewer segments than threads, over each product (oneDNN's own threads).
void segment_sgemm_grad_w(const int64_t* ptr, int64_t segments, const float* x, int64_t f_in,
                          const float* dy, int64_t f_out, float* dw, int num_threads);

}  // namespace sparsejit::dense
