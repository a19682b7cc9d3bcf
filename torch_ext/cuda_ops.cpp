// CUDA implementations of the sparsejit ops: argument checks, a schedule chosen from row-length
// statistics (codegen/cuda_spec.h), kernels compiled at run time by NVRTC and launched through
// the driver API on the current PyTorch stream (codegen/cuda_launch.h). Outputs and
// workspaces come from the caching allocator.
//
// Without NVRTC or the driver the ops still work: they copy to the CPU, run the CPU kernels
// and copy back, after one warning. Built only with SPARSEJIT_WITH_CUDA=ON.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>  // at::cuda::getCurrentCUDAStream is this c10 function
#include <torch/library.h>

#include <cstdlib>
#include <list>
#include <mutex>
#include <tuple>

#include "codegen/cuda_launch.h"
#include "codegen/disk_cache.h"
#include "torch_ext/checks.h"

namespace sparsejit {
namespace {

using codegen::CudaKernels;
using codegen::CudaKernelSpec;
using codegen::CudaScalar;
using codegen::IndexKind;

CudaScalar cuda_scalar(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return CudaScalar::F32;
    case at::kHalf: return CudaScalar::F16;
    case at::kBFloat16: return CudaScalar::BF16;
    case at::kDouble: return CudaScalar::F64;
    default: TORCH_CHECK_TYPE(false, "sparsejit (CUDA): unsupported dtype ", t);
  }
}

IndexKind index_kind(const at::Tensor& rowptr) {
  return rowptr.scalar_type() == at::kInt ? IndexKind::I32 : IndexKind::I64;
}

// The widest access (bytes, at most 16) every pointer allows.
int32_t aligned_bytes(std::initializer_list<const void*> ptrs) {
  int32_t a = 16;
  for (const void* p : ptrs) {
    if (p == nullptr) continue;
    const auto v = reinterpret_cast<uintptr_t>(p);
    while (a > 1 && v % a != 0) a /= 2;
  }
  return a;
}

bool deterministic() {
  if (at::globalContext().deterministicAlgorithms()) return true;
  const char* v = std::getenv("SPARSEJIT_DETERMINISTIC");
  return v && *v && std::string(v) != "0";
}

// NVRTC and the driver, or one warning and the CPU fallback.
bool gpu_kernels_available() {
  static const bool ok = [] {
    std::string why;
    const bool a = CudaKernels::instance().available(&why);
    if (!a)
      codegen::warn("sparsejit: CUDA kernels unavailable (" + why +
                    "); CUDA tensors are computed on the CPU and copied back, which is slow");
    return a;
  }();
  return ok;
}

[[noreturn]] void raise_cuda_error(const std::string& op, const std::string& err) {
  TORCH_CHECK(false, "sparsejit.", op, " (CUDA): ", err);
}

// ---- Row statistics (one device sync per structure, cached) ---------------------------------
struct StatsKey {
  const void* ptr;
  int64_t numel;
  int64_t version;
  int device;
  bool operator==(const StatsKey& o) const {
    return ptr == o.ptr && numel == o.numel && version == o.version && device == o.device;
  }
};

codegen::CudaRowStats row_stats(const at::Tensor& rowptr, int64_t nnz) {
  codegen::CudaRowStats st;
  st.rows = rowptr.numel() - 1;
  st.nnz = nnz;
  if (st.rows <= 0 || nnz == 0) return st;
  // A sync is not allowed while a CUDA graph is captured: assume the worst skew (the chunked
  // schedules are correct and balanced for any structure).
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) {
    st.max_row = nnz;
    return st;
  }
  static std::mutex mu;
  static std::list<std::pair<StatsKey, int64_t>> cache;  // most recent first, a few entries
  const StatsKey key{rowptr.data_ptr(), rowptr.numel(), static_cast<int64_t>(rowptr._version()),
                     rowptr.get_device()};
  {
    std::lock_guard<std::mutex> g(mu);
    for (auto it = cache.begin(); it != cache.end(); ++it) {
      if (it->first == key) {
        st.max_row = it->second;
        cache.splice(cache.begin(), cache, it);
        return st;
      }
    }
  }
  // Statistics only steer the schedule; a stale entry (reused memory) costs speed, not results.
  st.max_row = (rowptr.narrow(0, 1, st.rows) - rowptr.narrow(0, 0, st.rows)).max().item<int64_t>();
  std::lock_guard<std::mutex> g(mu);
  cache.emplace_front(key, st.max_row);
  if (cache.size() > 64) cache.pop_back();
  return st;
}

// ---- CPU fallback ---------------------------------------------------------------------------
// The CPU kernels have no float16: compute in float32 there and convert back.
at::Tensor to_cpu(const at::Tensor& t) {
  auto c = t.to(at::kCPU);
  return c.scalar_type() == at::kHalf ? c.to(at::kFloat) : c;
}
std::optional<at::Tensor> to_cpu(const std::optional<at::Tensor>& t) {
  if (!t.has_value()) return std::nullopt;
  return to_cpu(*t);
}

c10::OperatorHandle op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

