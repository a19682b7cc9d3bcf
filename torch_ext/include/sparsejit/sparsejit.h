// sparsejit C++ API for LibTorch programs.
//
//   #include <sparsejit/sparsejit.h>
//   auto A = sparsejit::CsrMatrix::from_edge_index(edge_index, num_nodes);
//   at::Tensor Y = sparsejit::spmm(A, X, "sum");
//
// Link against the imported target `sparsejit::ops` (find_package(sparsejit)). Calls go
// through the Torch dispatcher, so the same code runs on every device sparsejit supports.
// Autograd formulas are registered from Python; from C++ these calls are forward-only.
// Header-only (inline wrappers compiled into the calling program against its own torch): the
// op library itself is built on torch's stable ABI and holds no C++ Torch symbol.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>

#include <optional>
#include <string>
#include <vector>

namespace sparsejit {

// A validated CSR structure with optional values. rows = targets, cols = sources when
// built from an edge index, so spmm(A, X) is message passing (sum over in-neighbours).
struct CsrMatrix {
  at::Tensor rowptr;                 // [rows + 1], int32 or int64
  at::Tensor col;                    // [nnz], same dtype as rowptr
  std::optional<at::Tensor> values;  // [nnz] or [nnz, H]
  int64_t rows = 0;
  int64_t cols = 0;

  int64_t nnz() const { return col.numel(); }

  // Validates (throws c10::ValueError naming the bad argument, position and value).
  static CsrMatrix from_csr(at::Tensor rowptr, at::Tensor col, int64_t num_cols,
                            std::optional<at::Tensor> values = std::nullopt);
  // edge_index: [2, E], row 0 = sources, row 1 = targets. num_nodes < 0: 1 + max index.
  static CsrMatrix from_edge_index(const at::Tensor& edge_index, int64_t num_nodes = -1,
                                   std::optional<at::Tensor> values = std::nullopt);
};

at::Tensor spmm(const CsrMatrix& a, const at::Tensor& x, const std::string& reduce = "sum");
at::Tensor sddmm(const CsrMatrix& a, const at::Tensor& q, const at::Tensor& k);
at::Tensor edge_softmax(const CsrMatrix& a, const at::Tensor& scores);

// ---- fused sparse attention -------------------------------------------------------------------

// Dot-product attention on A's pattern (rows = targets i, columns = sources j):
// out[i, h] = sum_j P[ij, h] V[j, h], P = softmax_j(scale <Q[i, h], K[j, h]> + values[ij, h])
// over row i's entries, without forming the [nnz, H] scores. Q [rows, H, D], K [cols, H, D],
// V [cols, H, Dv] ([N, D] means one head, and the result is then [rows, Dv]); scale < 0 means
// 1 / sqrt(D); values [nnz] or [nnz, H] (CSR order) is an additive score term (A.values is
// not used unless passed here). Rows with no entries give 0. Returns [rows, H, Dv].
at::Tensor sparse_attention(const CsrMatrix& a, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, double scale = -1.0,
                            const std::optional<at::Tensor>& values = std::nullopt);
// GAT's additive attention: P = softmax_j(LeakyReLU(a_dst[i, h] + a_src[j, h] +
// edge_logits[ij, h])); a_dst [rows, H], a_src [cols, H], V [cols, H, C].
at::Tensor gat_attention(const CsrMatrix& a, const at::Tensor& a_dst, const at::Tensor& a_src,
                         const at::Tensor& v, double negative_slope = 0.2,
                         const std::optional<at::Tensor>& edge_logits = std::nullopt);
// GATv2's attention: P = softmax_j(att[h] . LeakyReLU(x_dst[i, h] + x_src[j, h]) +
// edge_logits[ij, h]); x_dst [rows, H, C], x_src [cols, H, C], att [H, C]; V defaults to x_src.
at::Tensor gatv2_attention(const CsrMatrix& a, const at::Tensor& x_dst, const at::Tensor& x_src,
                           const at::Tensor& att,
                           const std::optional<at::Tensor>& v = std::nullopt,
                           double negative_slope = 0.2,
                           const std::optional<at::Tensor>& edge_logits = std::nullopt);

// ---- RGMS (relational gather-matmul-scatter, R-GCN) ---------------------------------------

// A typed structure: every edge carries a relation id in [0, num_relations); grouped by
// relation, then target, once (the rgms_plan op; errors name the bad position and value).
struct TypedCsr {
  at::Tensor plan;  // one int64 plan tensor: header and arrays (csrc/rgms/plan_layout.h)
  int64_t num_src = 0, num_dst = 0, num_relations = 0;

