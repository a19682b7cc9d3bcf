"""Edge softmax: softmax of per-entry scores over each row's stored entries.

The wrapper (``sparsejit.edge_softmax``), fakes of ``edge_softmax`` and
``edge_softmax_backward`` (torch_ext/ops/edge_softmax.cpp), and the autograd formula.
"""

from __future__ import annotations

import torch

from sparsejit._library import ops, restores_type_errors
from sparsejit.families.spmm.matrix import SparseMatrix, as_matrix
from sparsejit.families.spmm._common import check_same_device
from sparsejit.runtime.autograd import call_op


@restores_type_errors
def edge_softmax(A: SparseMatrix, S: torch.Tensor) -> torch.Tensor:
    """Softmax of the scores ``S`` (``[nnz]`` or ``[nnz, H]``) over each row's entries.

    With a raw ``edge_index``, S is in the order of A's CSR entries (sorted by target)."""
    A = as_matrix(A)
    if not isinstance(S, torch.Tensor):
        raise TypeError(f"S must be a tensor; got {type(S).__name__}")
    if S.dim() not in (1, 2) or S.shape[0] != A.nnz:
        raise ValueError(
            f"S must be [nnz] or [nnz, H] with nnz = {A.nnz}; got shape {tuple(S.shape)}"
        )
    if S.device != A.device:
        raise ValueError(f"S is on {S.device} but the sparse matrix is on {A.device}")
    return call_op(ops.edge_softmax.default, _edge_softmax_setup, _edge_softmax_backward,
                   (A.indptr, S), (S,))


@torch.library.register_fake("sparsejit::edge_softmax")
def _edge_softmax_fake(rowptr, s):
    check_same_device("edge_softmax", rowptr=rowptr, s=s)
    return torch.empty_like(s)


@torch.library.register_fake("sparsejit::edge_softmax_backward")
def _edge_softmax_backward_fake(rowptr, y, grad):
    check_same_device("edge_softmax_backward", rowptr=rowptr, y=y, grad=grad)
    return torch.empty_like(y)


def _edge_softmax_setup(ctx, inputs, output):
    rowptr, _ = inputs
    ctx.save_for_backward(rowptr, output)


def _edge_softmax_backward(ctx, grad):
    rowptr, y = ctx.saved_tensors
    return None, ops.edge_softmax_backward(rowptr, y, grad.contiguous())


torch.library.register_autograd(
    "sparsejit::edge_softmax", _edge_softmax_backward, setup_context=_edge_softmax_setup
)
