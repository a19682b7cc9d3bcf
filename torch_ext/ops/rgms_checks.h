// The argument checks of the RGMS ops (rgms, rgms_backward, rgms_explain), CPU and CUDA alike:
// the plan's header and O(R + G + E) invariants (once per live plan), the operands' shapes,
// dtypes and devices, and the Torch-free problem description (csrc/rgms/rgms_run.h) of a
// checked call. Shared checks are in torch_ext/common.h.
#pragma once

#include "torch_ext/tensor_api.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "csrc/rgms/plan_layout.h"
#include "csrc/rgms/rgms_plan.h"
#include "csrc/rgms/rgms_run.h"
#include "torch_ext/common.h"
#include "torch_ext/validated.h"

namespace sparsejit {

inline void check_index_1d(const tx::Tensor& t, const char* op, const char* name) {
  SJ_CHECK_TYPE(t.scalar_type() == tx::kLong, "sparsejit.", op, ": ", name,
                   " must be int64; got ", t.scalar_type());
  SPARSEJIT_CHECK(op, t.dim() == 1, name, " must be 1-D; got shape ", t.sizes());
}


// The key the once-per-plan tables (validated_once, derived_once) use for a (rows, sources)
// pair: both counts packed exactly; sizes past 2^31 get a key no other call can repeat.
inline int64_t rows_sources_key(int64_t num_rows, int64_t num_src) {
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
inline PlanArgs check_rgms_args(const char* op, const tx::Tensor& plan, const tx::Tensor& x,
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
inline rgms::Problem make_problem(const PlanArgs& a, int64_t num_rows, int64_t num_src, int64_t f_in,
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

}  // namespace sparsejit
