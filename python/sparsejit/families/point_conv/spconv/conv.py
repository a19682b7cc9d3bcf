"""spconv 2.x convolution modules on sparsejit's kernel maps and gather-GEMM-scatter core.

Same constructor arguments, ``indice_key`` behaviour and weight layout
(``[out_channels, *kernel_size, in_channels]``) as spconv.pytorch, so a model written for
spconv runs by changing its import and loads an spconv state dict.
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch
from torch import nn

from sparsejit.families.point_conv.ops import point_conv
from sparsejit.families.point_conv.spconv.core import IndiceData, SparseConvTensor


def _tuple(v, ndim: int, name: str) -> List[int]:
    if isinstance(v, int):
        return [v] * ndim
    v = [int(e) for e in v]
    if len(v) != ndim:
        raise ValueError(f"{name} must be an int or {ndim} ints; got {v}")
    return v


class SparseModule(nn.Module):
    """Marks modules that take and return a SparseConvTensor (spconv.pytorch.SparseModule)."""


def conv_output_shape(shape, ksize, stride, padding, dilation) -> List[int]:
    out = [(s + 2 * p - d * (k - 1) - 1) // st + 1
           for s, k, st, p, d in zip(shape, ksize, stride, padding, dilation)]
    if any(o <= 0 for o in out):
        raise ValueError(f"convolution output spatial shape {out} is empty for input shape "
                         f"{list(shape)}, kernel {ksize}, stride {stride}, padding {padding}, "
                         f"dilation {dilation}")
    return out


def deconv_output_shape(shape, ksize, stride, padding, dilation) -> List[int]:
    return [(s - 1) * st - 2 * p + d * (k - 1) + 1
            for s, k, st, p, d in zip(shape, ksize, stride, padding, dilation)]


class SparseConvolution(SparseModule):
    def __init__(self, ndim: int, in_channels: int, out_channels: int, kernel_size=3,
                 stride=1, padding=0, dilation=1, groups: int = 1, bias: bool = True,
                 subm: bool = False, output_padding=0, transposed: bool = False,
                 inverse: bool = False, indice_key: Optional[str] = None, algo=None,
                 fp32_accum=None, record_voxel_count: bool = False,
                 large_kernel_fast_algo: bool = False, name=None):
        super().__init__()
        if groups != 1:
            raise NotImplementedError("sparsejit.spconv: groups != 1 is not supported")
        if inverse and indice_key is None:
            raise ValueError("SparseInverseConv needs the indice_key of the SparseConv it "
                             "inverts")
        self.ndim = ndim
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _tuple(kernel_size, ndim, "kernel_size")
        self.stride = _tuple(stride, ndim, "stride")
        self.padding = _tuple(padding, ndim, "padding")
        self.dilation = _tuple(dilation, ndim, "dilation")
        self.output_padding = _tuple(output_padding, ndim, "output_padding")
        if any(self.output_padding):
            raise NotImplementedError("sparsejit.spconv: output_padding != 0 is not supported")
        if subm:
            if any(k % 2 == 0 for k in self.kernel_size):
                raise ValueError(f"SubMConv needs odd kernel sizes; got {self.kernel_size}")
            self.stride = [1] * ndim
        self.groups = groups
        self.subm, self.transposed, self.inverse = subm, transposed, inverse
        self.indice_key = indice_key
        self.algo, self.fp32_accum, self.name = algo, fp32_accum, name
        # How the sums are computed (same results): "auto", "gather_gemm_scatter" or
        # "output_stationary" (see sparsejit.families.point_conv.ops).
        self.dataflow = "auto"
        self.weight = nn.Parameter(torch.empty(out_channels, *self.kernel_size, in_channels))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    @property
    def kernel_volume(self) -> int:
        return math.prod(self.kernel_size)

    def reset_parameters(self) -> None:
        fan_in = self.in_channels * self.kernel_volume
        bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        nn.init.uniform_(self.weight, -bound, bound)  # kaiming_uniform(a=sqrt(5)), as torch
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}")
        return s + (f", indice_key={self.indice_key!r}" if self.indice_key else "")

    def _kernel_weight(self) -> torch.Tensor:
        # [out, *k, in] -> [K, in, out]
        return self.weight.reshape(self.out_channels, self.kernel_volume,
                                   self.in_channels).permute(1, 2, 0)

    def forward(self, x: SparseConvTensor) -> SparseConvTensor:
        return self.fused_forward(x)

    def fused_forward(self, x: SparseConvTensor, relu: bool = False,
                      bn: Optional[nn.BatchNorm1d] = None) -> SparseConvTensor:
        """forward, optionally followed by an eval-mode BatchNorm1d folded into the weight and
        bias of this call (`bn`), and a ReLU fused into the convolution's pass (`relu`):
        what SparseSequential runs for ``conv, [BatchNorm1d,] ReLU`` runs of its children."""
        weight, bias = self._kernel_weight(), self.bias
        if bn is not None:  # y * g / sqrt(v + eps) + (beta - m * g / sqrt(v + eps))
            scale = bn.weight / torch.sqrt(bn.running_var + bn.eps) if bn.affine else \
                torch.rsqrt(bn.running_var + bn.eps)
            shift = (bn.bias if bn.affine else 0) - bn.running_mean * scale
            weight = weight * scale.to(weight.dtype)
            bias = (shift if bias is None else bias * scale + shift).to(weight.dtype)
        return self._conv(x, weight, bias, relu)

    def _conv(self, x: SparseConvTensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
              relu: bool) -> SparseConvTensor:
        if not isinstance(x, SparseConvTensor):
            raise TypeError(f"{type(self).__name__} expects a SparseConvTensor; got "
                            f"{type(x).__name__}")
        if x.features.shape[1] != self.in_channels:
            raise ValueError(f"{type(self).__name__}: input has {x.features.shape[1]} channels "
                             f"but the layer expects in_channels = {self.in_channels}")
        if len(x.spatial_shape) != self.ndim:
            raise ValueError(f"{type(self).__name__} is {self.ndim}-D but the input has "
                             f"spatial_shape {x.spatial_shape}")
        geometry = (self.kernel_size, self.stride, self.padding, self.dilation)
        if self.inverse:
            data = x.find_indice_pair(self.indice_key)
            if data is None or data.is_subm:
                raise KeyError(f"SparseInverseConv: indice_key {self.indice_key!r} does not name "
                               "a strided SparseConv applied earlier to this tensor's ancestors")
            if data.ksize != self.kernel_size:
                raise ValueError(f"SparseInverseConv: kernel_size {self.kernel_size} differs "
                                 f"from the inverted conv's {data.ksize}")
            y = point_conv(x.features, weight, bias, data.plan, data.indices.shape[0],
                            swap=True, dataflow=self.dataflow, relu=relu)
            out = SparseConvTensor(y, data.indices, data.spatial_shape, x.batch_size,
                                   x.grid, x.voxel_num, x.indice_dict, x.benchmark)
            return out
        data = x.find_indice_pair(self.indice_key)
        if data is not None and data.is_subm == self.subm and not self.transposed and \
                data.indices.shape[0] == x.indices.shape[0] and \
                [data.ksize, data.stride, data.padding, data.dilation] == list(geometry):
            plan, out_indices, out_shape = data.plan, data.out_indices, data.out_spatial_shape
        else:
            if self.subm:
                kind, out_shape = "subm", list(x.spatial_shape)
            elif self.transposed:
                kind, out_shape = "transposed", deconv_output_shape(x.spatial_shape, *geometry)
            else:
                kind, out_shape = "spconv", conv_output_shape(x.spatial_shape, *geometry)
            plan, out_indices = x.plan(kind, *geometry)
            if self.indice_key is not None and data is None:
                x.indice_dict[self.indice_key] = IndiceData(
                    out_indices, x.indices, plan, list(x.spatial_shape), out_shape, self.subm,
                    *[list(g) for g in geometry])
        y = point_conv(x.features, weight, bias, plan, out_indices.shape[0],
                        dataflow=self.dataflow, relu=relu)
        if self.subm:
            out = x.replace_feature(y)
        else:
            out = SparseConvTensor(y, out_indices, out_shape, x.batch_size, x.grid,
                                   x.voxel_num, x.indice_dict, x.benchmark)
        return out


def _variant(name: str, ndim: int, **flags):
    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, indice_key=None, algo=None,
                 fp32_accum=None, large_kernel_fast_algo=False, name=None):
        SparseConvolution.__init__(self, ndim, in_channels, out_channels, kernel_size, stride,
                                   padding, dilation, groups, bias, indice_key=indice_key,
                                   algo=algo, fp32_accum=fp32_accum, name=name, **flags)
    return type(name, (SparseConvolution,), {"__init__": __init__})


def _inverse_variant(name: str, ndim: int):
    def __init__(self, in_channels, out_channels, kernel_size, indice_key=None, bias=True,
                 algo=None, fp32_accum=None, large_kernel_fast_algo=False, name=None):
        SparseConvolution.__init__(self, ndim, in_channels, out_channels, kernel_size,
                                   bias=bias, inverse=True, indice_key=indice_key, algo=algo,
                                   fp32_accum=fp32_accum, name=name)
    return type(name, (SparseConvolution,), {"__init__": __init__})


SubMConv1d = _variant("SubMConv1d", 1, subm=True)
SubMConv2d = _variant("SubMConv2d", 2, subm=True)
SubMConv3d = _variant("SubMConv3d", 3, subm=True)
SubMConv4d = _variant("SubMConv4d", 4, subm=True)
SparseConv1d = _variant("SparseConv1d", 1)
SparseConv2d = _variant("SparseConv2d", 2)
SparseConv3d = _variant("SparseConv3d", 3)
SparseConv4d = _variant("SparseConv4d", 4)
SparseConvTranspose1d = _variant("SparseConvTranspose1d", 1, transposed=True)
SparseConvTranspose2d = _variant("SparseConvTranspose2d", 2, transposed=True)
SparseConvTranspose3d = _variant("SparseConvTranspose3d", 3, transposed=True)
SparseInverseConv1d = _inverse_variant("SparseInverseConv1d", 1)
SparseInverseConv2d = _inverse_variant("SparseInverseConv2d", 2)
SparseInverseConv3d = _inverse_variant("SparseInverseConv3d", 3)
