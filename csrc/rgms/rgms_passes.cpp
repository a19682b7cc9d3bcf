// The out-of-line pieces of the RGMS passes (rgms_passes.h): dense products, bfloat16
// rounding and the transform-first row loops, each with its ISA copies.
#include "csrc/rgms/rgms_passes.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "csrc/core/isa.h"

namespace sparsejit::rgms::detail {

// Row-major C = op(A) op(B) + beta C on the chosen backend (float64: always built-in).
void gemm_raw(Gemm g, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // Auto = oneDNN (when loaded; else dense::sgemm falls back to the built-in kernel): on the
  // tile shapes here it measured 1.2-2.5x faster than the built-in kernel, which wins only
  // below ~64 x 16 x 16 (benchmarks/archive/gemm_bench.cpp, docs/RGMS.md).
  if (g == Gemm::kBuiltin) {
    dense::sgemm_builtin(ta, tb, m, n, k, 1.f, a, lda, b, ldb, beta, c, ldc);
  } else {
    dense::sgemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, beta, c, ldc);
  }
}
void gemm_raw(Gemm, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a,
              int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  dense::dgemm(ta, tb, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc);
}

namespace {

// out[i * cols + j] = a[i * lda + j] rounded to bfloat16, with copies for AVX-512 and AVX2
// (the library's baseline build would round 4 lanes at a time), picked by isa_tier().
inline __attribute__((always_inline)) void round_rows_bf16_body(const float* a, int64_t rows,
                                                                int64_t cols, int64_t lda,
                                                                bf16* out) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* ar = a + i * lda;
    bf16* o = out + i * cols;
    for (int64_t j = 0; j < cols; ++j) o[j] = bf16(ar[j]);
  }
}
SJ_TARGET_V4 void round_rows_bf16_any_v4(const float* a, int64_t rows, int64_t cols,
                                         int64_t lda, bf16* out) {
  round_rows_bf16_body(a, rows, cols, lda, out);
}
SJ_TARGET_V3 void round_rows_bf16_any_v3(const float* a, int64_t rows, int64_t cols,
                                         int64_t lda, bf16* out) {
  round_rows_bf16_body(a, rows, cols, lda, out);
}
void round_rows_bf16_any_base(const float* a, int64_t rows, int64_t cols, int64_t lda,
                              bf16* out) {
  round_rows_bf16_body(a, rows, cols, lda, out);
}
void round_rows_bf16_any(const float* a, int64_t rows, int64_t cols, int64_t lda, bf16* out) {
  SJ_ISA_CALL(round_rows_bf16_any, (a, rows, cols, lda, out))
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// The same with AVX512-BF16's vcvtneps2bf16, 16 values an instruction (also round to nearest
// even; it treats denormal inputs as zero, below 1.2e-38, where the loop above keeps
// bfloat16 denormals; a NaN stays a NaN, its payload may differ).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void round_rows_bf16_avx512(
    const float* a, int64_t rows, int64_t cols, int64_t lda, bf16* out) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* ar = a + i * lda;
    bf16* o = out + i * cols;
    for (int64_t j = 0; j < cols; j += 16) {
      const __mmask16 k = cols - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (cols - j)) - 1);
      const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, ar + j));
      _mm256_mask_storeu_epi16(o + j, k, reinterpret_cast<const __m256i&>(h));
    }
  }
}
#endif

}  // namespace

// A tile rounded to bfloat16 for oneDNN's bfloat16 products: vcvtneps2bf16 where the CPU has
// it (the CPUs that take those products), else the loop.
void round_rows_bf16(const float* a, int64_t rows, int64_t cols, int64_t lda, bf16* out) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if (cpu_has_avx512_bf16()) return round_rows_bf16_avx512(a, rows, cols, lda, out);
#endif
  round_rows_bf16_any(a, rows, cols, lda, out);
}

