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
//
// The Torch-free work is in csrc/rgms; the device-generic builder and composite (what CUDA
// tensors run) in torch_ext/composite/rgms_composite.h; the checks in ops/rgms_checks.h.
#include "torch_ext/tensor_api.h"

#include <cstdlib>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "csrc/dense/gemm.h"
#include "csrc/rgms/plan_layout.h"
#include "csrc/rgms/rgms_plan.h"
#include "csrc/rgms/rgms_run.h"
#include "torch_ext/common.h"
#include "torch_ext/composite/rgms_composite.h"
#include "torch_ext/cuda_fallback.h"
#include "torch_ext/ops/rgms_checks.h"
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
    auto plan = composite::rgms_plan_tensor(ei, et, num_src, num_dst, num_relations);
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
  rgms::write_plan_head(words, num_relations, e, num_dst, num_src);
  // (edges on another device reach here only when the builder declined: back to their device)
  return edge_index.device().is_cpu() ? plan : plan.to(edge_index.device());
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

// bfloat16 tile products on oneDNN's bfloat16 GEMM (rgms::Problem::w_bf16): where it runs
// natively, unless SPARSEJIT_RGMS_BF16_GEMM=0.
bool bf16_gemm_enabled() {
  const char* v = std::getenv("SPARSEJIT_RGMS_BF16_GEMM");
  if (v != nullptr && std::string(v) == "0") return false;
  return dense::gemm_bf16_native();
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
      x_in.is_cpu() && !composite::rgms_composite_forced() && x_in.scalar_type() == tx::kBFloat16 &&
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
  if (!x_in.is_cpu() || composite::rgms_composite_forced()) {
    (void)make_problem(a, num_rows, x.size(0), f_in, f_out, gemm, tile);  // its checks
    return composite::rgms_composite(a, x, w, values, num_rows, root, x_root, bias).to(x_in.scalar_type());
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
  if (!x.is_cpu() || composite::rgms_composite_forced()) {
    (void)make_problem(a, num_rows, x.size(0), f_in, f_out, gemm, tile);  // its checks
    auto [dx, dw, dv] =
        composite::rgms_backward_composite(a, x, w, values, dy, need_x, need_w, need_values, root);
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