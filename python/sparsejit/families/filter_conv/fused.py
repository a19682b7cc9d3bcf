"""Fused groups of filter-sparse layers (issue 47): a ResNet bottleneck run over bands of
output rows by one op, ``sparsejit::filter_conv_bottleneck`` (csrc/filter_conv/fused_run.h),
so its intermediate activations stay in the core's cache instead of going to memory and back
between the layer calls.

``FusedBottleneck(conv1, conv2, conv3, shortcut=None)`` takes the layers sparsify made of a
block (``conv1``, ``conv2``: PrunedConv2d with ReLU, conv2 at stride 1 or more; ``conv3``: a
ResidualPrunedConv2d; the residual is the block's input, or ``shortcut(x)``, a 1x1
PrunedConv2d projection at conv2's stride without ReLU) and computes
``conv3(conv2(conv1(x)), residual=x or shortcut(x))``. sparsify's fusion
pass (``fuse_bottlenecks``) finds such chains in the traced model, times the fused module
against the chain on the shape the example input gave, and keeps the faster.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, List, Optional

import torch
from torch import nn

from sparsejit._library import FLOAT_DTYPES as _FLOATS, restores_type_errors


@torch.library.register_fake("sparsejit::filter_conv_bottleneck")
def _bottleneck_fake(x, plan1, rowptr1, taps1, values1, bias1, plan2, rowptr2, taps2, values2,
                     bias2, plan3, rowptr3, taps3, values3, bias3, band=0, plan4=None,
                     rowptr4=None, taps4=None, values4=None, bias4=None, stride2=1):
    if x.dim() != 4:
        raise ValueError("sparsejit.filter_conv_bottleneck: x must be 4-D [N, C, H, W]; got "
                         f"shape {tuple(x.shape)}")
    if x.dtype not in _FLOATS:
        raise TypeError("sparsejit: x must be float32, float64, bfloat16 or float16; got "
                        f"{x.dtype}")
    c_out = rowptr3.shape[0] - 1
    if plan4 is None:
        torch._check_value(c_out == x.shape[1], lambda: "sparsejit.filter_conv_bottleneck: "
                           f"conv3 gives {c_out} channels; the identity residual needs "
                           f"{x.shape[1]}")
    if stride2 < 1:
        raise ValueError(f"sparsejit.filter_conv_bottleneck: stride2 must be in [1, 8]; got "
                         f"{stride2}")
    # conv2's padding is k // 2 for an odd k: (H + 2 (k // 2) - k) // s + 1 = (H - 1) // s + 1
    y = x.new_empty((x.shape[0], c_out, (x.shape[2] - 1) // stride2 + 1,
                     (x.shape[3] - 1) // stride2 + 1))
    if x.shape[1] > 1 and x.shape[2] > 1 and x.shape[3] > 1 and not x.is_contiguous() and \
            x.is_contiguous(memory_format=torch.channels_last):
        y = y.contiguous(memory_format=torch.channels_last)  # as the CPU op does
    return y


def _is_1x1(c, stride: int = 1) -> bool:
    return c.kernel_size == (1, 1) and c.stride == (stride, stride) and \
        c.padding == (0, 0) and c.groups == 1


def bottleneck_problem(conv1, conv2, conv3, shortcut=None) -> Optional[str]:
    """Why the layers cannot run as one fused bottleneck (None when they can)."""
    from sparsejit.families.filter_conv.layers import ResidualPrunedConv2d, PrunedConv2d
    if not (isinstance(conv1, PrunedConv2d) and isinstance(conv2, PrunedConv2d) and
            isinstance(conv3, ResidualPrunedConv2d)):
        return "conv1 and conv2 must be PrunedConv2d and conv3 a ResidualPrunedConv2d"
    c3 = conv3.conv
    if not (_is_1x1(conv1) and _is_1x1(c3)):
        return "conv1 and conv3 must be 1x1, stride 1, unpadded, ungrouped"
    r, s = conv2.kernel_size
    t = conv2.stride[0]
    if r % 2 == 0 or s % 2 == 0 or conv2.stride != (t, t) or not 1 <= t <= 8 or \
            conv2.dilation != (1, 1) or conv2.padding != (r // 2, s // 2) or conv2.groups != 1:
        return ("conv2 must be an odd convolution with padding k // 2, one stride for both "
                "dimensions (1 to 8), undilated, ungrouped")
    if t != 1 and shortcut is None:
        return "a strided block needs its projection shortcut"
    if not (conv1.relu and conv2.relu and conv3.relu):
        return "every layer must end in a ReLU"
    if conv1.out_channels != conv2.in_channels or conv2.out_channels != c3.in_channels:
        return "the channels do not chain"
    if shortcut is None and c3.out_channels != conv1.in_channels:
        return "conv3's channels do not match an identity residual"
    if shortcut is not None:
        if not isinstance(shortcut, PrunedConv2d) or not _is_1x1(shortcut, t) or shortcut.relu:
            return "the shortcut must be a 1x1 PrunedConv2d at conv2's stride, without ReLU"
        if shortcut.in_channels != conv1.in_channels or \
                shortcut.out_channels != c3.out_channels:
            return "the shortcut's channels do not match the block's"
    layers = (conv1, conv2, c3) + (() if shortcut is None else (shortcut,))
    devices = {t.device for c in layers for t in (c.rowptr, c.values)}
    if devices != {torch.device("cpu")}:
        return "the fused op runs on the CPU only"
    return None


class FusedBottleneck(nn.Module):
    """``relu(conv3(relu(conv2(relu(conv1(x)))) + r))`` in one op, r = x or ``shortcut(x)``,
    over bands of `band` output rows (0: the planner's). Inputs the op does not take (another
    device, gradients needed, not 4-D) run the layers one after the other, with the same
    result."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, conv3: nn.Module,
                 shortcut: Optional[nn.Module] = None, band: int = 0):
        super().__init__()
        why = bottleneck_problem(conv1, conv2, conv3, shortcut)
        if why is not None:
            raise ValueError(f"sparsejit.FusedBottleneck: {why}")
        if band < 0:
            raise ValueError(f"sparsejit.FusedBottleneck: band must be >= 0; got {band}")
        self.conv1, self.conv2, self.conv3 = conv1, conv2, conv3
        self.shortcut = shortcut
        self.band = int(band)

    def unfused(self, x: torch.Tensor) -> torch.Tensor:
        r = x if self.shortcut is None else self.shortcut(x)
        return self.conv3(self.conv2(self.conv1(x)), residual=r)

    @restores_type_errors
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.device.type != "cpu" or \
                x.requires_grad or x.dtype not in _FLOATS:
            return self.unfused(x)
        a, b, c, s = self.conv1, self.conv2, self.conv3.conv, self.shortcut
        if s is None:
            return torch.ops.sparsejit.filter_conv_bottleneck(
                x, a.plan, a.rowptr, a.taps, a.values, a.bias, b.plan, b.rowptr, b.taps,
                b.values, b.bias, c.plan, c.rowptr, c.taps, c.values, c.bias, self.band)
        return torch.ops.sparsejit.filter_conv_bottleneck(
            x, a.plan, a.rowptr, a.taps, a.values, a.bias, b.plan, b.rowptr, b.taps, b.values,
            b.bias, c.plan, c.rowptr, c.taps, c.values, c.bias, self.band, s.plan, s.rowptr,
            s.taps, s.values, s.bias, b.stride[0])

    def extra_repr(self) -> str:
        return f"band={self.band or 'auto'}"


