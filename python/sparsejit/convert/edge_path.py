"""The per-edge path: PyG ``MessagePassing`` layers whose messages are not a scaled gather
(GENConv, attention-style layers, users' own) keep PyG's ``propagate`` and ``message``; their
aggregation, and the ``softmax(src, index)`` their message may call, run on sparsejit.

Mechanism: two per-instance overrides, no source reading.

* ``aggregate`` (an instance attribute shadowing the class's, which must be PyG's own): the
  messages, in edge order, are reduced by one ``sj.spmm`` over a matrix ``[num_dst, E]`` whose
  row i holds the ids of i's edges as columns (built from PyG's ``index`` by the traceable
  CSR op, cached per index content like every structure). Served aggregations: sum / mean /
  max / min, ``SoftmaxAggregation`` (GENConv's default: ``sj.edge_softmax`` of ``t * m`` per
  channel, then a sum) and ``PowerMeanAggregation``. Any call it cannot serve (a sparse
  adjacency, ``ptr``, another node dim) goes to the class's aggregate.
* ``softmax``: when the layer's ``message`` calls ``torch_geometric.utils.softmax`` through a
  module-level name (``from torch_geometric.utils import softmax``), that name in the
  message's module is pointed at :func:`softmax` below, which computes the same function with
  ``sj.edge_softmax`` over the cached structure while an accelerated layer's ``propagate``
  runs, and calls PyG's own otherwise (and for calls with ``ptr`` or another ``dim``).
  :func:`sparsejit.restore` puts the name back once no accelerated layer uses it.

The attention scores themselves are the user's code, computed per edge as in PyG (no SDDMM
is recognised inside them).
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from sparsejit.families.spmm import graph as G
from sparsejit.families.spmm.edge_softmax import edge_softmax
from sparsejit.families.spmm.matrix import SparseMatrix, _Structure
from sparsejit.families.spmm.spmm import spmm
from sparsejit.runtime.caches import content_key

KIND = "_sparsejit_edge_path"  # instance attribute: what the aggregate override serves
_REDUCE = {"SumAggregation": "sum", "MeanAggregation": "mean", "MaxAggregation": "max",
           "MinAggregation": "min"}
_OTHER = ("SoftmaxAggregation", "PowerMeanAggregation")
_HOOKS = ("_aggregate_forward_pre_hooks", "_aggregate_forward_hooks")

_ACTIVE = [0]  # accelerated propagate calls in progress (the softmax name serves them)
_PATCHED = {}  # id(module globals) -> [globals, name, PyG's softmax, layers using it]


class Unsupported(Exception):
    """The layer's aggregation is not one the per-edge path serves; says why."""


@dataclass
class Segments:
    """Edges grouped by target: ``by_edge`` ``[num_dst, E]`` (row i: the ids of i's edges,
    as columns), ``in_order`` (same rows, columns numbered in that CSR order), ``perm`` (CSR
    position -> edge) and ``inv`` (edge -> CSR position)."""

    by_edge: SparseMatrix
    in_order: SparseMatrix
    perm: torch.Tensor
    inv: torch.Tensor


def segments(index: torch.Tensor, num_dst) -> Segments:
    """The Segments of per-edge target `index` ``[E]`` over `num_dst` targets; cached per
    index content (traced under torch.compile)."""
    E = index.shape[0]
    index = index.to(torch.long)
    key = content_key(index, extra=(num_dst,))
    edges = G.Edges(index, index, None, E, num_dst, key=key)

    def build(e: G.Edges) -> tuple:
        ar = torch.arange(E, device=index.device)
        A, perm, row, _ = G.csr_of(ar, index, E, num_dst)
        perm = perm.to(torch.long)
        inv = torch.empty_like(perm).scatter_(0, perm, ar)
        ones = torch.arange(E + 1, dtype=A.indptr.dtype, device=index.device)
        A._s.transpose = (ones, index.to(A.indices.dtype), inv.to(A.indices.dtype))
        st = _Structure(A.indptr, ar.to(A.indices.dtype), (A.shape[0], E))
        st.transpose = (ones, row.to(A.indices.dtype), ar.to(A.indices.dtype))
        return (A, SparseMatrix(st), perm, inv)

    return Segments(*G.prepared(edges, "edge_segments_by_index", build))


