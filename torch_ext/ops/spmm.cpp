// SpMM: Y[i] = act(scale * reduce_{p in row i}(values[p] * X[col[p]]) + bias).
//
// Structure arguments come first (rowptr, col: int32 or int64, same dtype), then values
// ([nnz] or [nnz, H]) and X ([num_cols, F] or [num_cols, H, F]). num_cols is the structure's
// column count (X must have that many rows); -1 derives it from col with one pass. The
// optional t_* arguments carry a cached transpose for the backward pass; forward never reads
// them. `plan` is an SpMM plan tensor (csrc/spmm/spmm_plan.h) stamped with the structure it
// was built for; without one the cost model picks the kernel. For max / min the second
// output holds the CSR position of each extremum when need_arg is true (the gradient's
// routing), and is empty otherwise. float16 runs through the float32 kernels.
#include "torch_ext/tensor_api.h"

#include <algorithm>

#include "csrc/spmm/spmm_arg_backward.h"
#include "csrc/spmm/spmm_plan.h"
#include "csrc/spmm/spmm_run.h"
#include "codegen/cuda_spmm.h"
#include "kernels/cpu/kernels.h"
#include "torch_ext/common.h"
#include "torch_ext/ops/spmm_checks.h"
#include "torch_ext/cuda_common.h"
#include "torch_ext/cuda_fallback.h"
#include "torch_ext/validated.h"

SJ_LIBRARY_FRAGMENT(m) {
  m.def(
      "spmm(Tensor rowptr, Tensor col, Tensor? values, Tensor x, str reduce, SymInt num_cols=-1, "
      "Tensor? t_rowptr=None, Tensor? t_col=None, Tensor? t_perm=None, Tensor? plan=None, "
      "Tensor? bias=None, str activation=\"none\", float act_param=0.01, float scale=1.0, "
      "bool need_arg=True) -> (Tensor, Tensor)");
  // The cost model's plan for a structure, as a header-only plan tensor.
  m.def("spmm_plan(Tensor rowptr, Tensor col, int num_cols, int row_width, ScalarType dtype) "
        "-> Tensor");
  // A bucketed plan: rows regrouped by length (csrc/spmm/spmm_plan.h), as one tensor.
  m.def("spmm_bucketed_plan(Tensor rowptr, Tensor col, int num_cols, int max_log2=3, "
        "int prefetch=0) -> Tensor");
  // The gradient of max / min with respect to X: grad_out [rows, F] routed through arg (the
  // forward's positions) to the winning entries' columns (csrc/spmm/spmm_arg_backward.h).
  m.def("spmm_arg_backward(Tensor rowptr, Tensor col, Tensor arg, Tensor grad_out, "
        "Tensor? values, SymInt num_cols) -> Tensor");
}

