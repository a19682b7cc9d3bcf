"""TorchSparse 2.0's ``torchsparse.nn`` modules (``import sparsejit.torchsparse.nn as spnn``):
same names, arguments and parameters (``kernel`` ``[K, C_in, C_out]``, ``bias`` ``[C_out]``;
the norms and activations subclass torch's), so TorchSparse state dicts load."""

from __future__ import annotations

import math
import sys

import torch
from torch import nn

from sparsejit.torchsparse.nn import functional
from sparsejit.torchsparse.tensor import SparseTensor, make_ntuple

sys.modules[__name__ + ".functional"] = functional

__all__ = ["Conv3d", "BatchNorm", "ReLU", "LeakyReLU", "GlobalAvgPool", "GlobalMaxPool",
           "functional"]


def _apply(module: nn.Module, fn, input: SparseTensor) -> SparseTensor:
    if not isinstance(input, SparseTensor):
        raise TypeError(f"{type(module).__name__}: input must be a "
                        f"sparsejit.torchsparse.SparseTensor; got {type(input).__name__}")
    return input._derive(fn(input.feats))


class Conv3d(nn.Module):
    """Sparse 3-D convolution (``transposed=True``: back through a strided one's map)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size=3, stride=1,
                 dilation: int = 1, bias: bool = False, transposed: bool = False,
                 config=None) -> None:
        super().__init__()
        if not isinstance(in_channels, int) or not isinstance(out_channels, int) or \
                in_channels < 1 or out_channels < 1:
            raise ValueError(f"Conv3d: in_channels and out_channels must be ints >= 1; got "
                             f"{in_channels!r}, {out_channels!r}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = make_ntuple(kernel_size, 3, "kernel_size")
        self.stride = make_ntuple(stride, 3, "stride")
        for name, v in (("kernel_size", self.kernel_size), ("stride", self.stride)):
            if any(e < 1 for e in v):
                raise ValueError(f"Conv3d: {name} must be >= 1 on every axis; got {v}")
        self.dilation = dilation
        self.transposed = transposed
        self.config = dict(config or {})
        self.kernel_volume = math.prod(self.kernel_size)
        shape = (self.kernel_volume, in_channels, out_channels) if self.kernel_volume > 1 \
            else (in_channels, out_channels)
        self.kernel = nn.Parameter(torch.zeros(shape))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, dilation={self.dilation}, transposed={self.transposed}")

    def reset_parameters(self) -> None:
        n = (self.out_channels if self.transposed else self.in_channels) * self.kernel_volume
        std = 1 / math.sqrt(n)
        with torch.no_grad():
            self.kernel.uniform_(-std, std)
            if self.bias is not None:
                self.bias.uniform_(-std, std)

    def forward(self, input: SparseTensor) -> SparseTensor:
        if not isinstance(input, SparseTensor):
            raise TypeError(f"Conv3d: input must be a sparsejit.torchsparse.SparseTensor; got "
                            f"{type(input).__name__}")
        if input.feats.shape[1] != self.in_channels:
            raise ValueError(f"Conv3d: input has {input.feats.shape[1]} channels but "
                             f"in_channels = {self.in_channels}")
        return functional.conv3d(input, self.kernel, self.kernel_size, self.bias, self.stride,
                                 self.dilation, self.transposed)


class BatchNorm(nn.BatchNorm1d):
    def forward(self, input: SparseTensor) -> SparseTensor:
        return _apply(self, super().forward, input)


class ReLU(nn.ReLU):
    def forward(self, input: SparseTensor) -> SparseTensor:
        return _apply(self, super().forward, input)


class LeakyReLU(nn.LeakyReLU):
    def forward(self, input: SparseTensor) -> SparseTensor:
        return _apply(self, super().forward, input)


class GlobalAvgPool(nn.Module):
    def forward(self, input: SparseTensor) -> torch.Tensor:
        return functional.global_avg_pool(input)


class GlobalMaxPool(nn.Module):
    def forward(self, input: SparseTensor) -> torch.Tensor:
        return functional.global_max_pool(input)
