// Structure ops: validation, transpose, and CSR from an edge_index (the drop-in path's
// structure build, a registered op so torch.compile traces it).
//
// validate_csr(rowptr, col, num_cols): every invariant of a CSR structure (O(rows + nnz)).
// csr_transpose(rowptr, col, num_cols) -> (t_rowptr, t_col, t_perm): t_perm maps each entry
//   of the transpose to its position in the input.
// csr_from_edge_index(edge_index, num_nodes) -> (rowptr, col, perm): rows are targets
//   (edge_index[1]), sorted by (target, source), stable; perm maps CSR positions to edges.
#include <torch/library.h>

#include "csrc/core/csr.h"
#include "torch_ext/common.h"
#include "torch_ext/cuda_fallback.h"

TORCH_LIBRARY_FRAGMENT(sparsejit, m) {
  m.def("validate_csr(Tensor rowptr, Tensor col, SymInt num_cols) -> ()");
  m.def("csr_transpose(Tensor rowptr, Tensor col, SymInt num_cols) -> (Tensor, Tensor, Tensor)");
  m.def("csr_from_edge_index(Tensor edge_index, SymInt num_nodes) -> (Tensor, Tensor, Tensor)");
  // GCN's D^-1/2 (A + I) D^-1/2 of an unweighted edge_index (csrc/core/csr.h): the CSR of
  // the edges followed by one self-loop per node, perm into that list, values in `dtype`.
  m.def("gcn_adjacency(Tensor edge_index, SymInt num_nodes, ScalarType dtype) -> "
        "(Tensor, Tensor, Tensor, Tensor)");
}

