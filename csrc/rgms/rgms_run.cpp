// RGMS compute: see rgms_run.h for the partitioning of each pass.
#include "csrc/rgms/rgms_run.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "csrc/core/first_error.h"
#include "csrc/core/isa.h"
#include "csrc/rgms/rgms_plan.h"
#include "csrc/rgms/row_tiles.h"
#include "csrc/dense/gemm.h"
#include "kernels/cpu/rgms_kernel.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace sparsejit::rgms {
namespace {

int thread_count() {
#ifdef _OPENMP
  return omp_get_num_threads();
#else
  return 1;
#endif
}
int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// Row-major C = op(A) op(B) + beta C on the chosen backend (float64: always built-in).
void gemm_raw(Gemm g, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // Auto = oneDNN (when loaded; else dense::sgemm falls back to the built-in kernel): on the
  // tile shapes here it measured 1.2-2.5x faster than the built-in kernel, which wins only
  // below ~64 x 16 x 16 (benchmarks/gemm_bench.cpp, docs/RGMS.md).
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

// A tile rounded to bfloat16 for oneDNN's bfloat16 products: vcvtneps2bf16 where the CPU has
// it (the CPUs that take those products), else the loop.
void round_rows_bf16(const float* a, int64_t rows, int64_t cols, int64_t lda, bf16* out) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if (cpu_has_avx512_bf16()) return round_rows_bf16_avx512(a, rows, cols, lda, out);
#endif
  round_rows_bf16_any(a, rows, cols, lda, out);
}

// gemm_raw inside a parallel region: an error is recorded, not thrown.
template <typename T>
void gemm(FirstError& fe, Gemm g, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  fe.guard([&] { gemm_raw(g, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc); });
}

// A forward tile's product out[m, fo] = a[m, fi] @ W[r]: with p.w_bf16 (float32 only) on
// oneDNN's bfloat16 GEMM (or, with p.w_vnni, its bfloat16 micro-kernel), the tile rounded to
// bfloat16 in `abuf` first; else gemm().
template <typename T>
void tile_product(FirstError& fe, const Problem& p, std::vector<bf16>& abuf, int64_t m,
                  const T* a, const T* w, int64_t r, T* out) {
  const int64_t fi = p.f_in, fo = p.f_out;
  if constexpr (std::is_same_v<T, float>) {
    if (p.w_bf16 != nullptr) {
      fe.guard([&] {
        // Grown only: a vector resized down and up again zero-fills the regrown part on
        // every tile (4% of a bfloat16 forward at 1M entries, F = 64, perf).
        if (abuf.size() < size_t(std::max<int64_t>(m * fi, 1)))
          abuf.resize(size_t(std::max<int64_t>(m * fi, 1)));
        round_rows_bf16(a, m, fi, fi, abuf.data());
        if (p.w_vnni != nullptr &&
            dense::gemm_bf16_vnni(m, fo, fi, abuf.data(), std::max<int64_t>(fi, 1),
                                  p.w_vnni + r * p.w_vnni_stride, out, std::max<int64_t>(fo, 1),
                                  /*add_c=*/false))
          return;
        dense::gemm_bf16(false, false, m, fo, fi, 1.f, abuf.data(), std::max<int64_t>(fi, 1),
                         p.w_bf16 + r * fi * fo, std::max<int64_t>(fo, 1), 0.f, out,
                         std::max<int64_t>(fo, 1));
      });
      return;
    }
  }
  gemm(fe, p.gemm, false, false, m, fo, fi, a, std::max<int64_t>(fi, 1), w + r * fi * fo,
       std::max<int64_t>(fo, 1), T(0), out, fo);
}

template <typename T>
inline T coef(const PlanView& pv, const T* values, bool mean, int64_t g, int64_t p) {
  T c = values ? values[pv.perm[p]] : T(1);
  if (mean) c /= T(pv.grp_ptr[g + 1] - pv.grp_ptr[g]);
  return c;
}

// The transform-first relations' row loops over groups [g0, g1) (slot: each entry's row in
// the relation's transformed rows), rows of w columns, from `in` to `out`:
//   kToTargets: out[grp_dst[g]] += (values[perm[q]] * 1/|g|) * in[slot[q]]  (forward: in the
//               transformed rows, out Y)
//   kToSlots:   out[slot[q]] += (values[perm[q]] / |g|) * in[grp_dst[g]]    (dW, source side:
//               in dY, out the relation's rows)
// Cloned for AVX2 (x86-64-v4 gave the same 256-bit code): this file is compiled for the
// baseline ISA and without contraction, so both clones compute the same values. Widths 8, 16,
// 32 and 64 get their own copies with the row length known at compile time (W; 0: `w` at run
// time), so a row is a few whole vectors with no loop around them.
enum class SlotDir { kToTargets, kToSlots };

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

template <typename T>
void slot_rows_run(SlotDir d, const PlanView& pv, const int64_t* slot, const T* values,
                   bool mean, int64_t g0, int64_t g1, const T* in, T* out, int64_t w) {
  if (isa_tier() >= IsaTier::kAvx2)
    return slot_rows_v3<T>(d, pv, slot, values, mean, g0, g1, in, out, w);
  slot_rows_base<T>(d, pv, slot, values, mean, g0, g1, in, out, w);
}

// The tile loops (kernels/cpu/rgms_kernel.h), JIT-specialized per width or generic: the
// row-loop family RGMS shares with the point-cloud convolution (csrc/rgms/row_tiles.h).
using rows::TileFn;
using rows::tile_fn;

// Columns [i0, i1) of `width` owned by thread t of nt (whole blocks of `align` columns).
inline std::pair<int64_t, int64_t> column_share(int64_t width, int64_t t, int64_t nt,
                                                int64_t align) {
  const int64_t blocks = (width + align - 1) / align;
  return {std::min(width, blocks * t / nt * align), std::min(width, blocks * (t + 1) / nt * align)};
}

// One tile function per thread of a column-split pass, looked up before the parallel region
// (for p.num_threads threads; a region that gets fewer threads uses the generic loops).
template <typename T>
std::vector<TileFn> share_fns(const Problem& p, int64_t width, int64_t align, int64_t work,
                              int64_t width2 = 0) {
  const int64_t nt = std::max(1, p.num_threads);
  std::vector<TileFn> fns(size_t(nt), rows::generic_fn<T>());
  for (int64_t t = 0; t < nt; ++t) {
    const auto [i0, i1] = column_share(width, t, nt, align);
    if (i1 > i0) fns[size_t(t)] = tile_fn<T>(i1 - i0, work, width2);
  }
  return fns;
}

// Whether a pass runs its products fused, row by row (Gemm::kFused; kAuto: the forward and
// grad-X (the forward on the transposed structure) up to kFusedMaxForward columns each side;
// never for grad W, see rgms_run.h).
enum class Pass { kForward, kGradW };
bool use_fused(const Problem& p, Pass pass) {
  if (p.f_in <= 0 || p.f_out <= 0 || p.f_in > cpu::rgms_detail::kFusedMaxWidth ||
      p.f_out > cpu::rgms_detail::kFusedMaxWidth)
    return false;
  return p.gemm == Gemm::kFused ||
         (p.gemm == Gemm::kAuto && pass != Pass::kGradW &&
          std::max(p.f_in, p.f_out) <= kFusedMaxForward);
}

// One tile's launch for groups [g0, g1), columns [c0, c0 + w) (kernels/cpu/rgms_kernel.h).
template <typename T>
cpu::RgmsTileLaunch tile_launch(const Problem& p, int32_t kind, const T* values, const T* in,
                                T* out, int64_t c0, int64_t w, int64_t g0, int64_t g1) {
  cpu::RgmsTileLaunch l;
  l.kind = kind;
  l.mean = p.mean;
  l.grp_ptr = p.plan.grp_ptr;
  l.src = p.plan.src;
  l.perm = p.plan.perm;
  l.values = values;
  l.in = in;
  l.out = out;
  l.c0 = c0;
  l.width = w;
  l.g0 = g0;
  l.g1 = g1;
  return l;
}

// out[t, 0:w] = sum over group g0 + t's entries of coef * x[src, c0:c0 + w] (x row stride ldx).
template <typename T>
void gather_reduce(TileFn fn, const Problem& p, const T* values, const T* x, int64_t ldx,
                   int64_t c0, int64_t w, int64_t g0, int64_t g1, T* out) {
  auto l = tile_launch(p, 0, values, x, out, c0, w, g0, g1);
  l.ld_in = ldx;
  l.prefetch_end = p.plan.grp_ptr[g1];
  fn(&l);
}


// out[t, :] = dy[grp_dst[g0 + t], :].
template <typename T>
void gather_targets(const PlanView& pv, const T* dy, int64_t f, int64_t g0, int64_t g1, T* out) {
  for (int64_t g = g0; g < g1; ++g) std::memcpy(out + (g - g0) * f, dy + pv.grp_dst[g] * f, sizeof(T) * f);
}

int64_t lower_bound_dst(const PlanView& pv, int64_t g0, int64_t g1, int64_t row) {
  return std::lower_bound(pv.grp_dst + g0, pv.grp_dst + g1, row) - pv.grp_dst;
}

int64_t tile_of(const Problem& p) {
  return p.tile > 0 ? p.tile : default_tile(p.f_in, p.f_out);
}

// Rows [row0, row1) of Y before the relations add into them: x_root @ root + bias, or 0.
template <typename T>
void init_rows(FirstError& fe, const Problem& p, const RootTerm<T>& rt, int64_t row0,
               int64_t row1, T* y) {
  const int64_t fo = p.f_out, m = row1 - row0;
  if (m <= 0) return;
  if (rt.root && p.f_root > 0) {
    gemm(fe, p.gemm, false, false, m, fo, p.f_root, rt.x_root + row0 * p.f_root, p.f_root,
         rt.root, fo, T(0), y + row0 * fo, fo);
  } else {
    std::memset(y + row0 * fo, 0, sizeof(T) * m * fo);
  }
  if (rt.bias)
    for (int64_t i = row0; i < row1; ++i)
      for (int64_t j = 0; j < fo; ++j) y[i * fo + j] += rt.bias[j];
}

}  // namespace