namespace {

// The transform-first row loops (rgms_passes.h). Cloned for AVX2 (x86-64-v4 gave the same
// 256-bit code): this file is compiled for the baseline ISA and without contraction, so both
// clones compute the same values. Widths 8, 16, 32 and 64 get their own copies with the row
// length known at compile time (W; 0: `w` at run time), so a row is a few whole vectors with
// no loop around them.
template <typename T, SlotDir D, int W>
inline __attribute__((always_inline)) void slot_rows(const PlanView& pv, const int64_t* slot,
                                                     const T* values, bool mean, int64_t g0,
                                                     int64_t g1, const T* in, T* out,
                                                     int64_t w_run) {
  const int64_t w = W > 0 ? W : w_run;
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t p0 = pv.grp_ptr[g], p1 = pv.grp_ptr[g + 1];
    if constexpr (D == SlotDir::kToTargets) {
      T* __restrict o = out + pv.grp_dst[g] * w;
      const T inv = mean ? T(1) / T(p1 - p0) : T(1);
      for (int64_t q = p0; q < p1; ++q) {
        const T c = (values ? values[pv.perm[q]] : T(1)) * inv;
        const T* __restrict row = in + slot[q] * w;
        for (int64_t j = 0; j < w; ++j) o[j] += c * row[j];
      }
    } else {
      const T* __restrict row = in + pv.grp_dst[g] * w;
      // Without values every pair of the group has coef's 1 (/ |g|): computed once.
      const T same = values ? T(0) : coef(pv, values, mean, g, p0);
      for (int64_t q = p0; q < p1; ++q) {
        const T c = values ? coef(pv, values, mean, g, q) : same;
        T* __restrict o = out + slot[q] * w;
        for (int64_t j = 0; j < w; ++j) o[j] += c * row[j];
      }
    }
  }
}

template <typename T, int W>
inline __attribute__((always_inline)) void slot_rows_dir(SlotDir d, const PlanView& pv,
                                                         const int64_t* slot, const T* values,
                                                         bool mean, int64_t g0, int64_t g1,
                                                         const T* in, T* out, int64_t w) {
  if (d == SlotDir::kToTargets)
    slot_rows<T, SlotDir::kToTargets, W>(pv, slot, values, mean, g0, g1, in, out, w);
  else
    slot_rows<T, SlotDir::kToSlots, W>(pv, slot, values, mean, g0, g1, in, out, w);
}

template <typename T>
inline __attribute__((always_inline)) void slot_rows_either(SlotDir d, const PlanView& pv,
                                                            const int64_t* slot,
                                                            const T* values, bool mean,
                                                            int64_t g0, int64_t g1, const T* in,
                                                            T* out, int64_t w) {
  switch (w) {
    case 8: return slot_rows_dir<T, 8>(d, pv, slot, values, mean, g0, g1, in, out, w);
    case 16: return slot_rows_dir<T, 16>(d, pv, slot, values, mean, g0, g1, in, out, w);
    case 32: return slot_rows_dir<T, 32>(d, pv, slot, values, mean, g0, g1, in, out, w);
    case 64: return slot_rows_dir<T, 64>(d, pv, slot, values, mean, g0, g1, in, out, w);
    default: return slot_rows_dir<T, 0>(d, pv, slot, values, mean, g0, g1, in, out, w);
  }
}

// The row loops in an AVX2 copy and a baseline one, picked by isa_tier() (the AVX-512 tier
// takes the AVX2 copy too).
template <typename T>
SJ_TARGET_V3 void slot_rows_v3(SlotDir d, const PlanView& pv, const int64_t* slot,
                               const T* values, bool mean, int64_t g0, int64_t g1, const T* in,
                               T* out, int64_t w) {
  slot_rows_either<T>(d, pv, slot, values, mean, g0, g1, in, out, w);
}
template <typename T>
void slot_rows_base(SlotDir d, const PlanView& pv, const int64_t* slot, const T* values,
                    bool mean, int64_t g0, int64_t g1, const T* in, T* out, int64_t w) {
  slot_rows_either<T>(d, pv, slot, values, mean, g0, g1, in, out, w);
}

}  // namespace

template <typename T>
void slot_rows_run(SlotDir d, const PlanView& pv, const int64_t* slot, const T* values,
                   bool mean, int64_t g0, int64_t g1, const T* in, T* out, int64_t w) {
  if (isa_tier() >= IsaTier::kAvx2)
    return slot_rows_v3<T>(d, pv, slot, values, mean, g0, g1, in, out, w);
  slot_rows_base<T>(d, pv, slot, values, mean, g0, g1, in, out, w);
}

template void slot_rows_run<float>(SlotDir, const PlanView&, const int64_t*, const float*, bool,
                                   int64_t, int64_t, const float*, float*, int64_t);
template void slot_rows_run<double>(SlotDir, const PlanView&, const int64_t*, const double*,
                                    bool, int64_t, int64_t, const double*, double*, int64_t);

}  // namespace sparsejit::rgms::detail