def _pyg_class(module: str, name: str):
    mod = sys.modules.get(module)
    return None if mod is None else getattr(mod, name, None)


def _aggregation_kind(m: nn.Module) -> str:
    agg = getattr(m, "aggr_module", None)
    name = type(agg).__name__
    cls = _pyg_class("torch_geometric.nn.aggr", name)
    if cls is None or type(agg) is not cls or (name not in _REDUCE and name not in _OTHER):
        raise Unsupported(f"aggr={getattr(m, 'aggr', None)!r} (the per-edge path serves sum, "
                          "mean, max, min, softmax and powermean)")
    return name


def _pyg_softmax():
    return _pyg_class("torch_geometric.utils._softmax", "softmax")


def _softmax_names(fn) -> list:
    """The names under which `fn`'s module holds PyG's softmax (or ours, put there for an
    accelerated layer already) and `fn` uses."""
    orig = _pyg_softmax()
    g = getattr(fn, "__globals__", {})
    used = set(getattr(getattr(fn, "__code__", None), "co_names", ()))
    return [k for k in used if orig is not None and (g.get(k) is orig or g.get(k) is softmax)]


def probe(m: nn.Module) -> str:
    """A description of what the per-edge path serves for `m`, or Unsupported."""
    MP = _pyg_class("torch_geometric.nn.conv.message_passing", "MessagePassing")
    cls = type(m)
    if MP is None or not isinstance(m, MP):
        raise Unsupported("not a MessagePassing layer")
    if cls.aggregate is not MP.aggregate:
        raise Unsupported("it overrides aggregate()")
    if getattr(m, "flow", None) != "source_to_target":
        raise Unsupported(f"flow={getattr(m, 'flow', None)!r}")
    kind = _aggregation_kind(m)
    what = {"SoftmaxAggregation": "softmax", "PowerMeanAggregation": "powermean"}.get(
        kind, _REDUCE.get(kind))
    fn = getattr(cls.message, "__func__", cls.message)
    if _softmax_names(fn):
        what = "edge_softmax in message, " + what
    return what


def install(m: nn.Module) -> str:
    """Probes `m` and shadows its aggregate (and propagate, for the softmax name)."""
    what = probe(m)
    m.__dict__[KIND] = _aggregation_kind(m)
    m.__dict__["aggregate"] = types.MethodType(aggregate, m)
    fn = getattr(type(m).message, "__func__", type(m).message)
    names = _softmax_names(fn)
    if names:
        g = fn.__globals__
        entry = _PATCHED.setdefault(id(g), [g, names, _pyg_softmax(), set()])
        for name in names:
            g[name] = softmax
        entry[3].add(id(m))
        m.__dict__["propagate"] = types.MethodType(_active_propagate, m)
    return what


def uninstall(m: nn.Module) -> None:
    for key, (g, names, orig, users) in list(_PATCHED.items()):
        users.discard(id(m))
        if not users:
            for name in names:
                if g.get(name) is softmax:
                    g[name] = orig
            del _PATCHED[key]
    prop = m.__dict__.get("propagate")
    if getattr(prop, "__func__", None) is _active_propagate:
        del m.__dict__["propagate"]
    m.__dict__.pop(KIND, None)
    m.__dict__.pop("aggregate", None)


def installed(m: nn.Module) -> bool:
    return KIND in m.__dict__


def _active_propagate(self, edge_index, size=None, **kwargs):
    _ACTIVE[0] += 1
    try:
        return type(self).propagate(self, edge_index, size=size, **kwargs)
    finally:
        _ACTIVE[0] -= 1