// ---- Ops ------------------------------------------------------------------------------------

void validate_csr_cuda(const at::Tensor& rowptr, const at::Tensor& col, int64_t num_cols) {
  check_index_pair(rowptr, col);
  static auto op = op_handle("sparsejit::validate_csr")
                       .typed<void(const at::Tensor&, const at::Tensor&, int64_t)>();
  op.call(rowptr.cpu(), col.cpu(), num_cols);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> csr_transpose_cuda(const at::Tensor& rowptr,
                                                                  const at::Tensor& col,
                                                                  int64_t num_cols) {
  check_index_pair(rowptr, col);
  static auto op = op_handle("sparsejit::csr_transpose")
                       .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, int64_t)>();
  auto [r, c, p] = op.call(rowptr.cpu(), col.cpu(), num_cols);
  const auto dev = rowptr.device();
  return {r.to(dev), c.to(dev), p.to(dev)};
}

at::Tensor spmm_plan_cuda(const at::Tensor& rowptr, int64_t num_cols, int64_t row_width,
                          at::ScalarType dtype) {
  // The header describes the CPU kernels; CUDA calls choose their schedule per call.
  static auto op = op_handle("sparsejit::spmm_plan")
                       .typed<at::Tensor(const at::Tensor&, int64_t, int64_t, at::ScalarType)>();
  return op.call(rowptr.cpu(), num_cols, row_width, dtype).to(rowptr.device());
}

using SpmmResult = std::tuple<at::Tensor, at::Tensor>;

SpmmResult spmm_on_cpu(const at::Tensor& rowptr, const at::Tensor& col,
                       const std::optional<at::Tensor>& values, const at::Tensor& x,
                       c10::string_view reduce, const std::optional<at::Tensor>& bias,
                       c10::string_view activation, double act_param, double scale,
                       bool need_arg) {
  static auto op =
      op_handle("sparsejit::spmm")
          .typed<SpmmResult(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            const at::Tensor&, c10::string_view, const std::optional<at::Tensor>&,
                            const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                            const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                            c10::string_view, double, double, bool)>();
  auto [out, arg] = op.call(rowptr.cpu(), col.cpu(), to_cpu(values), to_cpu(x), reduce,
                            std::nullopt, std::nullopt, std::nullopt, std::nullopt, to_cpu(bias),
                            activation, act_param, scale, need_arg);
  return {out.to(x.device(), x.scalar_type()), arg.to(x.device())};
}

SpmmResult spmm_cuda(const at::Tensor& rowptr, const at::Tensor& col,
                     const std::optional<at::Tensor>& values, const at::Tensor& x,
                     c10::string_view reduce, const std::optional<at::Tensor>&,
                     const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                     const std::optional<at::Tensor>& /*plan: CPU schedules only*/,
                     const std::optional<at::Tensor>& bias, c10::string_view activation,
                     double act_param, double scale, bool need_arg) {
  const SpmmShape s = check_spmm_args(rowptr, col, values, x, reduce);
  const cpu::Act act = parse_activation(activation);
  const int64_t row_width = s.heads * s.features;
  at::Tensor bc;
  if (bias.has_value()) {
    TORCH_CHECK_VALUE(bias->numel() == row_width, "sparsejit.spmm: bias has ", bias->numel(),
                      " elements but each output row has ", row_width);
    check_same_device(*bias, x, "bias", "X");
    bc = bias->to(x.scalar_type()).contiguous();
  }
  c10::cuda::CUDAGuard guard(x.device());
  if (!gpu_kernels_available())
    return spmm_on_cpu(rowptr, col, values, x, reduce, bias, activation, act_param, scale,
                       need_arg);

  auto rp = rowptr.contiguous();
  auto cl = col.contiguous();
  auto xc = x.contiguous();
  at::Tensor vc = values.has_value() ? values->contiguous() : at::Tensor();
  auto out = at::empty(s.out_sizes, x.options());
  const bool with_arg = s.reduce == Reduce::Max || s.reduce == Reduce::Min;
  auto arg = with_arg ? at::empty(s.out_sizes, x.options().dtype(at::kLong))
                      : at::empty({0}, x.options().dtype(at::kLong));
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
  TORCH_CHECK_VALUE(invalid.empty(),
                    "sparsejit.spmm (CUDA): no kernel for this problem: ", invalid);
  const codegen::SpmmLaunchPlan plan = codegen::plan_spmm_launch(choice, s.rows, nnz);
  at::Tensor ws;
  if (plan.workspace_bytes > 0) {
    ws = at::empty({static_cast<int64_t>(plan.workspace_bytes)}, x.options().dtype(at::kByte));
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
                                   c10::cuda::getCurrentCUDAStream().stream(), plan.launches, &p,
                                   &err))
    raise_cuda_error("spmm", err + "\n(schedule: " + choice.reason + ")");
  // The CUDA kernels always record positions for max / min; dropped when not asked for.
  if (!need_arg) arg = at::empty({0}, x.options().dtype(at::kLong));
  return {out, arg};
}