bool forward_runs_tiles(int64_t f_in, int64_t f_out, Gemm gemm) {
  Problem p;
  p.f_in = f_in;
  p.f_out = f_out;
  p.gemm = gemm;
  return f_in > 0 && f_out > 0 && !use_fused(p, Pass::kForward);
}

int64_t default_tile(int64_t f_in, int64_t f_out) {
  // Gathered rows plus products within ~64 KiB of float32 (L1 + part of L2): the tile then
  // amortizes the per-call packing of W[r] (AIFB, F = 16: 512 groups measured ~20% faster
  // than 128).
  const int64_t width = std::max<int64_t>(1, f_in + f_out);
  return std::clamp<int64_t>(16384 / width, 16, 512);
}

// Parallel over relations; each thread stamps a private array of num_src marks with the
// relation id, so nothing is cleared between them.
SourceIndex index_sources(const Problem& p) {
  const PlanView& pv = p.plan;
  SourceIndex si;
  si.src_ptr.assign(size_t(pv.r + 1), 0);
  si.slot.assign(size_t(pv.e), 0);
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      for (int64_t r = 0; r < pv.r; ++r) si.src_ptr[r + 1] += si.src_ptr[r];
      si.src_list.assign(size_t(si.src_ptr[pv.r]), 0);
    }
