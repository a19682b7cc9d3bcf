// Edge softmax: softmax of the scores over each row's stored entries, per head, and its
// backward (grad_s = y * (g - sum_row(g * y))). Scores are [nnz] or [nnz, H].
#include "torch_ext/tensor_api.h"

#include "codegen/cuda_spmm.h"
#include "kernels/cpu/kernels.h"
#include "torch_ext/common.h"
#include "torch_ext/ops/spmm_checks.h"
#include "torch_ext/cuda_common.h"
#include "torch_ext/cuda_fallback.h"

SJ_LIBRARY_FRAGMENT(m) {
  m.def("edge_softmax(Tensor rowptr, Tensor s) -> Tensor");
  m.def("edge_softmax_backward(Tensor rowptr, Tensor y, Tensor grad) -> Tensor");
}

namespace sparsejit {
namespace {

// Calls f(T{}, I{}) with the kernel scalar and index types of (values, rowptr).
template <typename F>
void dispatch_types(const tx::Tensor& values, const tx::Tensor& rowptr, F&& f) {
  auto with_index = [&](auto V) {
    if (index_kind(rowptr) == IndexKind::I32) {
      f(V, int32_t{});
    } else {
      f(V, int64_t{});
    }
  };
  switch (scalar_kind(values.scalar_type(), "scores")) {
    case ScalarKind::F32: with_index(float{}); return;
    case ScalarKind::F64: with_index(double{}); return;
    case ScalarKind::BF16: with_index(bf16{}); return;
    case ScalarKind::F16: break;  // the callers convert half to float first
  }
  SJ_CHECK_TYPE(false, "sparsejit.edge_softmax: unsupported dtype ", values.scalar_type());
}

tx::Tensor edge_softmax_cpu(const tx::Tensor& rowptr, const tx::Tensor& scores) {
  const int64_t heads = check_edge_scores(rowptr, scores, "scores");
  auto rp = rowptr.contiguous();
  auto sc = half_as_float(scores).contiguous();
  auto out = new_output_like(sc);
  dispatch_types(sc, rp, [&](auto V, auto I) {
    using T = decltype(V);
    using IT = decltype(I);
    cpu::edge_softmax<T, IT>(rp.numel() - 1, heads, ptr<IT>(rp), ptr<T>(sc), ptr<T>(out),
                             tx::get_num_threads());
  });
  return scores.scalar_type() == tx::kHalf ? out.to(tx::kHalf) : out;
}

tx::Tensor edge_softmax_backward_cpu(const tx::Tensor& rowptr, const tx::Tensor& y,
                                     const tx::Tensor& grad) {
  const int64_t heads = check_edge_scores(rowptr, y, "y");
  SJ_CHECK_VALUE(grad.sizes() == y.sizes(), "sparsejit.edge_softmax_backward: grad has shape ",
                    grad.sizes(), " but the softmax output has shape ", y.sizes());
  check_float(grad, "grad");
  check_same_device(grad, y, "grad", "y");
  auto rp = rowptr.contiguous();
  auto yc = half_as_float(y).contiguous();
  auto gc = grad.to(yc.scalar_type()).contiguous();
  auto out = new_output_like(yc);
  dispatch_types(yc, rp, [&](auto V, auto I) {
    using T = decltype(V);
    using IT = decltype(I);
    cpu::edge_softmax_backward<T, IT>(rp.numel() - 1, heads, ptr<IT>(rp), ptr<T>(yc),
                                      ptr<T>(gc), ptr<T>(out), tx::get_num_threads());
  });
  return y.scalar_type() == tx::kHalf ? out.to(tx::kHalf) : out;
}

#ifdef SPARSEJIT_WITH_CUDA
using namespace cuda_ext;

tx::Tensor softmax_common(const tx::Tensor& rowptr, const tx::Tensor& y, const tx::Tensor* grad,
                          const char* op_name) {
  const int64_t heads = check_edge_scores(rowptr, y, grad ? "y" : "scores");
  DeviceGuard guard(y.device());
  auto rp = rowptr.contiguous();
  auto yc = y.contiguous();
  tx::Tensor gc;
  if (grad) gc = grad->to(y.scalar_type()).contiguous();
  if (!gpu_kernels_available()) {
    if (grad) return call_on_cpu<tx::Tensor>("sparsejit::edge_softmax_backward", rp, yc, gc);
    return call_on_cpu<tx::Tensor>("sparsejit::edge_softmax", rp, yc);
  }
  auto out = new_output_like(yc);
  const int64_t rows = rp.numel() - 1;
  if (rows == 0 || yc.numel() == 0 || heads == 0) return out;
  const codegen::CudaEdgeSoftmaxSpec spec = codegen::plan_cuda_edge_softmax(
      cuda_scalar(yc.scalar_type()), index_kind(rp), heads, grad != nullptr);
  cuda::SoftmaxParams p{rp.data_ptr(),  yc.data_ptr(), gc.defined() ? gc.data_ptr() : nullptr,
                        out.data_ptr(), rows,          0};
  std::string err;
  if (!CudaKernels::instance().run(spec, y.get_device(), current_stream(),
                                   {codegen::plan_edge_softmax_launch(spec, rows)}, &p, &err))
    raise_cuda_error(op_name, err);
  return out;
}

tx::Tensor edge_softmax_cuda(const tx::Tensor& rowptr, const tx::Tensor& scores) {
  return softmax_common(rowptr, scores, nullptr, "edge_softmax");
}

tx::Tensor edge_softmax_backward_cuda(const tx::Tensor& rowptr, const tx::Tensor& y,
                                      const tx::Tensor& grad) {
  SJ_CHECK_VALUE(grad.sizes() == y.sizes(), "sparsejit.edge_softmax_backward: grad has shape ",
                    grad.sizes(), " but the softmax output has shape ", y.sizes());
  check_same_device(grad, y, "grad", "y");
  return softmax_common(rowptr, y, &grad, "edge_softmax_backward");
}

#endif

}  // namespace

SJ_LIBRARY_IMPL(CPU, m) {
  m.impl("edge_softmax", SJ_KERNEL(&edge_softmax_cpu));
  m.impl("edge_softmax_backward", SJ_KERNEL(&edge_softmax_backward_cpu));
}

#ifdef SPARSEJIT_WITH_CUDA
SJ_LIBRARY_IMPL(CUDA, m) {
  m.impl("edge_softmax", SJ_KERNEL(&edge_softmax_cuda));
  m.impl("edge_softmax_backward", SJ_KERNEL(&edge_softmax_backward_cuda));
}
#endif

}  // namespace sparsejit
