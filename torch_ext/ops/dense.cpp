// Dense products the families' layers share: pyg-lib's segment_matmul and the Linear.
//
// segment_matmul(x, ptr, w) -> rows ptr[k]:ptr[k+1] of x times w[k];
// segment_matmul_backward_w(x, ptr, grad_y) -> dw[k] = x_k^T grad_y_k.
// linear(x, weight, bias?) -> x @ weight^T (+ bias): float32 on the CPU, on the dense layer's
//   GEMM (oneDNN) in blocks of rows over every thread, the bias added per block in cache; the
//   PyG-signature layers' Linears take it where it is faster than torch's (see
//   sparsejit.linear). Its gradients are segment_matmul calls with one segment.
// linear_add_(out, x, weight): out += x @ weight^T in place, on the same GEMM (beta = 1): the
//   layers' root terms summed onto a fresh aggregation (autograd and the choice between the
//   two GEMMs: sparsejit.families.dense.ops.linear_add_).
//
// float32 / float64 run natively; bfloat16 / float16 run in float32 and are converted back.
// segment_matmul off the float32 CPU kernels: torch_ext/composite/dense_composite.h.
#include "torch_ext/tensor_api.h"

#include <optional>
#include <vector>

#include "csrc/dense/gemm.h"
#include "torch_ext/common.h"
#include "torch_ext/composite/dense_composite.h"