#pragma omp parallel num_threads(std::max(1, p.num_threads)) if (pv.e > 65536)
    {
      std::vector<int64_t> mark(size_t(p.num_src), -1), local(size_t(p.num_src), 0);
#pragma omp for schedule(dynamic, 1)
      for (int64_t r = 0; r < pv.r; ++r) {
        int64_t count = 0;
        const int64_t q0 = pv.grp_ptr[pv.rel_ptr[r]], q1 = pv.grp_ptr[pv.rel_ptr[r + 1]];
        for (int64_t q = q0; q < q1; ++q) {
          const int64_t s = pv.src[q];
          if (mark[s] != r) {
            mark[s] = r;
            local[s] = count;
            if (pass == 1) si.src_list[size_t(si.src_ptr[r] + count)] = s;
            ++count;
          }
          if (pass == 1) si.slot[size_t(q)] = local[s];
        }
        if (pass == 0) si.src_ptr[r + 1] = count;
      }
    }
  }
  return si;
}

namespace {

RelationPlan plan_from_sources(const Problem& p, const SourceIndex& si) {
  const PlanView& pv = p.plan;
  RelationPlan rp;
  const double fi = double(p.f_in), fo = double(p.f_out);
  int64_t budget = p.num_rows;  // transformed rows kept, in rows of F_out
  for (int64_t r = 0; r < pv.r; ++r) {
    const int64_t g = pv.rel_ptr[r + 1] - pv.rel_ptr[r];
    const int64_t e = g > 0 ? pv.grp_ptr[pv.rel_ptr[r + 1]] - pv.grp_ptr[pv.rel_ptr[r]] : 0;
    const int64_t s = si.src_ptr[r + 1] - si.src_ptr[r];
    rp.entries.push_back(e);
    rp.targets.push_back(g);
    rp.sources.push_back(s);
    const double agg_first = double(g) * fi * fo + double(e) * fi;
    const double tr_first = double(s) * fi * fo + double(s) * fi + double(e) * fo;
    int8_t c = 1;
    if (p.strategy == Strategy::kTransformFirst) {
      c = 2;
    } else if (p.strategy == Strategy::kAuto && e > 0 && tr_first < 0.9 * agg_first &&
               s <= budget) {
      c = 2;
      budget -= s;
    }
    rp.choice.push_back(c);
  }
  return rp;
}

// The cached index when the caller has one, else a fresh one kept in `own`.
const SourceIndex& sources_of(const Problem& p, SourceIndex& own) {
  if (p.sources) return *p.sources;
  own = index_sources(p);
  return own;
}
}  // namespace

TransposedPlan transpose_plan(const Problem& p) {
  const PlanView& pv = p.plan;
  const int64_t e = pv.e, r = pv.r;
  // The entries as edges (original target -> original source), in plan order.
  std::vector<int64_t> t_src(static_cast<size_t>(e)), t_dst(static_cast<size_t>(e)),
      t_rel(static_cast<size_t>(e));
  for (int64_t rel = 0; rel < r; ++rel)
    for (int64_t g = pv.rel_ptr[rel]; g < pv.rel_ptr[rel + 1]; ++g)
      for (int64_t q = pv.grp_ptr[g]; q < pv.grp_ptr[g + 1]; ++q) {
        t_src[size_t(q)] = pv.grp_dst[g];
        t_dst[size_t(q)] = pv.src[q];
        t_rel[size_t(q)] = rel;
      }
  TransposedPlan t;
  t.rel_ptr.resize(size_t(r + 1));
  t.grp_ptr.resize(size_t(e + 1));
  t.grp_dst.resize(size_t(e));
  t.src.resize(size_t(e));
  t.perm.resize(size_t(e));
  build_plan(t_src.data(), t_dst.data(), t_rel.data(), e, p.num_src, r, t.rel_ptr.data(),
             t.grp_ptr.data(), t.grp_dst.data(), t.src.data(), t.perm.data());
  Problem q = p;
  q.plan = t.view(r, e);
  q.num_rows = p.num_src;
  q.num_src = p.num_rows;
  t.sources = index_sources(q);
  return t;
}

RelationPlan relation_plan(const Problem& p) {
  SourceIndex own;
  return plan_from_sources(p, sources_of(p, own));
}

