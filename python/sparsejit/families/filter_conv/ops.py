"""Filter-sparse convolution ops (pruned Conv2d inference): fakes for torch.compile /
torch.export. The user-facing modules are sparsejit.families.filter_conv.layers (PrunedConv2d)
and .tuner (sparsify).

``filter_conv_plan(weight, threshold, variant) -> (plan, rowptr, taps, values)`` compresses a
weight ``[C_out, C_in/groups, R, S]`` per output channel; ``filter_conv(plan, rowptr, taps,
values, x, bias, kernel_size, stride, padding, dilation, groups, relu, variant=-1)`` runs it.
Inference only: no autograd formula is registered.
"""

from typing import Optional, Sequence

import torch

from sparsejit._library import FLOAT_DTYPES

# Variants (the plan's kernel word, the ops' `variant` argument; kernels/cpu/filter_conv_args.h).
# "generic" is the planner's tile with the precompiled loop; "jit" and "jit_baked" the same tile
# with the loop compiled for the layer by the CPU JIT (the layer's constants; baked: every tap
# an immediate offset), falling back to the precompiled loop, with one warning, when the JIT
# cannot compile; "auto" is "jit" when the JIT is on (SPARSEJIT_JIT), else "generic".
VARIANTS = {"auto": 0, "scalar": 1, "vec8x1": 2, "vec8x2": 3, "vec8x4": 4, "vec8x8": 5,
            "jit": 6, "jit_baked": 7, "generic": 8}
JIT_VARIANTS = ("jit", "jit_baked")



def _pair(v: Sequence[int], name: str):
    if len(v) == 1:
        return int(v[0]), int(v[0])
    if len(v) != 2:
        raise ValueError(f"sparsejit.filter_conv: {name} must have 2 entries; got {list(v)}")
    return int(v[0]), int(v[1])


def output_size(h: int, w: int, kernel_size, stride, padding, dilation):
    (r, s), (sh, sw), (ph, pw), (dh, dw) = (_pair(kernel_size, "kernel_size"),
                                            _pair(stride, "stride"), _pair(padding, "padding"),
                                            _pair(dilation, "dilation"))
    return (h + 2 * ph - dh * (r - 1) - 1) // sh + 1, (w + 2 * pw - dw * (s - 1) - 1) // sw + 1


@torch.library.register_fake("sparsejit::filter_conv_plan")
def _filter_conv_plan_fake(weight, threshold=0.0, variant=0):
    if weight.dim() != 4:
        raise ValueError("sparsejit.filter_conv_plan: weight must be 4-D [C_out, C_in/groups, "
                         f"R, S]; got shape {tuple(weight.shape)}")
    nnz = torch.library.get_ctx().new_dynamic_size()
    opt = dict(dtype=torch.long, device=weight.device)
    return (weight.new_empty(14, **opt), weight.new_empty(weight.shape[0] + 1, **opt),
            weight.new_empty(nnz, **opt),
            weight.new_empty(nnz, dtype=torch.float32, device=weight.device))


@torch.library.register_fake("sparsejit::filter_conv")
def _filter_conv_fake(plan, rowptr, taps, values, x, bias: Optional[torch.Tensor], kernel_size,
                      stride, padding, dilation, groups, relu, variant=-1,
                      residual: Optional[torch.Tensor] = None):
    # One argument on meta routes the whole call here: mixed devices must fail as on the CPU.
    devices = {n: t.device for n, t in dict(plan=plan, rowptr=rowptr, taps=taps, values=values,
                                            x=x, bias=bias, residual=residual).items()
               if t is not None}
    if len(set(devices.values())) > 1:
        raise ValueError("sparsejit.filter_conv: all tensor arguments must be on one device; "
                         "got " + ", ".join(f"{n} on {d}" for n, d in devices.items()))
    if x.dim() != 4:
        raise ValueError(f"sparsejit.filter_conv: x must be 4-D [N, C_in, H, W]; got shape "
                         f"{tuple(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"sparsejit: x must be float32, float64, bfloat16 or float16; got "
                        f"{x.dtype}")
    oh, ow = output_size(x.shape[2], x.shape[3], kernel_size, stride, padding, dilation)
    y = x.new_empty((x.shape[0], rowptr.shape[0] - 1, oh, ow))
    if residual is not None:
        if residual.dtype not in FLOAT_DTYPES:
            raise TypeError(f"sparsejit: residual must be float32, float64, bfloat16 or "
                            f"float16; got {residual.dtype}")
        torch._check_value(residual.dim() == 4, lambda: "sparsejit.filter_conv: residual must have "
                     f"the output's shape {tuple(y.shape)}; got {tuple(residual.shape)}")
        for d in range(4):
            torch._check_value(residual.shape[d] == y.shape[d], lambda: "sparsejit.filter_conv: "
                         f"residual must have the output's shape {tuple(y.shape)}; got "
                         f"{tuple(residual.shape)}")
    if x.shape[1] > 1 and x.shape[2] > 1 and x.shape[3] > 1 and not x.is_contiguous() and \
            x.is_contiguous(memory_format=torch.channels_last):
        y = y.contiguous(memory_format=torch.channels_last)  # as the CPU op does
    return y
