// The C++ API (include/sparsejit/sparsejit.h): thin wrappers that build CSR structures and
// call the registered ops through the dispatcher.
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cmath>

#include "sparsejit/sparsejit.h"

namespace sparsejit {
namespace {

c10::OperatorHandle op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

}  // namespace

CsrMatrix CsrMatrix::from_csr(at::Tensor rowptr, at::Tensor col, int64_t num_cols,
                              std::optional<at::Tensor> values) {
  static auto validate =
      op("sparsejit::validate_csr").typed<void(const at::Tensor&, const at::Tensor&, int64_t)>();
  validate.call(rowptr, col, num_cols);
  if (values.has_value()) {
    TORCH_CHECK_VALUE(values->size(0) == col.numel(), "sparsejit: values has ", values->size(0),
                      " entries but the structure stores ", col.numel());
  }
  CsrMatrix m;
  m.rows = rowptr.numel() - 1;
  m.cols = num_cols;
  m.rowptr = std::move(rowptr);
  m.col = std::move(col);
  m.values = std::move(values);
  return m;
}

CsrMatrix CsrMatrix::from_edge_index(const at::Tensor& edge_index, int64_t num_nodes,
                                     std::optional<at::Tensor> values) {
  TORCH_CHECK_VALUE(edge_index.dim() == 2 && edge_index.size(0) == 2,
                    "sparsejit: edge_index must have shape [2, E]; got ", edge_index.sizes());
  if (num_nodes < 0) {
    num_nodes = edge_index.size(1) > 0 ? std::max<int64_t>(edge_index.max().item<int64_t>() + 1, 0)
                                       : 0;
  }
  // The op checks the range and sorts by (target, source), stably; perm maps CSR positions
  // to edges.
  static auto build = op("sparsejit::csr_from_edge_index")
                          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                              const at::Tensor&, int64_t)>();
  auto [rowptr, col, perm] = build.call(edge_index, num_nodes);
  if (values.has_value()) values = values->index_select(0, perm);
  return from_csr(rowptr, col, num_nodes, std::move(values));
}

at::Tensor spmm(const CsrMatrix& a, const at::Tensor& x, const std::string& reduce) {
  TORCH_CHECK_VALUE(x.size(0) == a.cols, "sparsejit.spmm: X has ", x.size(0),
                    " rows but the sparse matrix has ", a.cols, " columns");
  using Opt = const std::optional<at::Tensor>&;
  static auto h =
      op("sparsejit::spmm")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, Opt,
                                                    const at::Tensor&, c10::string_view, int64_t,
                                                    Opt, Opt, Opt, Opt, Opt, c10::string_view,
                                                    double, double, bool)>();
  // No plan: the op's cost model chooses; no epilogue. Autograd is Python-side, so the
  // max / min positions are not needed here.
  return std::get<0>(h.call(a.rowptr, a.col, a.values, x, reduce, a.cols, std::nullopt,
                            std::nullopt, std::nullopt, std::nullopt, std::nullopt, "none", 0.01,
                            1.0, /*need_arg=*/false));
}

at::Tensor sddmm(const CsrMatrix& a, const at::Tensor& q, const at::Tensor& k) {
  TORCH_CHECK_VALUE(k.size(0) == a.cols, "sparsejit.sddmm: K has ", k.size(0),
                    " rows but the sparse matrix has ", a.cols, " columns");
  static auto h = op("sparsejit::sddmm")
                      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        const at::Tensor&, int64_t,
                                        const std::optional<at::Tensor>&,
                                        const std::optional<at::Tensor>&,
                                        const std::optional<at::Tensor>&)>();
  return h.call(a.rowptr, a.col, q, k, a.cols, std::nullopt, std::nullopt, std::nullopt);
}

at::Tensor edge_softmax(const CsrMatrix& a, const at::Tensor& scores) {
  TORCH_CHECK_VALUE(scores.size(0) == a.nnz(), "sparsejit.edge_softmax: scores has ",
                    scores.size(0), " entries but the sparse matrix stores ", a.nnz());
  static auto h =
      op("sparsejit::edge_softmax").typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return h.call(a.rowptr, scores);
}

// ---- fused sparse attention ---------------------------------------------------------------