namespace {

// The weight gradient taken inside grad X's pass (backward_x_transposed, "grad W in grad X"
// in docs/RGMS.md). That pass is the forward on the transposed structure: its
// aggregate-first tiles hold, per group (relation r, source s), agg_s = sum of coef * dY
// rows of s's targets, and dW[r] = sum over s of X[s]^T agg_s. So each such tile also gathers
// its groups' X rows (the pass's own output rows: one chunk's range of X, in cache) and adds
// one GEMM into its slab's partial dW[r], which saves the separate pass's two random gathers
// per entry. Chunks and slabs (runs of chunks, each one thread's, in order) are fixed by the
// problem, not the thread count, and the slabs are summed in order: the same bits on any
// number of threads.
template <typename T>
struct GradWSink {
  const T* x = nullptr;          // the original X: [the pass's rows, the pass's f_out]
  const int8_t* want = nullptr;  // [R]: relations whose dW is still needed
  std::vector<int8_t> done;      // [R]: set by the pass (wanted and aggregated first there)
  std::vector<T> partial;        // [slabs, R, the pass's f_out, its f_in]: partial dW
  int64_t slabs = 0, chunks = 0;
};

// Chunks of rows of Y for the forward's pass: small enough for their rows to stay in L2
// across the relations (256 KiB), at least 8 per thread for balance.
int64_t forward_chunks(int64_t n, int64_t fo, int64_t elem, int nt) {
  const int64_t by_cache = (n * fo * elem + (256 << 10) - 1) / (256 << 10);
  return std::clamp<int64_t>(std::max<int64_t>(by_cache, nt == 1 ? 1 : 8 * nt), 1,
                             std::max<int64_t>(n, 1));
}

template <typename T>
void forward_impl(const Problem& p, const T* x, const T* w, const T* values, T* y,
                  const RootTerm<T>& rt, GradWSink<T>* sink) {
  const PlanView& pv = p.plan;
  const int64_t n = p.num_rows, fi = p.f_in, fo = p.f_out, tile = tile_of(p);
  // Relations computed transform-first: their distinct sources' rows times W[r], once.
  std::vector<int8_t> choice(size_t(pv.r), 1);
  SourceIndex own;
  const SourceIndex* si = nullptr;
  std::vector<T> transformed;
  std::vector<int64_t> t_off;
  if (p.strategy != Strategy::kAggregateFirst && fo > 0 && pv.e > 0) {
    // One pass indexes every relation's sources: the cost model reads their counts, the
    // transform-first relations their slots.
    si = &sources_of(p, own);
    choice = plan_from_sources(p, *si).choice;
    bool any = false;
    for (auto c : choice) any = any || c == 2;
    if (any) {
      // Only the transform-first relations' rows are kept (t_off: their prefix sums).
      t_off.assign(size_t(pv.r + 1), 0);
      for (int64_t r = 0; r < pv.r; ++r)
        t_off[r + 1] = t_off[r] + (choice[r] == 2 ? si->src_ptr[r + 1] - si->src_ptr[r] : 0);
      transformed.assign(size_t(t_off[pv.r] * fo), T(0));
      std::vector<int64_t> items;  // (relation, first source slot) of every tile
      for (int64_t r = 0; r < pv.r; ++r)
        for (int64_t k = si->src_ptr[r]; choice[r] == 2 && k < si->src_ptr[r + 1]; k += tile) {
          items.push_back(r);
          items.push_back(k);
        }
      const int64_t n_items = int64_t(items.size() / 2);
      FirstError fe;
#pragma omp parallel num_threads(std::max(1, p.num_threads)) if (n_items > 1)
      {
        std::vector<T> rows(size_t(tile * std::max<int64_t>(fi, 1)));
        std::vector<bf16> abuf;
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < n_items; ++it) {
          const int64_t r = items[2 * it], k0 = items[2 * it + 1];
          const int64_t k1 = std::min(si->src_ptr[r + 1], k0 + tile), m = k1 - k0;
          for (int64_t k = k0; k < k1; ++k) {
            T* dst = rows.data() + (k - k0) * fi;
            if (p.x_bf16 != nullptr) {  // the sources' bfloat16 rows, widened exactly
              const bf16* src = p.x_bf16 + si->src_list[k] * fi;
              for (int64_t j = 0; j < fi; ++j) dst[j] = T(src[j]);
            } else {
              std::memcpy(dst, x + si->src_list[k] * fi, sizeof(T) * fi);
            }
          }
          tile_product(fe, p, abuf, m, rows.data(), w, r,
                       transformed.data() + (t_off[r] + k0 - si->src_ptr[r]) * fo);
        }
      }
      fe.rethrow();
    }
  }
  const bool fused = use_fused(p, Pass::kForward);
  const TileFn gather_fn = tile_fn<T>(fi, pv.e * fi, fused ? fo : 0);
  // bfloat16 X on the fused rows: kind 8 on the weights in pairs (forward() packs them where
  // fused_bf16_takes, the only case a caller sets x_bf16 for the fused rows).
  const bool fused_bf16 = fused && p.x_bf16 != nullptr;
  if (fused_bf16 && p.w_pairs == nullptr)
    throw std::logic_error("rgms forward: x_bf16 on the fused rows without w_pairs");
  // Rows of width fo: the tiles' products added into Y, and the sink's X rows (its width is
  // this pass's f_out).
  const TileFn rows_fn = fused ? nullptr : tile_fn<T>(fo, pv.e * fo);
  if (sink) {
    sink->done.assign(size_t(pv.r), 0);
    for (int64_t r = 0; r < pv.r && !fused; ++r)
      sink->done[size_t(r)] = int8_t(sink->want[r] != 0 && choice[size_t(r)] == 1);
  }
  FirstError fe;
#pragma omp parallel num_threads(std::max(1, p.num_threads)) if (n * fo > 4096)
  {
    // Every relation adds into the chunk's rows of Y (forward_chunks). With a sink the
    // chunks run in its fixed slabs, one slab per task.
    const int64_t chunks =
        sink ? sink->chunks : forward_chunks(n, fo, int64_t(sizeof(T)), thread_count());
    const int64_t units = sink ? sink->slabs : chunks;
    std::vector<T> agg(size_t(tile * std::max<int64_t>(fi, 1))), prod(size_t(tile * std::max<int64_t>(fo, 1)));
    std::vector<T> xs(sink ? size_t(tile * fo) : 0);  // the sink's X rows
    std::vector<bf16> abuf;  // a tile in bfloat16 (p.w_bf16)
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < units; ++u)
    for (int64_t c = sink ? chunks * u / units : u,
                 c_end = sink ? chunks * (u + 1) / units : u + 1;
         c < c_end; ++c) {
      const int64_t row0 = n * c / chunks, row1 = n * (c + 1) / chunks;
      if (fo == 0) continue;
      init_rows(fe, p, rt, row0, row1, y);
      for (int64_t r = 0; r < pv.r; ++r) {
        const int64_t ga = lower_bound_dst(pv, pv.rel_ptr[r], pv.rel_ptr[r + 1], row0);
        const int64_t gb = lower_bound_dst(pv, ga, pv.rel_ptr[r + 1], row1);
        if (choice[r] == 2) {  // reduce transformed rows straight into Y
          slot_rows_run(SlotDir::kToTargets, pv, si->slot.data(), values, p.mean, ga, gb,
                        transformed.data() + t_off[r] * fo, y, fo);
          continue;
        }
        const T* w_r = w + r * fi * fo;
        if (fused) {  // y[target] += (reduced row) @ W[r], row by row
          if (gb <= ga) continue;
          auto l = tile_launch(p, 2, values, x, y, 0, fi, ga, gb);
          l.ld_in = fi;
          l.ld_out = fo;
          l.prefetch_end = pv.grp_ptr[gb];
          l.grp_dst = pv.grp_dst;
          l.w = w_r;
          l.width2 = fo;
          if (fused_bf16) {
            l.kind = 8;
            l.in = p.x_bf16;
            l.w = p.w_pairs + r * p.w_pairs_stride;
            l.ld_w = dense::bf16_vnni_ld(fo);
          }
          gather_fn(&l);
          continue;
        }
        for (int64_t g0 = ga; g0 < gb; g0 += tile) {
          const int64_t g1 = std::min(gb, g0 + tile), m = g1 - g0;
          if (p.x_bf16 != nullptr) {  // bfloat16 rows, widened in the kernel (kind 7)
            auto l = tile_launch<T>(p, 7, values, nullptr, agg.data(), 0, fi, g0, g1);
            l.in = p.x_bf16;
            l.ld_in = fi;
            l.prefetch_end = p.plan.grp_ptr[g1];
            gather_fn(&l);
          } else {
            gather_reduce(gather_fn, p, values, x, fi, 0, fi, g0, g1, agg.data());
          }
          tile_product(fe, p, abuf, m, agg.data(), w, r, prod.data());
          rows::scatter_add_rows(rows_fn, prod.data(), fo, pv.grp_dst + g0, m, y, fo);
          if (sink && sink->done[size_t(r)]) {  // partial dW[r] += X[rows]^T agg
            rows::gather_rows(rows_fn, sink->x, fo, 0, fo, pv.grp_dst + g0,
                              static_cast<const T*>(nullptr), m, xs.data());
            gemm(fe, p.gemm, true, false, fo, fi, m, xs.data(), fo, agg.data(), fi, T(1),
                 sink->partial.data() + (u * pv.r + r) * fo * fi, fi);
          }
        }
      }
    }
  }
  fe.rethrow();
}

}  // namespace

