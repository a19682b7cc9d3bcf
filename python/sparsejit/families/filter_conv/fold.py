"""BatchNorm folding for ``sparsify(model, x, fold_bn=True)``: a ``BatchNorm2d`` that directly
follows a ``Conv2d`` is folded into the convolution's weight and bias (running statistics, so
eval mode only), and a ReLU that directly follows is fused into the layer (``ConvReLU``, run by
the sparse kernel's epilogue when the layer is converted).

Two ways to find the pairs:
- ``torch.fx.symbolic_trace`` when the model traces: any conv -> bn (-> relu) chain whose
  intermediate results have no other use, the conv and bn modules called once. The result is
  a ``torch.fx.GraphModule``; the original model is left unchanged (its leaf modules are shared,
  but none is modified).
- otherwise, adjacent children of every ``nn.Sequential``: ``Conv2d, BatchNorm2d[, ReLU]``,
  rewritten in place (the BatchNorm and ReLU slots become ``nn.Identity``).
"""

from __future__ import annotations

import operator
from collections import Counter
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn


def fold_bn(weight: torch.Tensor, bias: Optional[torch.Tensor], bn: nn.BatchNorm2d):
    """Weight and bias of a conv followed by bn (running statistics, as in eval mode)."""
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("sparsejit.PrunedConv2d.from_dense: bn must track running statistics")
    if bn.num_features != weight.shape[0]:
        raise ValueError(f"sparsejit.PrunedConv2d.from_dense: bn has {bn.num_features} "
                         f"features but the convolution has {weight.shape[0]} output channels")
    inv = torch.rsqrt(bn.running_var.double() + bn.eps)
    gamma = bn.weight.double() if bn.weight is not None else torch.ones_like(inv)
    beta = bn.bias.double() if bn.bias is not None else torch.zeros_like(inv)
    scale = gamma * inv
    b = bias.double() if bias is not None else torch.zeros_like(inv)
    new_w = (weight.double() * scale.view(-1, 1, 1, 1)).to(weight.dtype)
    new_b = ((b - bn.running_mean.double()) * scale + beta).to(weight.dtype)
    return new_w, new_b


