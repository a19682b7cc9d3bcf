// RGMS compute (Torch-free): Y[i] = sum_{p = (i, j, r)} coef_p * X[j] @ W[r] over a plan from
// csrc/rgms/rgms_plan.h (entries grouped by relation, then target), and its gradients.
//
// Every function runs in ONE OpenMP parallel region (no per-relation dispatch) and tiles each
// relation's groups so the gathered rows stay in cache:
//   forward     rows of Y split into chunks (dynamic schedule); per chunk and relation, tiles
//               of groups: gather-reduce X rows (aggregate-then-transform), one small GEMM
//               with W[r], add into the chunk's own rows of Y (no races, deterministic).
//   grad X      the forward above on the transposed structure (TransposedPlan: the entries
//               grouped by (relation, source)): dX = RGMS(A^T, dY, W^T), so rows of dX are
//               split into chunks like Y's, with the forward's cost model per relation.
//               (Until 2026-11 the columns of dX were split between threads, each walking
//               every entry: at 16-32 columns two threads ran 2-3x slower than one.)
//   grad W      with dX also wanted, GEMM tiles (widths above 32) and large enough tiles
//               (at least 32 groups per chunk and relation on average): inside grad X's
//               pass, whose tiles already hold coef * dY reduced per (relation, source): each
//               such tile adds X[sources]^T @ tile into its slab's partial dW[r] (16 slabs of
//               chunks fixed by the problem, summed in order, so the same bits on any thread
//               count; partials at most 32 MiB). The relations left: whole relations per
//               thread (dynamic, largest first) when no relation holds more than a quarter of
//               a thread's share of the entries; else rows of every dW[r] split between
//               threads (F_in). Per tile: gather-reduce the thread's columns of X, GEMM
//               (transposed) with the gathered dY rows, accumulate. dW alone (no dX) always
//               takes that separate pass, so it can differ from dW with dX by rounding.
//   source side relations the forward computes transform-first (few distinct sources) get
//               dW on their sources instead, before the pass above: per relation (dynamic
//               schedule), reduce coef * dY rows onto the distinct sources (T_r, S_r rows),
//               dW[r] = X[sources]^T T_r: S_r GEMM rows instead of one per distinct target.
//   grad values one dot product per entry, tiles of groups spread dynamically.
// coef_p = values[perm_p] (1 without values), divided by the group's size for reduce = mean
// (R-GCN's c_{i,r}). Dense products go through csrc/dense/gemm.h (oneDNN or built-in).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/common/types.h"