  // edge_index [2, E] (row 0 sources, row 1 targets), edge_type [E]. num_nodes < 0:
  // 1 + max index; num_relations < 0: 1 + max relation id.
  static TypedCsr from_edge_index(const at::Tensor& edge_index, const at::Tensor& edge_type,
                                  int64_t num_nodes = -1, int64_t num_relations = -1);
};

// Y[i] = sum over entries (i, j, r) of a * X[j] @ W[r]; W is [R, F_in, F_out]; reduce "sum"
// or "mean" (per target and relation, R-GCN's c_{i,r}); values [E] in edge order, optional.
// root [F_in, F_out] and bias [F_out], optional: Y += X @ root + bias in the same pass (an
// R-GCN layer; needs num_src == num_dst).
at::Tensor rgms(const TypedCsr& a, const at::Tensor& x, const at::Tensor& w,
                const std::string& reduce = "sum",
                const std::optional<at::Tensor>& values = std::nullopt,
                const std::optional<at::Tensor>& root = std::nullopt,
                const std::optional<at::Tensor>& bias = std::nullopt);

// Rows ptr[k]:ptr[k+1] of x times w[k] (pyg-lib's segment_matmul).
at::Tensor segment_matmul(const at::Tensor& x, const at::Tensor& ptr, const at::Tensor& w);

// ---- point-cloud sparse convolution ---------------------------------------------------------

// A kernel map as a plan tensor plus the output sites (the point_conv_plan op). coords [N, 1 + D]
// integers, batch index first; kind "subm", "spconv", "coarse" or "transposed" (see
// docs/SPARSE_CONV.md); errors name the bad row, column and value.
struct ConvMap {
  at::Tensor plan, out_coords;
  static ConvMap build(const at::Tensor& coords, const std::vector<int64_t>& spatial_shape,
                       int64_t batch_size, const std::string& kind,
                       const std::vector<int64_t>& kernel, const std::vector<int64_t>& stride,
                       const std::vector<int64_t>& padding,
                       const std::vector<int64_t>& dilation);
  int64_t num_in() const;   // input sites the map was built on
  int64_t num_out() const;  // output sites
};

// y = bias + sum over the map's pairs (i, o, k) of features[i] @ weight[k]; weight is
// [K, C_in, C_out] (spconv's [C_out, *kernel, C_in] permuted). inverse: the map read backwards
// (spconv's SparseInverseConv: outputs are the map's input sites). dataflow: 0 auto,
// 1 gather-GEMM-scatter, 2 output-stationary. relu: y = max(y, 0), fused into the pass.
at::Tensor point_conv(const at::Tensor& features, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, const ConvMap& map,
                       bool inverse = false, int64_t dataflow = 0, bool relu = false);

// Filter-sparse convolution (pruned Conv2d inference, docs/FILTER_SPARSE_CONV.md): the
// weight [C_out, C_in/groups, R, S] compressed once (zeros and |w| <= threshold dropped), then
// y = relu?(conv2d(x, W) + bias [+ residual]) without touching the zeros (a residual of y's
// shape, e.g. a ResNet block's identity, is added before the ReLU). CPU, inference only; x float32
// (other float dtypes computed in float32), NCHW or channels_last; y NCHW.
struct PrunedConv2d {
  at::Tensor plan, rowptr, taps, values;  // from the filter_conv_plan op
  std::optional<at::Tensor> bias;         // [C_out] or none
  std::vector<int64_t> kernel_size{1, 1}, stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
  bool relu = false;

  // Fold a following BatchNorm into weight and bias first (scale = gamma / sqrt(var + eps)).
  static PrunedConv2d from_dense(const at::Tensor& weight, std::optional<at::Tensor> bias,
                                 std::vector<int64_t> stride = {1, 1},
                                 std::vector<int64_t> padding = {0, 0},
                                 std::vector<int64_t> dilation = {1, 1}, int64_t groups = 1,
                                 bool relu = false, double threshold = 0.0);
  at::Tensor forward(const at::Tensor& x,
                     const std::optional<at::Tensor>& residual = std::nullopt) const;
  int64_t nnz() const { return taps.numel(); }
};

}  // namespace sparsejit

// ---- definitions ------------------------------------------------------------------------------

