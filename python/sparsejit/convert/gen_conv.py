"""GENConv without edge features: its messages ``ReLU(x_j) + eps`` depend on the source node
alone, so the aggregation runs on node rows and the adjacency, with no ``[E, F]`` tensor.

* sum / mean / max / min: ``spmm(A, h, reduce)`` with ``h = ReLU(x) + eps`` per node.
* power mean: ``spmm(A, clamp(h)^p, mean)``, clamped, to the power ``1/p``.
* softmax: ``sum_j h_j exp(t h_j - m_i) / sum_j exp(t h_j - m_i)``; the target's maximum
  ``m_i`` cancels, so each channel is shifted by its maximum over all sources ``M`` instead:
  ``u = exp(t h - M)`` per node, then ``spmm(A, h u, sum) / (spmm(A, u, sum) + 1e-16 e^{M -
  m_i})``, exact while no target's terms all underflow: a target whose own maximum lies more
  than 60 below ``M`` in some channel (checked per call, one node-level max SpMM) sends the
  call to the per-edge path instead.

Installed by :mod:`sparsejit.convert.edge_path` on PyG's own ``GENConv`` (exact class) as a
per-instance ``propagate``; every other call (edge features, a sparse adjacency, hooks,
explain, decomposed layers) goes to the class's propagate, i.e. PyG's message and the
per-edge path's aggregate.
"""

from __future__ import annotations

import sys
import types

import torch
from torch import nn

from sparsejit.families.spmm import graph as G
from sparsejit.families.spmm.spmm import spmm

SPREAD = 60.0  # largest shift below the channel's maximum served (exp(-60) ~ 1e-26)
_HOOKS = ("_propagate_forward_pre_hooks", "_propagate_forward_hooks",
          "_message_forward_pre_hooks", "_message_forward_hooks",
          "_aggregate_forward_pre_hooks", "_aggregate_forward_hooks")
_REDUCE = {"SumAggregation": "sum", "MeanAggregation": "mean", "MaxAggregation": "max",
           "MinAggregation": "min"}


def is_gen_conv(m: nn.Module) -> bool:
    mod = sys.modules.get("torch_geometric.nn.conv.gen_conv")
    cls = None if mod is None else getattr(mod, "GENConv", None)
    return cls is not None and type(m) is cls


def install(m: nn.Module) -> None:
    m.__dict__["propagate"] = types.MethodType(propagate, m)


def installed(m: nn.Module) -> bool:
    prop = m.__dict__.get("propagate")
    return getattr(prop, "__func__", None) is propagate


def propagate(self, edge_index, size=None, **kwargs):
    """GENConv's propagate: node-level SpMMs where the call has no edge features."""
    x = kwargs.get("x")
    x_src, x_dst = (x if isinstance(x, (tuple, list)) else (x, None))
    plain = isinstance(edge_index, torch.Tensor) and edge_index.layout == torch.strided and \
        edge_index.dim() == 2 and not type(edge_index).__module__.startswith("torch_geometric")
    if not plain or kwargs.get("edge_attr") is not None or not isinstance(x_src, torch.Tensor) \
            or x_src.dim() != 2 or getattr(self, "_explain", None) or \
            self.decomposed_layers != 1 or any(getattr(self, h) for h in _HOOKS):
        return type(self).propagate(self, edge_index, size=size, **kwargs)
    n_src = x_src.shape[0] if size is None or size[0] is None else size[0]
    n_dst = size[1] if size is not None and size[1] is not None else (
        x_dst.shape[0] if isinstance(x_dst, torch.Tensor) else n_src)
    A, _, _, _ = G.structure(G.edges_of(edge_index, (n_src, n_dst)))
    h = x_src.relu() + self.eps
    agg = self.aggr_module
    kind = type(agg).__name__
    if kind in _REDUCE:
        return spmm(A, h, _REDUCE[kind])
    if kind == "PowerMeanAggregation":
        return _power_mean(agg, A, h)
    out = _softmax(agg, A, h)
    if out is None:  # a target too far below its channel's maximum: per edge
        return type(self).propagate(self, edge_index, size=size, **kwargs)
    return out


def _power_mean(agg, A, h):
    p = agg.p
    if agg.channels != 1:
        p = p.view(-1, agg.channels)
    plain = isinstance(p, (int, float)) and p == 1
    if plain:
        return spmm(A, h, "mean")
    out = spmm(A, h.clamp(min=agg.min_value, max=agg.max_value).pow(p), "mean")
    return out.clamp(min=agg.min_value, max=agg.max_value).pow(1.0 / p)


def _softmax(agg, A, h):
    t = agg.t
    if agg.channels != 1:
        t = t.view(-1, agg.channels)
    a = h if isinstance(t, (int, float)) and t == 1 else h * t
    semi = not agg.learn and agg.semi_grad
    if torch.compiler.is_compiling() or h.dtype == torch.float16:
        return None  # the spread check reads data / exp(-60) underflows in half: per edge
    with torch.no_grad():
        top = a.detach().amax(0, keepdim=True) if a.shape[0] else a.new_zeros(1, a.shape[1])
        own = spmm(A, a.detach(), "max")  # each target's maximum (0 without in-edges)
        has = (A.degree() > 0).unsqueeze(1)
        if bool(((top - own > SPREAD) & has).any()):
            return None
        own = torch.where(has, own, top)  # (no in-edges: 0 / 1e-16, as in PyG)
    with torch.set_grad_enabled(torch.is_grad_enabled() and not semi):
        u = torch.exp(a - top)
        den = spmm(A, u, "sum")
    num = spmm(A, h * u, "sum")
    # PyG divides exp(a - m_i) by its sum plus 1e-16: here both are scaled by exp(m_i - top)
    return num / (den + 1e-16 * torch.exp(own - top))