class _Chain(nn.Module):
    """The unfused block, as the graph ran it (what the fused module is timed against)."""

    def __init__(self, conv1, conv2, conv3, shortcut=None):
        super().__init__()
        self.conv1, self.conv2, self.conv3, self.shortcut = conv1, conv2, conv3, shortcut

    def forward(self, x):
        r = x if self.shortcut is None else self.shortcut(x)
        return self.conv3(self.conv2(self.conv1(x)), residual=r)


def bottleneck_candidates(gm: torch.fx.GraphModule) -> List[tuple]:
    """(conv1, conv2, conv3, shortcut or None) nodes of every chain x -> conv1 -> conv2 ->
    conv3(., residual=x or shortcut(x)) whose modules make a fused bottleneck, each module
    called once and each intermediate used only by the next layer."""
    modules = dict(gm.named_modules())
    calls = Counter(n.target for n in gm.graph.nodes if n.op == "call_module")

    def module_node(n):
        return isinstance(n, torch.fx.Node) and n.op == "call_module" and calls[n.target] == 1

    found = []
    for n3 in gm.graph.nodes:
        if not module_node(n3) or set(n3.kwargs) != {"residual"} or len(n3.args) != 1:
            continue
        n2 = n3.args[0]
        if not module_node(n2) or len(n2.users) != 1 or len(n2.args) != 1 or n2.kwargs:
            continue
        n1 = n2.args[0]
        if not module_node(n1) or len(n1.users) != 1 or len(n1.args) != 1 or n1.kwargs:
            continue
        x, res, n4 = n1.args[0], n3.kwargs["residual"], None
        if res is not x:  # a projection shortcut of the same input, used only here
            if not module_node(res) or len(res.users) != 1 or len(res.args) != 1 or \
                    res.kwargs or res.args[0] is not x:
                continue
            n4 = res
        if bottleneck_problem(modules[n1.target], modules[n2.target], modules[n3.target],
                              None if n4 is None else modules[n4.target]) is None:
            found.append((n1, n2, n3, n4))
    return found


def apply_bottleneck(gm: torch.fx.GraphModule, nodes: tuple, fused: FusedBottleneck) -> None:
    """Replaces the chain `nodes` by one call of `fused`, stored under conv3's name (the
    layers become its children; the old names of conv1, conv2 and the shortcut are removed)."""
    from sparsejit.families.filter_conv.fold import set_module
    n1, n2, n3, n4 = nodes
    set_module(gm, n3.target, fused)
    with gm.graph.inserting_before(n3):
        new = gm.graph.call_module(n3.target, (n1.args[0],))
    n3.replace_all_uses_with(new)
    for n in (n3, n2, n1, n4):
        if n is not None:
            gm.graph.erase_node(n)
    for n in (n2, n1, n4):
        if n is not None:
            gm.delete_submodule(n.target)


def fuse_bottlenecks(gm: torch.fx.GraphModule, shapes: dict,
                     rewrite: Callable[..., bool]) -> List[str]:
    """sparsify's bottleneck pass: for each candidate chain that the example input reached,
    ``rewrite(name, before, after, shape, dtype)`` decides (by measurement) whether the fused
    module replaces the chain. Returns the names of the fused blocks."""
    modules = dict(gm.named_modules())
    done = []
    for nodes in bottleneck_candidates(gm):
        n1, n2, n3, n4 = nodes
        if n1.target not in shapes or len(shapes[n1.target][0]) != 4:
            continue
        shape, dtype = shapes[n1.target]
        m1, m2, m3 = (modules[n.target] for n in nodes[:3])
        m4 = None if n4 is None else modules[n4.target]
        fused = FusedBottleneck(m1, m2, m3, m4)
        prefix = n3.target.rsplit(".", 1)[0] if "." in n3.target else n3.target
        if rewrite(f"{prefix} bottleneck", _Chain(m1, m2, m3, m4), fused, shape, dtype):
            apply_bottleneck(gm, nodes, fused)
            done.append(n3.target)
    return done
