// The structure ops' device-generic builders (csr_builders.h).
#include "torch_ext/composite/csr_builders.h"

#include "torch_ext/common.h"

namespace sparsejit::composite {

// The CSR of the edge list (src[k] -> dst[k]) with rows = dst, in (target, source, edge) order,
// as csr_from_edges: one stable sort of the key dst * n + src (two stable sorts when n * n
// does not fit), rowptr by searching the sorted targets. src, dst: int64 [m], in range.
std::tuple<tx::Tensor, tx::Tensor, tx::Tensor> csr_from_edges(const tx::Tensor& src,
                                                              const tx::Tensor& dst, int64_t n) {
  tx::Tensor perm;
  if (n <= 3037000499LL) {  // n * n + n < 2^63
    perm = std::get<1>(tx::sort(dst * n + src, /*stable=*/true, 0, false));
  } else {
    const auto by_src = std::get<1>(tx::sort(src, /*stable=*/true, 0, false));
    perm = by_src.index_select(
        0, std::get<1>(tx::sort(dst.index_select(0, by_src), /*stable=*/true, 0, false)));
  }
  const auto rows_sorted = dst.index_select(0, perm);
  const auto rowptr = tx::searchsorted(rows_sorted, tx::arange(n + 1, dst.options()));
  return {rowptr, src.index_select(0, perm), perm};
}

// Raises naming the first bad edge; the edge is read only on failure.
void check_edges_in_range(const tx::Tensor& ei, int64_t num_nodes, const char* op) {
  if (ei.size(1) == 0) return;
  const auto bad = tx::logical_or(ei < 0, ei >= num_nodes).any(0);
  if (!bad.any().item<bool>()) return;  // the sync
  const int64_t k = bad.nonzero().select(1, 0)[0].item<int64_t>();
  const auto e = ei.select(1, k).cpu();
  SJ_CHECK_VALUE(false, "sparsejit.", op, ": edge_index[:, ", k, "] = [",
                    e[0].item<int64_t>(), ", ", e[1].item<int64_t>(),
                    "] is out of range for num_nodes = ", num_nodes);
}

std::tuple<tx::Tensor, tx::Tensor, tx::Tensor, tx::Tensor> gcn_adjacency(const tx::Tensor& ei,
                                                                         int64_t num_nodes,
                                                                         tx::ScalarType dtype) {
  const int64_t e = ei.size(1);
  const auto loops = tx::arange(num_nodes, ei.options());
  const auto src = tx::cat({ei[0], loops}), dst = tx::cat({ei[1], loops});
  auto [rowptr, col, perm] = csr_from_edges(src, dst, num_nodes);
  // d_v = 1 + incoming edges that are not self-loops: sums of 0s and 1s, exact in any order.
  const auto deg = tx::ones({num_nodes}, ei.options().dtype(tx::kDouble))
                       .index_add_(0, ei[1], ei[0].ne(ei[1]).to(tx::kDouble));
  const auto dinv = deg.sqrt().reciprocal();  // 1 / sqrt(d), rounded as the CPU's
  const auto row = dst.index_select(0, perm);
  auto values = dinv.index_select(0, row) * dinv.index_select(0, col);
  values.masked_fill_(tx::logical_and(perm < e, col == row), 0.0);  // an old self-loop
  return {rowptr, col, perm, values.to(dtype)};
}

bool csr_invalid(const tx::Tensor& rowptr, const tx::Tensor& col, int64_t num_cols) {
  const int64_t rows = rowptr.numel() - 1;
  auto bad = rowptr[0].ne(0).logical_or(rowptr[rows].ne(col.numel()));
  if (rows > 0)
    bad = bad.logical_or((rowptr.narrow(0, 1, rows) < rowptr.narrow(0, 0, rows)).any());
  if (col.numel() > 0) bad = bad.logical_or(tx::logical_or(col < 0, col >= num_cols).any());
  return bad.item<bool>();  // the sync
}

std::tuple<tx::Tensor, tx::Tensor, tx::Tensor> csr_transpose(const tx::Tensor& rowptr,
                                                             const tx::Tensor& col,
                                                             int64_t num_cols) {
  const int64_t rows = rowptr.numel() - 1, nnz = col.numel();
  const auto counts = (rowptr.narrow(0, 1, rows) - rowptr.narrow(0, 0, rows)).to(tx::kLong);
  const auto row = tx::repeat_interleave(tx::arange(rows, rowptr.options()), counts, 0, nnz);
  // Entries are in row order, so a stable sort by column leaves each column's rows ascending.
  auto [col_sorted, t_perm] = tx::sort(col, /*stable=*/true, 0, false);
  const auto t_rowptr = tx::searchsorted(col_sorted, tx::arange(num_cols + 1, col.options()));
  return {t_rowptr.to(rowptr.scalar_type()), row.index_select(0, t_perm),
          t_perm.to(rowptr.scalar_type())};
}

}  // namespace sparsejit::composite
