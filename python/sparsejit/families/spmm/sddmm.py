"""SDDMM: ``S[p] = <Q[i], K[j]>`` for every stored entry ``p = (i, j)``.

The wrapper (``sparsejit.sddmm``), the fake of the ``sddmm`` op (torch_ext/ops/sddmm.cpp)
and its autograd: ``dQ = spmm(A with dS, K)``, ``dK = spmm(A^T with dS, Q)``.
"""

from __future__ import annotations

import torch

from sparsejit._library import ops, restores_type_errors
from sparsejit.families.spmm.matrix import SparseMatrix, as_matrix
from sparsejit.families.spmm._common import check_dense, check_same_device, transpose
from sparsejit.runtime.autograd import call_op, needs_grad


@restores_type_errors
def sddmm(A: SparseMatrix, Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """``S[p] = <Q[i], K[j]>`` for every stored entry ``p = (i, j)`` of A.

    Q is ``[rows, F]`` and K ``[cols, F]`` (or both ``[., H, F]`` for ``S`` of shape
    ``[nnz, H]``). A's values are not used. Differentiable in Q and K.
    """
    A = as_matrix(A, max(Q.shape[0], K.shape[0]) if isinstance(A, torch.Tensor) else None)
    check_dense(A, Q, "Q", A.shape[0], "rows")
    check_dense(A, K, "K", A.shape[1], "columns")
    if Q.shape[1:] != K.shape[1:]:
        raise ValueError(
            f"Q and K feature shapes differ: {tuple(Q.shape)} vs {tuple(K.shape)}"
        )
    if Q.dtype != K.dtype:
        raise TypeError(f"Q dtype ({Q.dtype}) must match K dtype ({K.dtype})")
    t = A.transpose_arrays() if needs_grad(K) else (None, None, None)
    return call_op(ops.sddmm.default, _sddmm_setup, _sddmm_backward,
                   (A.indptr, A.indices, Q, K, A.shape[1], *t), (Q, K))


@torch.library.register_fake("sparsejit::sddmm")
def _sddmm_fake(rowptr, col, q, k, num_cols=-1, t_rowptr=None, t_col=None, t_perm=None):
    check_same_device("sddmm", rowptr=rowptr, col=col, q=q, k=k, t_rowptr=t_rowptr,
                      t_col=t_col, t_perm=t_perm)
    if q.dim() == 3:
        return q.new_empty((col.shape[0], q.shape[1]))
    return q.new_empty((col.shape[0],))


def _sddmm_setup(ctx, inputs, output):
    rowptr, col, q, k, _num_cols, t_rowptr, t_col, t_perm = inputs
    ctx.save_for_backward(rowptr, col, q, k, t_rowptr, t_col, t_perm)


def _sddmm_backward(ctx, grad_s):
    rowptr, col, q, k, t_rowptr, t_col, t_perm = ctx.saved_tensors
    grad_q = grad_k = None
    g = grad_s.contiguous()
    if ctx.needs_input_grad[2]:
        grad_q, _ = ops.spmm(rowptr, col, g, k, "sum", k.shape[0])
    if ctx.needs_input_grad[3]:
        trp, tcol, tperm = transpose(rowptr, col, k.shape[0], t_rowptr, t_col, t_perm)
        grad_k, _ = ops.spmm(trp, tcol, g.index_select(0, tperm.to(torch.long)), q, "sum",
                             q.shape[0])
    return None, None, grad_q, grad_k, None, None, None, None


torch.library.register_autograd(
    "sparsejit::sddmm", _sddmm_backward, setup_context=_sddmm_setup
)
