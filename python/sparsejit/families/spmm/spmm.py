"""SpMM: ``Y[i] = act(scale * reduce_{j in row i}(a_ij * X[j]) + bias)``.

The user-facing wrapper (``sparsejit.spmm``), the fake implementations of the SpMM ops
(``spmm``, ``spmm_plan``, ``spmm_bucketed_plan``; torch_ext/ops/spmm.cpp) and the autograd
formula, which calls the same ops: ``dX = A^T (dY / deg)`` through the cached transpose,
``dvalues = SDDMM(A, dY, X)``, max/min routed through the saved extremum positions.
"""

from __future__ import annotations

from typing import Optional

import torch

from sparsejit import _core
from sparsejit.families.spmm import plans
from sparsejit.runtime import tuners
from sparsejit._library import ops, restores_type_errors
from sparsejit.families.spmm.matrix import SparseMatrix, as_matrix
from sparsejit.families.spmm._common import check_dense, check_same_device, row_width, transpose
from sparsejit.runtime.autograd import call_op, needs_grad

REDUCES = ("sum", "mean", "max", "min")
ACTIVATIONS = (None,) + tuple(a for a in _core.enums()["act"] if a != "runtime")
_PLAN = plans.layout()
_REDUCES, _ACTIVATIONS = REDUCES, ACTIVATIONS


@restores_type_errors
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
    check_dense(A, X, "X", A.shape[1], "columns")
    values = A.values
    if values is not None:
        if values.dtype != X.dtype:
            raise TypeError(f"A.values dtype ({values.dtype}) must match X dtype ({X.dtype})")
        if values.dim() == 2 and (X.dim() != 3 or X.shape[1] != values.shape[1]):
            raise ValueError(
                f"values of shape {tuple(values.shape)} need X of shape "
                f"[{A.shape[1]}, {values.shape[1]}, F]; got {tuple(X.shape)}"
            )
    width = row_width(X)
    if bias is not None:
        if bias.numel() != width:
            raise ValueError(
                f"bias has {bias.numel()} elements but each output row has {width} "
                f"(shape {tuple(X.shape[1:])})"
            )
        if bias.device != X.device:
            raise ValueError(f"bias is on {bias.device} but X is on {X.device}")
    t = (None, None, None)
    grad = needs_grad(X, values)
    if grad and reduce in ("sum", "mean"):
        t = A.transpose_arrays()
    act = activation or "none"
    act_param = negative_slope if act == "leaky_relu" else alpha
    if tune and not torch.compiler.is_compiling() and not plans.is_tuned(A, width, X.dtype,
                                                                        reduce):
        heads = X.shape[1] if X.dim() == 3 else 1
        tuners.tune(A, "spmm", X.shape[-1], reduce, X.dtype, heads)  # the spmm family's tuner
    plan = plans.spmm_plan_for(A, width, X.dtype, reduce)
    # Positional call of the overload (no keyword or overload resolution on the hot path).
    args = (A.indptr, A.indices, values, X, reduce, A.shape[1], *t, plan, bias, act,
            float(act_param), float(scale), grad)
    out, _ = call_op(ops.spmm.default, _spmm_setup, _spmm_backward, args, (X, values, bias))
    return out


# ---- fakes -------------------------------------------------------------------------------


@torch.library.register_fake("sparsejit::spmm")
def _spmm_fake(rowptr, col, values, x, reduce, num_cols=-1, t_rowptr=None, t_col=None,
               t_perm=None, plan=None, bias=None, activation="none", act_param=0.01, scale=1.0,
               need_arg=True):
    check_same_device("spmm", rowptr=rowptr, col=col, values=values, x=x, t_rowptr=t_rowptr,
                      t_col=t_col, t_perm=t_perm, bias=bias)
    if plan is not None and plan.device.type == "meta" and x.device.type != "meta":
        raise ValueError("sparsejit.spmm: plan is a meta tensor but X is on " + str(x.device))
    out_shape = (rowptr.shape[0] - 1,) + tuple(x.shape[1:])
    out = x.new_empty(out_shape)
    if reduce in ("max", "min") and need_arg:
        arg = x.new_empty(out_shape, dtype=torch.long)
    else:
        arg = x.new_empty((0,), dtype=torch.long)
    return out, arg


