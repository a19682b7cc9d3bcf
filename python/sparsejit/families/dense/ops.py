"""The dense family: pyg-lib's segment_matmul, gather_matmul (PyG's HeteroLinear) and the
Linear on sparsejit's dense GEMM layer, which every family's layers share: wrappers, fakes and
autograd of the ops in torch_ext/ops/dense.cpp.

    Y = sj.segment_matmul(X, ptr, W)         # rows ptr[k]:ptr[k+1] of X times W[k]
    Y = sj.gather_matmul(X, index, W)        # Y[i] = X[i] @ W[index[i]]
    Y = sj.linear(X, weight, bias)           # the faster of this GEMM layer and torch's
"""

from __future__ import annotations

import os
from typing import Dict, Optional

import torch

from sparsejit import _core
from sparsejit._library import ops, restores_type_errors
from sparsejit.runtime.autograd import call_op, composite
from sparsejit.runtime.timing import paired_median_ms


@restores_type_errors
def segment_matmul(x: torch.Tensor, ptr: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """pyg-lib's segment_matmul: rows ``ptr[k]:ptr[k+1]`` of `x` times ``w[k]``
    (``x [N, F_in]``, ``ptr [K + 1]`` from 0 to N, ``w [K, F_in, F_out]``)."""
    return call_op(ops.segment_matmul.default, _segment_matmul_setup, _segment_matmul_backward,
                   (x, ptr, w), (x, w))


@restores_type_errors
def gather_matmul(x: torch.Tensor, index: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``out[i] = x[i] @ w[index[i]]`` (PyG's HeteroLinear): rows grouped by type (a stable
    sort), one segment_matmul, rows put back. Differentiable in x and w through
    segment_matmul's autograd. `index` must hold integers in ``[0, w.shape[0])``."""
    if not isinstance(index, torch.Tensor) or index.dtype.is_floating_point or \
            index.dtype == torch.bool or index.dtype.is_complex:
        raise TypeError("sparsejit.gather_matmul: index must be an integer tensor")
    if x.dim() != 2 or w.dim() != 3:
        raise ValueError(f"sparsejit.gather_matmul: x must be [N, F_in] and w [K, F_in, F_out]; "
                         f"got {tuple(x.shape)} and {tuple(w.shape)}")
    if index.dim() != 1 or index.shape[0] != x.shape[0]:
        raise ValueError(f"sparsejit.gather_matmul: index must have shape [N] = "
                         f"[{x.shape[0]}]; got {tuple(index.shape)}")
    k = w.shape[0]
    index = index.long()
    if not torch.compiler.is_compiling() and index.numel():
        lo, hi = int(index.min()), int(index.max())
        if lo < 0 or hi >= k:
            bad = int(((index < 0) | (index >= k)).nonzero()[0])
            raise ValueError(f"sparsejit.gather_matmul: index[{bad}] = {int(index[bad])} is out "
                             f"of range for w.shape[0] = {k}")
    perm = torch.argsort(index, stable=True)
    counts = torch.zeros(k, dtype=torch.long, device=index.device).index_add_(
        0, index, torch.ones_like(index))
    ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    y = segment_matmul(x[perm], ptr, w)
    return torch.empty_like(y).index_copy_(0, perm, y)


# ---- fakes --------------------------------------------------------------------------------

@torch.library.register_fake("sparsejit::segment_matmul")
def _segment_matmul_fake(x, ptr, w):
    if x.dim() != 2 or w.dim() != 3 or w.shape[1] != x.shape[1]:
        raise ValueError("sparsejit.segment_matmul: x must be [N, F_in] and w [K, F_in, F_out]")
    return x.new_empty(x.shape[0], w.shape[2])


@torch.library.register_fake("sparsejit::segment_matmul_backward_w")
def _segment_matmul_backward_w_fake(x, ptr, grad_y):
    return x.new_empty(ptr.shape[0] - 1, x.shape[1], grad_y.shape[1])


@torch.library.register_fake("sparsejit::linear")
def _linear_fake(x, weight, bias=None):
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError("sparsejit.linear: x must be [N, F_in] and weight [F_out, F_in]")
    return x.new_empty(x.shape[0], weight.shape[0])


@torch.library.register_fake("sparsejit::linear_add_")
def _linear_add_fake(out, x, weight):
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1] or \
            tuple(out.shape) != (x.shape[0], weight.shape[0]):
        raise ValueError("sparsejit.linear_add_: out must be [N, F_out], x [N, F_in] and "
                         "weight [F_out, F_in]")


# ---- autograd -----------------------------------------------------------------------------

def _segment_matmul_setup(ctx, inputs, output):
    x, ptr, w = inputs
    ctx.save_for_backward(x, ptr, w)


def _segment_matmul_backward(ctx, grad):
    x, ptr, w = ctx.saved_tensors
    need = ctx.needs_input_grad
    grad = grad.contiguous()
    dx = torch.ops.sparsejit.segment_matmul(grad, ptr, w.transpose(1, 2)) if need[0] else None
    dw = torch.ops.sparsejit.segment_matmul_backward_w(x, ptr, grad) if need[2] else None
    return dx, None, dw


torch.library.register_autograd("sparsejit::segment_matmul", _segment_matmul_backward,
                                setup_context=_segment_matmul_setup)


def _linear_setup(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _product_grads(grad, x, weight, need_x: bool, need_w: bool):
    """The gradients of x @ weight^T: dx = grad @ weight and dw = grad^T @ x as one-segment
    segment_matmul calls (the same GEMM layer as the forward); None where not needed."""
    if not (need_x or need_w):
        return None, None
    grad = grad.contiguous()
    ptr = torch.arange(2, dtype=torch.long) * x.shape[0]  # [0, N] (symbolic N under compile)
    dx = torch.ops.sparsejit.segment_matmul(grad, ptr, weight.unsqueeze(0)) if need_x else None
    dw = torch.ops.sparsejit.segment_matmul_backward_w(grad, ptr, x)[0] if need_w else None
    return dx, dw


def _linear_backward(ctx, grad):
    """dx and dw from :func:`_product_grads`, db = grad summed over the rows."""
    x, weight = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, dw = _product_grads(grad, x, weight, need[0], need[1])
    db = grad.sum(0) if ctx.has_bias and need[2] else None
    return dx, dw, db


torch.library.register_autograd("sparsejit::linear", _linear_backward,
                                setup_context=_linear_setup)

# ---- linear: the dense GEMM layer or torch's, whichever this CPU runs faster ---------------

# Rows below which the dense layer is never taken: a call's fixed cost decides there (AMD EPYC
# with AVX-512: [2708, 128] x [128, 128] 1.58 vs 1.60 ms forward + backward). Above it the
# crossover is measured (:func:`_linear_min_rows`): on the Xeon with AMX torch's GEMM took
# 0.80-0.89x the dense layer's time forward + backward up to 4096 rows (F = 64).
_LINEAR_MIN_ROWS = 1024
_LADDER = (2048, 4096, 8192, 16384)  # the rows at which the crossover is measured
_LADDER_TOP = 32768  # the first probe's rows: from here on no crossover is measured
_linear_choice: Dict[str, object] = {}


def _linear_faster() -> bool:
    """Whether sparsejit's GEMM layer (oneDNN in blocks of rows over every thread) ran a
    Linear faster than torch's (MKL, OpenBLAS, ...) on this machine: measured once per process
    (~0.2 s) on a [32768, 128] x [128, 128] forward, 7 calls of each interleaved, medians
    compared; SPARSEJIT_LINEAR=0 / 1 decides instead. (The backward's products run on the
    same two GEMMs. A smaller probe, [8192, 128] forward + backward, measured 0.75-0.93 of
    torch's time on the AMD EPYC and flipped between processes; this one measured 0.55-0.83
    in ten.)
    On that CPU torch's MKL took 1.2-1.9x longer on tall [N, 64-128] products
    (`benchmarks/history/`, "PyG layers' Linears on the dense GEMM layer")."""
    env = os.environ.get("SPARSEJIT_LINEAR", "")
    if env in ("0", "1"):
        return env == "1"
    if "probe" in _linear_choice:
        return _linear_choice["probe"]
    if not _core.gemm_backend().startswith("onednn"):
        _linear_choice["probe"] = False
        return False
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32768, 128, generator=gen)
    w = torch.randn(128, 128, generator=gen)
    b = torch.randn(128, generator=gen)
    with torch.no_grad():
        ours, theirs = paired_median_ms(
            [lambda: torch.ops.sparsejit.linear(x, w, b),
             lambda: torch.nn.functional.linear(x, w, b)], 7)
    _linear_choice["probe"] = ours < 0.95 * theirs
    return _linear_choice["probe"]


def _min_rows_from(ratios: Dict[int, float]) -> int:
    """The least rows from which the dense layer is taken, given its time over torch's at each
    rung of the ladder: the smallest rung from which it was no slower at every larger rung
    (32768, the first probe's size, when even the largest rung was slower; _LINEAR_MIN_ROWS
    when every rung was faster)."""
    rows = _LADDER_TOP
    for rung in sorted(ratios, reverse=True):
        if ratios[rung] > 1.0:
            break
        rows = rung
    return _LINEAR_MIN_ROWS if rows == min(ratios, default=rows) else rows


def _linear_min_rows() -> int:
    """Rows from which :func:`linear` takes the dense layer on this machine: measured once
    per process (~0.1 s; asked only for inputs below _LADDER_TOP rows, and where the first
    probe found that layer faster), forward + backward of a [rows, 64] x [64, 64] Linear at
    each rung of _LADDER, 7 calls of each interleaved; _LINEAR_MIN_ROWS when SPARSEJIT_LINEAR
    decides. (The measurement's own GEMMs make torch's BLAS allocate its buffers, ~40 MiB,
    which a process with only larger inputs never needs: hence only below _LADDER_TOP.)"""
    if os.environ.get("SPARSEJIT_LINEAR", "") in ("0", "1"):
        return _LINEAR_MIN_ROWS
    if "min_rows" in _linear_choice:
        return _linear_choice["min_rows"]
    gen = torch.Generator().manual_seed(0)
    ratios = {}
    with torch.inference_mode(False), torch.enable_grad():
        w = torch.randn(64, 64, generator=gen, requires_grad=True)
        b = torch.randn(64, generator=gen, requires_grad=True)
        for rung in _LADDER:
            x = torch.randn(rung, 64, generator=gen, requires_grad=True)
            g = torch.randn(rung, 64, generator=gen)

            def ours():
                call_op(ops.linear.default, _linear_setup, _linear_backward, (x, w, b),
                        (x, w, b)).backward(g)

            def theirs():
                torch.nn.functional.linear(x, w, b).backward(g)

            t_ours, t_theirs = paired_median_ms([ours, theirs], 7)
            ratios[rung] = t_ours / t_theirs
    _linear_choice["ratios"] = ratios
    _linear_choice["min_rows"] = _min_rows_from(ratios)
    return _linear_choice["min_rows"]


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``torch.nn.functional.linear(x, weight, bias)``, on sparsejit's dense GEMM layer where
    that is faster: float32 CPU inputs of at least as many rows as this machine needs for it
    (1024 to 32768, measured once: :func:`_linear_min_rows`), when a one-time measurement
    found it faster than torch's GEMM on this machine (see :func:`_linear_faster`); else
    ``F.linear``, and always ``F.linear`` under ``torch.compile`` / ``torch.export`` (no guard
    on the number of rows). The same values up to the GEMMs' order of summation;
    differentiable."""
    if _takes_dense_layer(x, weight, bias):
        return call_op(ops.linear.default, _linear_setup, _linear_backward, (x, weight, bias),
                       (x, weight, bias))
    return torch.nn.functional.linear(x, weight, bias)


def _linear_add_forward(ctx, out, x, weight):
    """``out += x @ weight^T`` in place (``sparsejit::linear_add_``) on a fresh ``out`` that
    autograd has not saved; its gradient passes through, dx and dw as :func:`linear`'s
    (:func:`_product_grads`). An in-place op has no registered formula: a composite."""
    torch.ops.sparsejit.linear_add_(out, x, weight)
    ctx.mark_dirty(out)
    ctx.save_for_backward(x, weight)
    return out


def _linear_add_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    need = ctx.needs_input_grad
    # `out`'s gradient is handed on contiguous: the aggregation that made `out` would
    # otherwise copy a broadcast gradient (``out.sum().backward()``) a second time.
    grad = grad.contiguous()
    dx, dw = _product_grads(grad, x, weight, need[1], need[2])
    return grad, dx, dw


_linear_add = composite("LinearAdd", _linear_add_forward, _linear_add_backward)


def linear_add_(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``out.addmm_(x, weight.t())``: a Linear's product summed onto ``out`` in place, on
    sparsejit's GEMM layer where :func:`linear` would take it (float32 CPU, at least 1024 rows,
    the faster GEMM on this machine, eager mode; ``out`` contiguous), else torch's ``addmm_``.
    For a fresh ``out`` that autograd has not saved (an aggregation's result); differentiable
    in x, weight and ``out``."""
    if out.dtype == torch.float32 and out.device.type == "cpu" and out.is_contiguous() and \
            _takes_dense_layer(x, weight, None):
        return _linear_add(out, x, weight)
    return out.addmm_(x, weight.t())


def _relu_linear_forward(ctx, h, weight, bias):
    """``relu_(h) @ weight^T + bias`` on a fresh ``h`` that autograd has not saved (a Linear's
    output): outputs the product and ``h`` itself, made ReLU in place. The backward writes the
    product's input gradient into a buffer of its own (:func:`_product_grads`) and applies
    the ReLU's mask there in place, where autograd's ReLU would allocate one more [N, F]
    tensor and pass over memory once more."""
    r = torch.relu_(h)
    ctx.mark_dirty(h)
    ctx.set_materialize_grads(False)  # no zero-filled [N, F] gradient for an unused r
    out = torch.ops.sparsejit.linear(r, weight, bias)
    ctx.save_for_backward(r, weight)
    ctx.has_bias = bias is not None
    return out, r


def _relu_linear_backward(ctx, grad, grad_r):
    r, weight = ctx.saved_tensors
    need = ctx.needs_input_grad
    if grad is None:  # only r's gradient reached this node
        grad = torch.zeros((r.shape[0], weight.shape[0]), dtype=r.dtype)
    dr, dw = _product_grads(grad, r, weight, need[0], need[1])
    if dr is not None:
        if grad_r is not None:  # h's ReLU output was used elsewhere as well
            dr = dr.add_(grad_r)
        torch.ops.aten.threshold_backward.grad_input(dr, r, 0.0, grad_input=dr)
    db = grad.sum(0) if ctx.has_bias and need[2] else None
    return dr, dw, db


_relu_linear = composite("ReluLinear", _relu_linear_forward, _relu_linear_backward)


def relu_linear(h: torch.Tensor, weight: torch.Tensor,
                bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``linear(relu_(h), weight, bias)`` for a fresh ``h`` that autograd has not saved (a
    Linear's output; ``h`` is made ReLU in place). Where :func:`linear` takes sparsejit's GEMM
    layer the ReLU's gradient is applied in place on the product's (one [N, F] buffer and
    pass fewer, the same values); else ``relu_`` and :func:`linear`."""
    if h.is_contiguous() and _takes_dense_layer(h, weight, bias):
        return _relu_linear(h, weight, bias)[0]
    return linear(torch.relu_(h), weight, bias)


def _takes_dense_layer(x, weight, bias) -> bool:
    """Whether :func:`linear` (and :func:`linear_add_`) take sparsejit's GEMM layer: eager
    mode, float32 CPU tensors of the op's ranks (x and weight 2-D), at least
    _LINEAR_MIN_ROWS rows and the faster GEMM on this machine (:func:`_linear_faster`), from
    the rows where it measured faster (:func:`_linear_min_rows`)."""
    def cpu_f32(t):
        return isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dtype == torch.float32
    return not torch.compiler.is_compiling() and cpu_f32(x) and cpu_f32(weight) and \
        x.dim() == 2 and weight.dim() == 2 and (bias is None or cpu_f32(bias)) and \
        x.shape[0] >= _LINEAR_MIN_ROWS and _linear_faster() and \
        (x.shape[0] >= _LADDER_TOP or x.shape[0] >= _linear_min_rows())