bool fused_bf16_takes(const Problem& p) {
  // Kind 8 multiplies with vdpbf16ps only in a JIT instantiation built for this CPU (the
  // library's own copy emulates it, slower than kind 2 on widened rows).
  return p.f_in > 0 && p.f_out > 0 && use_fused(p, Pass::kForward) && cpu_has_avx512_bf16() &&
         tile_fn<float>(p.f_in, p.plan.e * p.f_in, p.f_out) != rows::generic_fn<float>();
}

namespace {

// W [R, f_in, f_out] in bfloat16, each relation packed in bfloat16 pairs
// (dense::pack_bf16_vnni); `per` values a relation.
std::vector<bf16> pack_pairs(const Problem& p, int64_t& per) {
  per = dense::bf16_vnni_size(p.f_in, p.f_out);
  std::vector<bf16> packed(size_t(std::max<int64_t>(p.plan.r * per, 1)));
  for (int64_t r = 0; r < p.plan.r; ++r)
    dense::pack_bf16_vnni(p.w_bf16 + r * p.f_in * p.f_out, p.f_in, p.f_out, p.f_out,
                          packed.data() + r * per);
  return packed;
}

}  // namespace

template <typename T>
void forward(const Problem& p, const T* x, const T* w, const T* values, T* y,
             const RootTerm<T>& rt) {
  if constexpr (std::is_same_v<T, float>) {
    // The bfloat16 weights packed in pairs once per call: for the bfloat16 micro-kernel
    // where the forward runs tiles, for the fused rows' vdpbf16ps (kind 8) where it runs
    // those (each path reads only its own).
    const bool tiles = p.w_bf16 != nullptr && p.w_vnni == nullptr &&
                       forward_runs_tiles(p.f_in, p.f_out, p.gemm) &&
                       dense::gemm_bf16_ukernel_takes(p.f_out);
    const bool rows = !tiles && p.x_bf16 != nullptr && p.w_bf16 != nullptr &&
                      fused_bf16_takes(p);
    if (tiles || rows) {
      int64_t per = 0;
      const std::vector<bf16> packed = pack_pairs(p, per);
      Problem q = p;
      (tiles ? q.w_vnni : q.w_pairs) = packed.data();
      (tiles ? q.w_vnni_stride : q.w_pairs_stride) = per;
      forward_impl<T>(q, x, w, values, y, rt, nullptr);
      return;
    }
  }
  forward_impl<T>(p, x, w, values, y, rt, nullptr);
}

