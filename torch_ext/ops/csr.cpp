// Structure ops: validation, transpose, and CSR from an edge_index (the drop-in path's
// structure build, a registered op so torch.compile traces it).
//
// validate_csr(rowptr, col, num_cols): every invariant of a CSR structure (O(rows + nnz)).
// csr_transpose(rowptr, col, num_cols) -> (t_rowptr, t_col, t_perm): t_perm maps each entry
//   of the transpose to its position in the input.
// csr_from_edge_index(edge_index, num_nodes) -> (rowptr, col, perm): rows are targets
//   (edge_index[1]), sorted by (target, source), stable; perm maps CSR positions to edges.
//
// CPU: the counting sorts of csrc/core/csr.h. CUDA: the same results from device-generic ATen
// ops (a stable sort, searchsorted, index_add: torch_ext/composite/csr_builders.h), no copy to
// the host; they also run on CPU tensors when SPARSEJIT_STRUCTURE_ATEN=1, which is how tests
// check them against the counting sorts on a machine without a GPU.
#include "torch_ext/tensor_api.h"

#include <cstdlib>

#include "csrc/core/csr.h"
#include "torch_ext/common.h"
#include "torch_ext/composite/csr_builders.h"
#include "torch_ext/cuda_fallback.h"

SJ_LIBRARY_FRAGMENT(m) {
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
void dispatch_index(const tx::Tensor& t, F&& f) {
  if (index_kind(t) == IndexKind::I32) {
    f(int32_t{});
  } else {
    f(int64_t{});
  }
}

void validate_csr_cpu(const tx::Tensor& rowptr, const tx::Tensor& col, int64_t num_cols) {
  check_index_pair(rowptr, col);
  SJ_CHECK_VALUE(num_cols >= 0, "sparsejit: num_cols must be >= 0; got ", num_cols);
  auto rp = rowptr.contiguous();
  auto cl = col.contiguous();
  dispatch_index(rp, [&](auto I) {
    using IT = decltype(I);
    auto r = validate_csr<IT>(ptr<IT>(rp), rp.numel(), ptr<IT>(cl), cl.numel(), num_cols);
    SJ_CHECK_VALUE(r.ok, "sparsejit: invalid CSR structure: ", r.message);
  });
}

std::tuple<tx::Tensor, tx::Tensor, tx::Tensor> csr_transpose_cpu(const tx::Tensor& rowptr,
                                                                 const tx::Tensor& col,
                                                                 int64_t num_cols) {
  // The transpose scatters by column: a full validation (O(rows + nnz), like the transpose
  // itself) keeps a bad column from writing out of bounds.
  validate_csr_cpu(rowptr, col, num_cols);
  auto rp = rowptr.contiguous();
  auto cl = col.contiguous();
  const int64_t rows = rp.numel() - 1;
  auto t_rowptr = tx::empty({num_cols + 1}, rp.options());
  auto t_col = tx::empty({cl.numel()}, rp.options());
  auto t_perm = tx::empty({cl.numel()}, rp.options());
  dispatch_index(rp, [&](auto I) {
    using IT = decltype(I);
    csr_transpose<IT>(ptr<IT>(rp), ptr<IT>(cl), rows, num_cols, ptr<IT>(t_rowptr), ptr<IT>(t_col),
                      ptr<IT>(t_perm));
  });
  return {t_rowptr, t_col, t_perm};
}

// The checks both edge_index builders share; returns it as contiguous int64.
tx::Tensor checked_edge_index(const tx::Tensor& edge_index, int64_t num_nodes, const char* op) {
  SJ_CHECK_VALUE(edge_index.dim() == 2 && edge_index.size(0) == 2, "sparsejit.", op,
                    ": edge_index must have shape [2, E]; got ", edge_index.sizes());
  const auto d = edge_index.scalar_type();
  SJ_CHECK_TYPE(d == tx::kLong || d == tx::kInt || d == tx::kShort, "sparsejit.", op,
                   ": edge_index must hold integers (int16, int32 or int64); got ", d);
  SJ_CHECK_VALUE(num_nodes >= 0, "sparsejit.", op, ": num_nodes must be >= 0; got ",
                    num_nodes);
  return edge_index.to(tx::kLong).contiguous();
}

// `bad`: -1, or the first edge of `ei` (contiguous int64 [2, E]) with an endpoint outside
// [0, num_nodes), as the builders in csrc/core/csr.h return it.
void check_edges_in_range(const tx::Tensor& ei, int64_t bad, int64_t num_nodes, const char* op) {
  if (bad < 0) return;
  const int64_t* src = ptr<int64_t>(ei);
  SJ_CHECK_VALUE(false, "sparsejit.", op, ": edge_index[:, ", bad, "] = [", src[bad], ", ",
                    src[ei.size(1) + bad], "] is out of range for num_nodes = ", num_nodes);
}

std::tuple<tx::Tensor, tx::Tensor, tx::Tensor> csr_from_edge_index_cpu(
    const tx::Tensor& edge_index, int64_t num_nodes) {
  const auto ei = checked_edge_index(edge_index, num_nodes, "csr_from_edge_index");
  const int64_t e = ei.size(1);
  auto rowptr = tx::empty({num_nodes + 1}, ei.options());
  auto col = tx::empty({e}, ei.options());
  auto perm = tx::empty({e}, ei.options());
  const int64_t* src = ptr<int64_t>(ei);
  check_edges_in_range(ei,
                       csr_from_edges(src, src + e, e, num_nodes, ptr<int64_t>(rowptr),
                                      ptr<int64_t>(col), ptr<int64_t>(perm)),
                       num_nodes, "csr_from_edge_index");
  return {rowptr, col, perm};
}

std::tuple<tx::Tensor, tx::Tensor, tx::Tensor, tx::Tensor> gcn_adjacency_cpu(
    const tx::Tensor& edge_index, int64_t num_nodes, tx::ScalarType dtype) {
  SJ_CHECK_TYPE(tx::isFloatingType(dtype), "sparsejit.gcn_adjacency: dtype must be a "
                   "floating type; got ", dtype);
  const auto ei = checked_edge_index(edge_index, num_nodes, "gcn_adjacency");
  const int64_t e = ei.size(1), m = e + num_nodes;
  auto rowptr = tx::empty({num_nodes + 1}, ei.options());
  auto col = tx::empty({m}, ei.options());
  auto perm = tx::empty({m}, ei.options());
  // float32 and float64 are written directly; other dtypes convert from float64.
  const bool f32 = dtype == tx::kFloat;
  auto values = tx::empty({m}, ei.options().dtype(f32 ? tx::kFloat : tx::kDouble));
  const int64_t* src = ptr<int64_t>(ei);
  int64_t* rp = ptr<int64_t>(rowptr);
  int64_t* cl = ptr<int64_t>(col);
  int64_t* pm = ptr<int64_t>(perm);
  const int64_t bad =
      f32 ? gcn_adjacency(src, src + e, e, num_nodes, rp, cl, pm, ptr<float>(values))
          : gcn_adjacency(src, src + e, e, num_nodes, rp, cl, pm, ptr<double>(values));
  check_edges_in_range(ei, bad, num_nodes, "gcn_adjacency");
  return {rowptr, col, perm, f32 ? values : values.to(dtype)};
}

// ---- On the device: the builders of torch_ext/composite/csr_builders.h -------------------------

std::tuple<tx::Tensor, tx::Tensor, tx::Tensor> csr_from_edge_index_aten(
    const tx::Tensor& edge_index, int64_t num_nodes) {
  const auto ei = checked_edge_index(edge_index, num_nodes, "csr_from_edge_index");
  composite::check_edges_in_range(ei, num_nodes, "csr_from_edge_index");
  return composite::csr_from_edges(ei[0], ei[1], num_nodes);
}

std::tuple<tx::Tensor, tx::Tensor, tx::Tensor, tx::Tensor> gcn_adjacency_aten(
    const tx::Tensor& edge_index, int64_t num_nodes, tx::ScalarType dtype) {
  SJ_CHECK_TYPE(tx::isFloatingType(dtype), "sparsejit.gcn_adjacency: dtype must be a "
                   "floating type; got ", dtype);
  const auto ei = checked_edge_index(edge_index, num_nodes, "gcn_adjacency");
  composite::check_edges_in_range(ei, num_nodes, "gcn_adjacency");
  return composite::gcn_adjacency(ei, num_nodes, dtype);
}

// validate_csr's invariants as device reductions; on failure, the CPU validator names it.
void validate_csr_aten(const tx::Tensor& rowptr, const tx::Tensor& col, int64_t num_cols) {
  check_index_pair(rowptr, col);
  SJ_CHECK_VALUE(num_cols >= 0, "sparsejit: num_cols must be >= 0; got ", num_cols);
  const bool ok = rowptr.numel() >= 1 && !composite::csr_invalid(rowptr, col, num_cols);
  if (!ok) validate_csr_cpu(rowptr.cpu(), col.cpu(), num_cols);  // raises, naming the problem
}

std::tuple<tx::Tensor, tx::Tensor, tx::Tensor> csr_transpose_aten(const tx::Tensor& rowptr,
                                                                  const tx::Tensor& col,
                                                                  int64_t num_cols) {
  validate_csr_aten(rowptr, col, num_cols);
  return composite::csr_transpose(rowptr, col, num_cols);
}

// The CPU ops: the counting sorts, or the ATen builders when SPARSEJIT_STRUCTURE_ATEN is set.
void validate_csr_op(const tx::Tensor& rowptr, const tx::Tensor& col, int64_t num_cols) {
  structure_aten_forced() ? validate_csr_aten(rowptr, col, num_cols)
                         : validate_csr_cpu(rowptr, col, num_cols);
}
std::tuple<tx::Tensor, tx::Tensor, tx::Tensor> csr_transpose_op(const tx::Tensor& rowptr,
                                                                const tx::Tensor& col,
                                                                int64_t num_cols) {
  return structure_aten_forced() ? csr_transpose_aten(rowptr, col, num_cols)
                                : csr_transpose_cpu(rowptr, col, num_cols);
}
std::tuple<tx::Tensor, tx::Tensor, tx::Tensor> csr_from_edge_index_op(
    const tx::Tensor& edge_index, int64_t num_nodes) {
  return structure_aten_forced() ? csr_from_edge_index_aten(edge_index, num_nodes)
                                : csr_from_edge_index_cpu(edge_index, num_nodes);
}
std::tuple<tx::Tensor, tx::Tensor, tx::Tensor, tx::Tensor> gcn_adjacency_op(
    const tx::Tensor& edge_index, int64_t num_nodes, tx::ScalarType dtype) {
  return structure_aten_forced() ? gcn_adjacency_aten(edge_index, num_nodes, dtype)
                                : gcn_adjacency_cpu(edge_index, num_nodes, dtype);
}

}  // namespace

SJ_LIBRARY_IMPL(CPU, m) {
  m.impl("gcn_adjacency", SJ_KERNEL(&gcn_adjacency_op));
  m.impl("validate_csr", SJ_KERNEL(&validate_csr_op));
  m.impl("csr_transpose", SJ_KERNEL(&csr_transpose_op));
  m.impl("csr_from_edge_index", SJ_KERNEL(&csr_from_edge_index_op));
}

#ifdef SPARSEJIT_WITH_CUDA
// Built on the device by ATen's sort / searchsorted (no copy to the host; one flag read per
// call to raise a bad input).
SJ_LIBRARY_IMPL(CUDA, m) {
  m.impl("validate_csr", SJ_KERNEL(&validate_csr_aten));
  m.impl("csr_transpose", SJ_KERNEL(&csr_transpose_aten));
  m.impl("csr_from_edge_index", SJ_KERNEL(&csr_from_edge_index_aten));
  m.impl("gcn_adjacency", SJ_KERNEL(&gcn_adjacency_aten));
}
#endif

}  // namespace sparsejit