namespace {

// [N, D] -> [N, 1, D]; anything else is passed on for the op to check (it names the argument).
at::Tensor heads3(const at::Tensor& t) { return t.dim() == 2 ? t.unsqueeze(1) : t; }

std::optional<at::Tensor> edge_term(const CsrMatrix& a, const std::optional<at::Tensor>& t,
                                    int64_t heads, const char* name) {
  if (!t.has_value()) return std::nullopt;
  TORCH_CHECK_VALUE((t->dim() == 1 || (t->dim() == 2 && t->size(1) == heads)) &&
                        t->size(0) == a.nnz(),
                    "sparsejit.sparse_attention: ", name, " must be [nnz] or [nnz, H] = [",
                    a.nnz(), ", ", heads, "]; got shape ", t->sizes());
  return (t->dim() == 1 ? t->unsqueeze(1).expand({a.nnz(), heads}) : *t).contiguous();
}

at::Tensor run_attention(const CsrMatrix& a, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, const std::optional<at::Tensor>& bias, int64_t mode,
                         double scale, double slope, const std::optional<at::Tensor>& att) {
  TORCH_CHECK_VALUE(k.dim() >= 1 && k.size(0) == a.cols, "sparsejit.sparse_attention: the keys "
                    "have ", k.dim() >= 1 ? k.size(0) : 0, " rows but the sparse matrix has ",
                    a.cols, " columns");
  using Opt = const std::optional<at::Tensor>&;
  static auto h = op("sparsejit::sparse_attention")
                      .typed<std::tuple<at::Tensor, at::Tensor>(
                          const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const at::Tensor&, const at::Tensor&, Opt, int64_t, double, double,
                          double, int64_t, Opt, Opt, Opt, Opt)>();
  // No dropout (inference); the transposed pattern is only needed by the backward.
  return std::get<0>(h.call(a.rowptr, a.col, q, k, v, bias, mode, scale, slope, 0.0, 0,
                            std::nullopt, std::nullopt, std::nullopt, att));
}

}  // namespace

at::Tensor sparse_attention(const CsrMatrix& a, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, double scale,
                            const std::optional<at::Tensor>& values) {
  const bool one_head = q.dim() == 2;
  at::Tensor q3 = heads3(q), k3 = heads3(k), v3 = heads3(v);
  if (scale < 0) scale = 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(q3.size(-1), 1)));
  at::Tensor out = run_attention(a, q3, k3, v3, edge_term(a, values, q3.size(1), "values"),
                                 /*mode=*/0, scale, 0.0, std::nullopt);
  return one_head ? out.squeeze(1) : out;
}

at::Tensor gat_attention(const CsrMatrix& a, const at::Tensor& a_dst, const at::Tensor& a_src,
                         const at::Tensor& v, double negative_slope,
                         const std::optional<at::Tensor>& edge_logits) {
  TORCH_CHECK_VALUE(a_dst.dim() == 2 && a_src.dim() == 2, "sparsejit.gat_attention: a_dst and "
                    "a_src must be [N, H]; got ", a_dst.sizes(), " and ", a_src.sizes());
  return run_attention(a, a_dst.unsqueeze(-1), a_src.unsqueeze(-1), heads3(v),
                       edge_term(a, edge_logits, a_dst.size(1), "edge_logits"), /*mode=*/1, 1.0,
                       negative_slope, std::nullopt);
}

at::Tensor gatv2_attention(const CsrMatrix& a, const at::Tensor& x_dst, const at::Tensor& x_src,
                           const at::Tensor& att, const std::optional<at::Tensor>& v,
                           double negative_slope, const std::optional<at::Tensor>& edge_logits) {
  at::Tensor q = heads3(x_dst), k = heads3(x_src);
  at::Tensor w = att.dim() == 3 ? att.reshape({att.size(-2), att.size(-1)}) : att;
  return run_attention(a, q, k, v.has_value() ? heads3(*v) : k,
                       edge_term(a, edge_logits, q.size(1), "edge_logits"), /*mode=*/2, 1.0,
                       negative_slope, w);
}

// ---- RGMS ------------------------------------------------------------------------------

TypedCsr TypedCsr::from_edge_index(const at::Tensor& edge_index, const at::Tensor& edge_type,
                                   int64_t num_nodes, int64_t num_relations) {
  TORCH_CHECK_VALUE(edge_index.dim() == 2 && edge_index.size(0) == 2,
                    "sparsejit: edge_index must have shape [2, E]; got ", edge_index.sizes());
  TORCH_CHECK_VALUE(edge_type.dim() == 1, "sparsejit: edge_type must be 1-D; got ",
                    edge_type.sizes());
  if (num_nodes < 0) {
    num_nodes = edge_index.size(1) > 0 ? std::max<int64_t>(edge_index.max().item<int64_t>() + 1, 0)
                                       : 0;
  }
  if (num_relations < 0) {
    num_relations = edge_type.numel() > 0
                        ? std::max<int64_t>(edge_type.max().item<int64_t>() + 1, 1)
                        : 1;
  }
  static auto plan = op("sparsejit::rgms_plan")
                         .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t,
                                           int64_t, int64_t)>();
  TypedCsr t;
  t.plan = plan.call(edge_index, edge_type, num_nodes, num_nodes, num_relations);
  t.num_src = t.num_dst = num_nodes;
  t.num_relations = num_relations;
  return t;
}