@torch.library.register_fake("sparsejit::spmm_arg_backward")
def _spmm_arg_backward_fake(rowptr, col, arg, grad_out, values, num_cols):
    if grad_out.dim() != 2 or arg.shape != grad_out.shape:
        raise ValueError("sparsejit.spmm_arg_backward: arg and grad_out must be [rows, F]")
    return grad_out.new_empty(num_cols, grad_out.shape[1])


@torch.library.register_fake("sparsejit::spmm_plan")
def _spmm_plan_fake(rowptr, col, num_cols, row_width, dtype):
    return rowptr.new_empty((_PLAN["header_words"],), dtype=torch.long)


@torch.library.register_fake("sparsejit::spmm_bucketed_plan")
def _spmm_bucketed_plan_fake(rowptr, col, num_cols, max_log2=3, prefetch=0):
    rows = rowptr.shape[0] - 1
    words = _PLAN["header_words"] + rows + (rows + 1) + 2 * col.shape[0]
    return rowptr.new_empty((words,), dtype=torch.long)


# ---- autograd ------------------------------------------------------------------------------


def _row_degree(rowptr):
    return (rowptr[1:] - rowptr[:-1]).to(torch.long)


def _spmm_setup(ctx, inputs, output):
    (rowptr, col, values, x, reduce, _num_cols, t_rowptr, t_col, t_perm, plan, bias,
     activation, act_param, scale, _need_arg) = inputs
    out, arg = output
    ctx.reduce = reduce
    ctx.activation, ctx.act_param, ctx.scale = activation, act_param, scale
    ctx.has_bias = bias is not None
    # The output is saved only when the activation's derivative needs it.
    saved_out = out if activation in ("relu", "leaky_relu", "elu") else None
    ctx.save_for_backward(rowptr, col, values, x, arg, t_rowptr, t_col, t_perm, plan, bias,
                          saved_out)


def _activation_grad(ctx, grad_out, out, z_fn):
    """Gradient w.r.t. the pre-activation z = scale * reduced + bias."""
    act = ctx.activation
    if act == "none":
        return grad_out
    if act == "relu":
        return grad_out * (out > 0)
    if act == "leaky_relu":
        return torch.where(out > 0, grad_out, grad_out * ctx.act_param)
    if act == "elu":
        return torch.where(out > 0, grad_out, grad_out * (out + ctx.act_param))
    if act == "gelu":
        z = z_fn().float()
        cdf = 0.5 * (1.0 + torch.erf(z * 0.7071067811865476))
        pdf = torch.exp(-0.5 * z * z) * 0.3989422804014327
        return (grad_out.float() * (cdf + z * pdf)).to(grad_out.dtype)
    raise ValueError(f"unknown activation {act!r}")


def _spmm_backward(ctx, grad_out, _grad_arg):
    (rowptr, col, values, x, arg, t_rowptr, t_col, t_perm, plan, bias,
     saved_out) = ctx.saved_tensors
    reduce = ctx.reduce
    grad_bias = None
    if ctx.activation != "none" or ctx.has_bias or ctx.scale != 1.0:
        def z_fn():
            r, _ = ops.spmm(rowptr, col, values, x, reduce, x.shape[0], plan=plan,
                            need_arg=False)
            z = r * ctx.scale
            return z + bias.view(z.shape[1:]) if bias is not None else z

        grad_z = _activation_grad(ctx, grad_out, saved_out, z_fn)
        if ctx.has_bias and ctx.needs_input_grad[10]:
            grad_bias = grad_z.sum(0).reshape(bias.shape).to(bias.dtype)
        grad_out = grad_z * ctx.scale if ctx.scale != 1.0 else grad_z
    need_values = values is not None and ctx.needs_input_grad[2]
    need_x = ctx.needs_input_grad[3]
    grad_values = grad_x = None
    if reduce in ("max", "min"):
        if (need_values or need_x) and arg.numel() != grad_out.numel():
            raise RuntimeError(
                "sparsejit.spmm: the gradient of reduce='max'/'min' w.r.t. X or values needs "
                "the extremum positions, but the forward ran with need_arg=False (it was "
                "called with no input requiring grad, or under torch.no_grad())"
            )
        grad_values, grad_x = _spmm_arg_backward(
            rowptr, col, values, x, arg, grad_out, need_values, need_x
        )
        return (None, None, grad_values, grad_x, None, None, None, None, None, None,
                grad_bias, None, None, None, None)

    g = grad_out.contiguous()
    inv_deg = None
    if reduce == "mean":
        inv_deg = 1.0 / _row_degree(rowptr).clamp(min=1).to(g.dtype)
    if need_x:
        trp, tcol, tperm = transpose(rowptr, col, x.shape[0], t_rowptr, t_col, t_perm)
        tvals = None if values is None else values.index_select(0, tperm.to(torch.long))
        if inv_deg is not None:
            # mean: dX = A^T diag(1 / deg) dY, the 1 / deg of each entry's forward row folded
            # into the transposed entries' values ([nnz] gathers instead of an [N, F] pass).
            scale_t = inv_deg.index_select(0, tcol)
            if tvals is not None:
                scale_t = scale_t.view((-1,) + (1,) * (tvals.dim() - 1)) * tvals
            tvals = scale_t
        # Plans are stamped with the forward structure: the transpose uses the cost model.
        grad_x, _ = ops.spmm(trp, tcol, tvals, g, "sum", rowptr.shape[0] - 1)
    if need_values:
        if inv_deg is not None:
            g = g * inv_deg.view((-1,) + (1,) * (g.dim() - 1))
        if values.dim() == 1 and x.dim() == 3:
            # One value shared by all heads: per-head dot products, summed over heads.
            grad_values = ops.sddmm(rowptr, col, g, x, x.shape[0]).sum(-1)
        else:
            grad_values = ops.sddmm(rowptr, col, g, x, x.shape[0])
    return (None, None, grad_values, grad_x, None, None, None, None, None, None, grad_bias,
            None, None, None, None)


