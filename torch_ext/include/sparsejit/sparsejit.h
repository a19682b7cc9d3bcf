// sparsejit C++ API for LibTorch programs.
//
//   #include <sparsejit/sparsejit.h>
//   auto A = sparsejit::CsrMatrix::from_edge_index(edge_index, num_nodes);
//   at::Tensor Y = sparsejit::spmm(A, X, "sum");
//
// Link against the imported target `sparsejit::ops` (find_package(sparsejit)). Calls go
// through the Torch dispatcher, so the same code runs on every device sparsejit supports.
// Autograd formulas are registered from Python; from C++ these calls are forward-only.
#pragma once

#include <ATen/ATen.h>

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

// A kernel map as a plan tensor plus the output sites (the conv_plan op). coords [N, 1 + D]
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
at::Tensor sparse_conv(const at::Tensor& features, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, const ConvMap& map,
                       bool inverse = false, int64_t dataflow = 0, bool relu = false);

// Filter-sparse convolution (pruned Conv2d inference, docs/FILTER_SPARSE_CONV.md): the
// weight [C_out, C_in/groups, R, S] compressed once (zeros and |w| <= threshold dropped), then
// y = relu?(conv2d(x, W) + bias) without touching the zeros. CPU, inference only; x float32
// (other float dtypes computed in float32), NCHW or channels_last; y NCHW.
struct SparseConv2d {
  at::Tensor plan, rowptr, taps, values;  // from the filter_conv_plan op
  std::optional<at::Tensor> bias;         // [C_out] or none
  std::vector<int64_t> kernel_size{1, 1}, stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
  bool relu = false;

  // Fold a following BatchNorm into weight and bias first (scale = gamma / sqrt(var + eps)).
  static SparseConv2d from_dense(const at::Tensor& weight, std::optional<at::Tensor> bias,
                                 std::vector<int64_t> stride = {1, 1},
                                 std::vector<int64_t> padding = {0, 0},
                                 std::vector<int64_t> dilation = {1, 1}, int64_t groups = 1,
                                 bool relu = false, double threshold = 0.0);
  at::Tensor forward(const at::Tensor& x) const;
  int64_t nnz() const { return taps.numel(); }
};

}  // namespace sparsejit
