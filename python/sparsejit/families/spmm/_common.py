"""Argument checks and dispatch helpers shared by the op wrappers in this package."""

from __future__ import annotations

import contextlib
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


def needs_grad(*tensors: Optional[torch.Tensor]) -> bool:
    return torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in tensors
    )


def without_autograd(*tensors: Optional[torch.Tensor]):
    """A context that calls the op below the Autograd dispatch key when no input needs a
    gradient. The ops' autograd formulas are registered from Python, so passing through the
    Autograd key costs a Python round trip (about 10 us a call) even when nothing is
    recorded; inference skips it. Under torch.compile the normal path is traced."""
    if torch.compiler.is_compiling() or needs_grad(*tensors):
        return contextlib.nullcontext()
    return torch._C._AutoDispatchBelowAutograd()


_EAGER_FUNCTIONS: dict = {}


def call_op(op, setup, backward, args, grad_inputs):
    """Calls `op(*args)` (every schema argument, positionally) with the autograd formula that
    is registered for it (`setup`, `backward`, as given to torch.library.register_autograd).

    Eager calls that need a gradient go through a plain torch.autograd.Function built once
    per op around the same two functions: torch.library's registered-autograd wrapper costs
    about 0.2 ms a call in Python (filling schema defaults), more than the op itself on small
    graphs. Calls with nothing to differentiate run below the Autograd key; under
    torch.compile the op is called normally, so the registered formula is what is traced."""
    if torch.compiler.is_compiling():
        return op(*args)
    if not needs_grad(*grad_inputs):
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args)
    fn = _EAGER_FUNCTIONS.get(op)
    if fn is None:
        fn = _EAGER_FUNCTIONS[op] = _eager_function(op, setup, backward)
    return fn.apply(*args)


def _eager_function(op, setup, backward):
    class EagerOp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            with torch._C._AutoDispatchBelowAutograd():
                out = op(*args)
            setup(ctx, args, out)
            outs = out if isinstance(out, tuple) else (out,)
            integer = [o for o in outs if isinstance(o, torch.Tensor) and
                       not (o.is_floating_point() or o.is_complex())]
            if integer:
                ctx.mark_non_differentiable(*integer)
            return out

        @staticmethod
        def backward(ctx, *grads):
            return backward(ctx, *grads)

    EagerOp.__name__ = EagerOp.__qualname__ = f"Eager_{op}".replace(".", "_").replace(":", "_")
    return EagerOp


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
