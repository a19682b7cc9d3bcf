// RGMS: relational gather-matmul-scatter, Y[i] = sum_{p in row i} a_p * X[src_p] @ W[type_p].
//
// rgms_plan(edge_index, edge_type, num_src, num_dst, num_relations) -> plan: the typed
//   structure grouped by relation and target (csrc/rgms/rgms_plan.h), built and validated
//   once, as one int64 plan tensor: the common plan header, then the arrays
//   (csrc/rgms/plan_layout.h).
// rgms(plan, x, w, values, reduce, num_rows, gemm, tile, strategy) -> y [num_rows, F_out]:
//   csrc/rgms/rgms_run.h (one parallel region; per relation aggregate-then-transform or
//   transform-then-aggregate over tiles of groups, each tile one GEMM). Never a per-edge tensor.
// rgms_backward(plan, x, w, values, grad_y, reduce, need_x, need_w, need_values)
//   -> (dx, dw, dvalues), each empty when not needed.
// (segment_matmul and the Linear: torch_ext/ops/dense.cpp.)
//
// float32 / float64 run natively; bfloat16 / float16 run in float32 and are converted back.
#include "torch_ext/tensor_api.h"
#ifndef SPARSEJIT_STABLE_ABI
#include <ATen/core/dispatch/Dispatcher.h>
#endif

#include <cstdlib>

#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "csrc/dense/gemm.h"
#include "csrc/rgms/plan_layout.h"
#include "csrc/rgms/rgms_plan.h"
#include "csrc/rgms/rgms_run.h"
#include "torch_ext/common.h"
#include "torch_ext/cuda_fallback.h"
#include "torch_ext/validated.h"

SJ_LIBRARY_FRAGMENT(m) {
  m.def("rgms_plan(Tensor edge_index, Tensor edge_type, SymInt num_src, SymInt num_dst, "
        "int num_relations) -> Tensor");
  m.def("rgms(Tensor plan, Tensor x, Tensor w, Tensor? values, str reduce, SymInt num_rows, "
        "int gemm=0, "
        "int tile=0, int strategy=0, Tensor? root=None, Tensor? bias=None, "
        "Tensor? x_root=None) -> Tensor");
  m.def("rgms_explain(Tensor plan, int num_rows, int num_src, int f_in, int f_out) -> Tensor");
  m.def("rgms_backward(Tensor plan, Tensor x, Tensor w, Tensor? values, Tensor grad_y, "
        "str reduce, "
        "bool need_x, bool need_w, bool need_values, int gemm=0, int tile=0, "
        "int strategy=0, Tensor? root=None) -> (Tensor, Tensor, Tensor)");
}