def _spmm_arg_backward(rowptr, col, values, x, arg, grad_out, need_values, need_x):
    """Gradient of max / min: each output element routes to the entry that won it.

    `arg` holds the winning CSR position per output element (-1 for empty rows). Ties go to
    the first stored entry of the row, so exactly one entry receives each gradient. dX of a
    2-D X on the CPU runs the spmm_arg_backward op (O(rows x F), threads add into private
    copies); multi-head X, CUDA tensors and dvalues take the ATen scatter below."""
    native_x = need_x and x.dim() == 2 and x.device.type == "cpu" and \
        (values is None or values.dim() == 1) and not torch.is_grad_enabled()
    grad_x = None
    if native_x:
        grad_x = ops.spmm_arg_backward(rowptr, col, arg, grad_out.to(x.dtype).contiguous(),
                                       values if values is None else values.to(x.dtype),
                                       x.shape[0])
        need_x = False
        if not need_values:
            return None, grad_x
    if col.numel() == 0:  # no stored entry: nothing receives a gradient
        if need_x:
            grad_x = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
        return (torch.zeros_like(values) if need_values else None), grad_x
    valid = arg >= 0
    pos = arg.clamp(min=0)
    g = torch.where(valid, grad_out, torch.zeros((), dtype=grad_out.dtype))
    src = col.to(torch.long).index_select(0, pos.reshape(-1)).view(pos.shape)
    heads = x.shape[1] if x.dim() == 3 else 1
    grad_values = None
    if values is not None:
        if values.dim() == 2:
            head_idx = torch.arange(heads, device=pos.device).view(1, heads, 1)
            v = values[pos, head_idx.expand_as(pos)]
        else:
            v = values.index_select(0, pos.reshape(-1)).view(pos.shape)
    if need_x:
        contrib = g * v if values is not None else g
        grad_x = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
        grad_x.scatter_add_(0, src, contrib.to(x.dtype))
    if need_values:
        xs = torch.gather(x, 0, src)
        contrib = (g * xs).to(values.dtype)
        if values.dim() == 2:
            head_idx = torch.arange(heads, device=pos.device).view(1, heads, 1)
            flat = (pos * heads + head_idx).reshape(-1)
            grad_values = torch.zeros(values.numel(), dtype=values.dtype, device=values.device)
            grad_values.scatter_add_(0, flat, contrib.reshape(-1))
            grad_values = grad_values.view(values.shape)
        else:
            grad_values = torch.zeros(values.shape, dtype=values.dtype, device=values.device)
            grad_values.scatter_add_(0, pos.reshape(-1), contrib.reshape(-1))
    return grad_values, grad_x


torch.library.register_autograd(
    "sparsejit::spmm", _spmm_backward, setup_context=_spmm_setup
)
