"""Fused sparse attention: ``out[i] = sum_{j in row i} softmax_j(s_ij) V[j]`` in one fused op.

Three score forms share one kernel (torch_ext/ops/attention.cpp,
kernels/cpu/attention_kernel.h): ``sparse_attention`` (dot product, ``s = scale <Q[i], K[j]> +
values``, TransformerConv), ``gat_attention`` (additive, ``s = LeakyReLU(a_dst[i] + a_src[j] +
edge_logits)``, GATConv) and ``gatv2_attention`` (``s = att . LeakyReLU(x_i + x_j)``,
GATv2Conv).
The forward takes each target row in three passes on the CPU (scores and their max, the
weights, the weighted sum; an online softmax per row on CUDA) and saves only the row
log-sum-exp; no ``[nnz, H]`` logits or probabilities are written. The backward recomputes them (the
FlashAttention recipe), in two passes: over targets (dQ, bias) and over sources through the
cached transpose (dK, dV).

This module holds the wrappers, the fakes of ``sparse_attention`` and
``sparse_attention_backward`` and the autograd formula.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from sparsejit._library import ops, restores_type_errors
from sparsejit.families.spmm.matrix import SparseMatrix, as_matrix
from sparsejit.families.spmm._common import check_same_device, transpose
from sparsejit.runtime.autograd import call_op, needs_grad

_DOT, _ADDITIVE, _GATV2 = 0, 1, 2


def _heads3(t: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor; got {type(t).__name__}")
    if t.dim() == 2:
        return t.unsqueeze(1)
    if t.dim() != 3:
        raise ValueError(f"{name} must be [N, D] or [N, H, D]; got shape {tuple(t.shape)}")
    return t


def _edge_term(values: Optional[torch.Tensor], A: SparseMatrix, heads: int, name: str):
    """Per-entry additive score term as ``[nnz, H]`` (a ``[nnz]`` term is shared by heads)."""
    if values is None:
        return None
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"{name} must be a tensor; got {type(values).__name__}")
    if values.shape[0] != A.nnz or values.dim() not in (1, 2) or (
            values.dim() == 2 and values.shape[1] != heads):
        raise ValueError(f"{name} must be [nnz] or [nnz, H] = [{A.nnz}, {heads}]; got shape "
                         f"{tuple(values.shape)}")
    if values.dim() == 1:
        values = values.unsqueeze(1).expand(A.nnz, heads)
    return values.contiguous()


def _seed(dropout: float) -> int:
    # Drawn from torch's generator, so torch.manual_seed makes the dropout mask reproducible.
    return int(torch.randint(0, 2**62, (1,)).item()) if dropout > 0 else 0


def _run(A, q, k, v, bias, mode, scale, slope, dropout, return_attention_weights, att=None):
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1); got {dropout}")
    seed = _seed(dropout)
    t = A.transpose_arrays() if needs_grad(q, k, v, bias, att) else (None, None, None)
    out, lse = call_op(ops.sparse_attention.default, _setup, _backward,
                       (A.indptr, A.indices, q, k, v, bias, mode, float(scale), float(slope),
                        float(dropout), seed, *t, att), (q, k, v, bias, att))
    if not return_attention_weights:
        return out
    return out, _weights(A, q, k, bias, lse, mode, scale, slope, att)


@torch.no_grad()
def _weights(A, q, k, bias, lse, mode, scale, slope, att=None):
    """The softmax weights ``[nnz, H]`` (CSR order), materialized only on request, from the
    saved row log-sum-exp (before dropout; no gradient flows through them)."""
    row, col = A.row_indices(), A.indices.to(torch.long)
    if mode == _DOT:
        s = (q[row].float() * k[col].float()).sum(-1) * scale
    elif mode == _GATV2:
        u = torch.nn.functional.leaky_relu(q[row].float() + k[col].float(), slope)
        s = (u * att.float()).sum(-1)
    else:
        s = q[row, :, 0].float() + k[col, :, 0].float()
    if bias is not None:
        s = s + bias.float()
    if mode == _ADDITIVE:
        s = torch.nn.functional.leaky_relu(s, slope)
    w = torch.exp(s - lse.float()[row])
    return torch.where(s == float("-inf"), torch.zeros_like(w), w).to(q.dtype)  # masked


@restores_type_errors
def sparse_attention(A, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                     scale: Optional[float] = None, values: Optional[torch.Tensor] = None,
                     dropout: float = 0.0, return_attention_weights: bool = False):
    """Dot-product attention on the pattern of A (rows = targets i, columns = sources j):
    ``out[i, h] = sum_j P[ij, h] V[j, h]`` with ``P = softmax_j(scale <Q[i, h], K[j, h]> +
    values[ij, h])`` over row i's stored entries.

    Q ``[rows, H, D]``, K ``[cols, H, D]``, V ``[cols, H, Dv]`` (``[N, D]`` means one head);
    `scale` defaults to ``1 / sqrt(D)``; `values` (``[nnz]`` or ``[nnz, H]``, CSR order) is an
    additive score term, e.g. A's own values or an edge-feature score. `dropout` drops
    attention weights (mask from torch's generator, regenerated in the backward). Rows with no
    entries give 0. Returns ``[rows, H, Dv]`` (and the ``[nnz, H]`` weights, before dropout and
    detached, with ``return_attention_weights=True``). Differentiable in Q, K, V and values.
    """
    A = as_matrix(A, max(Q.shape[0], K.shape[0]) if isinstance(A, torch.Tensor) else None)
    q, k, v = _heads3(Q, "Q"), _heads3(K, "K"), _heads3(V, "V")
    if scale is None:
        scale = 1.0 / math.sqrt(max(q.shape[-1], 1))
    bias = _edge_term(values, A, q.shape[1], "values")
    return _run(A, q, k, v, bias, _DOT, scale, 0.0, dropout, return_attention_weights)


@restores_type_errors
def gat_attention(A, a_dst: torch.Tensor, a_src: torch.Tensor, V: torch.Tensor,
                  negative_slope: float = 0.2, edge_logits: Optional[torch.Tensor] = None,
                  dropout: float = 0.0, return_attention_weights: bool = False):
    """GAT's additive attention, fused: ``P = softmax_j(LeakyReLU(a_dst[i, h] + a_src[j, h] +
    edge_logits[ij, h]))`` over row i's entries, ``out[i, h] = sum_j P[ij, h] V[j, h]``.

    a_dst ``[rows, H]``, a_src ``[cols, H]``, V ``[cols, H, C]``, edge_logits ``[nnz, H]`` or
    ``[nnz]`` in CSR order (optional: GAT's edge-feature term). Otherwise as
    :func:`sparse_attention`."""
    A = as_matrix(A, max(a_dst.shape[0], a_src.shape[0]) if isinstance(A, torch.Tensor)
                  else None)
    for t, name in ((a_dst, "a_dst"), (a_src, "a_src")):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a [N, H] tensor; got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t)}")
    v = _heads3(V, "V")
    bias = _edge_term(edge_logits, A, a_dst.shape[1], "edge_logits")
    return _run(A, a_dst.unsqueeze(-1), a_src.unsqueeze(-1), v, bias, _ADDITIVE, 1.0,
                negative_slope, dropout, return_attention_weights)


@restores_type_errors
def gatv2_attention(A, x_dst: torch.Tensor, x_src: torch.Tensor, att: torch.Tensor,
                    V: Optional[torch.Tensor] = None, negative_slope: float = 0.2,
                    edge_logits: Optional[torch.Tensor] = None, dropout: float = 0.0,
                    return_attention_weights: bool = False):
    """GATv2's attention, fused: ``P = softmax_j(att[h] . LeakyReLU(x_dst[i, h] + x_src[j, h])
    + edge_logits[ij, h])`` over row i's entries, ``out[i, h] = sum_j P[ij, h] V[j, h]`` (V
    defaults to x_src). x_dst ``[rows, H, C]``, x_src ``[cols, H, C]``, att ``[H, C]`` (or
    PyG's ``[1, H, C]``). The score costs O(C) per entry, recomputed in the backward, so no
    ``[nnz, H, C]`` tensor is formed. Otherwise as :func:`sparse_attention`."""
    A = as_matrix(A, max(x_dst.shape[0], x_src.shape[0]) if isinstance(A, torch.Tensor)
                  else None)
    q, k = _heads3(x_dst, "x_dst"), _heads3(x_src, "x_src")
    v = k if V is None else _heads3(V, "V")
    if not isinstance(att, torch.Tensor):
        raise TypeError(f"att must be a tensor; got {type(att).__name__}")
    att = att.reshape(att.shape[-2], att.shape[-1]) if att.dim() == 3 else att
    bias = _edge_term(edge_logits, A, q.shape[1], "edge_logits")
    return _run(A, q, k, v, bias, _GATV2, 1.0, negative_slope, dropout,
                return_attention_weights, att)


# ---- fakes ---------------------------------------------------------------------------------


def _compute_dtype(dtype):
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


@torch.library.register_fake("sparsejit::sparse_attention")
def _sparse_attention_fake(rowptr, col, q, k, v, bias, mode, scale, negative_slope, dropout,
                           seed, t_rowptr=None, t_col=None, t_perm=None, att=None):
    check_same_device("sparse_attention", rowptr=rowptr, col=col, q=q, k=k, v=v, bias=bias,
                      t_rowptr=t_rowptr, t_col=t_col, t_perm=t_perm, att=att)
    rows, heads = rowptr.shape[0] - 1, q.shape[1]
    out = q.new_empty((rows, heads, v.shape[2]))
    lse = q.new_empty((rows, heads), dtype=_compute_dtype(q.dtype))
    return out, lse


@torch.library.register_fake("sparsejit::sparse_attention_backward")
def _sparse_attention_backward_fake(rowptr, col, t_rowptr, t_col, t_perm, q, k, v, bias, out,
                                    lse, grad_out, mode, scale, negative_slope, dropout, seed,
                                    need_q, need_k, need_v, need_bias, att=None,
                                    need_att=False):
    check_same_device("sparse_attention_backward", rowptr=rowptr, col=col, t_rowptr=t_rowptr,
                      t_col=t_col, t_perm=t_perm, q=q, k=k, v=v, bias=bias, out=out, lse=lse,
                      grad_out=grad_out, att=att)
    pick = lambda need, t: t.new_empty(t.shape) if need else t.new_empty((0,))  # noqa: E731
    db = (bias.new_empty(bias.shape) if need_bias and bias is not None
          else q.new_empty((0,)))
    da = att.new_empty(att.shape) if need_att and att is not None else q.new_empty((0,))
    return pick(need_q, q), pick(need_k, k), pick(need_v, v), db, da


# ---- autograd ------------------------------------------------------------------------------


def _setup(ctx, inputs, output):
    (rowptr, col, q, k, v, bias, mode, scale, slope, dropout, seed, t_rowptr, t_col,
     t_perm, att) = inputs
    out, lse = output
    ctx.args = (mode, scale, slope, dropout, seed)
    ctx.save_for_backward(rowptr, col, q, k, v, bias, out, lse, t_rowptr, t_col, t_perm, att)


def _backward(ctx, grad_out, _grad_lse):
    rowptr, col, q, k, v, bias, out, lse, t_rowptr, t_col, t_perm, att = ctx.saved_tensors
    need = ctx.needs_input_grad
    need_bias = bias is not None and need[5]
    need_att = att is not None and need[14]
    trp, tcol, tperm = transpose(rowptr, col, k.shape[0], t_rowptr, t_col, t_perm)
    dq, dk, dv, db, da = ops.sparse_attention_backward(
        rowptr, col, trp, tcol, tperm, q, k, v, bias, out, lse, grad_out.contiguous(),
        *ctx.args, need[2], need[3], need[4], need_bias, att, need_att)
    return (None, None, dq if need[2] else None, dk if need[3] else None,
            dv if need[4] else None, db if need_bias else None,
            None, None, None, None, None, None, None, None, da if need_att else None)


torch.library.register_autograd("sparsejit::sparse_attention", _backward, setup_context=_setup)
