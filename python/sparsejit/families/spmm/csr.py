"""Structure ops: fakes for ``validate_csr``, ``csr_transpose``, ``csr_from_edge_index`` and
``gcn_adjacency`` (torch_ext/ops/csr.cpp). They have no autograd (index arrays, and GCN's
values, which depend on the structure only)."""

from __future__ import annotations

import torch


@torch.library.register_fake("sparsejit::validate_csr")
def _validate_csr_fake(rowptr, col, num_cols):
    return None


@torch.library.register_fake("sparsejit::csr_transpose")
def _csr_transpose_fake(rowptr, col, num_cols):
    return (
        rowptr.new_empty(num_cols + 1),
        col.new_empty(col.shape[0]),
        col.new_empty(col.shape[0]),
    )


@torch.library.register_fake("sparsejit::csr_from_edge_index")
def _csr_from_edge_index_fake(edge_index, num_nodes):
    e = edge_index.shape[1]
    return (
        edge_index.new_empty(num_nodes + 1, dtype=torch.long),
        edge_index.new_empty(e, dtype=torch.long),
        edge_index.new_empty(e, dtype=torch.long),
    )


@torch.library.register_fake("sparsejit::gcn_adjacency")
def _gcn_adjacency_fake(edge_index, num_nodes, dtype):
    m = edge_index.shape[1] + num_nodes
    return (
        edge_index.new_empty(num_nodes + 1, dtype=torch.long),
        edge_index.new_empty(m, dtype=torch.long),
        edge_index.new_empty(m, dtype=torch.long),
        edge_index.new_empty(m, dtype=dtype),
    )