SJ_LIBRARY_FRAGMENT(m) {
  m.def("segment_matmul(Tensor x, Tensor ptr, Tensor w) -> Tensor");
  m.def("segment_matmul_backward_w(Tensor x, Tensor ptr, Tensor grad_y) -> Tensor");
  m.def("linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("linear_add_(Tensor(a!) out, Tensor x, Tensor weight) -> ()");
}

namespace sparsejit {
namespace {

// ---- segment_matmul -------------------------------------------------------------------

// ptr: 1-D integer, starts at 0, never decreases, ends at x.size(0), num_segments + 1 long.
tx::Tensor checked_ptr(const char* op, const tx::Tensor& p, int64_t rows, int64_t segments,
                       const char* seg_source) {
  const auto d = p.scalar_type();
  SJ_CHECK_TYPE(d == tx::kLong || d == tx::kInt, "sparsejit.", op,
                   ": ptr must be int32 or int64; got ", d);
  SPARSEJIT_CHECK(op, p.dim() == 1, "ptr must be 1-D; got shape ", p.sizes());
  SPARSEJIT_CHECK(op, p.numel() == segments + 1, "ptr must have ", seg_source,
                  " + 1 = ", segments + 1, " entries; got ", p.numel());
  auto pc = p.to(tx::kLong).contiguous().cpu();
  const int64_t* v = ptr<int64_t>(pc);
  SPARSEJIT_CHECK(op, v[0] == 0, "ptr[0] must be 0; got ", v[0]);
  for (int64_t k = 0; k < segments; ++k) {
    SPARSEJIT_CHECK(op, v[k + 1] >= v[k], "ptr must not decrease; ptr[", k, "] = ", v[k], " > ptr[",
                    k + 1, "] = ", v[k + 1]);
  }
  SPARSEJIT_CHECK(op, v[segments] == rows, "ptr[-1] = ", v[segments],
                  " must equal the number of rows of x (", rows, ")");
  return pc;
}

tx::Tensor segment_matmul_impl(const tx::Tensor& x_in, const tx::Tensor& p, const tx::Tensor& w_in) {
  check_float(x_in, "x");
  check_float(w_in, "w");
  SPARSEJIT_CHECK("segment_matmul", x_in.dim() == 2, "x must be [N, F_in]; got shape ",
                  x_in.sizes());
  SPARSEJIT_CHECK("segment_matmul", w_in.dim() == 3, "w must be [K, F_in, F_out]; got shape ",
                  w_in.sizes());
  SJ_CHECK_TYPE(w_in.scalar_type() == x_in.scalar_type(), "sparsejit.segment_matmul: w dtype (",
                   w_in.scalar_type(), ") must match x dtype (", x_in.scalar_type(), ")");
  SPARSEJIT_CHECK("segment_matmul", w_in.size(1) == x_in.size(1), "w has F_in = ", w_in.size(1),
                  " but x has ", x_in.size(1), " features");
  check_same_device(w_in, x_in, "w", "x");
  check_same_device(p, x_in, "ptr", "x");
  const auto pc = checked_ptr("segment_matmul", p, x_in.size(0), w_in.size(0), "w.size(0)");
  const auto ct = compute_type(x_in.scalar_type());
  const auto x = x_in.to(ct).contiguous();
  const auto w = w_in.to(ct).contiguous();
  auto y = new_output({x.size(0), w.size(2)}, x.options());
  const int64_t* v = ptr<int64_t>(pc);  // on the host (checked_ptr; a sync for device ptr)
  if (ct == tx::kFloat && x.is_cpu()) {  // one parallel region over (segment, row block) tiles
    dense::segment_sgemm(v, w.size(0), ptr<float>(x), x.size(1), ptr<float>(w), w.size(2),
                         ptr<float>(y), tx::get_num_threads());
    return y.to(x_in.scalar_type());
  }
  composite::segment_matmul(x, w, v, y);
  return y.to(x_in.scalar_type());
}

tx::Tensor segment_matmul_backward_w_impl(const tx::Tensor& x_in, const tx::Tensor& p,
                                         const tx::Tensor& dy_in) {
  check_float(x_in, "x");
  check_float(dy_in, "grad_y");
  SPARSEJIT_CHECK("segment_matmul_backward_w",
                  x_in.dim() == 2 && dy_in.dim() == 2 && dy_in.size(0) == x_in.size(0),
                  "x [N, F_in] and grad_y [N, F_out] must agree in N; "
                  "got ",
                  x_in.sizes(), " and ", dy_in.sizes());
  SJ_CHECK_TYPE(dy_in.scalar_type() == x_in.scalar_type(),
                   "sparsejit.segment_matmul_backward_w: grad_y dtype must match x dtype");
  const auto pc = checked_ptr("segment_matmul_backward_w", p, x_in.size(0), p.numel() - 1,
                              "the number of segments");
  const auto ct = compute_type(x_in.scalar_type());
  const auto x = x_in.to(ct).contiguous();
  const auto dy = dy_in.to(ct).contiguous();
  const int64_t k_n = pc.numel() - 1;
  auto dw = tx::empty({k_n, x.size(1), dy.size(1)}, x.options());
  const int64_t* v = ptr<int64_t>(pc);
  if (ct == tx::kFloat && x.is_cpu()) {
    dense::segment_sgemm_grad_w(v, k_n, ptr<float>(x), x.size(1), ptr<float>(dy), dy.size(1),
                                ptr<float>(dw), tx::get_num_threads());
    return dw.to(x_in.scalar_type());
  }
  composite::segment_matmul_grad_w(x, dy, v, dw);
  return dw.to(x_in.scalar_type());
}

// x [N, F_in] and weight [F_out, F_in] checked (float32, CPU, ranks, widths) for `op`; x made
// contiguous and weight^T [F_in, F_out] copied out row-major, as segment_sgemm takes it.
struct LinearOperands {
  tx::Tensor x;
  std::vector<float> wt;
  int64_t n, fi, fo;
};

LinearOperands linear_operands(const tx::Tensor& x_in, const tx::Tensor& w_in, const char* op) {
  SJ_CHECK_TYPE(x_in.scalar_type() == tx::kFloat, "sparsejit.", op, ": x must be float32; got ",
                x_in.scalar_type(), " (torch.nn.functional.linear takes the other dtypes)");
  SJ_CHECK_TYPE(w_in.scalar_type() == tx::kFloat, "sparsejit.", op,
                ": weight must be float32; got ", w_in.scalar_type());
  SPARSEJIT_CHECK(op, x_in.dim() == 2, "x must be [N, F_in]; got shape ", x_in.sizes());
  SPARSEJIT_CHECK(op, w_in.dim() == 2, "weight must be [F_out, F_in]; got shape ",
                  w_in.sizes());
  SPARSEJIT_CHECK(op, w_in.size(1) == x_in.size(1), "weight has F_in = ", w_in.size(1),
                  " but x has ", x_in.size(1), " features");
  SPARSEJIT_CHECK(op, x_in.device().is_cpu(), "x must be on the CPU; got ", x_in.device());
  check_same_device(w_in, x_in, "weight", "x");
  LinearOperands o{x_in.contiguous(), {}, x_in.size(0), x_in.size(1), w_in.size(0)};
  const auto w = w_in.contiguous();
  o.wt.resize(size_t(std::max<int64_t>(o.fi * o.fo, 1)));
  const float* wp = ptr<float>(w);
  for (int64_t r = 0; r < o.fo; ++r)
    for (int64_t i = 0; i < o.fi; ++i) o.wt[size_t(i * o.fo + r)] = wp[r * o.fi + i];
  return o;
}

tx::Tensor linear_impl(const tx::Tensor& x_in, const tx::Tensor& w_in,
                       const std::optional<tx::Tensor>& b_in) {
  auto o = linear_operands(x_in, w_in, "linear");
  tx::Tensor b;
  if (b_in.has_value()) {
    SJ_CHECK_TYPE(b_in->scalar_type() == tx::kFloat, "sparsejit.linear: bias must be float32; got ",
                  b_in->scalar_type());
    SPARSEJIT_CHECK("linear", b_in->dim() == 1 && b_in->size(0) == o.fo,
                    "bias must be [F_out] = [", o.fo, "]; got shape ", b_in->sizes());
    check_same_device(*b_in, x_in, "bias", "x");
    b = b_in->contiguous();
  }
  auto y = new_output({o.n, o.fo}, o.x.options());
  if (o.n == 0 || o.fo == 0) return y;
  const int64_t seg[2] = {0, o.n};
  dense::segment_sgemm(seg, 1, ptr<float>(o.x), o.fi, o.wt.data(), o.fo, ptr<float>(y),
                       tx::get_num_threads(), b.defined() ? ptr<float>(b) : nullptr);
  return y;
}

// out += x @ weight^T in place: out must be a contiguous float32 [N, F_out] CPU tensor.
void linear_add_impl(const tx::Tensor& out, const tx::Tensor& x_in, const tx::Tensor& w_in) {
  auto o = linear_operands(x_in, w_in, "linear_add_");
  SJ_CHECK_TYPE(out.scalar_type() == tx::kFloat, "sparsejit.linear_add_: out must be float32; got ",
                out.scalar_type());
  SPARSEJIT_CHECK("linear_add_", out.dim() == 2 && out.size(0) == o.n && out.size(1) == o.fo,
                  "out must be [N, F_out] = [", o.n, ", ", o.fo, "]; got shape ", out.sizes());
  SPARSEJIT_CHECK("linear_add_", out.is_contiguous(), "out must be contiguous");
  check_same_device(out, x_in, "out", "x");
  if (o.n == 0 || o.fo == 0 || o.fi == 0) return;
  const int64_t seg[2] = {0, o.n};
  dense::segment_sgemm(seg, 1, ptr<float>(o.x), o.fi, o.wt.data(), o.fo, ptr<float>(out),
                       tx::get_num_threads(), nullptr, /*accumulate=*/true);
}

}  // namespace

SJ_LIBRARY_IMPL(CPU, m) {
  m.impl("segment_matmul", SJ_KERNEL(&segment_matmul_impl));
  m.impl("segment_matmul_backward_w", SJ_KERNEL(&segment_matmul_backward_w_impl));
  m.impl("linear", SJ_KERNEL(&linear_impl));
  m.impl("linear_add_", SJ_KERNEL(&linear_add_impl));
}

#ifdef SPARSEJIT_WITH_CUDA
// segment_matmul: cuBLAS per segment (ptr read on the host).
SJ_LIBRARY_IMPL(CUDA, m) {
  m.impl("segment_matmul", SJ_KERNEL(&segment_matmul_impl));
  m.impl("segment_matmul_backward_w", SJ_KERNEL(&segment_matmul_backward_w_impl));
}
#endif

}  // namespace sparsejit
