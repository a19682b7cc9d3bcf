"""Loads the op library and registers what the C++ side leaves to Python: fake (meta)
implementations for torch.compile / torch.export, and autograd formulas.

The ops themselves (schemas and CPU kernels) are in torch_ext/. Everything here works on
raw tensors; the user-facing API in functional.py wraps these with SparseMatrix.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent


def _point_at_nvrtc() -> None:
    """Lets the CUDA backend find libnvrtc from the pip wheels (nvidia-cuda-nvrtc, or the
    ones a CUDA build of torch depends on) without LD_LIBRARY_PATH."""
    if os.environ.get("SPARSEJIT_NVRTC_DIRS"):
        return
    try:
        import nvidia  # namespace package of NVIDIA's wheels
    except ImportError:
        return
    dirs = [os.path.join(root, sub) for root in nvidia.__path__
            for sub in ("cu13/lib", "cuda_nvrtc/lib", "cu12/lib")]
    found = [d for d in dirs if os.path.isdir(d)]
    if found:
        os.environ["SPARSEJIT_NVRTC_DIRS"] = os.pathsep.join(found)


def _load_library() -> None:
    candidates = [_HERE / "libsparsejit_ops.so"]
    env = os.environ.get("SPARSEJIT_OPS_LIBRARY")
    if env:
        candidates.insert(0, Path(env))
    for path in candidates:
        if path.exists():
            torch.ops.load_library(str(path))
            return
    raise ImportError(
        "sparsejit: the op library libsparsejit_ops.so was not found next to "
        f"{_HERE} (looked for: {', '.join(map(str, candidates))}). Build it with `make build` "
        "from the repository root, or set SPARSEJIT_OPS_LIBRARY to its path."
    )


_point_at_nvrtc()
_load_library()

ops = torch.ops.sparsejit


# ---------------------------------------------------------------------------------------
# Fake implementations: shapes and dtypes only.
# ---------------------------------------------------------------------------------------


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


@torch.library.register_fake("sparsejit::spmm")
def _spmm_fake(rowptr, col, values, x, reduce, t_rowptr=None, t_col=None, t_perm=None,
               plan=None, bias=None, activation="none", act_param=0.01, scale=1.0,
               need_arg=True):
    out_shape = (rowptr.shape[0] - 1,) + tuple(x.shape[1:])
    out = x.new_empty(out_shape)
    if reduce in ("max", "min") and need_arg:
        arg = x.new_empty(out_shape, dtype=torch.long)
    else:
        arg = x.new_empty((0,), dtype=torch.long)
    return out, arg


@torch.library.register_fake("sparsejit::sddmm")
def _sddmm_fake(rowptr, col, q, k, t_rowptr=None, t_col=None, t_perm=None):
    if q.dim() == 3:
        return q.new_empty((col.shape[0], q.shape[1]))
    return q.new_empty((col.shape[0],))


@torch.library.register_fake("sparsejit::edge_softmax")
def _edge_softmax_fake(rowptr, s):
    return torch.empty_like(s)


@torch.library.register_fake("sparsejit::spmm_plan")
def _spmm_plan_fake(rowptr, num_cols, row_width, dtype):
    return rowptr.new_empty((4,), dtype=torch.long)


@torch.library.register_fake("sparsejit::spmm_bucketed_plan")
def _spmm_bucketed_plan_fake(rowptr, col, max_log2=3, prefetch=0):
    rows = rowptr.shape[0] - 1
    return rowptr.new_empty((8 + rows + (rows + 1) + 2 * col.shape[0],), dtype=torch.long)


@torch.library.register_fake("sparsejit::edge_softmax_backward")
def _edge_softmax_backward_fake(rowptr, y, grad):
    return torch.empty_like(y)


# ---------------------------------------------------------------------------------------
# Autograd.
# ---------------------------------------------------------------------------------------


def _transpose(rowptr, col, num_cols, t_rowptr, t_col, t_perm):
    """The cached transpose when the caller passed one, else computed now."""
    if t_rowptr is not None and t_col is not None and t_perm is not None:
        return t_rowptr, t_col, t_perm
    return ops.csr_transpose(rowptr, col, num_cols)


def _row_degree(rowptr):
    return (rowptr[1:] - rowptr[:-1]).to(torch.long)


def _spmm_setup(ctx, inputs, output):
    (rowptr, col, values, x, reduce, t_rowptr, t_col, t_perm, plan, bias, activation,
     act_param, scale, _need_arg) = inputs
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
            r, _ = ops.spmm(rowptr, col, values, x, reduce, plan=plan, need_arg=False)
            z = r * ctx.scale
            return z + bias.view(z.shape[1:]) if bias is not None else z

        grad_z = _activation_grad(ctx, grad_out, saved_out, z_fn)
        if ctx.has_bias and ctx.needs_input_grad[9]:
            grad_bias = grad_z.sum(0).reshape(bias.shape).to(bias.dtype)
        grad_out = grad_z * ctx.scale
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
            col, values, x, arg, grad_out, need_values, need_x
        )
        return (None, None, grad_values, grad_x, None, None, None, None, None, grad_bias,
                None, None, None, None)

    g = grad_out.contiguous()
    if reduce == "mean":
        deg = _row_degree(rowptr).clamp(min=1).to(g.dtype)
        g = g / deg.view((-1,) + (1,) * (g.dim() - 1))
    if need_x:
        trp, tcol, tperm = _transpose(rowptr, col, x.shape[0], t_rowptr, t_col, t_perm)
        tvals = None if values is None else values.index_select(0, tperm.to(torch.long))
        # A header-only plan (kernel choice) carries over to the transpose; a bucketed plan
        # (arrays of the forward structure, more than 4 words) does not.
        t_plan = plan if plan is not None and plan.numel() == 4 else None
        grad_x, _ = ops.spmm(trp, tcol, tvals, g, "sum", plan=t_plan)
    if need_values:
        if values.dim() == 1 and x.dim() == 3:
            # One value shared by all heads: per-head dot products, summed over heads.
            grad_values = ops.sddmm(rowptr, col, g, x).sum(-1)
        else:
            grad_values = ops.sddmm(rowptr, col, g, x)
    return (None, None, grad_values, grad_x, None, None, None, None, None, grad_bias, None,
            None, None, None)


def _spmm_arg_backward(col, values, x, arg, grad_out, need_values, need_x):
    """Gradient of max / min: each output element routes to the entry that won it.

    `arg` holds the winning CSR position per output element (-1 for empty rows). Ties go to
    the first stored entry of the row, so exactly one entry receives each gradient."""
    valid = arg >= 0
    pos = arg.clamp(min=0)
    g = torch.where(valid, grad_out, torch.zeros((), dtype=grad_out.dtype))
    src = col.to(torch.long).index_select(0, pos.reshape(-1)).view(pos.shape)
    heads = x.shape[1] if x.dim() == 3 else 1
    grad_x = grad_values = None
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


def _sddmm_setup(ctx, inputs, output):
    rowptr, col, q, k, t_rowptr, t_col, t_perm = inputs
    ctx.save_for_backward(rowptr, col, q, k, t_rowptr, t_col, t_perm)


def _sddmm_backward(ctx, grad_s):
    rowptr, col, q, k, t_rowptr, t_col, t_perm = ctx.saved_tensors
    grad_q = grad_k = None
    g = grad_s.contiguous()
    if ctx.needs_input_grad[2]:
        grad_q, _ = ops.spmm(rowptr, col, g, k, "sum")
    if ctx.needs_input_grad[3]:
        trp, tcol, tperm = _transpose(rowptr, col, k.shape[0], t_rowptr, t_col, t_perm)
        grad_k, _ = ops.spmm(trp, tcol, g.index_select(0, tperm.to(torch.long)), q, "sum")
    return None, None, grad_q, grad_k, None, None, None


torch.library.register_autograd(
    "sparsejit::sddmm", _sddmm_backward, setup_context=_sddmm_setup
)


def _edge_softmax_setup(ctx, inputs, output):
    rowptr, _ = inputs
    ctx.save_for_backward(rowptr, output)


def _edge_softmax_backward(ctx, grad):
    rowptr, y = ctx.saved_tensors
    return None, ops.edge_softmax_backward(rowptr, y, grad.contiguous())


torch.library.register_autograd(
    "sparsejit::edge_softmax", _edge_softmax_backward, setup_context=_edge_softmax_setup
)