namespace {

// Relations whose dW is taken on their source side (see rgms_run.h): side[r] == 2, and the
// relations' distinct-source lists.
struct SourceSide {
  std::vector<int8_t> side;
  SourceIndex own;                      // built here when the caller has no cached index
  const SourceIndex* cached = nullptr;  // the caller's
  const SourceIndex& si() const { return cached ? *cached : own; }
  bool any = false;
};

// Chooses the source-side relations (the forward's transform-first ones) and computes their
// dW[r], one relation per task.
template <typename T>
SourceSide source_side(const Problem& p, const T* x, const T* values, const T* dy, T* dw) {
  const PlanView& pv = p.plan;
  const int64_t fi = p.f_in, fo = p.f_out;
  SourceSide ss;
  ss.side.assign(size_t(pv.r), 1);
  if (p.strategy == Strategy::kAggregateFirst || pv.e == 0 || fi == 0 || fo == 0 || !dw)
    return ss;
  if (p.sources) {
    ss.cached = p.sources;
  } else {
    ss.own = index_sources(p);
  }
  ss.side = plan_from_sources(p, ss.si()).choice;
  std::vector<int64_t> rels;
  for (int64_t r = 0; r < pv.r; ++r)
    if (ss.side[r] == 2 && ss.si().src_ptr[r + 1] > ss.si().src_ptr[r]) rels.push_back(r);
  ss.any = !rels.empty();
  if (!ss.any) return ss;
  const int64_t n_rels = int64_t(rels.size());
  FirstError fe;
  // Parallel even for one relation: a GEMM called outside an active parallel region lets
  // oneDNN thread it, and its threaded sgemm for this shape (F_in x F_out, K = S_r in the
  // thousands) took 3x the serial time on 2 threads (2026-11, EPYC, 20k nodes, F = 16).
#pragma omp parallel num_threads(std::max(1, p.num_threads)) if (pv.e * fo > 4096)
  {
    std::vector<T> t_r, xs;
#pragma omp for schedule(dynamic, 1)
    for (int64_t k = 0; k < n_rels; ++k) {
      const int64_t r = rels[size_t(k)];
      const int64_t s0 = ss.si().src_ptr[r], s_r = ss.si().src_ptr[r + 1] - s0;
      t_r.assign(size_t(s_r * fo), T(0));
      // T_r[slot] += coef * dY[target]: entries in their stored order (deterministic).
      slot_rows_run(SlotDir::kToSlots, pv, ss.si().slot.data(), values, p.mean,
                    pv.rel_ptr[r], pv.rel_ptr[r + 1], dy, t_r.data(), fo);
      // dW[r] = X[sources]^T T_r
      xs.resize(size_t(s_r * fi));
      for (int64_t i = 0; i < s_r; ++i)
        std::memcpy(xs.data() + i * fi, x + ss.si().src_list[size_t(s0 + i)] * fi, sizeof(T) * fi);
      gemm(fe, p.gemm, true, false, fi, fo, s_r, xs.data(), fi, t_r.data(), fo, T(0),
           dw + r * fi * fo, fo);
    }
  }
  fe.rethrow();
  return ss;
}

// dX = RGMS(A^T, dY, W^T) (+ dY @ root^T): the forward on the transposed structure, with
// each entry's coefficient (values, 1/|group| for the mean) in a vector by plan position.
template <typename T>
void backward_x_transposed(const Problem& p, const TransposedPlan* tp, const T* w,
                           const T* values, const T* dy, T* dx, const T* root,
                           GradWSink<T>* sink) {
  const PlanView& pv = p.plan;
  const int64_t fi = p.f_in, fo = p.f_out;
  Problem q = p;
  q.plan = tp->view(pv.r, pv.e);
  q.num_rows = p.num_src;
  q.num_src = p.num_rows;
  q.f_in = fo;
  q.f_out = fi;
  q.mean = false;
  q.sources = &tp->sources;
  q.transposed = nullptr;
  q.strategy = p.strategy == Strategy::kAggregateFirst  ? Strategy::kTransformFirst
               : p.strategy == Strategy::kTransformFirst ? Strategy::kAggregateFirst
                                                          : Strategy::kAuto;
  q.f_root = root ? fo : 0;
  std::vector<T> c;
  if (values || p.mean) {
    c.resize(size_t(pv.e));
    for (int64_t g = 0; g < pv.rel_ptr[pv.r]; ++g) {
      if (values) {
        for (int64_t k = pv.grp_ptr[g]; k < pv.grp_ptr[g + 1]; ++k)
          c[size_t(k)] = coef(pv, values, p.mean, g, k);
      } else {  // mean without values: coef's 1 / |g|, one division a group
        const T inv = T(1) / T(pv.grp_ptr[g + 1] - pv.grp_ptr[g]);
        std::fill(c.begin() + pv.grp_ptr[g], c.begin() + pv.grp_ptr[g + 1], inv);
      }
    }
  }
  std::vector<T> wt(size_t(pv.r * fi * fo));  // W[r]^T: [F_out, F_in] per relation
  for (int64_t r = 0; r < pv.r; ++r)
    for (int64_t i = 0; i < fi; ++i)
      for (int64_t j = 0; j < fo; ++j) wt[size_t((r * fo + j) * fi + i)] = w[(r * fi + i) * fo + j];
  std::vector<T> root_t;
  RootTerm<T> rt;
  if (root) {
    root_t.resize(size_t(fi * fo));
    for (int64_t i = 0; i < fi; ++i)
      for (int64_t j = 0; j < fo; ++j) root_t[size_t(j * fi + i)] = root[i * fo + j];
    rt.x_root = dy;
    rt.root = root_t.data();
  }
  forward_impl<T>(q, dy, wt.data(), c.empty() ? nullptr : c.data(), dx, rt, sink);
}

// Whether dW runs inside grad X's pass (GradWSink) for these widths and this structure: the
// transposed pass runs GEMM tiles (not the fused rows, no bfloat16), its tiles average at
// least 32 groups per (chunk, relation) (smaller ones make poor GEMMs for dW), and the
// partials fit in 32 MiB. Depends on the problem, never on the thread count.
template <typename T>
bool grad_w_in_grad_x(const Problem& p, const TransposedPlan& tp, int64_t chunks, int64_t slabs) {
  const int64_t fi = p.f_in, fo = p.f_out;
  if (p.w_bf16 != nullptr || p.x_bf16 != nullptr || !forward_runs_tiles(fo, fi, p.gemm))
    return false;
  // kAggregateFirst makes the transposed pass transform-first everywhere: no tiles to share.
  if (p.strategy == Strategy::kAggregateFirst) return false;
  int64_t active = 0;
  for (int64_t r = 0; r < p.plan.r; ++r)
    active += tp.rel_ptr[size_t(r + 1)] > tp.rel_ptr[size_t(r)];
  const int64_t groups = tp.rel_ptr[size_t(p.plan.r)];
  const double bytes = double(slabs) * double(p.plan.r) * double(fi) * double(fo) * sizeof(T);
  return active > 0 && groups >= 32 * chunks * active && bytes <= double(32 << 20);
}

// One relation's dW[r][i0:i0 + wd, :] (rows i0.. of it, every column): zeroed, then the sum
// over tiles of agg[:, i0:i0 + wd]^T @ dYg (or the fused kind-4 rows). agg [tile, wd] and
// dyg [tile, fo] are the caller's scratch.
template <typename T>
void relation_dw(FirstError& fe, const Problem& p, TileFn fn, bool fused, int64_t r, int64_t i0,
                 int64_t wd, const T* x, const T* values, const T* dy, T* dw, T* agg, T* dyg) {
  const PlanView& pv = p.plan;
  const int64_t fi = p.f_in, fo = p.f_out, tile = tile_of(p);
  T* dw_r = dw + r * fi * fo + i0 * fo;
  if (fo > 0) std::memset(dw_r, 0, sizeof(T) * wd * fo);
  if (pv.rel_ptr[r + 1] <= pv.rel_ptr[r] || fo == 0) return;
  if (fused) {  // per group: dW[r] rows += (reduced own columns) x dY[target]
    auto l = tile_launch(p, 4, values, x, dw_r, i0, wd, pv.rel_ptr[r], pv.rel_ptr[r + 1]);
    l.ld_in = fi;
    l.prefetch_end = pv.grp_ptr[pv.rel_ptr[r + 1]];
    l.grp_dst = pv.grp_dst;
    l.aux = dy;
    l.width2 = fo;
    fn(&l);
    return;
  }
  for (int64_t g0 = pv.rel_ptr[r]; g0 < pv.rel_ptr[r + 1]; g0 += tile) {
    const int64_t g1 = std::min(pv.rel_ptr[r + 1], g0 + tile), m = g1 - g0;
    gather_reduce(fn, p, values, x, fi, i0, wd, g0, g1, agg);
    gather_targets(pv, dy, fo, g0, g1, dyg);
    gemm(fe, p.gemm, true, false, wd, fo, m, agg, wd, dyg, fo, T(1), dw_r, fo);
  }
}

// Whether grad W gives whole relations to threads (dynamic schedule, largest first) rather
// than splitting every relation's rows of dW between them: when no relation holds more than
// a quarter of one thread's share of the entries, so the schedule stays balanced. Whole
// relations gather each dY row once (the row split gathers it once per thread) and run
// [F_in, F_out] products instead of [F_in / threads, F_out] ones.
bool grad_w_by_relation(const Problem& p, const std::vector<int8_t>& side) {
  const PlanView& pv = p.plan;
  const int64_t nt = std::max(1, p.num_threads);
  if (nt == 1) return false;
  int64_t total = 0, largest = 0;
  for (int64_t r = 0; r < pv.r; ++r) {
    if (side[size_t(r)] == 2) continue;
    const int64_t e_r = pv.grp_ptr[pv.rel_ptr[r + 1]] - pv.grp_ptr[pv.rel_ptr[r]];
    total += e_r;
    largest = std::max(largest, e_r);
  }
  return total > 0 && largest * 4 * nt <= total;
}

// dW[r][i0:i1, :] = sum over tiles of agg[:, i0:i1]^T @ dYg; thread t owns rows [i0, i1), or
// (grad_w_by_relation) whole relations. Source-side relations were written by source_side.
template <typename T>
void backward_w(const Problem& p, const T* x, const T* values, const T* dy, T* dw,
                const std::vector<int8_t>& side) {
  const PlanView& pv = p.plan;
  const int64_t fi = p.f_in, fo = p.f_out, tile = tile_of(p);
  FirstError fe;
  const bool fused = use_fused(p, Pass::kGradW);
  if (grad_w_by_relation(p, side)) {
    std::vector<int64_t> rels;
    for (int64_t r = 0; r < pv.r; ++r)
      if (!(side[size_t(r)] == 2 && pv.rel_ptr[r + 1] > pv.rel_ptr[r])) rels.push_back(r);
    const auto entries = [&](int64_t r) {
      return pv.grp_ptr[pv.rel_ptr[r + 1]] - pv.grp_ptr[pv.rel_ptr[r]];
    };
    std::stable_sort(rels.begin(), rels.end(),
                     [&](int64_t a, int64_t b) { return entries(a) > entries(b); });
    const TileFn fn = tile_fn<T>(fi, pv.e * fi, fused ? fo : 0);
    const int64_t n_rels = int64_t(rels.size());
#pragma omp parallel num_threads(std::max(1, p.num_threads)) if (n_rels > 1 && pv.e * fi > 4096)
    {
      std::vector<T> agg(size_t(tile * fi)), dyg(size_t(tile * std::max<int64_t>(fo, 1)));
#pragma omp for schedule(dynamic, 1)
      for (int64_t k = 0; k < n_rels; ++k)
        relation_dw(fe, p, fn, fused, rels[size_t(k)], 0, fi, x, values, dy, dw, agg.data(),
                    dyg.data());
    }
    fe.rethrow();
    return;
  }
  const auto fns = share_fns<T>(p, fi, 1, pv.e * fi, fused ? fo : 0);
#pragma omp parallel num_threads(std::max(1, p.num_threads)) if (pv.e * fi > 4096 && fi >= 2)
  {
    const int64_t nt = thread_count(), t = thread_id();
    const auto [i0, i1] = column_share(fi, t, nt, 1);
    const int64_t wd = i1 - i0;
    const TileFn fn = nt == int64_t(fns.size()) ? fns[size_t(t)] : rows::generic_fn<T>();
    std::vector<T> agg(size_t(tile * std::max<int64_t>(wd, 1))), dyg(size_t(tile * std::max<int64_t>(fo, 1)));
    for (int64_t r = 0; r < pv.r && wd > 0; ++r) {
      if (side[r] == 2 && pv.rel_ptr[r + 1] > pv.rel_ptr[r]) continue;
      relation_dw(fe, p, fn, fused, r, i0, wd, x, values, dy, dw, agg.data(), dyg.data());
    }
  }
  fe.rethrow();
}

// dvalues[perm_p] = scale_g * <x[src_p], dY[dst_g] @ W[r]^T>.
template <typename T>
void backward_values(const Problem& p, const T* x, const T* w, const T* dy, T* dv) {
  const PlanView& pv = p.plan;
  const int64_t fi = p.f_in, fo = p.f_out, tile = tile_of(p);
  std::vector<int64_t> items;  // (relation, first group) of every tile
  for (int64_t r = 0; r < pv.r; ++r)
    for (int64_t g0 = pv.rel_ptr[r]; g0 < pv.rel_ptr[r + 1]; g0 += tile) {
      items.push_back(r);
      items.push_back(g0);
    }
  const int64_t n_items = int64_t(items.size() / 2);
  FirstError fe;
#pragma omp parallel num_threads(std::max(1, p.num_threads)) if (pv.e * fi > 4096)
  {
    std::vector<T> dyg(size_t(tile * std::max<int64_t>(fo, 1))), dagg(size_t(tile * std::max<int64_t>(fi, 1)));
#pragma omp for schedule(dynamic, 4)
    for (int64_t it = 0; it < n_items; ++it) {
      const int64_t r = items[2 * it], g0 = items[2 * it + 1];
      const int64_t g1 = std::min(pv.rel_ptr[r + 1], g0 + tile), m = g1 - g0;
      gather_targets(pv, dy, fo, g0, g1, dyg.data());
      if (fi > 0) {
        gemm(fe, p.gemm, false, true, m, fi, fo, dyg.data(), std::max<int64_t>(fo, 1),
             w + r * fi * fo, std::max<int64_t>(fo, 1), T(0), dagg.data(), fi);
      }
      for (int64_t g = g0; g < g1; ++g) {
        const T* d = dagg.data() + (g - g0) * fi;
        const T scale = p.mean ? T(1) / T(pv.grp_ptr[g + 1] - pv.grp_ptr[g]) : T(1);
        for (int64_t q = pv.grp_ptr[g]; q < pv.grp_ptr[g + 1]; ++q) {
          const T* row = x + pv.src[q] * fi;
          T acc = 0;
          for (int64_t j = 0; j < fi; ++j) acc += row[j] * d[j];
          dv[pv.perm[q]] = scale * acc;
        }
      }
    }
  }
  fe.rethrow();
}

}  // namespace

