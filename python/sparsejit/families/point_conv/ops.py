"""Point-cloud sparse convolution ops: kernel-map plans and the gather-GEMM-scatter conv.

    plan, out_coords = point_conv_plan(coords, spatial_shape, batch_size, "subm", kernel, ...)
    y = point_conv(features, weight, bias, plan, num_out)   # weight [K, C_in, C_out]

A plan is an int64 tensor (the common plan header, then the kernel map: pairs grouped by
kernel offset, indexed by output and by input row); it crosses ``.to()``, ``torch.save`` and
torch.compile. ``swap=True`` reads a plan backwards (spconv's inverse convolution: outputs
are the plan's input sites). The dataflow ("auto", "gather_gemm_scatter",
"output_stationary") only changes speed, never the result beyond rounding.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from sparsejit._library import FLOAT_DTYPES, ops, restores_type_errors

from sparsejit.families.point_conv import schedules
from sparsejit.families.point_conv.plan import KINDS, plan_info, plan_pairs  # noqa: F401  (re-exported)
from sparsejit.runtime.autograd import call_op

DATAFLOWS = {"auto": 0, "gather_gemm_scatter": 1, "output_stationary": 2}


def _dataflow_id(dataflow: Union[str, int]) -> int:
    if isinstance(dataflow, int) and dataflow in DATAFLOWS.values():
        return dataflow
    if dataflow not in DATAFLOWS:
        raise ValueError(f"sparsejit.point_conv: dataflow must be one of {list(DATAFLOWS)}; "
                         f"got {dataflow!r}")
    return DATAFLOWS[dataflow]


def _ints(v, dims: int, name: str) -> list:
    if isinstance(v, int):
        return [v] * dims
    v = [int(e) for e in v]
    if len(v) != dims:
        raise ValueError(f"sparsejit: {name} must have {dims} values (one per spatial axis); "
                         f"got {v}")
    return v


@restores_type_errors
def point_conv_plan(coords: torch.Tensor, spatial_shape: Sequence[int], batch_size: int,
              kind: str, kernel_size, stride=1, padding=0, dilation=1,
              out_coords: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Kernel map of one convolution geometry as ``(plan, out_coords)``; `coords` is
    ``[N, 1 + D]`` integers, batch index first. See the module docstring for `kind`."""
    if not isinstance(coords, torch.Tensor):
        raise TypeError(f"sparsejit.point_conv_plan: coords must be a tensor; got {type(coords).__name__}")
    dims = len(spatial_shape)
    return torch.ops.sparsejit.point_conv_plan(
        coords, [int(s) for s in spatial_shape], int(batch_size), kind,
        _ints(kernel_size, dims, "kernel_size"), _ints(stride, dims, "stride"),
        _ints(padding, dims, "padding"), _ints(dilation, dims, "dilation"), out_coords)


@restores_type_errors
def point_conv(features: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                plan: torch.Tensor, num_out: int, swap: bool = False,
                dataflow: Union[str, int] = "auto", relu: bool = False) -> torch.Tensor:
    """``y[o] = bias + sum_{(i, o, k) in plan} features[i] @ weight[k]`` with `weight`
    ``[K, C_in, C_out]``; differentiable in features, weight and bias. ``relu=True`` returns
    ``max(y, 0)``, applied as each output row is finished (no pre-activation tensor; the
    backward masks the gradient with the output)."""
    if not isinstance(features, torch.Tensor) or features.dtype not in FLOAT_DTYPES:
        raise TypeError("sparsejit.point_conv: features must be a floating tensor")
    d = _dataflow_id(dataflow)
    if schedules.recorders and not torch.compiler.is_compiling():
        for record in schedules.recorders:
            record(features, weight, plan, bool(swap))
    if d == 0 and not torch.compiler.is_compiling() and isinstance(weight, torch.Tensor) and \
            weight.dim() == 3:
        # sj.tune's choices: the forward's dataflow in bits 0-1, the backward's feature-
        # gradient dataflow in bits 2-3 and weight-gradient path in bits 4-5 (read by
        # _sparse_conv_backward; the C++ forward runs bits 0-1).
        fwd, bwd, wgrad = _tuned_dataflows(plan, weight.shape[1], weight.shape[2],
                                           features.dtype, bool(swap))
        d = fwd | (bwd << 2) | (wgrad << 4)
    return call_op(ops.point_conv.default, _sparse_conv_setup, _sparse_conv_backward,
                   (features, weight, bias, plan, num_out, bool(swap), d, bool(relu)),
                   (features, weight, bias))