namespace sparsejit {
namespace detail {

// The op library's one exported C symbol (torch_ext/library.cpp): referencing it keeps a
// program that calls only these inline wrappers linked to the library (the ops register
// when it loads).
extern "C" int sparsejit_ops_loaded();

// An op's typed handle whose calls raise what LibTorch code catches: the op library is built on
// torch's stable ABI, where a failed argument check arrives as std::invalid_argument; it is
// rethrown as c10::ValueError (c10::TypeError for a dtype error, marked "TypeError: ").
template <class Sig>
struct CheckedOp;
template <class R, class... A>
struct CheckedOp<R(A...)> {
  c10::TypedOperatorHandle<R(A...)> handle;
  template <class... B>
  R call(B&&... args) const {
    try {
      return handle.call(std::forward<B>(args)...);
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      constexpr const char* kType = "TypeError: ";
      if (msg.rfind(kType, 0) == 0) TORCH_CHECK_TYPE(false, msg.substr(std::strlen(kType)));
      TORCH_CHECK_VALUE(false, msg);
    }
  }
};

struct Op {
  c10::OperatorHandle handle;
  template <class Sig>
  CheckedOp<Sig> typed() const {
    return CheckedOp<Sig>{handle.typed<Sig>()};
  }
};

inline Op op(const char* name) {
  (void)sparsejit_ops_loaded();
  return Op{c10::Dispatcher::singleton().findSchemaOrThrow(name, "")};
}

}  // namespace detail

inline CsrMatrix CsrMatrix::from_csr(at::Tensor rowptr, at::Tensor col, int64_t num_cols,
                              std::optional<at::Tensor> values) {
  static auto validate =
      detail::op("sparsejit::validate_csr")
          .typed<void(const at::Tensor&, const at::Tensor&, int64_t)>();
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

inline CsrMatrix CsrMatrix::from_edge_index(const at::Tensor& edge_index, int64_t num_nodes,
                                     std::optional<at::Tensor> values) {
  TORCH_CHECK_VALUE(edge_index.dim() == 2 && edge_index.size(0) == 2,
                    "sparsejit: edge_index must have shape [2, E]; got ", edge_index.sizes());
  if (num_nodes < 0) {
    num_nodes = edge_index.size(1) > 0 ? std::max<int64_t>(edge_index.max().item<int64_t>() + 1, 0)
                                       : 0;
  }
  // The op checks the range and sorts by (target, source), stably; perm maps CSR positions
  // to edges.
  static auto build = detail::op("sparsejit::csr_from_edge_index")
                          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                              const at::Tensor&, int64_t)>();
  auto [rowptr, col, perm] = build.call(edge_index, num_nodes);
  if (values.has_value()) values = values->index_select(0, perm);
  return from_csr(rowptr, col, num_nodes, std::move(values));
}

inline at::Tensor spmm(const CsrMatrix& a, const at::Tensor& x, const std::string& reduce) {
  TORCH_CHECK_VALUE(x.size(0) == a.cols, "sparsejit.spmm: X has ", x.size(0),
                    " rows but the sparse matrix has ", a.cols, " columns");
  using Opt = const std::optional<at::Tensor>&;
  static auto h =
      detail::op("sparsejit::spmm")
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

inline at::Tensor sddmm(const CsrMatrix& a, const at::Tensor& q, const at::Tensor& k) {
  TORCH_CHECK_VALUE(k.size(0) == a.cols, "sparsejit.sddmm: K has ", k.size(0),
                    " rows but the sparse matrix has ", a.cols, " columns");
  static auto h = detail::op("sparsejit::sddmm")
                      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        const at::Tensor&, int64_t,
                                        const std::optional<at::Tensor>&,
                                        const std::optional<at::Tensor>&,
                                        const std::optional<at::Tensor>&)>();
  return h.call(a.rowptr, a.col, q, k, a.cols, std::nullopt, std::nullopt, std::nullopt);
}

inline at::Tensor edge_softmax(const CsrMatrix& a, const at::Tensor& scores) {
  TORCH_CHECK_VALUE(scores.size(0) == a.nnz(), "sparsejit.edge_softmax: scores has ",
                    scores.size(0), " entries but the sparse matrix stores ", a.nnz());
  static auto h =
      detail::op("sparsejit::edge_softmax")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return h.call(a.rowptr, scores);
}

// ---- fused sparse attention ---------------------------------------------------------------

namespace detail {

// [N, D] -> [N, 1, D]; anything else is passed on for the op to check (it names the argument).
inline at::Tensor heads3(const at::Tensor& t) { return t.dim() == 2 ? t.unsqueeze(1) : t; }

inline std::optional<at::Tensor> edge_term(const CsrMatrix& a, const std::optional<at::Tensor>& t,
                                    int64_t heads, const char* name) {
  if (!t.has_value()) return std::nullopt;
  TORCH_CHECK_VALUE((t->dim() == 1 || (t->dim() == 2 && t->size(1) == heads)) &&
                        t->size(0) == a.nnz(),
                    "sparsejit.sparse_attention: ", name, " must be [nnz] or [nnz, H] = [",
                    a.nnz(), ", ", heads, "]; got shape ", t->sizes());
  return (t->dim() == 1 ? t->unsqueeze(1).expand({a.nnz(), heads}) : *t).contiguous();
}

inline at::Tensor run_attention(const CsrMatrix& a, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, const std::optional<at::Tensor>& bias, int64_t mode,
                         double scale, double slope, const std::optional<at::Tensor>& att) {
  TORCH_CHECK_VALUE(k.dim() >= 1 && k.size(0) == a.cols, "sparsejit.sparse_attention: the keys "
                    "have ", k.dim() >= 1 ? k.size(0) : 0, " rows but the sparse matrix has ",
                    a.cols, " columns");
  using Opt = const std::optional<at::Tensor>&;
  static auto h = detail::op("sparsejit::sparse_attention")
                      .typed<std::tuple<at::Tensor, at::Tensor>(
                          const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const at::Tensor&, const at::Tensor&, Opt, int64_t, double, double,
                          double, int64_t, Opt, Opt, Opt, Opt)>();
  // No dropout (inference); the transposed pattern is only needed by the backward.
  return std::get<0>(h.call(a.rowptr, a.col, q, k, v, bias, mode, scale, slope, 0.0, 0,
                            std::nullopt, std::nullopt, std::nullopt, att));
}

}  // namespace detail

inline at::Tensor sparse_attention(const CsrMatrix& a, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, double scale,
                            const std::optional<at::Tensor>& values) {
  const bool one_head = q.dim() == 2;
  at::Tensor q3 = detail::heads3(q), k3 = detail::heads3(k), v3 = detail::heads3(v);
  if (scale < 0) scale = 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(q3.size(-1), 1)));
  at::Tensor out =
      detail::run_attention(a, q3, k3, v3, detail::edge_term(a, values, q3.size(1), "values"),
                            /*mode=*/0, scale, 0.0, std::nullopt);
  return one_head ? out.squeeze(1) : out;
}