namespace sparsejit {
namespace {

void check_index_1d(const tx::Tensor& t, const char* op, const char* name) {
  SJ_CHECK_TYPE(t.scalar_type() == tx::kLong, "sparsejit.", op, ": ", name,
                   " must be int64; got ", t.scalar_type());
  SPARSEJIT_CHECK(op, t.dim() == 1, name, " must be 1-D; got shape ", t.sizes());
}

// ---- plan -----------------------------------------------------------------------------

// The plan with tensor ops on the edges' own device, word for word build_plan's: a stable sort
// by the key relation * num_dst + target (the CPU's two stable counting sorts: ties keep edge
// order), groups where the key changes, rel_ptr by a search of each group's relation. nullopt
// when an edge is out of range (the caller's CPU checks name it) or the key could overflow.
// Host syncs: the validity flag, the group count, and the whole plan once for its
// fingerprint (a serial hash, computed on the host; the header goes back in one small copy).
std::optional<tx::Tensor> rgms_plan_tensor(const tx::Tensor& ei, const tx::Tensor& et,
                                           int64_t num_src, int64_t num_dst, int64_t r) {
  const int64_t e = ei.size(1);
  // (the key's scalars cross the stable ABI as doubles: exact below 2^53)
  if (num_dst > (int64_t{1} << 53) || e > (int64_t{1} << 53) ||
      (num_dst > 0 && r > (int64_t{1} << 62) / num_dst))
    return std::nullopt;
  const auto i64 = ei.options();
  const tx::Tensor s = ei.select(0, 0), d = ei.select(0, 1);
  if (e > 0) {
    const tx::Tensor bad = (et < 0) | (et >= r) | (s < 0) | (s >= num_src) | (d < 0) |
                           (d >= num_dst);
    if (bad.any().item<bool>()) return std::nullopt;  // sync: the validity flag
  }
  const tx::Tensor key = et * num_dst + d;
  auto [sk, perm] = tx::sort(key, /*stable=*/true, 0, false);
  const tx::Tensor starts = tx::nonzero(run_starts(sk)).reshape({-1});  // sync: the group count
  const int64_t g = starts.numel();
  const tx::Tensor lead = perm.index_select(0, starts);  // first edge of each group
  const tx::Tensor arrays[] = {
      tx::searchsorted(et.index_select(0, lead), tx::arange(r + 1, i64)),         // rel_ptr
      tx::cat({starts, tx::zeros({e + 1 - g}, i64) + e}),                          // grp_ptr
      tx::cat({d.index_select(0, lead), tx::zeros({e - g}, i64)}),                 // grp_dst
      s.index_select(0, perm),                                                     // src
      perm};                                                                       // perm
  tx::Tensor plan = tx::empty({rgms::plan_words(r, e)}, i64);
  int64_t at[rgms::kNumArrays];
  rgms::array_offsets(r, e, at);
  for (int i = 0; i < rgms::kNumArrays; ++i)
    plan.narrow(0, at[i], rgms::kArrays[i].length(r, e)).copy_(arrays[i]);
  // sync: the words for the fingerprint (the CPU plan's own stamp_plan over them).
  tx::Tensor host = plan.cpu();
  int64_t* words = ptr<int64_t>(host);
  std::fill(words, words + rgms::kFixedWords, int64_t{0});
  plan::write_header(words, OpKind::Rgms, /*kernel=*/0, /*prefetch=*/0, /*param=*/r,
                     rgms::stamp_plan(words, r, e, num_dst, num_src));
  if (plan.device().is_cpu()) return host;
  plan.narrow(0, 0, rgms::kFixedWords).copy_(host.narrow(0, 0, rgms::kFixedWords));
  return plan;
}

tx::Tensor rgms_plan_cpu(
    const tx::Tensor& edge_index, const tx::Tensor& edge_type, int64_t num_src, int64_t num_dst,
    int64_t num_relations) {
  const char* op = "rgms_plan";
  SPARSEJIT_CHECK(op, edge_index.dim() == 2 && edge_index.size(0) == 2,
                  "edge_index must have shape [2, E]; got ", edge_index.sizes());
  SJ_CHECK_TYPE(!tx::isFloatingType(edge_index.scalar_type()) &&
                       !tx::isComplexType(edge_index.scalar_type()) &&
                       edge_index.scalar_type() != tx::kBool,
                   "sparsejit.rgms_plan: edge_index must hold integers; got ",
                   edge_index.scalar_type());
  SJ_CHECK_TYPE(!tx::isFloatingType(edge_type.scalar_type()) &&
                       !tx::isComplexType(edge_type.scalar_type()) &&
                       edge_type.scalar_type() != tx::kBool,
                   "sparsejit.rgms_plan: edge_type must hold integers; got ",
                   edge_type.scalar_type());
  const int64_t e = edge_index.size(1);
  SPARSEJIT_CHECK(op, edge_type.dim() == 1 && edge_type.numel() == e,
                  "edge_type must have shape [E] = [", e, "] (one relation per edge); got ",
                  edge_type.sizes());
  SPARSEJIT_CHECK(op, num_relations >= 1, "num_relations must be >= 1; got ", num_relations);
  SPARSEJIT_CHECK(op, num_src >= 0 && num_dst >= 0, "node counts must be >= 0; got ", num_src,
                  " sources and ", num_dst, " targets");
  SPARSEJIT_CHECK(op, edge_type.device() == edge_index.device(), "edge_type is on ",
                  edge_type.device(), " but edge_index is on ", edge_index.device());
  auto ei = edge_index.to(tx::kLong).contiguous();
  auto et = edge_type.to(tx::kLong).contiguous();
  if (!ei.device().is_cpu() || structure_aten_forced()) {
    // The device-generic builder (what CUDA runs; on CPU tensors when forced, for tests).
    auto plan = rgms_plan_tensor(ei, et, num_src, num_dst, num_relations);
    if (plan.has_value()) return *plan;
    // Bad input: the CPU checks below name the offending edge (a copy of the edges).
    ei = ei.cpu();
    et = et.cpu();
  }
  const int64_t* s = ptr<int64_t>(ei);
  const int64_t* d = s + e;
  const auto ok = rgms::check_typed_edges(s, d, ptr<int64_t>(et), e, num_src, num_dst,
                                          num_relations);
  SPARSEJIT_CHECK(op, ok.ok, ok.message);
  auto plan = tx::empty({rgms::plan_words(num_relations, e)}, ei.options());
  int64_t* words = ptr<int64_t>(plan);
  const auto v = rgms::view_words(words, num_relations, e);
  rgms::build_plan(s, d, ptr<int64_t>(et), e, num_dst, num_relations, v.rel_ptr, v.grp_ptr,
                   v.grp_dst, v.src, v.perm);
  plan::write_header(words, OpKind::Rgms, /*kernel=*/0, /*prefetch=*/0,
                     /*param=*/num_relations,
                     rgms::stamp_plan(words, num_relations, e, num_dst, num_src));
  // (edges on another device reach here only when the builder declined: back to their device)
  return edge_index.device().is_cpu() ? plan : plan.to(edge_index.device());
}

// ---- rgms -----------------------------------------------------------------------------

// The key the once-per-plan tables (validated_once, derived_once) use for a (rows, sources)
// pair: both counts packed exactly; sizes past 2^31 get a key no other call can repeat.
int64_t rows_sources_key(int64_t num_rows, int64_t num_src) {
  if (num_rows < (int64_t(1) << 31) && num_src < (int64_t(1) << 31))
    return (num_rows << 31) | num_src;
  static std::atomic<int64_t> unique_key{-1};
  return unique_key.fetch_sub(1);
}

// A checked call's plan: the plan tensor and views of its arrays (csrc/rgms/plan_layout.h).
struct PlanArgs {
  tx::Tensor plan;
  tx::Tensor rel_ptr, grp_ptr, grp_dst, src, perm;
  int64_t r, e;
  bool mean;
};

PlanArgs check_rgms_args(const char* op, const tx::Tensor& plan, const tx::Tensor& x,
                         const tx::Tensor& w, const std::optional<tx::Tensor>& values,
                         tx::Str reduce, int64_t num_rows) {
  check_index_1d(plan, op, "plan");
  check_float(x, "X");
  check_float(w, "W");
  SPARSEJIT_CHECK(op, x.dim() == 2, "X must be [num_nodes, F_in]; got shape ", x.sizes());
  SPARSEJIT_CHECK(op, w.dim() == 3, "W must be [num_relations, F_in, F_out]; got shape ",
                  w.sizes());
  SJ_CHECK_TYPE(w.scalar_type() == x.scalar_type(), "sparsejit.", op, ": W dtype (",
                   w.scalar_type(), ") must match X dtype (", x.scalar_type(), ")");
  // The header's words, read on the host once per live plan (a device plan's only sync
  // after its first validation), name the family, R and E on every call.
  SPARSEJIT_CHECK(op, plan.numel() >= rgms::kFixedWords, "plan has ", plan.numel(),
                  " words, fewer than the plan header's ", rgms::kFixedWords,
                  ": not a plan from rgms_plan");
  const auto header = std::static_pointer_cast<const std::vector<int64_t>>(
      derived_once("rgms_header", plan, 0, [&] {
        const auto h = plan.narrow(0, 0, rgms::kFixedWords).cpu().contiguous();
        return Derived{std::make_shared<std::vector<int64_t>>(
                           ptr<int64_t>(h), ptr<int64_t>(h) + rgms::kFixedWords),
                       int64_t{8} * rgms::kFixedWords};
      }));
  const std::vector<int64_t>& hw = *header;
  SPARSEJIT_CHECK(op,
                  hw[plan::kWordMagic] == plan::kPlanMagic &&
                      hw[plan::kWordVersion] == plan::kPlanVersion &&
                      hw[plan::kWordOp] == static_cast<int64_t>(OpKind::Rgms),
                  "plan is not an RGMS plan from rgms_plan (its header names op '",
                  plan::plan_op_name(hw[plan::kWordOp]), "', version ", hw[plan::kWordVersion],
                  ")");
  PlanArgs a;
  a.r = w.size(0);
  SPARSEJIT_CHECK(op, a.r == hw[plan::kWordParam], "W has ", a.r,
                  " relations but the typed structure has ", hw[plan::kWordParam]);
  a.e = rgms::entries_of(plan.numel(), a.r);
  SPARSEJIT_CHECK(op, a.e >= 0 && a.e == hw[plan::kWordNnz], "plan has ", plan.numel(),
                  " words but its header describes ", hw[plan::kWordParam], " relations and ",
                  hw[plan::kWordNnz], " entries (", rgms::plan_words(a.r, hw[plan::kWordNnz]),
                  " words)");
  SPARSEJIT_CHECK(op, w.size(1) == x.size(1), "W has F_in = ", w.size(1), " but X has ", x.size(1),
                  " features");
  SPARSEJIT_CHECK(op, num_rows >= 0, "num_rows must be >= 0; got ", num_rows);
  for (const auto* t : {&plan, &w}) {
    check_same_device(*t, x, "the typed structure / W", "X");
  }
  if (values.has_value()) {
    const auto& v = *values;
    SJ_CHECK_TYPE(v.scalar_type() == x.scalar_type(), "sparsejit.", op, ": values dtype (",
                     v.scalar_type(), ") must match X dtype (", x.scalar_type(), ")");
    SPARSEJIT_CHECK(op, v.dim() == 1 && v.numel() == a.e, "values must have shape [", a.e,
                    "]; got ", v.sizes());
    check_same_device(v, x, "values", "X");
  }
  SPARSEJIT_CHECK(op, reduce == "sum" || reduce == "mean", "reduce must be 'sum' or 'mean'; got '",
                  std::string(reduce), "'");
  a.mean = reduce == "mean";
  a.plan = plan.contiguous();
  {
    int64_t at[rgms::kNumArrays];
    rgms::array_offsets(a.r, a.e, at);
    a.rel_ptr = a.plan.narrow(0, at[0], a.r + 1);
    a.grp_ptr = a.plan.narrow(0, at[1], a.e + 1);
    a.grp_dst = a.plan.narrow(0, at[2], a.e);
    a.src = a.plan.narrow(0, at[3], a.e);
    a.perm = a.plan.narrow(0, at[4], a.e);
  }
  // O(R + G + E): once per live plan (same tensors, versions, row and source counts).
  const int64_t num_src = x.size(0);
  const int64_t key = rows_sources_key(num_rows, num_src);
  validated_once("rgms", a.plan, key, [&] {
    // A device plan is checked on a host copy (once per live plan: the sync is here).
    const tx::Tensor host = a.plan.is_cpu() ? a.plan : a.plan.cpu();
    const int64_t* words = ptr<int64_t>(host);
    const auto v = rgms::view_words(words, a.r, a.e);
    const auto ok = rgms::check_plan(v.rel_ptr, a.r, v.grp_ptr, v.grp_dst, v.src, v.perm, a.e,
                                     num_rows, num_src);
    SPARSEJIT_CHECK(op, ok.ok, "invalid typed structure: ", ok.message);
    // The header: an RGMS plan, for this many relations and entries, for num_rows targets and
    // X's sources, and its arrays unchanged since rgms_plan stamped them.
    std::string error;
    const bool header_ok = plan::check_header(
        words, host.numel(), OpKind::Rgms,
        rgms::stamp_plan(words, a.r, a.e, num_rows, num_src), &error);
    SPARSEJIT_CHECK(op, header_ok, error,
                    " (an RGMS plan is checked against num_rows, X's rows and its own arrays)");
  });
  return a;
}

// The Torch-free problem description (csrc/rgms/rgms_run.h) of a checked call.
rgms::Problem make_problem(const PlanArgs& a, int64_t num_rows, int64_t num_src, int64_t f_in,
                           int64_t f_out, int64_t gemm, int64_t tile) {
  SPARSEJIT_CHECK("rgms", gemm >= 0 && gemm <= 3,
                  "gemm must be 0 (auto), 1 (oneDNN), 2 (built-in) "
                  "or 3 (fused row products); got ",
                  gemm);
  SPARSEJIT_CHECK("rgms", tile >= 0 && tile <= (int64_t(1) << 20),
                  "tile must be in [0, 2^20]; got ", tile);
  rgms::Problem p;
  p.plan = {ptr<int64_t>(a.rel_ptr), ptr<int64_t>(a.grp_ptr), ptr<int64_t>(a.grp_dst),
            ptr<int64_t>(a.src),     ptr<int64_t>(a.perm),    a.r,
            a.e};
  p.num_rows = num_rows;
  p.num_src = num_src;
  p.f_in = f_in;
  p.f_out = f_out;
  p.mean = a.mean;
  p.gemm = static_cast<rgms::Gemm>(gemm);
  p.tile = tile;
  p.num_threads = tx::get_num_threads();
  return p;
}

int64_t source_index_bytes(const rgms::SourceIndex& s) {
  return 8 * int64_t(s.src_ptr.size() + s.src_list.size() + s.slot.size());
}

// The structure's distinct-source index (csrc/rgms/rgms_run.h), built once per live plan and
// source count, not on every call: the cost model and the transform-first / source-side
// passes read it. The returned pointer keeps it alive for the call.
std::shared_ptr<const rgms::SourceIndex> attach_sources(const PlanArgs& a, rgms::Problem& p) {
  if (p.strategy == rgms::Strategy::kAggregateFirst || a.e == 0) return nullptr;
  auto made = derived_once("rgms_sources", a.plan, p.num_src, [&] {
    auto s = std::make_shared<rgms::SourceIndex>(rgms::index_sources(p));
    return Derived{s, source_index_bytes(*s)};
  });
  auto sources = std::static_pointer_cast<const rgms::SourceIndex>(made);
  p.sources = sources.get();
  return sources;
}

// The transposed structure the backward's dX runs on (csrc/rgms/rgms_run.h), built once per
// live plan and (rows, sources) pair, as the source index is.
std::shared_ptr<const rgms::TransposedPlan> attach_transposed(const PlanArgs& a,
                                                              rgms::Problem& p) {
  if (a.e == 0) return nullptr;
  const int64_t key = rows_sources_key(p.num_rows, p.num_src);
  auto made = derived_once("rgms_transposed", a.plan, key, [&] {
    auto t = std::make_shared<rgms::TransposedPlan>(rgms::transpose_plan(p));
    const int64_t words = int64_t(t->rel_ptr.size() + t->grp_ptr.size() + t->grp_dst.size() +
                                  t->src.size() + t->perm.size());
    return Derived{t, 8 * words + source_index_bytes(t->sources)};
  });
  auto t = std::static_pointer_cast<const rgms::TransposedPlan>(made);
  p.transposed = t.get();
  return t;
}

template <typename T>
const T* opt_ptr(const std::optional<tx::Tensor>& t) {
  return t.has_value() ? ptr<T>(*t) : nullptr;
}

// ---- The device-generic composite (what CUDA tensors run) -------------------------------------
// The aggregate-first dataflow from ATen ops and sparsejit's own SpMM / SDDMM ops, so on a GPU:
// each (relation, target) group's reduce of its sources' rows is an SpMM over the groups
// (NVRTC kernels), the per-relation GEMMs are cuBLAS (tx::mm on each relation's slice of
// groups), the scatter of the groups' products to their targets is a second SpMM over a
// target -> group CSR (no atomics). Backward: dW on cuBLAS per relation, dX an SpMM over a
// source -> entry CSR, dvalues an SDDMM. Host reads: rel_ptr (R + 1 sizes) once per plan, and
// the plan's first validation. SPARSEJIT_RGMS_COMPOSITE=1 runs it on CPU tensors too, which is
// how tests check it against the CPU kernels without a GPU.

// bfloat16 tile products on oneDNN's bfloat16 GEMM (rgms::Problem::w_bf16): where it runs
// natively, unless SPARSEJIT_RGMS_BF16_GEMM=0.
bool bf16_gemm_enabled() {
  const char* v = std::getenv("SPARSEJIT_RGMS_BF16_GEMM");
  if (v != nullptr && std::string(v) == "0") return false;
  return dense::gemm_bf16_native();
}

bool composite_forced() {
  const char* v = std::getenv("SPARSEJIT_RGMS_COMPOSITE");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

// What the composite derives from a plan (once per live plan, row and source count).
struct Composite {
  std::vector<int64_t> rel;  // rel_ptr on the host: group ranges of the relations
  int64_t groups = 0;        // G
  tx::Tensor grp_rowptr;     // grp_ptr[0 : G + 1]: groups -> entries (col = src)
  tx::Tensor tg_rowptr, tg_col;  // targets -> groups
  tx::Tensor sg_rowptr, sg_col, sg_pos;  // sources -> (group, entry position) of their entries
  tx::Tensor inv_size;       // [E]: 1 / the size of each entry's group (mean)
};

std::shared_ptr<const Composite> composite_of(const PlanArgs& a, int64_t num_rows,
                                              int64_t num_src) {
  const int64_t key = rows_sources_key(num_rows, num_src);
  auto made = derived_once("rgms_composite", a.plan, key,
                           [&] {
    auto c = std::make_shared<Composite>();
    const tx::Tensor rel = a.rel_ptr.cpu();
    c->rel.assign(ptr<int64_t>(rel), ptr<int64_t>(rel) + rel.numel());
    c->groups = c->rel.back();
    const auto opt = a.grp_ptr.options();
    c->grp_rowptr = a.grp_ptr.narrow(0, 0, c->groups + 1).contiguous();
    // Targets -> groups: a stable sort of the groups by target.
    const auto dst = a.grp_dst.narrow(0, 0, c->groups);
    auto [dst_sorted, by_dst] = tx::sort(dst, /*stable=*/true, 0, false);
    c->tg_rowptr = tx::searchsorted(dst_sorted, tx::arange(num_rows + 1, opt));
    c->tg_col = by_dst;
    // Each entry's group, and the sources -> entries CSR.
    const auto sizes = c->grp_rowptr.narrow(0, 1, c->groups) - c->grp_rowptr.narrow(0, 0, c->groups);
    const auto entry_group =
        tx::repeat_interleave(tx::arange(c->groups, opt), sizes, 0, a.e);
    c->inv_size = tx::ones({a.e}, opt.dtype(tx::kDouble))
                      .div_(sizes.index_select(0, entry_group).to(tx::kDouble));
    auto [src_sorted, by_src] = tx::sort(a.src, /*stable=*/true, 0, false);
    c->sg_rowptr = tx::searchsorted(src_sorted, tx::arange(num_src + 1, opt));
    c->sg_col = entry_group.index_select(0, by_src);
    c->sg_pos = by_src;
    int64_t bytes = 8 * int64_t(c->rel.size());
    for (const auto* t : {&c->grp_rowptr, &c->tg_rowptr, &c->tg_col, &c->sg_rowptr, &c->sg_col,
                          &c->sg_pos, &c->inv_size})
      bytes += static_cast<int64_t>(t->nbytes());
    return Derived{std::shared_ptr<const Composite>(c), bytes};
  });
  return std::static_pointer_cast<const Composite>(made);
}

// The composite's nested sparsejit::spmm / sddmm calls, through the dispatcher (so that they
// reach the kernel of the tensors' device).
#ifndef SPARSEJIT_STABLE_ABI
tx::Tensor call_spmm(const tx::Tensor& rowptr, const tx::Tensor& col,
                     const std::optional<tx::Tensor>& values, const tx::Tensor& x,
                     tx::Str reduce, int64_t num_cols) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("sparsejit::spmm", "")
          .typed<std::tuple<tx::Tensor, tx::Tensor>(
              const tx::Tensor&, const tx::Tensor&, const std::optional<tx::Tensor>&,
              const tx::Tensor&, tx::Str, c10::SymInt, const std::optional<tx::Tensor>&,
              const std::optional<tx::Tensor>&, const std::optional<tx::Tensor>&,
              const std::optional<tx::Tensor>&, const std::optional<tx::Tensor>&,
              tx::Str, double, double, bool)>();
  return std::get<0>(op.call(rowptr, col, values, x, reduce, c10::SymInt(num_cols), std::nullopt,
                             std::nullopt, std::nullopt, std::nullopt, std::nullopt, "none",
                             0.01, 1.0, false));
}

tx::Tensor call_sddmm(const tx::Tensor& rowptr, const tx::Tensor& col, const tx::Tensor& q,
                      const tx::Tensor& k) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("sparsejit::sddmm", "")
          .typed<tx::Tensor(const tx::Tensor&, const tx::Tensor&, const tx::Tensor&,
                            const tx::Tensor&, c10::SymInt, const std::optional<tx::Tensor>&,
                            const std::optional<tx::Tensor>&, const std::optional<tx::Tensor>&)>();
  return op.call(rowptr, col, q, k, c10::SymInt(k.size(0)), std::nullopt, std::nullopt,
                 std::nullopt);
}
#else
tx::Tensor call_spmm(const tx::Tensor& rowptr, const tx::Tensor& col,
                     const std::optional<tx::Tensor>& values, const tx::Tensor& x,
                     tx::Str reduce, int64_t num_cols) {
  const std::optional<tx::Tensor> none;
  return tx::unbox_tensor(tx::call_boxed<2>("sparsejit::spmm", "", rowptr, col, values, x, reduce,
                                            num_cols, none, none, none, none, none,
                                            std::string("none"), 0.01, 1.0, false)[0]);
}

tx::Tensor call_sddmm(const tx::Tensor& rowptr, const tx::Tensor& col, const tx::Tensor& q,
                      const tx::Tensor& k) {
  const std::optional<tx::Tensor> none;
  return tx::unbox_tensor(tx::call_boxed<1>("sparsejit::sddmm", "", rowptr, col, q, k,
                                            int64_t(k.size(0)), none, none, none)[0]);
}
#endif

// Z [G, F_in]: each group's reduce (sum or mean) of a_e X[src[e]].
tx::Tensor composite_groups(const PlanArgs& a, const Composite& c, const tx::Tensor& x,
                            const std::optional<tx::Tensor>& values) {
  std::optional<tx::Tensor> v;
  if (values.has_value()) v = values->index_select(0, a.perm);
  return call_spmm(c.grp_rowptr, a.src, v, x, a.mean ? "mean" : "sum", x.size(0));
}

tx::Tensor rgms_composite(const PlanArgs& a, const tx::Tensor& x, const tx::Tensor& w,
                          const std::optional<tx::Tensor>& values, int64_t num_rows,
                          const std::optional<tx::Tensor>& root,
                          const std::optional<tx::Tensor>& x_root,
                          const std::optional<tx::Tensor>& bias) {
  tx::AutoDispatchBelowADInplaceOrView below_autograd;
  const auto c = composite_of(a, num_rows, x.size(0));
  const auto z = composite_groups(a, *c, x, values);
  auto zw = tx::empty({c->groups, w.size(2)}, x.options());
  for (int64_t r = 0; r < a.r; ++r) {
    const int64_t g0 = c->rel[r], n = c->rel[r + 1] - g0;
    if (n == 0) continue;
    auto out_r = zw.narrow(0, g0, n);
    tx::mm_out(out_r, z.narrow(0, g0, n), w[r]);
  }
  auto y = call_spmm(c->tg_rowptr, c->tg_col, std::nullopt, zw, "sum", c->groups);
  if (root.has_value()) y.addmm_(*x_root, *root);
  if (bias.has_value()) y.add_(*bias);
  return y;
}

std::tuple<tx::Tensor, tx::Tensor, tx::Tensor> rgms_backward_composite(
    const PlanArgs& a, const tx::Tensor& x, const tx::Tensor& w,
    const std::optional<tx::Tensor>& values, const tx::Tensor& dy, bool need_x, bool need_w,
    bool need_values, const std::optional<tx::Tensor>& root) {
  tx::AutoDispatchBelowADInplaceOrView below_autograd;
  const int64_t num_rows = dy.size(0);
  const auto c = composite_of(a, num_rows, x.size(0));
  const auto dzw = dy.index_select(0, a.grp_dst.narrow(0, 0, c->groups));  // [G, F_out]
  tx::Tensor z;
  if (need_w) z = composite_groups(a, *c, x, values);
  auto dw = need_w ? tx::zeros_like(w) : tx::empty({0}, x.options());
  auto dz = (need_x || need_values) ? tx::empty({c->groups, x.size(1)}, x.options())
                                    : tx::Tensor();
  for (int64_t r = 0; r < a.r; ++r) {
    const int64_t g0 = c->rel[r], n = c->rel[r + 1] - g0;
    if (n == 0) continue;
    if (need_w) {
      auto dw_r = dw[r];
      tx::mm_out(dw_r, z.narrow(0, g0, n).t(), dzw.narrow(0, g0, n));
    }
    if (dz.defined()) {
      auto dz_r = dz.narrow(0, g0, n);
      tx::mm_out(dz_r, dzw.narrow(0, g0, n), w[r].t());
    }
  }
  // Each entry's factor: its value, divided by its group's size for the mean.
  std::optional<tx::Tensor> factor;
  if (values.has_value()) factor = values->index_select(0, a.perm);
  if (a.mean) {
    const auto inv = c->inv_size.to(x.scalar_type());
    factor = factor.has_value() ? *factor * inv : inv;
  }
  tx::Tensor dx = tx::empty({0}, x.options());
  if (need_x) {
    std::optional<tx::Tensor> f_src;
    if (factor.has_value()) f_src = factor->index_select(0, c->sg_pos);
    dx = call_spmm(c->sg_rowptr, c->sg_col, f_src, dz, "sum", c->groups);
    if (root.has_value()) dx.addmm_(dy, root->t());
  }
  tx::Tensor dv = tx::empty({0}, x.options());
  if (need_values) {
    auto dots = call_sddmm(c->grp_rowptr, a.src, dz, x);  // <dZ[g], X[src[e]]> per entry
    if (a.mean) dots = dots * c->inv_size.to(x.scalar_type());
    dv = tx::empty({a.e}, x.options()).index_put_({a.perm}, dots);
  }
  return {dx, dw, dv};
}

tx::Tensor rgms_impl(const tx::Tensor& plan, const tx::Tensor& x_in, const tx::Tensor& w_in,
                    const std::optional<tx::Tensor>& values_in, tx::Str reduce,
                    int64_t num_rows, int64_t gemm, int64_t tile, int64_t strategy,
                    const std::optional<tx::Tensor>& root_in,
                    const std::optional<tx::Tensor>& bias_in,
                    const std::optional<tx::Tensor>& x_root_in) {
  SPARSEJIT_CHECK("rgms", strategy >= 0 && strategy <= 2,
                  "strategy must be 0 (auto), 1 (aggregate "
                  "first) or 2 (transform first); got ",
                  strategy);
  const auto a = check_rgms_args("rgms", plan, x_in, w_in, values_in, reduce, num_rows);
  const auto ct = compute_type(x_in.scalar_type());
  // bfloat16 X and W on the CPU where the CPU multiplies bfloat16 natively: the GEMM tiles
  // multiply on oneDNN's bfloat16 GEMM or micro-kernel (rgms::Problem::w_bf16), and where
  // they or the fused rows' vdpbf16ps (rgms::fused_bf16_takes) run, X is read as it is
  // (x_bf16, decided below) instead of converted. Elsewhere bfloat16 runs in float32.
  const bool bf16_native =
      x_in.is_cpu() && !composite_forced() && x_in.scalar_type() == tx::kBFloat16 &&
      w_in.scalar_type() == tx::kBFloat16 && bf16_gemm_enabled();
  auto x = bf16_native ? tx::Tensor() : x_in.to(ct).contiguous();
  const auto w = w_in.to(ct).contiguous();
  std::optional<tx::Tensor> values;
  if (values_in.has_value()) values = values_in->to(ct).contiguous();
  const int64_t f_in = x_in.size(1), f_out = w.size(2);
  // The fused root term (x_root @ root; x_root defaults to X) and bias.
  std::optional<tx::Tensor> root, bias, x_root;
  if (root_in.has_value()) {
    const auto& xr_in = x_root_in.has_value() ? *x_root_in : x_in;
    const char* xr_name = x_root_in.has_value() ? "x_root" : "X (as x_root)";
    SJ_CHECK_TYPE(root_in->scalar_type() == x_in.scalar_type() &&
                         xr_in.scalar_type() == x_in.scalar_type(),
                     "sparsejit.rgms: root and x_root must have X's dtype (", x_in.scalar_type(),
                     "); got ", root_in->scalar_type(), " and ", xr_in.scalar_type());
    check_same_device(*root_in, x_in, "root", "X");
    check_same_device(xr_in, x_in, "x_root", "X");
    SPARSEJIT_CHECK("rgms", xr_in.dim() == 2 && xr_in.size(0) == num_rows, xr_name,
                    " must be [num_rows = ", num_rows, ", F] for the root term; got ",
                    xr_in.sizes());
    SPARSEJIT_CHECK(
        "rgms",
        root_in->dim() == 2 && root_in->size(0) == xr_in.size(1) && root_in->size(1) == f_out,
        "root must be [", xr_in.size(1), ", F_out = ", f_out, "]; got ", root_in->sizes());
    root = root_in->to(ct).contiguous();
    x_root = xr_in.to(ct).contiguous();
  } else {
    SPARSEJIT_CHECK("rgms", !x_root_in.has_value(), "x_root given without root");
  }
  if (bias_in.has_value()) {
    SJ_CHECK_TYPE(bias_in->scalar_type() == x_in.scalar_type(), "sparsejit.rgms: bias must ",
                     "have X's dtype (", x_in.scalar_type(), "); got ", bias_in->scalar_type());
    check_same_device(*bias_in, x_in, "bias", "X");
    SPARSEJIT_CHECK("rgms", bias_in->dim() == 1 && bias_in->size(0) == f_out,
                    "bias must be [F_out = ", f_out, "]; got ", bias_in->sizes());
    bias = bias_in->to(ct).contiguous();
  }
  if (!x_in.is_cpu() || composite_forced()) {
    (void)make_problem(a, num_rows, x.size(0), f_in, f_out, gemm, tile);  // its checks
    return rgms_composite(a, x, w, values, num_rows, root, x_root, bias).to(x_in.scalar_type());
  }
  auto y = new_output({num_rows, f_out}, w.options());
  auto p = make_problem(a, num_rows, x_in.size(0), f_in, f_out, gemm, tile);
  p.strategy = static_cast<rgms::Strategy>(strategy);
  const bool bf16_gather =
      bf16_native && (rgms::forward_runs_tiles(f_in, f_out, static_cast<rgms::Gemm>(gemm)) ||
                      rgms::fused_bf16_takes(p));
  tx::Tensor x_bf16;
  if (bf16_gather) {
    x_bf16 = x_in.contiguous();
    p.x_bf16 = static_cast<const bf16*>(x_bf16.data_ptr());
  } else if (bf16_native) {
    x = x_in.to(ct).contiguous();  // fused rows without vdpbf16ps: float32 rows
  }
  p.f_root = root.has_value() ? root->size(0) : 0;
  const auto sources = attach_sources(a, p);
  // bfloat16 X and W: the tile products run on oneDNN's bfloat16 GEMM where the CPU
  // multiplies bfloat16 natively (the rest stays float32, as below).
  tx::Tensor w_bf16;
  if (bf16_native) {
    w_bf16 = w_in.contiguous();
    p.w_bf16 = static_cast<const bf16*>(w_bf16.data_ptr());
  }
  SJ_DISPATCH_FLOATING_TYPES(ct, "sparsejit.rgms", [&] {
    rgms::RootTerm<scalar_t> rt;
    rt.root = opt_ptr<scalar_t>(root);
    rt.x_root = opt_ptr<scalar_t>(x_root);
    rt.bias = opt_ptr<scalar_t>(bias);
    rgms::forward<scalar_t>(p, bf16_gather ? nullptr : ptr<scalar_t>(x), ptr<scalar_t>(w),
                            opt_ptr<scalar_t>(values),
                            ptr<scalar_t>(y), rt);
  });
  return y.to(x_in.scalar_type());
}

std::tuple<tx::Tensor, tx::Tensor, tx::Tensor> rgms_backward_impl(
    const tx::Tensor& plan, const tx::Tensor& x_in, const tx::Tensor& w_in, const std::optional<tx::Tensor>& values_in,
    const tx::Tensor& grad_y_in, tx::Str reduce, bool need_x, bool need_w,
    bool need_values, int64_t gemm, int64_t tile, int64_t strategy,
    const std::optional<tx::Tensor>& root_in) {
  SPARSEJIT_CHECK("rgms_backward", strategy >= 0 && strategy <= 2,
                  "strategy must be 0 (auto), 1 "
                  "(target side) or 2 (source side); got ",
                  strategy);
  const int64_t num_rows = grad_y_in.dim() >= 1 ? grad_y_in.size(0) : 0;
  const auto a = check_rgms_args("rgms_backward", plan, x_in, w_in, values_in, reduce, num_rows);
  SPARSEJIT_CHECK("rgms_backward", grad_y_in.dim() == 2 && grad_y_in.size(1) == w_in.size(2),
                  "grad_y must be [num_rows, F_out = ", w_in.size(2), "]; got ", grad_y_in.sizes());
  SJ_CHECK_TYPE(grad_y_in.scalar_type() == x_in.scalar_type(),
                   "sparsejit.rgms_backward: grad_y dtype (", grad_y_in.scalar_type(),
                   ") must match X dtype (", x_in.scalar_type(), ")");
  check_same_device(grad_y_in, x_in, "grad_y", "X");
  const auto ct = compute_type(x_in.scalar_type());
  const auto x = x_in.to(ct).contiguous();
  const auto w = w_in.to(ct).contiguous();
  const auto dy = grad_y_in.to(ct).contiguous();
  std::optional<tx::Tensor> values;
  if (values_in.has_value()) values = values_in->to(ct).contiguous();
  need_values = need_values && values.has_value();
  const int64_t f_in = x.size(1), f_out = w.size(2);
  // root: dX also gets dY @ root^T (the root term's gradient when x_root is X).
  std::optional<tx::Tensor> root;
  if (root_in.has_value()) {
    SJ_CHECK_TYPE(root_in->scalar_type() == x_in.scalar_type(), "sparsejit.rgms_backward: ",
                     "root must have X's dtype (", x_in.scalar_type(), "); got ",
                     root_in->scalar_type());
    check_same_device(*root_in, x_in, "root", "X");
    SPARSEJIT_CHECK("rgms_backward",
                    root_in->dim() == 2 && root_in->size(0) == f_in && root_in->size(1) == f_out,
                    "root must be [F_in = ", f_in, ", F_out = ", f_out, "]; got ",
                    root_in->sizes());
    SPARSEJIT_CHECK("rgms_backward", x.size(0) == num_rows,
                    "root needs X with num_rows = ", num_rows, " rows (X is x_root); got ",
                    x.size(0));
    if (need_x) root = root_in->to(ct).contiguous();
  }
  const auto out_t = x_in.scalar_type();
  if (!x.is_cpu() || composite_forced()) {
    (void)make_problem(a, num_rows, x.size(0), f_in, f_out, gemm, tile);  // its checks
    auto [dx, dw, dv] =
        rgms_backward_composite(a, x, w, values, dy, need_x, need_w, need_values, root);
    return {dx.to(out_t), dw.to(out_t), dv.to(out_t)};
  }
  auto dx = need_x ? new_output_like(x) : tx::empty({0}, x.options());
  auto dw = need_w ? tx::zeros_like(w) : tx::empty({0}, x.options());
  auto dv = need_values ? tx::empty({a.e}, x.options()) : tx::empty({0}, x.options());
  auto p = make_problem(a, num_rows, x.size(0), f_in, f_out, gemm, tile);
  p.strategy = static_cast<rgms::Strategy>(strategy);
  const auto sources = attach_sources(a, p);
  const auto transposed = need_x ? attach_transposed(a, p) : nullptr;
  SJ_DISPATCH_FLOATING_TYPES(ct, "sparsejit.rgms_backward", [&] {
    rgms::backward<scalar_t>(p, ptr<scalar_t>(x), ptr<scalar_t>(w), opt_ptr<scalar_t>(values),
                             ptr<scalar_t>(dy), need_x ? ptr<scalar_t>(dx) : nullptr,
                             need_w ? ptr<scalar_t>(dw) : nullptr,
                             need_values ? ptr<scalar_t>(dv) : nullptr, opt_ptr<scalar_t>(root));
  });
  return {dx.to(out_t), dw.to(out_t), dv.to(out_t)};
}

// [R, 4]: entries, distinct targets, distinct sources, the forward's choice per relation
// (1 aggregate first, 2 transform first) for these widths (csrc/rgms/rgms_run.h).
tx::Tensor rgms_explain_cpu(const tx::Tensor& plan, int64_t num_rows, int64_t num_src,
                            int64_t f_in, int64_t f_out) {
  SPARSEJIT_CHECK("rgms_explain", f_in >= 0 && f_out >= 0, "widths must be >= 0");
  SPARSEJIT_CHECK("rgms_explain", num_src >= 0, "num_src must be >= 0; got ", num_src);
  check_index_1d(plan, "rgms_explain", "plan");
  SPARSEJIT_CHECK("rgms_explain", plan.numel() > plan::kWordParam,
                  "plan has ", plan.numel(), " words: not a plan from rgms_plan");
  // R from the header (the plan is on the CPU); check_rgms_args checks the rest.
  const int64_t r = plan.contiguous().data_ptr<int64_t>()[plan::kWordParam];
  SPARSEJIT_CHECK("rgms_explain", r >= 1 && r <= plan.numel(),
                  "the plan's header names ", r, " relations: not a plan from rgms_plan");
  // Shapes only (the explain reads no feature): expanded, so a wide layer allocates nothing.
  const auto x = tx::empty({1}).expand({num_src, f_in});
  const auto w = tx::empty({1}).expand({r, f_in, f_out});
  const auto a = check_rgms_args("rgms_explain", plan, x, w, std::nullopt, "sum", num_rows);
  const auto p = make_problem(a, num_rows, num_src, f_in, f_out, 0, 0);
  const auto rp = rgms::relation_plan(p);
  auto out = tx::empty({a.r, 4}, tx::kLong);
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t r = 0; r < a.r; ++r) {
    o[4 * r] = rp.entries[r];
    o[4 * r + 1] = rp.targets[r];
    o[4 * r + 2] = rp.sources[r];
    o[4 * r + 3] = rp.choice[r];
  }
  return out;
}

}  // namespace