def _plain_index(index) -> Optional[torch.Tensor]:
    if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.layout != torch.strided \
            or index.dtype.is_floating_point or index.dtype == torch.bool:
        return None
    return index.as_subclass(torch.Tensor) if type(index) is not torch.Tensor else index


def _num(index: torch.Tensor, n) -> Optional[int]:
    if n is not None:
        return n
    if torch.compiler.is_compiling():
        return None
    return int(index.max()) + 1 if index.numel() else 0


def softmax(src, index=None, ptr=None, num_nodes=None, dim=0):
    """PyG's ``softmax(src, index, ptr, num_nodes, dim)``: by ``sj.edge_softmax`` over the
    cached structure of `index` inside an accelerated propagate, else PyG's own."""
    orig = _pyg_softmax()
    idx = _plain_index(index)
    if _ACTIVE[0] and idx is not None and ptr is None and isinstance(src, torch.Tensor) and \
            src.dim() in (1, 2) and dim in (0, -src.dim()) and src.shape[0] == idx.shape[0] \
            and src.is_floating_point():
        n = _num(idx, num_nodes)
        if n is not None:
            seg = segments(idx, n)
            return edge_softmax(seg.by_edge, src.index_select(0, seg.perm)).index_select(
                0, seg.inv)
    return orig(src, index, ptr, num_nodes, dim)


def aggregate(self, inputs, index, ptr=None, dim_size=None):
    """PyG's aggregate for a layer on the per-edge path: one SpMM where the call fits it."""
    kind = self.__dict__[KIND]
    idx = _plain_index(index)
    node_dim = self.node_dim
    ok = idx is not None and ptr is None and isinstance(inputs, torch.Tensor) and \
        inputs.dim() >= 2 and inputs.is_floating_point() and \
        node_dim in (0, -inputs.dim()) and inputs.shape[0] == idx.shape[0] and \
        not any(getattr(self, h, None) for h in _HOOKS)
    n = _num(idx, dim_size) if ok else None
    if n is None:
        return type(self).aggregate(self, inputs, index, ptr=ptr, dim_size=dim_size)
    seg = segments(idx, n)
    E, tail = inputs.shape[0], tuple(inputs.shape[1:])
    if kind in _REDUCE:
        out = spmm(seg.by_edge, _flat(inputs), _REDUCE[kind])
    elif kind == "SoftmaxAggregation":
        out = _softmax_aggregate(self.aggr_module, inputs, seg)
    else:
        out = _power_mean(self.aggr_module, inputs, seg)
    return out.reshape((n,) + tail)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """`t` as ``[E, everything else]`` (also for E = 0)."""
    return t.reshape(t.shape[0], math.prod(t.shape[1:]))


def _softmax_aggregate(agg, x, seg: Segments):
    t = agg.t
    if agg.channels != 1:
        t = t.view(-1, agg.channels)
    alpha = x if isinstance(t, (int, float)) and t == 1 else x * t
    E = x.shape[0]
    xc = _flat(x).index_select(0, seg.perm)
    ac = _flat(alpha).index_select(0, seg.perm)
    if not agg.learn and agg.semi_grad:
        with torch.no_grad():
            w = edge_softmax(seg.in_order, ac)
    else:
        w = edge_softmax(seg.in_order, ac)
    return spmm(seg.in_order, xc * w, "sum")


def _power_mean(agg, x, seg: Segments):
    p = agg.p
    if agg.channels != 1:
        p = p.view(-1, agg.channels)
    plain = isinstance(p, (int, float)) and p == 1
    if not plain:
        x = x.clamp(min=agg.min_value, max=agg.max_value).pow(p)
    out = spmm(seg.by_edge, _flat(x), "mean")
    if not plain:
        out = out.reshape((-1,) + tuple(x.shape[1:]))
        out = out.clamp(min=agg.min_value, max=agg.max_value).pow(1.0 / p)
    return out