inline at::Tensor gat_attention(const CsrMatrix& a, const at::Tensor& a_dst,
                                const at::Tensor& a_src, const at::Tensor& v,
                                double negative_slope,
                                const std::optional<at::Tensor>& edge_logits) {
  TORCH_CHECK_VALUE(a_dst.dim() == 2 && a_src.dim() == 2, "sparsejit.gat_attention: a_dst and "
                    "a_src must be [N, H]; got ", a_dst.sizes(), " and ", a_src.sizes());
  return detail::run_attention(a, a_dst.unsqueeze(-1), a_src.unsqueeze(-1), detail::heads3(v),
                               detail::edge_term(a, edge_logits, a_dst.size(1), "edge_logits"),
                               /*mode=*/1, 1.0, negative_slope, std::nullopt);
}

inline at::Tensor gatv2_attention(const CsrMatrix& a, const at::Tensor& x_dst,
                                  const at::Tensor& x_src, const at::Tensor& att,
                                  const std::optional<at::Tensor>& v, double negative_slope,
                                  const std::optional<at::Tensor>& edge_logits) {
  at::Tensor q = detail::heads3(x_dst), k = detail::heads3(x_src);
  at::Tensor w = att.dim() == 3 ? att.reshape({att.size(-2), att.size(-1)}) : att;
  return detail::run_attention(a, q, k, v.has_value() ? detail::heads3(*v) : k,
                               detail::edge_term(a, edge_logits, q.size(1), "edge_logits"),
                               /*mode=*/2, 1.0, negative_slope, w);
}

// ---- RGMS ------------------------------------------------------------------------------