namespace sparsejit {
namespace {

template <typename F>
void dispatch_index(const at::Tensor& t, F&& f) {
  if (index_kind(t) == IndexKind::I32) {
    f(int32_t{});
  } else {
    f(int64_t{});
  }
}

void validate_csr_cpu(const at::Tensor& rowptr, const at::Tensor& col, int64_t num_cols) {
  check_index_pair(rowptr, col);
  TORCH_CHECK_VALUE(num_cols >= 0, "sparsejit: num_cols must be >= 0; got ", num_cols);
  auto rp = rowptr.contiguous();
  auto cl = col.contiguous();
  dispatch_index(rp, [&](auto I) {
    using IT = decltype(I);
    auto r = validate_csr<IT>(ptr<IT>(rp), rp.numel(), ptr<IT>(cl), cl.numel(), num_cols);
    TORCH_CHECK_VALUE(r.ok, "sparsejit: invalid CSR structure: ", r.message);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> csr_transpose_cpu(const at::Tensor& rowptr,
                                                                 const at::Tensor& col,
                                                                 int64_t num_cols) {
  // The transpose scatters by column: a full validation (O(rows + nnz), like the transpose
  // itself) keeps a bad column from writing out of bounds.
  validate_csr_cpu(rowptr, col, num_cols);
  auto rp = rowptr.contiguous();
  auto cl = col.contiguous();
  const int64_t rows = rp.numel() - 1;
  auto t_rowptr = at::empty({num_cols + 1}, rp.options());
  auto t_col = at::empty({cl.numel()}, rp.options());
  auto t_perm = at::empty({cl.numel()}, rp.options());
  dispatch_index(rp, [&](auto I) {
    using IT = decltype(I);
    csr_transpose<IT>(ptr<IT>(rp), ptr<IT>(cl), rows, num_cols, ptr<IT>(t_rowptr), ptr<IT>(t_col),
                      ptr<IT>(t_perm));
  });
  return {t_rowptr, t_col, t_perm};
}

// The checks both edge_index builders share; returns it as contiguous int64.
at::Tensor checked_edge_index(const at::Tensor& edge_index, int64_t num_nodes, const char* op) {
  TORCH_CHECK_VALUE(edge_index.dim() == 2 && edge_index.size(0) == 2, "sparsejit.", op,
                    ": edge_index must have shape [2, E]; got ", edge_index.sizes());
  const auto d = edge_index.scalar_type();
  TORCH_CHECK_TYPE(d == at::kLong || d == at::kInt || d == at::kShort, "sparsejit.", op,
                   ": edge_index must hold integers (int16, int32 or int64); got ", d);
  TORCH_CHECK_VALUE(num_nodes >= 0, "sparsejit.", op, ": num_nodes must be >= 0; got ",
                    num_nodes);
  return edge_index.to(at::kLong).contiguous();
}

// `bad`: -1, or the first edge of `ei` (contiguous int64 [2, E]) with an endpoint outside
// [0, num_nodes), as the builders in csrc/core/csr.h return it.
void check_edges_in_range(const at::Tensor& ei, int64_t bad, int64_t num_nodes, const char* op) {
  if (bad < 0) return;
  const int64_t* src = ptr<int64_t>(ei);
  TORCH_CHECK_VALUE(false, "sparsejit.", op, ": edge_index[:, ", bad, "] = [", src[bad], ", ",
                    src[ei.size(1) + bad], "] is out of range for num_nodes = ", num_nodes);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> csr_from_edge_index_cpu(
    const at::Tensor& edge_index, int64_t num_nodes) {
  const auto ei = checked_edge_index(edge_index, num_nodes, "csr_from_edge_index");
  const int64_t e = ei.size(1);
  auto rowptr = at::empty({num_nodes + 1}, ei.options());
  auto col = at::empty({e}, ei.options());
  auto perm = at::empty({e}, ei.options());
  const int64_t* src = ptr<int64_t>(ei);
  check_edges_in_range(ei,
                       csr_from_edges(src, src + e, e, num_nodes, ptr<int64_t>(rowptr),
                                      ptr<int64_t>(col), ptr<int64_t>(perm)),
                       num_nodes, "csr_from_edge_index");
  return {rowptr, col, perm};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gcn_adjacency_cpu(
    const at::Tensor& edge_index, int64_t num_nodes, at::ScalarType dtype) {
  TORCH_CHECK_TYPE(at::isFloatingType(dtype), "sparsejit.gcn_adjacency: dtype must be a "
                   "floating type; got ", dtype);
  const auto ei = checked_edge_index(edge_index, num_nodes, "gcn_adjacency");
  const int64_t e = ei.size(1), m = e + num_nodes;
  auto rowptr = at::empty({num_nodes + 1}, ei.options());
  auto col = at::empty({m}, ei.options());
  auto perm = at::empty({m}, ei.options());
  auto values = at::empty({m}, ei.options().dtype(at::kDouble));
  const int64_t* src = ptr<int64_t>(ei);
  check_edges_in_range(ei,
                       gcn_adjacency(src, src + e, e, num_nodes, ptr<int64_t>(rowptr),
                                     ptr<int64_t>(col), ptr<int64_t>(perm), ptr<double>(values)),
                       num_nodes, "gcn_adjacency");
  return {rowptr, col, perm, values.to(dtype)};
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsejit, CPU, m) {
  m.impl("gcn_adjacency", &gcn_adjacency_cpu);
  m.impl("validate_csr", &validate_csr_cpu);
  m.impl("csr_transpose", &csr_transpose_cpu);
  m.impl("csr_from_edge_index", &csr_from_edge_index_cpu);
}

#ifdef SPARSEJIT_WITH_CUDA
// Structure building is a one-off per graph: computed on the CPU, results moved back.
TORCH_LIBRARY_IMPL(sparsejit, CUDA, m) {
  m.impl("validate_csr", SPARSEJIT_CUDA_FALLBACK);
  m.impl("csr_transpose", SPARSEJIT_CUDA_FALLBACK);
  m.impl("csr_from_edge_index", SPARSEJIT_CUDA_FALLBACK);
  m.impl("gcn_adjacency", SPARSEJIT_CUDA_FALLBACK);
}
#endif

}  // namespace sparsejit