namespace sparsejit::rgms {

struct PlanView {
  const int64_t* rel_ptr;  // [r + 1]
  const int64_t* grp_ptr;  // [e + 1]
  const int64_t* grp_dst;  // [e]
  const int64_t* src;      // [e]
  const int64_t* perm;     // [e]
  int64_t r = 0, e = 0;
};

// Per relation: aggregate-then-transform (reduce the entries onto the relation's distinct
// targets, then GEMM the reduced rows with W[r]) or transform-then-aggregate (GEMM the
// relation's distinct sources with W[r] once, then reduce the transformed rows). kAuto: the
// cost model (relation_plan). dX runs the forward on the transposed structure (backward).
enum class Strategy : int { kAuto = 0, kAggregateFirst = 1, kTransformFirst = 2 };

// Where the small dense products run (tests force each; kAuto = the planner's choice):
// per tile of groups on oneDNN or the built-in GEMM kernel, or kFused: no GEMM call, each
// group's row multiplied while it is in registers (kernels/cpu/row_tile_kernel.h kinds 2 and 4,
// JIT-compiled for the two widths). kAuto takes kFused for the forward (and so for grad X,
// the forward on the transposed structure) up to kFusedMaxForward columns each side, oneDNN
// tiles otherwise (benchmarks/archive/bench_rgms_kernels.py, 2 threads, quiet machine, AIFB and an
// AIFB-sized random graph: fused forward 1.95-2.31x at 16 columns, 1.12-1.43x at 32, 0.83-0.99x
// at 64; grad W 0.95-1.27x at 16, behind from 64; docs/RGMS.md). sj.tune measures both per
// structure.
enum class Gemm : int { kAuto = 0, kOneDnn = 1, kBuiltin = 2, kFused = 3 };
constexpr int64_t kFusedMaxForward = 32;

// The ops' `strategy` and `gemm` arguments by name, exported to Python as
// `_core.enums()["rgms_strategy"]` / `["rgms_gemm"]` (the tuner passes them, never numbers).
inline constexpr Strategy kAllStrategies[] = {Strategy::kAuto, Strategy::kAggregateFirst,
                                              Strategy::kTransformFirst};
inline constexpr Gemm kAllGemms[] = {Gemm::kAuto, Gemm::kOneDnn, Gemm::kBuiltin, Gemm::kFused};
inline const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kAuto: return "auto";
    case Strategy::kAggregateFirst: return "aggregate_first";
    case Strategy::kTransformFirst: return "transform_first";
  }
  return "unknown";
}
inline const char* gemm_name(Gemm g) {
  switch (g) {
    case Gemm::kAuto: return "auto";
    case Gemm::kOneDnn: return "onednn";
    case Gemm::kBuiltin: return "builtin";
    case Gemm::kFused: return "fused";
  }
  return "unknown";
}

// Distinct sources per relation (structure only, so computed once per typed structure and
// cached by the caller): src_ptr [R + 1], src_list [sum S_r] (first-seen order), and each
// entry's slot in its relation's list.
struct SourceIndex {
  std::vector<int64_t> src_ptr, src_list, slot;
};

struct TransposedPlan;

struct Problem {
  PlanView plan;
  int64_t num_rows = 0;  // rows of Y / dY
  int64_t num_src = 0;   // rows of X / dX
  int64_t f_in = 0, f_out = 0;
  bool mean = false;
  Gemm gemm = Gemm::kAuto;
  int64_t tile = 0;  // groups per tile; 0 = chosen from f_in / f_out
  int num_threads = 1;  // the caller's intra-op thread count (at::get_num_threads())
  Strategy strategy = Strategy::kAuto;
  int64_t f_root = 0;  // columns of x_root (the root term's input), when there is one
  // The structure's source index (index_sources), when the caller caches it; else built on
  // each call that needs it.
  const SourceIndex* sources = nullptr;
  // The transposed structure (transpose_plan), when the caller caches it; else the backward
  // builds it on each call that computes dX.
  const TransposedPlan* transposed = nullptr;
  // float32 forward only: W [R, f_in, f_out] in bfloat16. When set, the tile
  // products (the fused rows too, see w_pairs; not the root term) run on oneDNN's bfloat16 GEMM
  // (dense::gemm_bf16): each gathered tile is rounded to bfloat16 (to nearest even;
  // vcvtneps2bf16 where the CPU has it, which reads float32 denormals as zero) and
  // multiplied by these weights with float32 accumulation. The Torch adapter sets it for
  // bfloat16 inputs where dense::gemm_bf16_native().
  const bf16* w_bf16 = nullptr;
  // With w_bf16, where dense::gemm_bf16_ukernel_takes(f_out): the same weights packed per
  // relation for the bfloat16 micro-kernel (dense::pack_bf16_vnni, w_vnni_stride values per
  // relation); the tiles then multiply on it instead of oneDNN's bfloat16 GEMM. forward()
  // packs them itself (once per call): callers leave these unset.
  const bf16* w_vnni = nullptr;
  int64_t w_vnni_stride = 0;
  // float32 forward with w_bf16, where the forward runs tiles or fused_bf16_takes: X
  // [num_src, f_in] in bfloat16, read as it is by the tile gathers, the fused rows (kind 8)
  // and the transform-first row copies (widened exactly, so every sum equals that of a
  // converted float32 X); X itself may then be null.
  const bf16* x_bf16 = nullptr;
  // With x_bf16 and w_bf16 on the fused rows (fused_bf16_takes): W in bfloat16 pairs per
  // relation (dense::pack_bf16_vnni, w_pairs_stride values per relation) for kind 8 of
  // kernels/cpu/row_tile_kernel.h; forward() packs them itself.
  const bf16* w_pairs = nullptr;
  int64_t w_pairs_stride = 0;
};