template <typename T>
void backward(const Problem& p, const T* x, const T* w, const T* values, const T* dy, T* dx,
              T* dw, T* dvalues, const T* root) {
  const PlanView& pv = p.plan;
  const bool want_w = dw && p.f_in > 0 && p.f_out > 0;
  const auto ss = source_side(p, x, values, dy, want_w ? dw : nullptr);
  std::vector<int8_t> side = ss.side;  // 2: dW[r] written before backward_w
  if (dx) {
    if (p.f_out == 0 || (pv.e == 0 && !root)) {
      std::memset(dx, 0, sizeof(T) * p.num_src * p.f_in);
    } else {
      TransposedPlan own;
      const TransposedPlan* tp = p.transposed;
      if (!tp) {
        own = transpose_plan(p);
        tp = &own;
      }
      // The transposed pass's chunks when it carries dW: fixed by the problem (at least 32).
      const int64_t chunks = std::min<int64_t>(
          std::max<int64_t>(forward_chunks(p.num_src, p.f_in, int64_t(sizeof(T)), 1), 32),
          std::max<int64_t>(p.num_src, 1));
      const int64_t slabs = std::min<int64_t>(16, chunks);
      GradWSink<T> sink;
      const bool with_w = want_w && grad_w_in_grad_x<T>(p, *tp, chunks, slabs);
      std::vector<int8_t> want(size_t(pv.r));
      if (with_w) {
        for (int64_t r = 0; r < pv.r; ++r) want[size_t(r)] = int8_t(ss.side[size_t(r)] != 2);
        sink.x = x;
        sink.want = want.data();
        sink.chunks = chunks;
        sink.slabs = slabs;
        sink.partial.assign(size_t(slabs * pv.r * p.f_in * p.f_out), T(0));
      }
      backward_x_transposed(p, tp, w, values, dy, dx, root, with_w ? &sink : nullptr);
      if (with_w) {  // dW[r] = the slabs' partials, summed in slab order
        const int64_t block = p.f_in * p.f_out;
#pragma omp parallel for num_threads(std::max(1, p.num_threads)) schedule(static)
        for (int64_t r = 0; r < pv.r; ++r) {
          if (!sink.done[size_t(r)]) continue;
          T* out = dw + r * block;
          std::memcpy(out, sink.partial.data() + r * block, sizeof(T) * block);
          for (int64_t u = 1; u < slabs; ++u) {
            const T* part = sink.partial.data() + (u * pv.r + r) * block;
            for (int64_t k = 0; k < block; ++k) out[k] += part[k];
          }
        }
        for (int64_t r = 0; r < pv.r; ++r)
          if (sink.done[size_t(r)]) side[size_t(r)] = 2;
      }
    }
  }
  if (want_w) backward_w(p, x, values, dy, dw, side);
  if (dvalues) backward_values(p, x, w, dy, dvalues);
}

template void forward<float>(const Problem&, const float*, const float*, const float*, float*,
                             const RootTerm<float>&);
template void forward<double>(const Problem&, const double*, const double*, const double*,
                              double*, const RootTerm<double>&);
template void backward<float>(const Problem&, const float*, const float*, const float*,
                              const float*, float*, float*, float*, const float*);
template void backward<double>(const Problem&, const double*, const double*, const double*,
                               const double*, double*, double*, double*, const double*);

}  // namespace sparsejit::rgms
