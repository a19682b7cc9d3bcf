"""PyG conv modules that ``sparsejit.nn`` implements, swapped for its layers.

A PyG module is recognised by its exact class, looked up in ``sys.modules`` (torch_geometric
is never imported here: a model holding PyG modules has imported it already). The sparsejit
layer is built with the PyG module's constructor arguments, read back from its attributes,
on the meta device (no memory, no draw from the user's random generator); then every
parameter and buffer of the PyG module is put into the new layer under the same name: the
same tensor objects, so optimizers, tensor hooks, ``state_dict`` keys and ``load_state_dict``
keep working. Anything that would change the maths (an aggregation or flow sparsejit lacks,
PyG message-passing hooks, explain mode, lazy sizes, hooks on inner modules) leaves the
module as it was, with the reason.
"""

from __future__ import annotations

import sys
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import nn

# PyG class name -> the sparsejit.nn class name (same names) and the node_dim PyG gives it.
_NODE_DIM = {"GCNConv": -2, "SAGEConv": -2, "GraphConv": -2, "GINConv": -2, "GINEConv": -2,
             "GATConv": 0, "GATv2Conv": 0, "TransformerConv": 0, "RGCNConv": 0,
             "FastRGCNConv": 0, "EdgeConv": -2, "DynamicEdgeConv": -2}
_SUM = ("add", "sum")
_ANY = ("add", "sum", "mean", "max", "min")

# The hook dictionaries of PyG's MessagePassing: sparsejit's layers have no message or
# aggregate step to call them from.
_MP_HOOKS = ("_propagate_forward_pre_hooks", "_propagate_forward_hooks",
             "_message_forward_pre_hooks", "_message_forward_hooks",
             "_aggregate_forward_pre_hooks", "_aggregate_forward_hooks",
             "_message_and_aggregate_forward_pre_hooks", "_message_and_aggregate_forward_hooks",
             "_edge_update_forward_pre_hooks", "_edge_update_forward_hooks")

# nn.Module's per-instance hook dictionaries, handed over to the new layer (shared, so a
# handle taken on the PyG module still removes its hook).
_MODULE_HOOKS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                 "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
                 "_backward_pre_hooks", "_state_dict_hooks", "_state_dict_pre_hooks",
                 "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")

ORIGINAL = "_sparsejit_original"  # instance attribute of a converted layer: the PyG module


class Unsupported(Exception):
    """A configuration sparsejit's layer does not reproduce; the message says which."""


def pyg_conv_name(module: nn.Module) -> Optional[str]:
    """The name of `module`'s class when it is exactly one of torch_geometric's convs that
    sparsejit.nn implements (a user's subclass may change the maths: not matched)."""
    conv = sys.modules.get("torch_geometric.nn.conv")
    if conv is None:
        return None
    for name in _NODE_DIM:
        cls = getattr(conv, name, None)
        if cls is not None and type(module) is cls:
            return name
    return None


def _aggr(m, allowed, name) -> str:
    if not isinstance(m.aggr, str) or m.aggr not in allowed:
        raise Unsupported(f"aggr={m.aggr!r} (sparsejit's {name} takes {', '.join(allowed)})")
    return m.aggr


def _bias(lin) -> bool:
    return getattr(lin, "bias", None) is not None


def _gcn(m):
    _aggr(m, _SUM, "GCNConv")
    return dict(in_channels=m.in_channels, out_channels=m.out_channels, improved=m.improved,
                cached=m.cached, add_self_loops=m.add_self_loops, normalize=m.normalize,
                bias=m.bias is not None)


def _sage(m):
    return dict(in_channels=m.in_channels, out_channels=m.out_channels,
                aggr=_aggr(m, _ANY, "SAGEConv"), normalize=m.normalize,
                root_weight=m.root_weight, project=m.project, bias=_bias(m.lin_l))


def _graph(m):
    return dict(in_channels=m.in_channels, out_channels=m.out_channels,
                aggr=_aggr(m, _ANY, "GraphConv"), bias=_bias(m.lin_rel))


def _gin(m):
    _aggr(m, _SUM, "GINConv")
    return dict(nn=m.nn, eps=float(m.initial_eps), train_eps=isinstance(m.eps, nn.Parameter))


def _gine(m):
    kw = _gin(m)
    kw["edge_dim"] = None if m.lin is None else m.lin.in_channels
    return kw


def _gat(m):
    _aggr(m, _SUM, "GATConv")
    return dict(in_channels=m.in_channels, out_channels=m.out_channels, heads=m.heads,
                concat=m.concat, negative_slope=m.negative_slope, dropout=m.dropout,
                add_self_loops=m.add_self_loops, edge_dim=m.edge_dim, fill_value=m.fill_value,
                bias=m.bias is not None, residual=m.residual)


def _gatv2(m):
    kw = _gat(m)
    kw["share_weights"] = m.share_weights
    return kw


def _transformer(m):
    _aggr(m, _SUM, "TransformerConv")
    return dict(in_channels=m.in_channels, out_channels=m.out_channels, heads=m.heads,
                concat=m.concat, beta=m.beta, dropout=m.dropout, edge_dim=m.edge_dim,
                bias=_bias(m.lin_key), root_weight=m.root_weight)


