"""Pruned Conv2d / Linear inference with filter-sparse kernels: the modules ``sparsify``
(sparsejit.families.filter_conv.tuner) puts where the sparse kernel measures faster.

``PrunedConv2d.from_dense(conv, bn=None, threshold=0.0, relu=False)`` keeps the nonzeros of
``conv.weight`` (BatchNorm folded in first), and runs ``sparsejit::filter_conv``. Inference only:
the modules hold buffers, not parameters, and no gradient flows to the weight or the input.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from sparsejit._library import restores_type_errors
from torch import nn

from sparsejit.families.filter_conv.fold import fold_bn as _fold_bn
from sparsejit.families.filter_conv.ops import VARIANTS, output_size
from sparsejit.runtime.caches import own


def _pair(v) -> Tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


class PrunedConv2d(nn.Module):
    """A Conv2d whose weight's zeros are skipped: the weight compressed per output channel
    (``sparsejit::filter_conv_plan``), bias and an optional ReLU fused into the output write.
    Accepts NCHW or channels_last input of any float dtype (computed in float32; bfloat16
    read and written by the kernel itself, float16 and float64 results converted back);
    returns NCHW. The compressed weight is built
    on the host and its buffers placed on `weight`'s device; on a GPU the op runs the CUDA
    kernel (kernels/cuda/filter_conv.cuh; float32 accumulation, results in x's dtype)."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, stride=1,
                 padding=0, dilation=1, groups: int = 1, relu: bool = False,
                 threshold: float = 0.0, kernel: str = "auto"):
        super().__init__()
        if not isinstance(weight, torch.Tensor) or weight.dim() != 4:
            raise ValueError("sparsejit.PrunedConv2d: weight must be a 4-D tensor [C_out, "
                             "C_in/groups, R, S]")
        if kernel not in VARIANTS:
            raise ValueError(f"sparsejit.PrunedConv2d: kernel must be one of {list(VARIANTS)}; "
                             f"got {kernel!r}")
        if groups < 1 or weight.shape[0] % groups:
            raise ValueError(f"sparsejit.PrunedConv2d: groups ({groups}) must divide "
                             f"out_channels ({weight.shape[0]})")
        w = weight.detach().cpu()
        plan, rowptr, taps, values = torch.ops.sparsejit.filter_conv_plan(
            w, float(threshold), VARIANTS[kernel])
        dev = weight.device
        self.register_buffer("plan", plan.to(dev))
        self.register_buffer("rowptr", rowptr.to(dev))
        self.register_buffer("taps", taps.to(dev))
        self.register_buffer("values", values.to(dev))
        # Validated once while this layer lives (runtime.caches.own).
        own(self, self.plan, self.rowptr, self.taps, self.values)
        self.register_buffer("bias", None if bias is None else bias.detach().to(dev).float())
        self.out_channels = int(weight.shape[0])
        self.in_channels = int(weight.shape[1]) * groups
        self.kernel_size = _pair(tuple(weight.shape[2:]))
        self.stride, self.padding, self.dilation = _pair(stride), _pair(padding), _pair(dilation)
        self.groups = int(groups)
        self.relu = bool(relu)
        self.kernel = kernel

    @classmethod
    def from_dense(cls, conv: nn.Conv2d, bn: Optional[nn.BatchNorm2d] = None,
                   threshold: float = 0.0, relu: bool = False,
                   kernel: str = "auto") -> "PrunedConv2d":
        """The sparse twin of `conv` (followed by `bn`, folded in, and ReLU when `relu`);
        entries with magnitude <= `threshold` are dropped as well as zeros."""
        if not isinstance(conv, nn.Conv2d):
            raise TypeError(f"sparsejit.PrunedConv2d.from_dense: conv must be an nn.Conv2d; "
                            f"got {type(conv).__name__}")
        if conv.padding_mode != "zeros":
            raise ValueError("sparsejit.PrunedConv2d.from_dense: only padding_mode='zeros' is "
                             f"supported; got {conv.padding_mode!r}")
        padding = conv.padding
        if isinstance(padding, str):
            if padding == "valid":
                padding = (0, 0)
            else:  # 'same' (stride 1): symmetric only
                tot = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size)]
                if any(t % 2 for t in tot):
                    raise ValueError("sparsejit.PrunedConv2d.from_dense: padding='same' needs "
                                     "asymmetric padding for this kernel; not supported")
                padding = tuple(t // 2 for t in tot)
        weight, bias = conv.weight.detach(), conv.bias
        if bn is not None:
            weight, bias = _fold_bn(weight, None if bias is None else bias.detach(), bn)
        return cls(weight, bias, conv.stride, padding, conv.dilation, conv.groups, relu,
                   threshold, kernel)

    @property
    def nnz(self) -> int:
        return int(self.taps.shape[0])

    @property
    def sparsity(self) -> float:
        total = self.out_channels * (self.in_channels // self.groups) * \
            self.kernel_size[0] * self.kernel_size[1]
        return 1.0 - self.nnz / max(total, 1)

    def set_kernel(self, kernel: str) -> "PrunedConv2d":
        """Makes `kernel` (a name in ops.filter_conv.VARIANTS) the plan's variant (the plan's
        kernel word; saved with the state dict). sparsify sets the measured winner."""
        if kernel not in VARIANTS:
            raise ValueError(f"sparsejit.PrunedConv2d: kernel must be one of {list(VARIANTS)}; "
                             f"got {kernel!r}")
        self.plan[3] = VARIANTS[kernel]  # plan_header.h: kWordKernel
        self.kernel = kernel
        return self

    @restores_type_errors
    def forward(self, x: torch.Tensor, variant: int = -1,
                residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        """`variant` >= 0 forces a variant (ops.filter_conv.VARIANTS; tests, measurement).
        `residual` (the output's shape, e.g. a ResNet block's identity) is added in the
        output write, after the bias and before the ReLU: ``relu(conv(x) + bias +
        residual)`` in one pass (what ``sparsify(..., fold_bn=True)`` fuses)."""
        return self._op(x, self.relu, variant, residual)

    def _op(self, x: torch.Tensor, relu: bool, variant: int,
            residual: Optional[torch.Tensor]) -> torch.Tensor:
        return torch.ops.sparsejit.filter_conv(
            self.plan, self.rowptr, self.taps, self.values, x, self.bias, list(self.kernel_size),
            list(self.stride), list(self.padding), list(self.dilation), self.groups, relu,
            variant, residual)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"groups={self.groups}, relu={self.relu}, sparsity={self.sparsity:.3f}")


class ResidualPrunedConv2d(nn.Module):
    """``relu(conv(x) + residual)`` (ReLU optional) with the add and the ReLU in the sparse
    kernel's output write: no separate pass over the output, no extra tensor. What
    ``sparsify(..., fold_bn=True)`` makes of a ResNet block's last convolution, its residual
    add and ReLU. A residual that is not of the output's shape, dtype and device (a
    broadcasting add) takes the unfused path, with the same result."""

    def __init__(self, conv: "PrunedConv2d", relu: bool = True):
        super().__init__()
        if not isinstance(conv, PrunedConv2d) or conv.relu:
            raise ValueError("sparsejit.ResidualPrunedConv2d: conv must be a PrunedConv2d "
                             "without its own ReLU (the ReLU follows the residual)")
        self.conv, self.relu = conv, bool(relu)

    @restores_type_errors
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        c = self.conv
        if isinstance(x, torch.Tensor) and x.dim() == 4 and \
                isinstance(residual, torch.Tensor) and residual.dtype == x.dtype and \
                residual.device == x.device:
            oh, ow = output_size(x.shape[2], x.shape[3], c.kernel_size, c.stride, c.padding,
                                 c.dilation)
            if tuple(residual.shape) == (x.shape[0], c.out_channels, oh, ow):
                return c._op(x, self.relu, -1, residual)
        y = c(x) + residual
        return torch.relu(y) if self.relu else y

    def extra_repr(self) -> str:
        return f"relu={self.relu}"


class SparseLinear(nn.Module):
    """A Linear layer run as a 1x1 filter-sparse convolution: the rows of the input are the
    pixels of one image, ``Y^T [out, M] = W_sparse [out, in] . X^T [in, M]``."""

    def __init__(self, linear: nn.Linear, threshold: float = 0.0):
        super().__init__()
        w = linear.weight.detach()
        self.conv = PrunedConv2d(w.view(w.shape[0], w.shape[1], 1, 1), linear.bias,
                                 threshold=threshold)
        self.in_features, self.out_features = int(w.shape[1]), int(w.shape[0])

    @property
    def sparsity(self) -> float:
        return self.conv.sparsity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"sparsejit.SparseLinear: input has {x.shape[-1]} features; "
                             f"expected {self.in_features}")
        lead = x.shape[:-1]
        if x.numel() == 0:  # no rows: nothing to convolve (an empty image is an error there)
            return x.new_empty(*lead, self.out_features)
        xt = x.reshape(-1, self.in_features).t().reshape(1, self.in_features, -1, 1)
        y = self.conv(xt).reshape(self.out_features, -1).t()
        return y.reshape(*lead, self.out_features)


__all__ = ["PrunedConv2d", "SparseLinear", "ResidualPrunedConv2d"]
