// The structure ops' device-generic builders (ATen ops only: what CUDA tensors run;
// torch_ext/ops/csr.cpp calls them after its checks, and on CPU tensors when
// SPARSEJIT_STRUCTURE_ATEN=1, which is how tests check them against the counting sorts of
// csrc/core/csr.h on a machine without a GPU). No copy to the host; host synchronisations:
// one read of a flag per call to raise a bad structure or edge (the error must be raised by
// the op); the offending edge is read only on failure.
#pragma once

#include "torch_ext/tensor_api.h"

#include <cstdint>
#include <tuple>

namespace sparsejit::composite {

// The CSR of the edge list (src[k] -> dst[k]) with rows = dst, in (target, source, edge)
// order, as csrc/core/csr.h's csr_from_edges: (rowptr, col, perm). src, dst: int64 [m], in
// range [0, n).
std::tuple<tx::Tensor, tx::Tensor, tx::Tensor> csr_from_edges(const tx::Tensor& src,
                                                              const tx::Tensor& dst, int64_t n);

// edge_index (int64 [2, E]) within [0, num_nodes): raises naming the first bad edge.
void check_edges_in_range(const tx::Tensor& ei, int64_t num_nodes, const char* op);

// GCN's D^-1/2 (A + I) D^-1/2 of a checked, in-range edge_index (int64 [2, E]), as the
// gcn_adjacency op returns it: (rowptr, col, perm, values in `dtype`).
std::tuple<tx::Tensor, tx::Tensor, tx::Tensor, tx::Tensor> gcn_adjacency(const tx::Tensor& ei,
                                                                         int64_t num_nodes,
                                                                         tx::ScalarType dtype);

// Whether (rowptr, col) breaks a CSR invariant (indptr from 0 to nnz, never decreasing; columns
// in [0, num_cols)): device reductions, one flag read. rowptr has at least one entry.
bool csr_invalid(const tx::Tensor& rowptr, const tx::Tensor& col, int64_t num_cols);

// The transpose of a valid CSR structure: (t_rowptr, t_col, t_perm), t_perm mapping each
// entry of the transpose to its position in the input.
std::tuple<tx::Tensor, tx::Tensor, tx::Tensor> csr_transpose(const tx::Tensor& rowptr,
                                                             const tx::Tensor& col,
                                                             int64_t num_cols);

}  // namespace sparsejit::composite
