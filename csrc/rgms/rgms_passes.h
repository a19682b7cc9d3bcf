// The pieces the RGMS passes share (csrc/rgms/rgms_run.h): dense products, the
// transform-first row loops, tile launches of the row-loop family, row initialisation, the
// cost model's per-relation choice and the forward pass that grad X reuses on the transposed
// structure. Internal to csrc/rgms: rgms_cost.cpp (plan and cost model), rgms_forward.cpp,
// rgms_backward.cpp and rgms_passes.cpp (the out-of-line pieces) include it; every one of
// them is compiled without contraction (CMakeLists.txt), so the passes give the same bits
// whichever file a template is instantiated in.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "csrc/core/first_error.h"
#include "csrc/dense/gemm.h"
#include "csrc/rgms/rgms_run.h"
#include "csrc/rgms/row_tiles.h"
#include "kernels/cpu/row_tile_kernel.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace sparsejit::rgms::detail {

inline int thread_count() {
#ifdef _OPENMP
  return omp_get_num_threads();
#else
  return 1;
#endif
}
inline int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// Row-major C = op(A) op(B) + beta C on the chosen backend (float64: always built-in).
void gemm_raw(Gemm g, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm_raw(Gemm g, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a,
              int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

// A tile rounded to bfloat16 for oneDNN's bfloat16 products (rgms_passes.cpp).
void round_rows_bf16(const float* a, int64_t rows, int64_t cols, int64_t lda, bf16* out);

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
// An AVX2 copy and a baseline one, picked by isa_tier() (rgms_passes.cpp).
enum class SlotDir { kToTargets, kToSlots };
template <typename T>
void slot_rows_run(SlotDir d, const PlanView& pv, const int64_t* slot, const T* values,
                   bool mean, int64_t g0, int64_t g1, const T* in, T* out, int64_t w);

// The tile loops (kernels/cpu/row_tile_kernel.h), JIT-specialized per width or generic: the
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
inline bool use_fused(const Problem& p, Pass pass) {
  if (p.f_in <= 0 || p.f_out <= 0 || p.f_in > cpu::row_tile_detail::kFusedMaxWidth ||
      p.f_out > cpu::row_tile_detail::kFusedMaxWidth)
    return false;
  return p.gemm == Gemm::kFused ||
         (p.gemm == Gemm::kAuto && pass != Pass::kGradW &&
          std::max(p.f_in, p.f_out) <= kFusedMaxForward);
}

// One tile's launch for groups [g0, g1), columns [c0, c0 + w) (kernels/cpu/row_tile_kernel.h).
template <typename T>
cpu::RowTileLaunch tile_launch(const Problem& p, int32_t kind, const T* values, const T* in,
                                T* out, int64_t c0, int64_t w, int64_t g0, int64_t g1) {
  cpu::RowTileLaunch l;
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

inline int64_t lower_bound_dst(const PlanView& pv, int64_t g0, int64_t g1, int64_t row) {
  return std::lower_bound(pv.grp_dst + g0, pv.grp_dst + g1, row) - pv.grp_dst;
}

inline int64_t tile_of(const Problem& p) {
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

// The forward's per-relation choice (1 aggregate first, 2 transform first) from the
// relations' distinct sources (rgms_cost.cpp).
RelationPlan plan_from_sources(const Problem& p, const SourceIndex& si);
// The cached index when the caller has one, else a fresh one kept in `own`.
const SourceIndex& sources_of(const Problem& p, SourceIndex& own);

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
inline int64_t forward_chunks(int64_t n, int64_t fo, int64_t elem, int nt) {
  const int64_t by_cache = (n * fo * elem + (256 << 10) - 1) / (256 << 10);
  return std::clamp<int64_t>(std::max<int64_t>(by_cache, nt == 1 ? 1 : 8 * nt), 1,
                             std::max<int64_t>(n, 1));
}

// The forward pass (rgms_forward.cpp); with a sink, grad W's partials taken inside it.
template <typename T>
void forward_impl(const Problem& p, const T* x, const T* w, const T* values, T* y,
                  const RootTerm<T>& rt, GradWSink<T>* sink);

}  // namespace sparsejit::rgms::detail
