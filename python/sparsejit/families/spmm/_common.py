"""Argument checks shared by the op wrappers of the spmm and attention families (their eager
autograd path is sparsejit.runtime.autograd.call_op)."""

from __future__ import annotations

import math
from typing import Optional

import torch

from sparsejit.families.spmm.matrix import SparseMatrix

FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def check_dense(A: SparseMatrix, t: torch.Tensor, name: str, rows: int, side: str) -> None:
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
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be float32, float64, bfloat16 or float16; got {t.dtype}"
        )


def row_width(X: torch.Tensor) -> int:
    return math.prod(X.shape[1:])


def transpose(rowptr, col, num_cols, t_rowptr, t_col, t_perm):
    """The cached transpose when the caller passed one, else computed now."""
    if t_rowptr is not None and t_col is not None and t_perm is not None:
        return t_rowptr, t_col, t_perm
    return torch.ops.sparsejit.csr_transpose(rowptr, col, num_cols)


def check_same_device(op: str, **tensors) -> None:
    """Fakes run when any input is a meta tensor; a real kernel would reject inputs on
    different devices, so the fake must too (instead of returning uninitialized memory)."""
    devices = {name: t.device for name, t in tensors.items() if isinstance(t, torch.Tensor)}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"sparsejit.{op}: all tensor arguments must be on one device; got "
                         f"{listing}")