at::Tensor sddmm_cuda(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& q,
                      const at::Tensor& k, const std::optional<at::Tensor>&,
                      const std::optional<at::Tensor>&, const std::optional<at::Tensor>&) {
  const SddmmShape s = check_sddmm_args(rowptr, col, q, k);
  c10::cuda::CUDAGuard guard(q.device());
  if (!gpu_kernels_available()) {
    static auto op = op_handle("sparsejit::sddmm")
                         .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                           const at::Tensor&, const std::optional<at::Tensor>&,
                                           const std::optional<at::Tensor>&,
                                           const std::optional<at::Tensor>&)>();
    return op
        .call(rowptr.cpu(), col.cpu(), to_cpu(q), to_cpu(k), std::nullopt, std::nullopt,
              std::nullopt)
        .to(q.device(), q.scalar_type());
  }
  auto rp = rowptr.contiguous();
  auto cl = col.contiguous();
  auto qc = q.contiguous();
  auto kc = k.contiguous();
  const int64_t nnz = cl.numel();
  auto out = at::empty(s.out_sizes, q.options());
  if (nnz == 0 || s.heads == 0) return out;
  if (s.features == 0) return out.zero_();
  const CudaKernelSpec spec =
      codegen::plan_cuda_sddmm(cuda_scalar(q.scalar_type()), index_kind(rp), s.heads, s.features,
                               aligned_bytes({qc.data_ptr(), kc.data_ptr()}));
  const std::string invalid = spec.validate();
  TORCH_CHECK_VALUE(invalid.empty(),
                    "sparsejit.sddmm (CUDA): no kernel for this problem: ", invalid);
  cuda::SddmmParams p{
      rp.data_ptr(), cl.data_ptr(), qc.data_ptr(), kc.data_ptr(), out.data_ptr(), s.rows, nnz};
  std::string err;
  if (!CudaKernels::instance().run(spec, q.get_device(), c10::cuda::getCurrentCUDAStream().stream(),
                                   {codegen::plan_sddmm_launch(spec, nnz)}, &p, &err))
    raise_cuda_error("sddmm", err);
  return out;
}

at::Tensor softmax_common(const at::Tensor& rowptr, const at::Tensor& y, const at::Tensor* grad,
                          const char* op_name) {
  const int64_t heads = check_edge_scores(rowptr, y, grad ? "y" : "scores");
  c10::cuda::CUDAGuard guard(y.device());
  auto rp = rowptr.contiguous();
  auto yc = y.contiguous();
  at::Tensor gc;
  if (grad) gc = grad->to(y.scalar_type()).contiguous();
  if (!gpu_kernels_available()) {
    if (grad) {
      static auto op =
          op_handle("sparsejit::edge_softmax_backward")
              .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
      return op.call(rp.cpu(), to_cpu(yc), to_cpu(gc)).to(y.device(), y.scalar_type());
    }
    static auto op = op_handle("sparsejit::edge_softmax")
                         .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
    return op.call(rp.cpu(), to_cpu(yc)).to(y.device(), y.scalar_type());
  }
  auto out = at::empty_like(yc);
  const int64_t rows = rp.numel() - 1;
  if (rows == 0 || yc.numel() == 0 || heads == 0) return out;
  const CudaKernelSpec spec = codegen::plan_cuda_edge_softmax(
      cuda_scalar(yc.scalar_type()), index_kind(rp), heads, grad != nullptr);
  cuda::SoftmaxParams p{rp.data_ptr(),  yc.data_ptr(), gc.defined() ? gc.data_ptr() : nullptr,
                        out.data_ptr(), rows,          0};
  std::string err;
  if (!CudaKernels::instance().run(spec, y.get_device(), c10::cuda::getCurrentCUDAStream().stream(),
                                   {codegen::plan_edge_softmax_launch(spec, rows)}, &p, &err))
    raise_cuda_error(op_name, err);
  return out;
}

at::Tensor edge_softmax_cuda(const at::Tensor& rowptr, const at::Tensor& scores) {
  return softmax_common(rowptr, scores, nullptr, "edge_softmax");
}

at::Tensor edge_softmax_backward_cuda(const at::Tensor& rowptr, const at::Tensor& y,
                                      const at::Tensor& grad) {
  TORCH_CHECK_VALUE(grad.sizes() == y.sizes(), "sparsejit.edge_softmax_backward: grad has shape ",
                    grad.sizes(), " but the softmax output has shape ", y.sizes());
  check_same_device(grad, y, "grad", "y");
  return softmax_common(rowptr, y, &grad, "edge_softmax_backward");
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsejit, CUDA, m) {
  m.impl("validate_csr", &validate_csr_cuda);
  m.impl("csr_transpose", &csr_transpose_cuda);
  m.impl("spmm", &spmm_cuda);
  m.impl("sddmm", &sddmm_cuda);
  m.impl("edge_softmax", &edge_softmax_cuda);
  m.impl("edge_softmax_backward", &edge_softmax_backward_cuda);
  m.impl("spmm_plan", &spmm_plan_cuda);
}

}  // namespace sparsejit