class ConvReLU(nn.Module):
    """A dense Conv2d followed by ReLU: the unit sparsify measures (and converts to
    ``PrunedConv2d(..., relu=True)``) where fold_bn fused a ReLU."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


def fold_conv_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """A new Conv2d computing bn(conv(x)) in eval mode (conv and bn are not modified)."""
    w, b = fold_bn(conv.weight.detach(), None if conv.bias is None else conv.bias.detach(), bn)
    out = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                    conv.padding, conv.dilation, conv.groups, bias=True,
                    padding_mode=conv.padding_mode, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        out.weight.copy_(w)
        out.bias.copy_(b)
    return out.train(conv.training)


_RELU_FUNCTIONS = (torch.relu, torch.relu_, F.relu, F.relu_)


def _is_relu(node: torch.fx.Node, modules: dict, src: torch.fx.Node) -> bool:
    """`node` applies a plain ReLU to `src` and nothing else."""
    if node.op == "call_module":
        return type(modules.get(node.target)) is nn.ReLU and node.args == (src,)
    if node.op == "call_function" and node.target in _RELU_FUNCTIONS:
        return node.args[:1] == (src,) and len(node.args) <= 2 and \
            set(node.kwargs) <= {"inplace"}
    if node.op == "call_method" and node.target in ("relu", "relu_"):
        return node.args == (src,) and not node.kwargs
    return False


def set_module(root: nn.Module, name: str, new: nn.Module) -> None:
    """Replaces the submodule at dotted path `name` of `root` with `new`."""
    *path, leaf = name.split(".")
    parent = root
    for p in path:
        parent = getattr(parent, p)
    setattr(parent, leaf, new)


def _fold_graph(gm: torch.fx.GraphModule) -> Tuple[torch.fx.GraphModule, int, int]:
    modules = dict(gm.named_modules())
    calls = Counter(n.target for n in gm.graph.nodes if n.op == "call_module")
    folded = fused = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or type(modules.get(node.target)) is not nn.Conv2d:
            continue
        if calls[node.target] != 1 or len(node.users) != 1:
            continue
        bn_node = next(iter(node.users))
        if bn_node.op != "call_module" or type(modules.get(bn_node.target)) is not \
                nn.BatchNorm2d or calls[bn_node.target] != 1 or bn_node.args != (node,):
            continue
        unit: nn.Module = fold_conv_bn(modules[node.target], modules[bn_node.target])
        bn_node.replace_all_uses_with(node)
        gm.graph.erase_node(bn_node)
        folded += 1
        if len(node.users) == 1 and _is_relu(next(iter(node.users)), modules, node):
            relu_node = next(iter(node.users))
            relu_node.replace_all_uses_with(node)
            gm.graph.erase_node(relu_node)
            unit = ConvReLU(unit)
            fused += 1
        set_module(gm, node.target, unit)
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm, folded, fused


def _fold_sequential(model: nn.Module) -> Tuple[nn.Module, int, int]:
    folded = fused = 0
    for seq in [m for m in model.modules() if isinstance(m, nn.Sequential)]:
        names = list(seq._modules.keys())
        for i in range(len(names) - 1):
            conv, bn = seq._modules[names[i]], seq._modules[names[i + 1]]
            if type(conv) is not nn.Conv2d or type(bn) is not nn.BatchNorm2d:
                continue
            unit: nn.Module = fold_conv_bn(conv, bn)
            seq._modules[names[i + 1]] = nn.Identity()
            folded += 1
            if i + 2 < len(names) and type(seq._modules[names[i + 2]]) is nn.ReLU:
                seq._modules[names[i + 2]] = nn.Identity()
                unit = ConvReLU(unit)
                fused += 1
            seq._modules[names[i]] = unit
    return model, folded, fused


def fold_batchnorm(model: nn.Module) -> Tuple[nn.Module, int, int]:
    """(model with BatchNorms folded and ReLUs fused, BatchNorms folded, ReLUs fused).
    Raises ValueError if a BatchNorm2d is in training mode (its batch statistics cannot be
    folded)."""
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training:
            raise ValueError(f"sparsejit.sparsify: fold_bn needs the model in eval mode; "
                             f"BatchNorm {name!r} is in training mode (call model.eval())")
    try:
        gm = torch.fx.symbolic_trace(model)
    except Exception:  # noqa: BLE001  (any tracing failure: data-dependent control flow, ...)
        return _fold_sequential(model)
    return _fold_graph(gm)


# ---- after the per-layer decisions (sparsify(..., fold_bn=True), fuse=True) ----------------
# Two rewrites of the traced graph that change no result beyond float rounding order of the
# dense convolution's own library: a residual add and its ReLU move into a sparse
# convolution's output write, and a dense convolution followed by a max pool (the CNN stem)
# runs on channels_last with the ReLU after the pool.

_ADDS = (operator.add, operator.iadd, torch.add)


def _add_operands(node: torch.fx.Node):
    """(a, b) when `node` is a plain a + b of two graph values, else None."""
    if node.op == "call_function" and node.target in _ADDS and len(node.args) == 2 and \
            not node.kwargs:
        a, b = node.args
    elif node.op == "call_method" and node.target in ("add", "add_") and len(node.args) == 2 \
            and not node.kwargs:
        a, b = node.args
    else:
        return None
    if isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node):
        return a, b
    return None


class ConvPool(nn.Module):
    """A dense convolution (its ReLU fused by fold_bn, or none) followed by a MaxPool2d, run on
    channels_last: PyTorch's CPU max pool is several times faster there than on NCHW, and
    oneDNN's convolution is too. The ReLU runs after the pool, on a quarter of the elements
    (max and ReLU commute: relu(max(a, b)) == max(relu(a), relu(b)), NaN included). The result
    is handed back in the input's memory format. sparsify uses it where it measures faster."""

    def __init__(self, conv: nn.Module, relu: bool, pool: nn.MaxPool2d):
        super().__init__()
        self.conv, self.relu, self.pool = conv, bool(relu), pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:  # unbatched input: the plain order (channels_last needs 4 dims)
            y = self.conv(x)
            return self.pool(torch.relu(y) if self.relu else y)
        nchw = x.is_contiguous()
        y = self.pool(self.conv(x.contiguous(memory_format=torch.channels_last)))
        if self.relu:
            y = torch.relu_(y)
        return y.contiguous() if nchw else y


class ChannelsLastPool(nn.Module):
    """A MaxPool2d run on a channels_last copy of an NCHW input, the result handed back as
    NCHW: PyTorch's CPU max pool is several times faster on channels_last, enough to pay for
    the two copies on large maps (sparsify measures it per shape). Other inputs (already
    channels_last, unbatched, one channel) go to the pool as they are. The same values: a
    max pool only selects."""

    def __init__(self, pool: nn.MaxPool2d):
        super().__init__()
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] < 2 or not x.is_contiguous():
            return self.pool(x)
        return self.pool(x.contiguous(memory_format=torch.channels_last)).contiguous()