namespace sparsejit {
namespace {

using SpmmResult = std::tuple<tx::Tensor, tx::Tensor>;

tx::Tensor plan_header_cpu(const tx::Tensor& rowptr, const tx::Tensor& col, int64_t num_cols,
                           int64_t row_width, tx::ScalarType dtype) {
  check_index_pair(rowptr, col);
  SJ_CHECK_VALUE(num_cols >= 0 && row_width >= 0, "sparsejit.spmm_plan: num_cols and "
                    "row_width must be >= 0; got ", num_cols, " and ", row_width);
  const plan::StructureStamp stamp = checked_structure(rowptr, col, num_cols, "spmm_plan");
  SJ_CHECK_TYPE(dtype == tx::kFloat || dtype == tx::kDouble || dtype == tx::kBFloat16 ||
                       dtype == tx::kHalf,
                   "sparsejit.spmm_plan: dtype must be float32, float64, bfloat16 or float16; "
                   "got ", dtype);
  auto header = tx::empty({plan::kHeaderWords}, rowptr.options().dtype(tx::kLong));
  plan::cost_model_plan(stamp, row_width,
                        tx::elementSize(dtype == tx::kHalf ? tx::kFloat : dtype),
                        header.data_ptr<int64_t>());
  return header;
}

tx::Tensor spmm_bucketed_plan_cpu(const tx::Tensor& rowptr, const tx::Tensor& col,
                                  int64_t num_cols, int64_t max_log2, int64_t prefetch) {
  check_index_pair(rowptr, col);
  checked_structure(rowptr, col, num_cols, "spmm_bucketed_plan");
  SJ_CHECK_VALUE(max_log2 >= 0 && max_log2 <= 20,
                    "sparsejit.spmm_bucketed_plan: max_log2 must be in [0, 20]; got ", max_log2);
  SJ_CHECK_VALUE(prefetch >= 0 && prefetch <= 64,
                    "sparsejit.spmm_bucketed_plan: prefetch must be in [0, 64]; got ", prefetch);
  auto rp = rowptr.contiguous();
  auto cl = col.contiguous();
  const int64_t rows = rp.numel() - 1;
  auto words = tx::empty({plan::bucketed_plan_words(rows, cl.numel())},
                         rp.options().dtype(tx::kLong));
  auto build = [&](auto I) {
    using IT = decltype(I);
    plan::build_bucketed_plan<IT>(ptr<IT>(rp), ptr<IT>(cl), rows, num_cols,
                                  static_cast<int>(max_log2), static_cast<int32_t>(prefetch),
                                  words.data_ptr<int64_t>());
  };
  if (index_kind(rp) == IndexKind::I32) {
    build(int32_t{});
  } else {
    build(int64_t{});
  }
  return words;
}

SpmmResult spmm_cpu(const tx::Tensor& rowptr, const tx::Tensor& col,
                    const std::optional<tx::Tensor>& values_in, const tx::Tensor& x_in,
                    tx::Str reduce, int64_t num_cols,
                    const std::optional<tx::Tensor>& t_rowptr,
                    const std::optional<tx::Tensor>& t_col,
                    const std::optional<tx::Tensor>& t_perm,
                    const std::optional<tx::Tensor>& plan_tensor,
                    const std::optional<tx::Tensor>& bias, tx::Str activation,
                    double act_param, double scale, bool need_arg) {
  const SpmmShape s =
      check_spmm_call(rowptr, col, values_in, x_in, reduce, num_cols, t_rowptr, t_col, t_perm);
  const plan::StructureStamp& stamp = s.stamp;
  const tx::Tensor x = half_as_float(x_in);
  const std::optional<tx::Tensor> values = half_as_float(values_in);
  auto rp = rowptr.contiguous();
  auto cl = col.contiguous();
  auto xc = x.contiguous();
  tx::Tensor vc = values.has_value() ? values->contiguous() : tx::Tensor();
  auto out = new_output(s.out_sizes, x.options());
  const bool with_arg = need_arg && (s.reduce == Reduce::Max || s.reduce == Reduce::Min);
  auto arg = with_arg ? tx::empty(s.out_sizes, x.options().dtype(tx::kLong))
                      : tx::empty({0}, x.options().dtype(tx::kLong));
  const int64_t row_width = s.heads * s.features;
  tx::Tensor bc;
  if (bias.has_value()) {
    SJ_CHECK_VALUE(bias->numel() == row_width, "sparsejit.spmm: bias has ", bias->numel(),
                      " elements but each output row has ", row_width);
    check_float(*bias, "bias");
    check_same_device(*bias, x, "bias", "X");
    bc = bias->to(x.scalar_type()).contiguous();
  }
  plan::SpmmProblem p;
  p.dtype = scalar_kind(x.scalar_type(), "X");
  p.index = index_kind(rp);
  p.rowptr = rp.data_ptr();
  p.col = cl.data_ptr();
  p.values = vc.defined() ? vc.data_ptr() : nullptr;
  p.x = xc.data_ptr();
  p.out = out.data_ptr();
  p.arg = with_arg ? arg.data_ptr<int64_t>() : nullptr;
  p.num_cols = s.num_cols;
  p.stamp = stamp;
  cpu::SpmmArgs& a = p.args;
  a.rows = s.rows;
  a.heads = s.heads;
  a.features = s.features;
  a.value_heads = s.value_heads;
  a.reduce = s.reduce;
  a.num_threads = tx::get_num_threads();
  a.min_parallel_work = cpu::min_parallel_work();
  a.act = activation_arg(activation);
  a.act_param = static_cast<float>(act_param);
  a.scale = static_cast<float>(scale);
  a.bias = bc.defined() ? bc.data_ptr() : nullptr;
  tx::Tensor h;
  if (plan_tensor.has_value()) {
    SJ_CHECK_TYPE(plan_tensor->scalar_type() == tx::kLong && plan_tensor->dim() == 1,
                     "sparsejit.spmm: plan must be a 1-D int64 tensor (from spmm_plan or "
                     "spmm_bucketed_plan); got ", plan_tensor->scalar_type(), " of shape ",
                     plan_tensor->sizes());
    h = plan_tensor->to(tx::kCPU).contiguous();
    if (h.numel() > 0) checked_bucketed_plan(*plan_tensor, h, stamp);
  }
  // An empty plan tensor is a plan (and rejected), not "no plan": never pass null for it.
  static const int64_t kNoWords[1] = {0};
  const int64_t* words = !h.defined() ? nullptr : h.numel() ? h.data_ptr<int64_t>() : kNoWords;
  const std::string err = plan::run_spmm(p, words, h.defined() ? h.numel() : 0);
  SJ_CHECK_VALUE(err.empty(), "sparsejit.spmm: plan: ", err);
  if (x_in.scalar_type() == tx::kHalf) out = out.to(tx::kHalf);
  return {out, arg};
}

#ifdef SPARSEJIT_WITH_CUDA
using namespace cuda_ext;

SpmmResult spmm_cuda(const tx::Tensor& rowptr, const tx::Tensor& col,
                     const std::optional<tx::Tensor>& values, const tx::Tensor& x,
                     tx::Str reduce, int64_t num_cols,
                     const std::optional<tx::Tensor>& t_rowptr,
                     const std::optional<tx::Tensor>& t_col,
                     const std::optional<tx::Tensor>& t_perm,
                     const std::optional<tx::Tensor>& /*plan: CPU schedules only*/,
                     const std::optional<tx::Tensor>& bias, tx::Str activation,
                     double act_param, double scale, bool need_arg) {
  const SpmmShape s =
      check_spmm_call(rowptr, col, values, x, reduce, num_cols, t_rowptr, t_col, t_perm);
  num_cols = s.num_cols;
  const cpu::Act act = activation_arg(activation);
  const int64_t row_width = s.heads * s.features;
  tx::Tensor bc;
  if (bias.has_value()) {
    SJ_CHECK_VALUE(bias->numel() == row_width, "sparsejit.spmm: bias has ", bias->numel(),
                      " elements but each output row has ", row_width);
    check_same_device(*bias, x, "bias", "X");
    bc = bias->to(x.scalar_type()).contiguous();
  }
  DeviceGuard guard(x.device());
  if (!gpu_kernels_available())
    return call_on_cpu<SpmmResult>("sparsejit::spmm", rowptr, col, values, x, reduce, num_cols,
                                   t_rowptr, t_col, t_perm, std::optional<tx::Tensor>(), bias,
                                   activation, act_param, scale, need_arg);

  auto rp = rowptr.contiguous();
  auto cl = col.contiguous();
  auto xc = x.contiguous();
  tx::Tensor vc = values.has_value() ? values->contiguous() : tx::Tensor();
  auto out = new_output(s.out_sizes, x.options());
  const bool with_arg = s.reduce == Reduce::Max || s.reduce == Reduce::Min;
  auto arg = with_arg ? tx::empty(s.out_sizes, x.options().dtype(tx::kLong))
                      : tx::empty({0}, x.options().dtype(tx::kLong));
  if (s.rows == 0 || row_width == 0) return {out, arg};

  codegen::CudaSpmmProblem prob;
  prob.dtype = cuda_scalar(x.scalar_type());
  prob.index = index_kind(rp);
  prob.heads = s.heads;
  prob.features = s.features;
  prob.value_mode = s.value_heads == 0 ? 0 : (s.value_heads == 1 ? 1 : 2);
  prob.reduce = s.reduce;
  prob.act = act;
  prob.max_vec_bytes = aligned_bytes({xc.data_ptr(), out.data_ptr()});
  prob.deterministic = deterministic();
  const int64_t nnz = cl.numel();
  const codegen::CudaSpmmChoice choice = codegen::plan_cuda_spmm(prob, row_stats(rp, nnz));
  const std::string invalid = choice.spec.validate();
  SJ_CHECK_VALUE(invalid.empty(),
                    "sparsejit.spmm (CUDA): no kernel for this problem: ", invalid);
  const codegen::SpmmLaunchPlan plan = codegen::plan_spmm_launch(choice, s.rows, nnz);
  tx::Tensor ws;
  if (plan.workspace_bytes > 0) {
    ws = tx::empty({static_cast<int64_t>(plan.workspace_bytes)}, x.options().dtype(tx::kByte));
    if (plan.zero_bytes > 0) ws.narrow(0, 0, static_cast<int64_t>(plan.zero_bytes)).zero_();
  }
  cuda::SpmmParams p{};
  p.rowptr = rp.data_ptr();
  p.col = cl.data_ptr();
  p.values = vc.defined() ? vc.data_ptr() : nullptr;
  p.x = xc.data_ptr();
  p.bias = bc.defined() ? bc.data_ptr() : nullptr;
  p.out = out.data_ptr();
  p.arg = with_arg ? static_cast<long long*>(arg.data_ptr()) : nullptr;
  p.rows = s.rows;
  p.nnz = nnz;
  p.scale = static_cast<float>(scale);
  p.act_param = static_cast<float>(act_param);
  codegen::bind_spmm_workspace(plan, choice, ws.defined() ? ws.data_ptr() : nullptr, &p);
  std::string err;
  if (!CudaKernels::instance().run(choice.spec, x.get_device(),
                                   current_stream(), plan.launches, &p,
                                   &err))
    raise_cuda_error("spmm", err + "\n(schedule: " + choice.reason + ")");
  // The CUDA kernels always record positions for max / min; dropped when not asked for.
  if (!need_arg) arg = tx::empty({0}, x.options().dtype(tx::kLong));
  return {out, arg};
}

#endif

tx::Tensor spmm_arg_backward_cpu(const tx::Tensor& rowptr, const tx::Tensor& col,
                                 const tx::Tensor& arg, const tx::Tensor& grad_out,
                                 const std::optional<tx::Tensor>& values_in, int64_t num_cols) {
  const char* op = "spmm_arg_backward";
  check_index_pair(rowptr, col);
  SPARSEJIT_CHECK(op, num_cols >= 0, "num_cols must be >= 0; got ", num_cols);
  checked_structure(rowptr, col, num_cols, op);  // once per live structure
  const int64_t rows = rowptr.numel() - 1, nnz = col.numel();
  check_float(grad_out, "grad_out");
  SJ_CHECK_TYPE(arg.scalar_type() == tx::kLong, "sparsejit.", op,
                   ": arg must be int64 (the forward's positions); got ", arg.scalar_type());
  SPARSEJIT_CHECK(op, grad_out.dim() == 2 && grad_out.size(0) == rows,
                  "grad_out must be [rows = ", rows, ", F]; got ", grad_out.sizes());
  SPARSEJIT_CHECK(op, arg.sizes() == grad_out.sizes(), "arg must have grad_out's shape ",
                  grad_out.sizes(), "; got ", arg.sizes());
  for (const auto* t : {&col, &arg, &grad_out})
    check_same_device(*t, rowptr, "arg / grad_out / col", "rowptr");
  const auto ct = compute_type(grad_out.scalar_type());
  std::optional<tx::Tensor> values;
  if (values_in.has_value()) {
    SJ_CHECK_TYPE(values_in->scalar_type() == grad_out.scalar_type(), "sparsejit.", op,
                     ": values dtype (", values_in->scalar_type(), ") must match grad_out's (",
                     grad_out.scalar_type(), ")");
    SPARSEJIT_CHECK(op, values_in->dim() == 1 && values_in->numel() == nnz,
                    "values must have shape [nnz = ", nnz, "]; got ", values_in->sizes());
    check_same_device(*values_in, rowptr, "values", "rowptr");
    values = values_in->to(ct).contiguous();
  }
  const auto a = arg.contiguous();
  if (a.numel() > 0) {  // positions index col and values: every one must be -1 or an entry
    const int64_t* pa = ptr<int64_t>(a);
    const auto [lo, hi] = std::minmax_element(pa, pa + a.numel());
    const int64_t l = *lo, h = *hi;
    SPARSEJIT_CHECK(op, l >= -1 && h < nnz, "arg holds positions in [", l, ", ", h,
                    "], outside [-1, nnz = ", nnz, ")");
  }
  const auto g = grad_out.to(ct).contiguous();
  const int64_t f = g.size(1);
  auto dx = new_output({num_cols, f}, g.options());
  SJ_DISPATCH_FLOATING_TYPES(ct, "sparsejit.spmm_arg_backward", [&] {
    const scalar_t* v = values.has_value() ? ptr<scalar_t>(*values) : nullptr;
    const auto c = col.contiguous();
    if (c.scalar_type() == tx::kInt) {
      spmm::arg_backward_x<scalar_t, int32_t>(ptr<int64_t>(a), ptr<scalar_t>(g), rows, f,
                                              ptr<int32_t>(c), v, num_cols, ptr<scalar_t>(dx),
                                              tx::get_num_threads());
    } else {
      spmm::arg_backward_x<scalar_t, int64_t>(ptr<int64_t>(a), ptr<scalar_t>(g), rows, f,
                                              ptr<int64_t>(c), v, num_cols, ptr<scalar_t>(dx),
                                              tx::get_num_threads());
    }
  });
  return dx.to(grad_out.scalar_type());
}

}  // namespace

SJ_LIBRARY_IMPL(CPU, m) {
  m.impl("spmm_arg_backward", SJ_KERNEL(&spmm_arg_backward_cpu));
  m.impl("spmm", SJ_KERNEL(&spmm_cpu));
  m.impl("spmm_plan", SJ_KERNEL(&plan_header_cpu));
  m.impl("spmm_bucketed_plan", SJ_KERNEL(&spmm_bucketed_plan_cpu));
}

#ifdef SPARSEJIT_WITH_CUDA
SJ_LIBRARY_IMPL(CUDA, m) {
  m.impl("spmm", SJ_KERNEL(&spmm_cuda));
  // Plans describe CPU schedules (CUDA calls choose theirs per call): built on the CPU.
  m.impl("spmm_plan", SJ_CUDA_FALLBACK(&plan_header_cpu));
  m.impl("spmm_bucketed_plan", SJ_CUDA_FALLBACK(&spmm_bucketed_plan_cpu));
  // A CUDA build runs max / min's gradient through the Python scatter path (see
  // families/spmm/spmm.py); a direct call is answered on the CPU.
  m.impl("spmm_arg_backward", SJ_CUDA_FALLBACK(&spmm_arg_backward_cpu));
}
#endif

}  // namespace sparsejit
