"""spconv.pytorch modules swapped for ``sparsejit.spconv``'s (same names, constructor
arguments and weight layout ``[out, *kernel, in]``): the new module holds the spconv
module's own weight and bias tensors. A converted module takes spconv's own
``SparseConvTensor`` too (turned into sparsejit's on the way in), so code outside the model
that builds the input with spconv keeps working. spconv is recognised via ``sys.modules``
and never imported here.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from typing import Optional

import torch
from torch import nn

from sparsejit.convert.pyg import ORIGINAL, Unsupported, _tensors


def _spconv_class(module: str, name: str):
    mod = sys.modules.get(module)
    return None if mod is None else getattr(mod, name, None)


def is_spconv_module(module: nn.Module) -> bool:
    """Whether `module` is one of spconv.pytorch's sparse modules (takes a SparseConvTensor)."""
    base = _spconv_class("spconv.pytorch.modules", "SparseModule")
    return base is not None and isinstance(module, base)


def spconv_kind(module: nn.Module) -> Optional[str]:
    """'conv', 'pool', 'sequential' or 'dense' for a spconv.pytorch module sparsejit.spconv
    has, else None."""
    if not is_spconv_module(module):
        return None
    for kind, where, cls in (("conv", "spconv.pytorch.conv", "SparseConvolution"),
                             ("pool", "spconv.pytorch.pool", "SparseMaxPool"),
                             ("sequential", "spconv.pytorch.modules", "SparseSequential"),
                             ("dense", "spconv.pytorch", "ToDense")):
        c = _spconv_class(where, cls)
        if c is not None and isinstance(module, c):
            return kind
    return None


def blocker(model: nn.Module) -> Optional[str]:
    """Why the spconv modules of `model` cannot all be converted, or None. Sparse tensors
    pass between them, so they are converted all together or not at all."""
    for path, m in model.named_modules():
        if not is_spconv_module(m):
            continue
        kind = spconv_kind(m)
        if kind is None:
            return f"{path or '(model)'} ({type(m).__name__}) has no sparsejit.spconv counterpart"
        if kind == "conv":
            try:
                convert(m, kind)
            except Unsupported as e:
                return f"{path or '(model)'}: {e}"
    return None


def _as_sparsejit_tensor(module, args):
    x = args[0] if args else None
    if x is None or not type(x).__module__.startswith("spconv."):
        return None
    from sparsejit.families.point_conv.spconv.core import SparseConvTensor
    return (SparseConvTensor(x.features, x.indices, list(x.spatial_shape), x.batch_size),
            ) + tuple(args[1:])


def convert(m: nn.Module, kind: str) -> nn.Module:
    """The sparsejit.spconv module for spconv module `m` (its children already converted
    when it is a SparseSequential). Raises Unsupported with the reason."""
    from sparsejit import spconv as sjs
    name = type(m).__name__
    if kind == "conv":
        act = getattr(m, "act_type", None)
        if act is not None and getattr(act, "name", str(act)) not in ("None_", "None"):
            raise Unsupported(f"a fused activation ({act}) sparsejit.spconv does not run")
        if getattr(m, "groups", 1) != 1:
            raise Unsupported(f"groups={m.groups}")
        if any(getattr(m, "output_padding", [0])):
            raise Unsupported(f"output_padding={m.output_padding}")
        try:
            with torch.device("meta"):
                new = sjs.SparseConvolution(
                    m.ndim, m.in_channels, m.out_channels, list(m.kernel_size), list(m.stride),
                    list(m.padding), list(m.dilation), 1, m.bias is not None, m.subm,
                    transposed=m.transposed, inverse=m.inverse, indice_key=m.indice_key,
                    name=m.name)
        except (ValueError, NotImplementedError, TypeError) as e:
            raise Unsupported(str(e)) from None
        variant = getattr(sjs, name, None)
        if isinstance(variant, type) and issubclass(variant, sjs.SparseConvolution):
            new.__class__ = variant  # the variants differ from the base only in __init__
        have = {k: v for k, v in _tensors(new).items() if v[1] is not None}
        want = {k: v for k, v in _tensors(m).items() if v[1] is not None}
        if {k: tuple(v[1].shape) for k, v in have.items()} != \
                {k: tuple(v[1].shape) for k, v in want.items()}:
            shapes = {k: tuple(v[1].shape) for k, v in want.items()}
            raise Unsupported(f"its tensors {shapes} are not sparsejit.spconv's (weight "
                              "[out, *kernel, in], bias [out])")
        for key, (k, t) in want.items():
            getattr(new, k)[key] = t
    elif kind == "pool":
        if getattr(m, "subm", False):
            raise Unsupported("a submanifold max pool")
        new = sjs.SparseMaxPool(m.ndim, list(m.kernel_size), list(m.stride), list(m.padding),
                                list(m.dilation), m.indice_key)
        variant = getattr(sjs, name, None)
        if isinstance(variant, type) and issubclass(variant, sjs.SparseMaxPool):
            new.__class__ = variant
    elif kind == "sequential":
        new = sjs.SparseSequential(OrderedDict(m._modules.items()))
    else:
        new = sjs.ToDense()
    new.train(m.training)
    new.register_forward_pre_hook(_as_sparsejit_tensor)
    new.__dict__[ORIGINAL] = m
    return new


def original_of(new: nn.Module) -> nn.Module:
    """The spconv module `new` replaced, its tensors those `new` holds now."""
    m = new.__dict__[ORIGINAL]
    if new.__class__.__name__ != "SparseSequential":
        for key, (kind, t) in _tensors(new).items():
            if "." not in key and key in getattr(m, kind):
                getattr(m, kind)[key] = t
    m.train(new.training)
    return m
