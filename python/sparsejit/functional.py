"""The user-facing ops: spmm, sddmm, edge_softmax on SparseMatrix.

Each call checks its arguments against the matrix (shapes, dtypes, devices) and calls the
registered Torch op (``torch.ops.sparsejit.*``), passing the cached transpose when a
gradient will need it.
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional

import torch

from . import plan as _plan
from ._ops import ops
from .matrix import SparseMatrix, as_matrix

_REDUCES = ("sum", "mean", "max", "min")


def _check_dense(A: SparseMatrix, t: torch.Tensor, name: str, rows: int, side: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor; got {type(t).__name__}")
    if t.dim() not in (2, 3):
        raise ValueError(f"{name} must be [N, F] or [N, H, F]; got shape {tuple(t.shape)}")
    if t.shape[0] != rows:
        raise ValueError(
            f"{name} has {t.shape[0]} rows but the sparse matrix has {rows} {side} "
            f"(shape {A.shape})"
        )
    if t.device != A.device:
        raise ValueError(f"{name} is on {t.device} but the sparse matrix is on {A.device}")
    if t.dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        raise TypeError(f"{name} must be float32, float64 or bfloat16; got {t.dtype}")


def _row_width(X: torch.Tensor) -> int:
    return math.prod(X.shape[1:])


def _needs_transpose(*tensors: Optional[torch.Tensor]) -> bool:
    return torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in tensors
    )


def _without_autograd(*tensors: Optional[torch.Tensor]):
    """A context that calls the op below the Autograd dispatch key when no input needs a
    gradient. The ops' autograd formulas are registered from Python, so passing through the
    Autograd key costs a Python round trip (about 10 us a call) even when nothing is
    recorded; inference skips it. Under torch.compile the normal path is traced."""
    if torch.compiler.is_compiling() or _needs_transpose(*tensors):
        return contextlib.nullcontext()
    return torch._C._AutoDispatchBelowAutograd()


_ACTIVATIONS = (None, "none", "relu", "leaky_relu", "elu", "gelu")


def spmm(
    A: SparseMatrix,
    X: torch.Tensor,
    reduce: str = "sum",
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
    negative_slope: float = 0.01,
    alpha: float = 1.0,
    scale: float = 1.0,
    tune: bool = False,
) -> torch.Tensor:
    """``Y[i] = act(scale * reduce_{j in row i} (a_ij * X[j]) + bias)``.

    A is a SparseMatrix, or a raw PyG ``edge_index`` ``[2, E]`` (then the CSR structure is
    built once and reused from a cache keyed by the edge_index content).

    ``a_ij = 1`` when A has no values. X is ``[cols, F]`` or ``[cols, H, F]``; A's values
    may be ``[nnz]`` or ``[nnz, H]``. Rows with no stored entries reduce to 0 for every
    reduce (then ``act(bias)``). The epilogue (scale, bias ``[F]`` / ``[H, F]``, activation
    relu / leaky_relu (``negative_slope``) / elu (``alpha``) / gelu) is fused into the
    output write. Differentiable in X, A.values and bias; for max / min the gradient goes to
    the entry that attained the extremum (on ties, the first stored entry of the row).

    ``tune=True`` measures the candidate plans for this structure and feature shape on the
    first call (``sparsejit.tune``, with a progress bar on a terminal) and keeps the fastest
    on A and on disk; later calls and later processes reuse it. Without it the cost model
    chooses, without measuring.
    """
    A = as_matrix(A, X.shape[0] if isinstance(X, torch.Tensor) else None)
    if reduce not in _REDUCES:
        raise ValueError(f"reduce must be one of {_REDUCES}; got {reduce!r}")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {_ACTIVATIONS}; got {activation!r}")
    _check_dense(A, X, "X", A.shape[1], "columns")
    values = A.values
    if values is not None:
        if values.dtype != X.dtype:
            raise TypeError(f"A.values dtype ({values.dtype}) must match X dtype ({X.dtype})")
        if values.dim() == 2 and (X.dim() != 3 or X.shape[1] != values.shape[1]):
            raise ValueError(
                f"values of shape {tuple(values.shape)} need X of shape "
                f"[{A.shape[1]}, {values.shape[1]}, F]; got {tuple(X.shape)}"
            )
    width = _row_width(X)
    if bias is not None:
        if bias.numel() != width:
            raise ValueError(
                f"bias has {bias.numel()} elements but each output row has {width} "
                f"(shape {tuple(X.shape[1:])})"
            )
        if bias.device != X.device:
            raise ValueError(f"bias is on {bias.device} but X is on {X.device}")
    t = (None, None, None)
    needs_grad = _needs_transpose(X, values)
    if needs_grad and reduce in ("sum", "mean"):
        t = A.transpose_arrays()
    act = activation or "none"
    act_param = negative_slope if act == "leaky_relu" else alpha
    if tune and not torch.compiler.is_compiling() and not _plan._is_tuned(A, width, X.dtype):
        heads = X.shape[1] if X.dim() == 3 else 1
        _plan.tune(A, "spmm", X.shape[-1], reduce, X.dtype, heads)
    plan = _plan.spmm_plan_for(A, width, X.dtype, reduce)
    # Positional call of the overload (no keyword or overload resolution on the hot path).
    args = (A.indptr, A.indices, values, X, reduce, *t, plan, bias, act, float(act_param),
            float(scale), needs_grad)
    with _without_autograd(X, values, bias):
        out, _ = ops.spmm.default(*args)
    return out


def sddmm(A: SparseMatrix, Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """``S[p] = <Q[i], K[j]>`` for every stored entry ``p = (i, j)`` of A.

    Q is ``[rows, F]`` and K ``[cols, F]`` (or both ``[., H, F]`` for ``S`` of shape
    ``[nnz, H]``). A's values are not used. Differentiable in Q and K.
    """
    A = as_matrix(A, max(Q.shape[0], K.shape[0]) if isinstance(A, torch.Tensor) else None)
    _check_dense(A, Q, "Q", A.shape[0], "rows")
    _check_dense(A, K, "K", A.shape[1], "columns")
    if Q.shape[1:] != K.shape[1:]:
        raise ValueError(
            f"Q and K feature shapes differ: {tuple(Q.shape)} vs {tuple(K.shape)}"
        )
    if Q.dtype != K.dtype:
        raise TypeError(f"Q dtype ({Q.dtype}) must match K dtype ({K.dtype})")
    t = A.transpose_arrays() if _needs_transpose(K) else (None, None, None)
    with _without_autograd(Q, K):
        return ops.sddmm(A.indptr, A.indices, Q, K, *t)


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
    with _without_autograd(S):
        return ops.edge_softmax(A.indptr, S)