SJ_LIBRARY_IMPL(CPU, m) {
  m.impl("rgms_plan", SJ_KERNEL(&rgms_plan_cpu));
  m.impl("rgms", SJ_KERNEL(&rgms_impl));
  m.impl("rgms_backward", SJ_KERNEL(&rgms_backward_impl));
  m.impl("rgms_explain", SJ_KERNEL(&rgms_explain_cpu));
}

#ifdef SPARSEJIT_WITH_CUDA
// rgms / rgms_backward: the composite above (SpMM / SDDMM NVRTC kernels and cuBLAS).
// rgms_plan builds the plan on the
// device (rgms_plan_tensor: ATen's stable sort and searchsorted; bad edges are copied to the
// CPU checks for the error); rgms_explain is a CPU cost-model report.
SJ_LIBRARY_IMPL(CUDA, m) {
  m.impl("rgms_plan", SJ_KERNEL(&rgms_plan_cpu));  // device-generic: rgms_plan_tensor
  m.impl("rgms", SJ_KERNEL(&rgms_impl));
  m.impl("rgms_backward", SJ_KERNEL(&rgms_backward_impl));
  m.impl("rgms_explain", SJ_CUDA_FALLBACK(&rgms_explain_cpu));
}
#endif

}  // namespace sparsejit