def conv_pool_candidates(gm: torch.fx.GraphModule):
    """(conv node, pool node) pairs of the graph: a dense Conv2d or ConvReLU module called once
    whose only use is a MaxPool2d module (called once, without indices)."""
    modules = dict(gm.named_modules())
    calls = Counter(n.target for n in gm.graph.nodes if n.op == "call_module")
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_module" or not isinstance(modules.get(node.target), nn.MaxPool2d):
            continue
        pool = modules[node.target]
        src = node.args[0] if len(node.args) == 1 and not node.kwargs else None
        if pool.return_indices or calls[node.target] != 1 or not isinstance(src, torch.fx.Node):
            continue
        unit = modules.get(src.target) if src.op == "call_module" else None
        if type(unit) not in (nn.Conv2d, ConvReLU) or calls[src.target] != 1 or \
                len(src.users) != 1 or len(src.args) != 1 or src.kwargs:
            continue
        out.append((src, node))
    return out


def apply_conv_pool(gm: torch.fx.GraphModule, conv_node: torch.fx.Node,
                    pool_node: torch.fx.Node) -> None:
    """Replaces the pair by one ConvPool module (at the conv's name)."""
    modules = dict(gm.named_modules())
    unit = modules[conv_node.target]
    conv, relu = (unit.conv, True) if isinstance(unit, ConvReLU) else (unit, False)
    set_module(gm, conv_node.target, ConvPool(conv, relu, modules[pool_node.target]))
    pool_node.replace_all_uses_with(conv_node)
    gm.graph.erase_node(pool_node)


def fuse_residual(gm: torch.fx.GraphModule, wrap) -> List[str]:
    """relu(conv(x) + r) -> fused(x, residual=r) for every conv module for which `wrap(module)`
    returns a fused module (taking ``(x, residual=...)``, ReLU after the residual:
    layers.ResidualPrunedConv2d), the conv called once, its result used only by the add, the
    add's only use a ReLU. Returns the names of the fused convolutions."""
    modules = dict(gm.named_modules())
    calls = Counter(n.target for n in gm.graph.nodes if n.op == "call_module")
    fused = []
    for node in list(gm.graph.nodes):
        ab = _add_operands(node)
        if ab is None or len(node.users) != 1:
            continue
        relu_node = next(iter(node.users))
        if not _is_relu(relu_node, modules, node):
            continue
        for conv_node, other in (ab, ab[::-1]):
            mod = modules.get(conv_node.target) if conv_node.op == "call_module" else None
            if mod is None or calls[conv_node.target] != 1 or len(conv_node.users) != 1 or \
                    len(conv_node.args) != 1 or conv_node.kwargs or conv_node is other:
                continue
            unit = wrap(mod)
            if unit is None:
                continue
            set_module(gm, conv_node.target, unit)
            with gm.graph.inserting_before(node):
                new = gm.graph.call_module(conv_node.target, (conv_node.args[0],),
                                           {"residual": other})
            relu_node.replace_all_uses_with(new)
            gm.graph.erase_node(relu_node)
            gm.graph.erase_node(node)
            gm.graph.erase_node(conv_node)
            fused.append(conv_node.target)
            break
    return fused


# F.max_pool2d's arguments after the input, in its order (torch.max_pool2d: the first five).
_POOL_ARGS = ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")


def _constant(v) -> bool:
    return isinstance(v, (bool, int)) or (isinstance(v, (tuple, list)) and
                                          all(isinstance(u, int) for u in v))


def functional_pools_as_modules(gm: torch.fx.GraphModule) -> List[str]:
    """Each ``F.max_pool2d`` / ``torch.max_pool2d`` call of the graph with constant arguments
    (and no indices) becomes a call of an ``nn.MaxPool2d`` module with the same arguments,
    the same computation (the module calls F.max_pool2d), so the fusion pass measures and
    rewrites it like a pool module. Returns the new modules' names."""
    made = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (F.max_pool2d, torch.max_pool2d):
            continue
        names = _POOL_ARGS if node.target is F.max_pool2d else _POOL_ARGS[:5]
        if not node.args or len(node.args) - 1 > len(names) or \
                not set(node.kwargs) <= set(names):
            continue
        given = dict(zip(names, node.args[1:]), **node.kwargs)
        if "kernel_size" not in given or given.get("return_indices", False) or \
                not all(_constant(v) or v is None for v in given.values()):
            continue
        stride = given.get("stride")
        pool = nn.MaxPool2d(given["kernel_size"], stride if stride not in (None, [], ()) else None,
                            given.get("padding", 0), given.get("dilation", 1),
                            ceil_mode=bool(given.get("ceil_mode", False)))
        name, k = "max_pool2d_fn", 0
        while hasattr(gm, name):
            k += 1
            name = f"max_pool2d_fn_{k}"
        gm.add_submodule(name, pool)
        with gm.graph.inserting_before(node):
            call = gm.graph.call_module(name, (node.args[0],))
        node.replace_all_uses_with(call)
        gm.graph.erase_node(node)
        made.append(name)
    if made:
        gm.graph.lint()
        gm.recompile()
    return made


def finish(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm


__all__ = ["ConvReLU", "ConvPool", "ChannelsLastPool", "fold_conv_bn", "fold_batchnorm"]