def _rgcn(m):
    return dict(in_channels=m.in_channels, out_channels=m.out_channels,
                num_relations=m.num_relations, num_bases=m.num_bases,
                num_blocks=m.num_blocks, aggr=_aggr(m, ("mean", "add", "sum"), "RGCNConv"),
                root_weight=m.root is not None, is_sorted=m.is_sorted, bias=m.bias is not None)


def _edge(m):
    return dict(nn=m.nn, aggr=_aggr(m, _ANY, "EdgeConv"))


def _dynamic_edge(m):
    return dict(nn=m.nn, k=m.k, aggr=_aggr(m, _ANY, "DynamicEdgeConv"),
                num_workers=m.num_workers)


_ARGS: Dict[str, Callable[[nn.Module], dict]] = {
    "GCNConv": _gcn, "SAGEConv": _sage, "GraphConv": _graph, "GINConv": _gin,
    "GINEConv": _gine, "GATConv": _gat, "GATv2Conv": _gatv2, "TransformerConv": _transformer,
    "RGCNConv": _rgcn, "FastRGCNConv": _rgcn, "EdgeConv": _edge,
    "DynamicEdgeConv": _dynamic_edge}


def _check_common(m: nn.Module, name: str) -> None:
    if getattr(m, "flow", "source_to_target") != "source_to_target":
        raise Unsupported(f"flow={m.flow!r} (sparsejit's layers pass messages source to target)")
    if getattr(m, "node_dim", _NODE_DIM[name]) != _NODE_DIM[name]:
        raise Unsupported(f"node_dim={m.node_dim} (PyG's default for {name} is "
                          f"{_NODE_DIM[name]})")
    if getattr(m, "_explain", None):
        raise Unsupported("explain mode is on (PyG's explainer masks messages)")
    for h in _MP_HOOKS:
        if getattr(m, h, None):
            raise Unsupported(f"a PyG message-passing hook is registered ({h.strip('_')})")
    for path, p in list(m.named_parameters()) + list(m.named_buffers()):
        if isinstance(p, nn.parameter.UninitializedTensorMixin):
            raise Unsupported(f"{path} is not initialised yet (lazy in_channels=-1): run one "
                              "forward pass first")
    channels = getattr(m, "in_channels", None)
    if channels == -1 or (isinstance(channels, (tuple, list)) and -1 in channels):
        raise Unsupported("in_channels=-1 (lazy sizes): pass the sizes to the PyG layer")
    for path, sub in m.named_modules():
        # GIN's `nn` is the user's own module, kept as it is (with its hooks) by the new layer.
        own = path == "nn" or path.startswith("nn.")
        if path and not own and any(getattr(sub, h, None) for h in _MODULE_HOOKS
                                    if "state_dict" not in h):
            raise Unsupported(f"a hook is registered on its inner module {path!r}")


def _tensors(m: nn.Module) -> Dict[str, Tuple[str, torch.Tensor]]:
    """Every parameter / buffer slot of `m` (shared ones under each name), as
    ``{"sub.path.name": (kind, tensor or None)}``."""
    out = {}
    for path, sub in m.named_modules(remove_duplicate=False):
        for kind in ("_parameters", "_buffers"):
            for name, t in getattr(sub, kind).items():
                out[f"{path}.{name}" if path else name] = (kind, t)
    return out


def convert(m: nn.Module, name: str) -> nn.Module:
    """The sparsejit.nn layer for PyG module `m` (class `name`), holding `m`'s own tensors.
    Raises Unsupported with the reason when it would not compute what `m` computes."""
    from sparsejit import nn as sjnn
    _check_common(m, name)
    kwargs = _ARGS[name](m)
    cls = getattr(sjnn, "RGCNConv" if name == "FastRGCNConv" else name)
    try:
        with torch.device("meta"):
            new = cls(**kwargs)
    except (ValueError, NotImplementedError, TypeError) as e:
        raise Unsupported(str(e)) from None
    have, want = _tensors(new), _tensors(m)
    if {k: (v[0], None if v[1] is None else tuple(v[1].shape)) for k, v in have.items()} != \
            {k: (v[0], None if v[1] is None else tuple(v[1].shape)) for k, v in want.items()}:
        raise Unsupported(f"its parameters {sorted(want)} do not line up with "
                          f"sparsejit.nn.{cls.__name__}'s {sorted(have)}")
    for key, (kind, t) in want.items():
        path, _, leaf = key.rpartition(".")
        getattr(new.get_submodule(path), kind)[leaf] = t
    for sub in new.modules():
        for attr, v in vars(sub).items():
            if isinstance(v, torch.Tensor) and v.is_meta:
                raise Unsupported(f"sparsejit.nn.{cls.__name__} keeps a tensor {attr!r} that "
                                  "the PyG layer has no counterpart of")
    new.train(m.training)
    for h in _MODULE_HOOKS:
        if hasattr(m, h) and hasattr(new, h):
            new.__dict__[h] = getattr(m, h)
    new.__dict__[ORIGINAL] = m
    return new


def original_of(new: nn.Module) -> nn.Module:
    """The PyG module `new` replaced, its tensors brought up to date with `new`'s (``.to()``
    and ``.double()`` replace buffers, and parameters too when torch is told to overwrite
    them)."""
    m = new.__dict__[ORIGINAL]
    have = _tensors(new)
    for key, (kind, _) in _tensors(m).items():
        path, _, leaf = key.rpartition(".")
        if key in have:
            getattr(m.get_submodule(path), kind)[leaf] = have[key][1]
    m.train(new.training)
    return m
