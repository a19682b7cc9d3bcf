"""spconv 2.x container and utility modules: SparseSequential, ToDense, SparseMaxPool."""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional

import torch
from torch import nn

from sparsejit.families.point_conv.ops import plan_pairs
from sparsejit.families.point_conv.spconv.conv import SparseModule, _tuple, conv_output_shape
from sparsejit.families.point_conv.spconv.core import IndiceData, SparseConvTensor


def is_spconv_module(module: nn.Module) -> bool:
    return isinstance(module, SparseModule)


class SparseSequential(SparseModule):
    """nn.Sequential for sparse tensors: sparse modules take the SparseConvTensor, every
    other module (BatchNorm1d, ReLU, ...) is applied to its features."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for idx, module in enumerate(args):
                self.add_module(str(idx), module)
        for name, module in kwargs.items():
            if name in self._modules:
                raise ValueError(f"SparseSequential: name {name!r} already exists")
            self.add_module(name, module)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return SparseSequential(OrderedDict(list(self._modules.items())[idx]))
        if not -len(self) <= idx < len(self):
            raise IndexError(f"index {idx} is out of range")
        return list(self._modules.values())[idx]

    def __len__(self) -> int:
        return len(self._modules)

    def add(self, module: nn.Module, name: Optional[str] = None) -> None:
        self.add_module(str(len(self._modules)) if name is None else name, module)

    def forward(self, input):
        mods = list(self._modules.values())
        k = 0
        while k < len(mods):
            module = mods[k]
            fused = _fusable(mods, k, input)
            if fused is not None:  # conv [, eval BatchNorm1d], ReLU as one convolution call
                bn, used = fused
                input = module.fused_forward(input, relu=True, bn=bn)
                k += used
                continue
            if is_spconv_module(module):
                input = module(input)
            elif isinstance(input, SparseConvTensor):
                if input.indices.shape[0] != 0:
                    input = input.replace_feature(module(input.features))
            else:
                input = module(input)
            k += 1
        return input


def _fusable(mods, k, x):
    """(eval BatchNorm1d or None, modules consumed) when mods[k:] starts with a sparse
    convolution followed by a ReLU (directly, or through a BatchNorm1d in eval mode, which is
    then folded), else None. Hooks on the fused children would not run, so modules that have
    any are left alone."""
    from sparsejit.families.point_conv.spconv.conv import SparseConvolution

    conv = mods[k]
    if not isinstance(conv, SparseConvolution) or not isinstance(x, SparseConvTensor):
        return None
    nxt = mods[k + 1] if k + 1 < len(mods) else None
    if type(nxt) is nn.BatchNorm1d and not nxt.training and nxt.track_running_stats and \
            k + 2 < len(mods) and type(mods[k + 2]) is nn.ReLU:
        bn, relu, used = nxt, mods[k + 2], 3
    elif type(nxt) is nn.ReLU:
        bn, relu, used = None, nxt, 2
    else:
        return None
    for m in (conv, bn, relu):
        if m is not None and (m._forward_hooks or m._forward_pre_hooks):
            return None
    return bn, used


class ToDense(SparseModule):
    """SparseConvTensor -> dense ``[B, C, *spatial]``."""

    def forward(self, x: SparseConvTensor) -> torch.Tensor:
        return x.dense()


class SparseMaxPool(SparseModule):
    """Max over each output site's receptive field (spconv's output sites); sites of a field
    without inputs do not exist, so every output has at least one input."""

    def __init__(self, ndim: int, kernel_size=3, stride=None, padding=0, dilation=1,
                 indice_key: Optional[str] = None, subm: bool = False, algo=None, name=None):
        super().__init__()
        self.ndim = ndim
        self.kernel_size = _tuple(kernel_size, ndim, "kernel_size")
        self.stride = self.kernel_size if stride is None else _tuple(stride, ndim, "stride")
        self.padding = _tuple(padding, ndim, "padding")
        self.dilation = _tuple(dilation, ndim, "dilation")
        self.indice_key, self.subm = indice_key, subm

    def forward(self, x: SparseConvTensor) -> SparseConvTensor:
        geometry = (self.kernel_size, self.stride, self.padding, self.dilation)
        out_shape = conv_output_shape(x.spatial_shape, *geometry)
        plan, out_indices = x.plan("spconv", *geometry)
        if self.indice_key is not None and self.indice_key not in x.indice_dict:
            x.indice_dict[self.indice_key] = IndiceData(
                out_indices, x.indices, plan, list(x.spatial_shape), out_shape, False,
                *[list(g) for g in geometry])
        _, in_idx, out_idx = plan_pairs(plan)
        feats = x.features
        c = feats.shape[1]
        y = feats.new_full((out_indices.shape[0], c), float("-inf"))
        y = y.scatter_reduce(0, out_idx[:, None].expand(-1, c), feats[in_idx], "amax",
                             include_self=True)
        return SparseConvTensor(y, out_indices, out_shape, x.batch_size, x.grid, x.voxel_num,
                                x.indice_dict, x.benchmark)


def _pool(name: str, ndim: int):
    def __init__(self, kernel_size=3, stride=None, padding=0, dilation=1, indice_key=None,
                 algo=None, name=None):
        SparseMaxPool.__init__(self, ndim, kernel_size, stride, padding, dilation, indice_key)
    return type(name, (SparseMaxPool,), {"__init__": __init__})


SparseMaxPool1d = _pool("SparseMaxPool1d", 1)
SparseMaxPool2d = _pool("SparseMaxPool2d", 2)
SparseMaxPool3d = _pool("SparseMaxPool3d", 3)