at::Tensor rgms(const TypedCsr& a, const at::Tensor& x, const at::Tensor& w,
                const std::string& reduce, const std::optional<at::Tensor>& values,
                const std::optional<at::Tensor>& root, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK_VALUE(x.dim() == 2 && x.size(0) == a.num_src, "sparsejit.rgms: X must be [",
                    a.num_src, ", F_in]; got ", x.sizes());
  using Opt = const std::optional<at::Tensor>&;
  static auto h = op("sparsejit::rgms")
                      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        Opt, c10::string_view, int64_t, int64_t, int64_t,
                                        int64_t, Opt, Opt, Opt)>();
  // gemm, tile, strategy = 0: the cost model's choices; the root term reads X.
  return h.call(a.plan, x, w, values, reduce, a.num_dst, 0, 0, 0, root, bias, std::nullopt);
}

at::Tensor segment_matmul(const at::Tensor& x, const at::Tensor& ptr, const at::Tensor& w) {
  static auto h = op("sparsejit::segment_matmul")
                      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  return h.call(x, ptr, w);
}

SparseConv2d SparseConv2d::from_dense(const at::Tensor& weight, std::optional<at::Tensor> bias,
                                      std::vector<int64_t> stride, std::vector<int64_t> padding,
                                      std::vector<int64_t> dilation, int64_t groups, bool relu,
                                      double threshold) {
  TORCH_CHECK_VALUE(weight.dim() == 4, "sparsejit::SparseConv2d: weight must be 4-D [C_out, "
                    "C_in/groups, R, S]; got shape ", weight.sizes());
  static auto plan_op = op("sparsejit::filter_conv_plan")
                            .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                                const at::Tensor&, double, int64_t)>();
  SparseConv2d m;
  std::tie(m.plan, m.rowptr, m.taps, m.values) = plan_op.call(weight.cpu(), threshold, 0);
  m.bias = std::move(bias);
  m.kernel_size = {weight.size(2), weight.size(3)};
  m.stride = std::move(stride);
  m.padding = std::move(padding);
  m.dilation = std::move(dilation);
  m.groups = groups;
  m.relu = relu;
  return m;
}

at::Tensor SparseConv2d::forward(const at::Tensor& x) const {
  static auto conv_op =
      op("sparsejit::filter_conv")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&, c10::IntArrayRef,
                            c10::IntArrayRef, c10::IntArrayRef, c10::IntArrayRef, int64_t, bool,
                            int64_t)>();
  return conv_op.call(plan, rowptr, taps, values, x, bias, kernel_size, stride, padding,
                      dilation, groups, relu, -1);
}

// ---- point-cloud sparse convolution ---------------------------------------------------------

ConvMap ConvMap::build(const at::Tensor& coords, const std::vector<int64_t>& spatial_shape,
                       int64_t batch_size, const std::string& kind,
                       const std::vector<int64_t>& kernel, const std::vector<int64_t>& stride,
                       const std::vector<int64_t>& padding,
                       const std::vector<int64_t>& dilation) {
  static auto h = op("sparsejit::conv_plan")
                      .typed<std::tuple<at::Tensor, at::Tensor>(
                          const at::Tensor&, at::IntArrayRef, int64_t, c10::string_view,
                          at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef,
                          const std::optional<at::Tensor>&)>();
  auto [plan, out] = h.call(coords, spatial_shape, batch_size, kind, kernel, stride, padding,
                            dilation, std::nullopt);
  return {plan, out};
}

// Header words 8 (input sites) and 6 (output sites) of the plan (csrc/plan/plan_header.h).
int64_t ConvMap::num_in() const { return plan[8].item<int64_t>(); }
int64_t ConvMap::num_out() const { return plan[6].item<int64_t>(); }

at::Tensor sparse_conv(const at::Tensor& features, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, const ConvMap& map, bool inverse,
                       int64_t dataflow, bool relu) {
  static auto h = op("sparsejit::sparse_conv")
                      .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                                        const std::optional<at::Tensor>&, const at::Tensor&,
                                        c10::SymInt, bool, int64_t, bool)>();
  const int64_t num_out = inverse ? map.num_in() : map.num_out();
  return h.call(features, weight, bias, map.plan, c10::SymInt(num_out), inverse, dataflow,
                relu);
}

}  // namespace sparsejit
