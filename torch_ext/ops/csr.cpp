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

std::tuple<at::Tensor, at::Tensor, at::Tensor> csr_from_edge_index_cpu(
    const at::Tensor& edge_index, int64_t num_nodes) {
  TORCH_CHECK_VALUE(edge_index.dim() == 2 && edge_index.size(0) == 2,
                    "sparsejit: edge_index must have shape [2, E]; got ", edge_index.sizes());
  const auto d = edge_index.scalar_type();
  TORCH_CHECK_TYPE(d == at::kLong || d == at::kInt || d == at::kShort,
                   "sparsejit: edge_index must hold integers (int16, int32 or int64); got ", d);
  TORCH_CHECK_VALUE(num_nodes >= 0, "sparsejit: num_nodes must be >= 0; got ", num_nodes);
  auto ei = edge_index.to(at::kLong);
  const int64_t e = ei.size(1);
  if (e > 0) {
    const auto [lo, hi] = at::aminmax(ei);
    const int64_t mn = lo.item<int64_t>(), mx = hi.item<int64_t>();
    if (mn < 0 || mx >= num_nodes) {
      const int64_t bad =
          ((ei < 0) | (ei >= num_nodes)).any(0).nonzero().select(1, 0)[0].item<int64_t>();
      TORCH_CHECK_VALUE(false, "sparsejit: edge_index[:, ", bad, "] = [",
                        ei[0][bad].item<int64_t>(), ", ", ei[1][bad].item<int64_t>(),
                        "] is out of range for num_nodes = ", num_nodes);
    }
  }
  auto src = ei[0], dst = ei[1];
  auto key = dst * std::max<int64_t>(num_nodes, 1) + src;
  auto perm = std::get<1>(key.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
  auto col = src.index_select(0, perm).contiguous();
  auto counts = at::bincount(dst, /*weights=*/{}, num_nodes);
  auto rowptr = at::zeros({num_nodes + 1}, ei.options());
  if (num_nodes > 0 && e > 0) rowptr.slice(0, 1).copy_(counts.cumsum(0));
  return {rowptr, col, perm};
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsejit, CPU, m) {
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
}
#endif

}  // namespace sparsejit