inline TypedCsr TypedCsr::from_edge_index(const at::Tensor& edge_index, const at::Tensor& edge_type,
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
  static auto plan = detail::op("sparsejit::rgms_plan")
                         .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t,
                                           int64_t, int64_t)>();
  TypedCsr t;
  t.plan = plan.call(edge_index, edge_type, num_nodes, num_nodes, num_relations);
  t.num_src = t.num_dst = num_nodes;
  t.num_relations = num_relations;
  return t;
}

inline at::Tensor rgms(const TypedCsr& a, const at::Tensor& x, const at::Tensor& w,
                const std::string& reduce, const std::optional<at::Tensor>& values,
                const std::optional<at::Tensor>& root, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK_VALUE(x.dim() == 2 && x.size(0) == a.num_src, "sparsejit.rgms: X must be [",
                    a.num_src, ", F_in]; got ", x.sizes());
  using Opt = const std::optional<at::Tensor>&;
  static auto h = detail::op("sparsejit::rgms")
                      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        Opt, c10::string_view, int64_t, int64_t, int64_t,
                                        int64_t, Opt, Opt, Opt)>();
  // gemm, tile, strategy = 0: the cost model's choices; the root term reads X.
  return h.call(a.plan, x, w, values, reduce, a.num_dst, 0, 0, 0, root, bias, std::nullopt);
}

inline at::Tensor segment_matmul(const at::Tensor& x, const at::Tensor& ptr, const at::Tensor& w) {
  static auto h = detail::op("sparsejit::segment_matmul")
                      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  return h.call(x, ptr, w);
}

inline PrunedConv2d PrunedConv2d::from_dense(const at::Tensor& weight,
                                             std::optional<at::Tensor> bias,
                                      std::vector<int64_t> stride, std::vector<int64_t> padding,
                                      std::vector<int64_t> dilation, int64_t groups, bool relu,
                                      double threshold) {
  TORCH_CHECK_VALUE(weight.dim() == 4, "sparsejit::PrunedConv2d: weight must be 4-D [C_out, "
                    "C_in/groups, R, S]; got shape ", weight.sizes());
  static auto plan_op = detail::op("sparsejit::filter_conv_plan")
                            .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                                const at::Tensor&, double, int64_t)>();
  PrunedConv2d m;
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

inline at::Tensor PrunedConv2d::forward(const at::Tensor& x,
                                        const std::optional<at::Tensor>& residual) const {
  static auto conv_op =
      detail::op("sparsejit::filter_conv")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&, c10::IntArrayRef,
                            c10::IntArrayRef, c10::IntArrayRef, c10::IntArrayRef, int64_t, bool,
                            int64_t, const std::optional<at::Tensor>&)>();
  return conv_op.call(plan, rowptr, taps, values, x, bias, kernel_size, stride, padding,
                      dilation, groups, relu, -1, residual);
}

// ---- point-cloud sparse convolution ---------------------------------------------------------

inline ConvMap ConvMap::build(const at::Tensor& coords, const std::vector<int64_t>& spatial_shape,
                       int64_t batch_size, const std::string& kind,
                       const std::vector<int64_t>& kernel, const std::vector<int64_t>& stride,
                       const std::vector<int64_t>& padding,
                       const std::vector<int64_t>& dilation) {
  static auto h = detail::op("sparsejit::point_conv_plan")
                      .typed<std::tuple<at::Tensor, at::Tensor>(
                          const at::Tensor&, at::IntArrayRef, int64_t, c10::string_view,
                          at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef,
                          const std::optional<at::Tensor>&)>();
  auto [plan, out] = h.call(coords, spatial_shape, batch_size, kind, kernel, stride, padding,
                            dilation, std::nullopt);
  return {plan, out};
}

// Header words 8 (input sites) and 6 (output sites) of the plan (csrc/plan/plan_header.h).
inline int64_t ConvMap::num_in() const { return plan[8].item<int64_t>(); }
inline int64_t ConvMap::num_out() const { return plan[6].item<int64_t>(); }

inline at::Tensor point_conv(const at::Tensor& features, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, const ConvMap& map, bool inverse,
                       int64_t dataflow, bool relu) {
  static auto h = detail::op("sparsejit::point_conv")
                      .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                                        const std::optional<at::Tensor>&, const at::Tensor&,
                                        c10::SymInt, bool, int64_t, bool)>();
  const int64_t num_out = inverse ? map.num_in() : map.num_out();
  return h.call(features, weight, bias, map.plan, c10::SymInt(num_out), inverse, dataflow,
                relu);
}

}  // namespace sparsejit
