"""Structure ops: fakes for ``validate_csr``, ``csr_transpose`` and ``csr_from_edge_index``
(torch_ext/ops/csr.cpp). They have no autograd (index arrays only)."""

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