// Whether a forward of these widths runs the GEMM tiles for every relation it aggregates
// first (not the fused row kernels), `gemm` as in Problem.
bool forward_runs_tiles(int64_t f_in, int64_t f_out, Gemm gemm);
// Whether a float32 forward with x_bf16 and w_bf16 runs its fused rows on bfloat16 products
// (kind 8): the fused rows, a CPU with AVX512-BF16 and the rows' JIT instantiation.
bool fused_bf16_takes(const Problem& p);

// The transposed typed structure: the same entries grouped by (relation, source), so its
// targets are the original sources. dX = RGMS(A^T, dY, W^T): the backward runs the forward's
// passes on it (row chunks owned by threads, no column split, no write sharing). perm maps
// each transposed entry to the original entry's position (not the edge id), so a vector of
// per-entry coefficients in plan order carries values and the mean's 1/|group| over.
struct TransposedPlan {
  std::vector<int64_t> rel_ptr, grp_ptr, grp_dst, src, perm;
  SourceIndex sources;  // of the transposed structure (its sources: the original targets)
  PlanView view(int64_t r, int64_t e) const {
    return {rel_ptr.data(), grp_ptr.data(), grp_dst.data(), src.data(), perm.data(), r, e};
  }
};

// O(E + num_src + R) (two counting sorts, csrc/rgms/rgms_plan.h) plus the source index.
TransposedPlan transpose_plan(const Problem& p);

// Builds the source index of p's structure (O(E), parallel over relations).
SourceIndex index_sources(const Problem& p);

// The fused root term and bias of an R-GCN layer: Y = x_root @ root + bias + sum over
// relations. x_root [num_rows, f_root], root [f_root, f_out], bias [f_out]; each may be null.
template <typename T>
struct RootTerm {
  const T* x_root = nullptr;
  const T* root = nullptr;
  const T* bias = nullptr;
};

// Per relation r (arrays of length R): entries, distinct targets (groups), distinct sources,
// and the forward's choice (1 = aggregate first, 2 = transform first). The model: GEMM rows
// times F_in x F_out plus gathered elements, transform first when it is at least 10% cheaper,
// while the transformed rows (sum of the chosen relations' sources x F_out) fit in the
// output's size (so peak memory stays near inputs + outputs).
struct RelationPlan {
  std::vector<int64_t> entries, targets, sources;
  std::vector<int8_t> choice;
};
RelationPlan relation_plan(const Problem& p);

// y [num_rows, f_out] is fully written (rows without entries get the root term and bias).
template <typename T>
void forward(const Problem& p, const T* x, const T* w, const T* values, T* y,
             const RootTerm<T>& rt = {});

// Each output may be null (not needed). Each non-null one is fully written. root (may be
// null; needs num_src == num_rows and f_root == f_in): dX also gets dY @ root^T, the root
// term's gradient when x_root is X itself. dX is the forward on the transposed structure
// (p.transposed, or built here): p.strategy 1 (target side) is its transform-first, 2
// (source side) its aggregate-first, 0 its cost model.
template <typename T>
void backward(const Problem& p, const T* x, const T* w, const T* values, const T* dy, T* dx,
              T* dw, T* dvalues, const T* root = nullptr);

// The tile (groups per GEMM) the planner uses for these widths.
int64_t default_tile(int64_t f_in, int64_t f_out);

}  // namespace sparsejit::rgms