def _tuned_dataflows(plan, c_in, c_out, dtype, swap) -> Tuple[int, int, int]:
    """(forward dataflow, feature-gradient dataflow, weight-gradient path) that sparsejit.tune
    stored for this call; 0 = the cost model's."""
    return schedules.tuned_choices(plan, int(c_in), int(c_out), dtype, swap)


# ---- fakes --------------------------------------------------------------------------------

@torch.library.register_fake("sparsejit::point_conv_plan")
def _conv_plan_fake(coords, spatial_shape, batch_size, kind, kernel, stride, padding, dilation,
                    out_coords):
    if kind not in KINDS:
        raise ValueError(f"sparsejit.point_conv_plan: kind must be one of {KINDS}; got {kind!r}")
    if coords.dim() != 2 or coords.shape[1] != len(spatial_shape) + 1:
        raise ValueError(f"sparsejit.point_conv_plan: coords must be [N, {len(spatial_shape) + 1}]; "
                         f"got {tuple(coords.shape)}")
    ctx = torch.library.get_ctx()
    plan = coords.new_empty(ctx.new_dynamic_size(), dtype=torch.long)
    if kind == "subm":
        rows = coords.shape[0]
    elif kind == "generalized":
        rows = out_coords.shape[0]
    else:
        rows = ctx.new_dynamic_size()
    return plan, coords.new_empty(rows, coords.shape[1], dtype=torch.int32)


def _check_fake(op, x, w, plan, **more):
    # Every tensor argument: one on meta routes the whole call here, and a CPU result from
    # mixed devices would be uninitialized memory.
    tensors = dict(features=x, weight=w, plan=plan, **more)
    devices = {n: t.device for n, t in tensors.items() if isinstance(t, torch.Tensor)}
    if len(set(devices.values())) > 1:
        raise ValueError(f"sparsejit.{op}: all tensor arguments must be on one device; got "
                         + ", ".join(f"{n} on {d}" for n, d in devices.items()))
    if x.dim() != 2 or w.dim() != 3 or w.shape[1] != x.shape[1]:
        raise ValueError(f"sparsejit.{op}: features [N, C_in] and weight [K, C_in, C_out] do "
                         f"not agree: {tuple(x.shape)}, {tuple(w.shape)}")
    if w.dtype != x.dtype:
        raise TypeError(f"sparsejit.{op}: weight dtype must match features dtype")


@torch.library.register_fake("sparsejit::point_conv")
def _sparse_conv_fake(features, weight, bias, plan, num_out, swap, dataflow, relu=False):
    _check_fake("point_conv", features, weight, plan, bias=bias)
    return features.new_empty(num_out, weight.shape[2])


@torch.library.register_fake("sparsejit::point_conv_backward")
def _sparse_conv_backward_fake(features, weight, grad_out, plan, swap, dataflow, need_features,
                               need_weight):
    _check_fake("point_conv_backward", features, weight, plan, grad_out=grad_out)
    dx = features.new_empty(features.shape) if need_features else features.new_empty(0)
    dw = weight.new_empty(weight.shape) if need_weight else features.new_empty(0)
    return dx, dw


# ---- autograd -----------------------------------------------------------------------------

def _sparse_conv_setup(ctx, inputs, output):
    features, weight, bias, plan, num_out, swap, dataflow = inputs[:7]
    ctx.relu = bool(inputs[7]) if len(inputs) > 7 else False
    # The fused ReLU's mask is read from the output (alive anyway as the next layer's input).
    ctx.save_for_backward(features, weight, plan, output if ctx.relu else None)
    ctx.swap, ctx.dataflow = swap, dataflow
    ctx.has_bias = bias is not None


def _sparse_conv_backward(ctx, grad):
    features, weight, plan, out = ctx.saved_tensors
    need = ctx.needs_input_grad
    if ctx.relu:
        grad = torch.where(out > 0, grad, torch.zeros((), dtype=grad.dtype))
    grad = grad.contiguous()
    dx = dw = None
    if need[0] or need[1]:
        # The feature gradient's own tuned dataflow (bits 2-3, see point_conv), else the
        # forward's; the weight-gradient path (bits 4-5) goes to the op's bits 2-3.
        d = ((ctx.dataflow >> 2) & 3) or (ctx.dataflow & 3)
        d |= ((ctx.dataflow >> 4) & 3) << 2
        dx, dw = torch.ops.sparsejit.point_conv_backward(
            features, weight, grad, plan, ctx.swap, d, bool(need[0]), bool(need[1]))
    db = grad.sum(0) if ctx.has_bias and need[2] else None
    return (dx if need[0] else None, dw if need[1] else None, db, None, None, None, None, None)


torch.library.register_autograd("sparsejit::point_conv", _sparse_conv_backward,
                                setup_context=_sparse_conv_setup)
