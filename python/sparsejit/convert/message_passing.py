"""The generic path: PyG ``MessagePassing`` layers that sparsejit.nn does not implement, whose
message is a gather scaled per edge, run their gather + aggregate as one sparsejit SpMM.

Mechanism: a verified probe, then a per-instance ``propagate``.

* **Probe** (once, at :func:`sparsejit.accelerate`): the layer's own ``message`` is called
  on small random float64 inputs and must equal ``alpha * w_e * x_j + beta * w_e * y_i`` for
  two constants ``alpha`` and ``beta`` (``w_e`` the per-edge scalar argument, 1 when the
  message takes none or it is None; ``x_j`` the one source-gathered argument, ``y_i`` an
  optional target-gathered one). The constants are fitted on one draw and checked on two
  more draws of other widths, with ``w`` given and with ``w=None`` separately (SGConv's
  message needs its weight, TAGConv's takes None). This covers SGConv, APPNP, TAGConv,
  ChebConv, ClusterGCNConv, LEConv (``w (a_j - b_i)``) and users' layers of that shape,
  without reading source code. Messages that use parameters, other per-edge tensors, the
  edge index itself, or anything nonlinear fail the probe and the layer is left alone.
* **Propagate**: an instance attribute ``propagate`` shadows the class's (PyG's generated
  one). For a call it can serve (a ``[2, E]`` edge_index or EdgeIndex, ``[N, F]`` node
  features, a ``[E]`` weight or none, no PyG hooks, no explain, under torch.compile a static edge
  count) it runs
  ``alpha * spmm(A_w, x, reduce)`` on the CSR that ``sparsejit.nn`` builds once per
  edge_index content (the same cache; under torch.compile the structure op is traced), plus
  ``beta * (sum_j w_ij) * y_i`` (mean: divided by the in-degree), then the layer's
  ``update``. Any other call goes to PyG's own ``propagate``, unchanged. ``forward`` stays
  PyG's, so the layer's own preprocessing (gcn_norm, self-loops, dropout) is PyG's.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import nn

SPECIAL = {"edge_index", "adj_t", "edge_index_i", "edge_index_j", "size", "size_i", "size_j",
           "ptr", "index", "dim_size"}
FORM = "_sparsejit_form"  # instance attribute: the probed MessageForm
_REDUCE = {"add": "sum", "sum": "sum", "mean": "mean", "max": "max", "min": "min"}
_HOOKS = ("_propagate_forward_pre_hooks", "_propagate_forward_hooks",
          "_message_forward_pre_hooks", "_message_forward_hooks",
          "_aggregate_forward_pre_hooks", "_aggregate_forward_hooks",
          "_message_and_aggregate_forward_pre_hooks", "_message_and_aggregate_forward_hooks")


class Unsupported(Exception):
    """The layer's messages are not of the gather-scale-aggregate shape; says why."""


@dataclass(frozen=True)
class MessageForm:
    """``message = alpha * w * x_j + beta * w * y_i`` (per weight presence)."""

    src: str                  # propagate kwarg gathered at sources (x of x_j)
    dst: Optional[str]        # propagate kwarg gathered at targets (y of y_i), if any
    weight: Optional[str]     # the per-edge scalar kwarg, if any
    reduce: str               # sparsejit reduce
    with_w: Optional[Tuple[float, float]]     # (alpha, beta) when the weight is a tensor
    without_w: Optional[Tuple[float, float]]  # (alpha, beta) when it is None / absent
    update_args: Tuple[str, ...]              # kwargs the layer's own update() takes


def message_passing_class():
    mod = sys.modules.get("torch_geometric.nn.conv.message_passing")
    return None if mod is None else getattr(mod, "MessagePassing", None)


def _fit(msg, names, src_t, dst_t, w):
    """(alpha, beta) of `msg` at one draw, or None when it is not of the form."""
    E, F = src_t.shape
    ws = torch.ones(E, 1, dtype=src_t.dtype) if w is None else w.view(-1, 1)

    def call(a, b):
        args = {names["src"]: a}
        if names["dst"]:
            args[names["dst"]] = b
        if names["weight"]:
            args[names["weight"]] = w
        out = msg(**args)
        if not isinstance(out, torch.Tensor) or out.shape != a.shape:
            raise Unsupported(f"message returned {type(out).__name__} of shape "
                              f"{getattr(out, 'shape', None)} for x_j of shape {tuple(a.shape)}")
        return out

    zeros = torch.zeros_like(dst_t)
    ref = ws * src_t
    a_out = call(src_t, zeros)
    alpha = float((a_out * ref).sum() / (ref * ref).sum())
    beta = 0.0
    if names["dst"]:
        ref_b = ws * dst_t
        b_out = call(torch.zeros_like(src_t), dst_t)
        beta = float((b_out * ref_b).sum() / (ref_b * ref_b).sum())
    return alpha, beta, call


def _probe_variant(msg, names, with_weight: bool) -> Optional[Tuple[float, float]]:
    g = torch.Generator().manual_seed(1234)

    def draw(E, F):
        x = torch.randn(E, F, generator=g, dtype=torch.float64)
        y = torch.randn(E, F, generator=g, dtype=torch.float64)
        w = torch.rand(E, generator=g, dtype=torch.float64) + 0.5 if with_weight else None
        return x, y, w

    try:
        with torch.no_grad():
            x, y, w = draw(7, 3)
            alpha, beta, _ = _fit(msg, names, x, y, w)
            for E, F in ((5, 4), (9, 2)):
                x, y, w = draw(E, F)
                ws = torch.ones(E, 1, dtype=x.dtype) if w is None else w.view(-1, 1)
                _, _, call = _fit(msg, names, x, y, w)
                if not torch.allclose(call(x, y), alpha * ws * x + beta * ws * y,
                                      rtol=1e-9, atol=1e-12):
                    return None
    except Unsupported:
        raise
    except Exception:  # the message refused the probe's inputs (None weight, a shape, ...)
        return None
    return alpha, beta


def probe(m: nn.Module) -> MessageForm:
    """The MessageForm of PyG layer `m`, or Unsupported with the reason."""
    MP = message_passing_class()
    cls = type(m)
    if not isinstance(m.aggr, str) or m.aggr not in _REDUCE:
        raise Unsupported(f"aggr={m.aggr!r} (the SpMM path reduces by sum, mean, max or min)")
    if cls.aggregate is not MP.aggregate:
        raise Unsupported("it overrides aggregate()")
    if "propagate" in cls.__dict__ and cls.__dict__["propagate"] is not \
            getattr(cls, "_jinja_propagate", None):
        raise Unsupported("it overrides propagate()")
    if m.flow != "source_to_target":
        raise Unsupported(f"flow={m.flow!r}")
    insp = m.inspector
    params = list(insp.get_param_names("message"))
    srcs = [p for p in params if p.endswith("_j")]
    dsts = [p for p in params if p.endswith("_i") and p not in SPECIAL]
    others = [p for p in params if p not in srcs and p not in dsts]
    if len(srcs) != 1 or len(dsts) > 1 or len(others) > 1 or set(others) & SPECIAL:
        raise Unsupported(f"message({', '.join(params)}) is not (x_j[, y_i][, per-edge weight])")
    update_args = tuple(insp.get_param_names("update"))
    if any(a in SPECIAL or a.endswith(("_i", "_j")) for a in update_args):
        raise Unsupported(f"update() takes {update_args}")
    names = dict(src=srcs[0], dst=dsts[0] if dsts else None,
                 weight=others[0] if others else None)
    with_w = _probe_variant(m.message, names, True) if others else None
    without_w = _probe_variant(m.message, names, False)
    if with_w is None and without_w is None:
        raise Unsupported(f"message({', '.join(params)}) is not alpha * w * {srcs[0]}"
                          + (f" + beta * w * {dsts[0]}" if dsts else "") + " (probe)")
    reduce = _REDUCE[m.aggr]
    if reduce in ("max", "min"):
        with_w = with_w if with_w is None or with_w[1] == 0 else None
        without_w = without_w if without_w is None or without_w[1] == 0 else None
        if with_w is None and without_w is None:
            raise Unsupported(f"aggr={m.aggr!r} over a message that uses {dsts[0]}")
    return MessageForm(names["src"][:-2], names["dst"][:-2] if names["dst"] else None,
                       names["weight"], reduce, with_w, without_w,
                       update_args if cls.update is not MP.update else ())


def install(m: nn.Module) -> MessageForm:
    """Probes `m` and shadows its propagate; returns the form (Unsupported if it fails)."""
    form = probe(m)
    m.__dict__[FORM] = form
    m.__dict__["propagate"] = types.MethodType(propagate, m)
    return form


def uninstall(m: nn.Module) -> None:
    m.__dict__.pop(FORM, None)
    m.__dict__.pop("propagate", None)


def installed(m: nn.Module) -> bool:
    return FORM in m.__dict__


def _data_dependent(edge_index) -> bool:
    """Under torch.compile: an edge count that is not a plain int. PyG's gcn_norm drops
    self-loops by a mask, so the count depends on the data, and Inductor failed on the
    backward of the SpMM path then (a saved tensor of size u + n, from which it cannot bind
    u); such calls keep PyG's propagate, which compiles. (Dynamo cannot tell an unbacked size
    from a dynamic one without a graph break, so dynamic edge counts take PyG's path too.)"""
    return torch.compiler.is_compiling() and not isinstance(edge_index.shape[1], int)


def _pyg(self, edge_index, size, kwargs):
    return type(self).propagate(self, edge_index, size=size, **kwargs)


def propagate(self, edge_index, size=None, **kwargs):
    """PyG's ``propagate`` for a probed layer: the SpMM path where the call fits it, PyG's
    own propagate otherwise."""
    form: MessageForm = self.__dict__[FORM]
    plain = isinstance(edge_index, torch.Tensor) and edge_index.layout == torch.strided and \
        edge_index.dim() == 2
    if not plain or getattr(self, "_explain", None) or any(getattr(self, h) for h in _HOOKS) \
            or _data_dependent(edge_index):
        return _pyg(self, edge_index, size, kwargs)
    data = kwargs.get(form.src)
    x_src = data[0] if isinstance(data, (tuple, list)) else data
    dst_given = data[1] if isinstance(data, (tuple, list)) else None
    y = None
    if form.dst is not None:
        yd = kwargs.get(form.dst)
        y = yd[1] if isinstance(yd, (tuple, list)) else yd
    w = kwargs.get(form.weight) if form.weight else None
    coeffs = form.with_w if w is not None else form.without_w
    # [N, F] features only: the probe checked the message on 2-D inputs (a [E] weight times
    # a 3-D x_j would broadcast differently in PyG's own message)
    if coeffs is None or not isinstance(x_src, torch.Tensor) or x_src.dim() != 2 or \
            self.node_dim % 2 != 0 or (form.dst is not None and (
                not isinstance(y, torch.Tensor) or y.dim() != 2)):
        return _pyg(self, edge_index, size, kwargs)
    if w is not None:
        if not isinstance(w, torch.Tensor) or not w.is_floating_point() or \
                w.numel() != edge_index.shape[1] or w.dim() > 2 or \
                (w.dim() == 2 and w.shape[1] != 1):
            return _pyg(self, edge_index, size, kwargs)
        if w.dtype != x_src.dtype:  # PyG's w * x_j promotes: so do we
            common = torch.promote_types(w.dtype, x_src.dtype)
            w, x_src = w.to(common), x_src.to(common)
            y = None if y is None else y.to(common)
    alpha, beta = coeffs
    return _spmm_propagate(self, form, edge_index, size, x_src, dst_given, y, w, alpha, beta,
                           kwargs)


def node_counts(x_src: torch.Tensor, x_dst: Optional[torch.Tensor], size) -> Tuple[int, int]:
    """(sources, targets) of a propagate call as PyG counts them: `size`'s entries where
    given, else the rows of the source features and of the target-side tensor (`x_dst`, or
    the sources again when there is none)."""
    n_src = x_src.shape[0] if size is None or size[0] is None else size[0]
    if size is not None and size[1] is not None:
        return n_src, size[1]
    return n_src, x_dst.shape[0] if x_dst is not None else n_src


def _spmm_propagate(self, form, edge_index, size, x_src, dst_given, y, w, alpha, beta, kwargs):
    from sparsejit.families.spmm import graph as G
    from sparsejit.families.spmm.spmm import spmm
    n_src, n_dst = node_counts(x_src, dst_given if isinstance(dst_given, torch.Tensor) else y,
                               size)
    edges = G.edges_of(edge_index, (n_src, n_dst))
    A, perm, row, _ = G.structure(edges)
    wv = None if w is None else G.in_csr_order(w.reshape(-1), perm)
    x2 = x_src.reshape(x_src.shape[0], -1)
    if form.reduce in ("max", "min") and alpha != 1.0:
        wv = torch.full((A.nnz,), alpha, dtype=x2.dtype, device=x2.device) if wv is None \
            else wv * alpha
        alpha = 1.0
    out = spmm(A.with_values(wv), x2, form.reduce, scale=alpha)
    if beta != 0.0:
        ones = torch.ones(A.nnz, dtype=x2.dtype, device=x2.device) if wv is None else wv
        wsum = torch.zeros(n_dst, dtype=x2.dtype, device=x2.device).index_add(0, row, ones)
        if form.reduce == "mean":
            deg = torch.zeros(n_dst, dtype=x2.dtype, device=x2.device).index_add(
                0, row, torch.ones_like(ones))
            wsum = wsum / deg.clamp(min=1)
        out = out + beta * wsum.unsqueeze(1) * y.reshape(y.shape[0], -1)
    out = out.reshape((n_dst,) + tuple(x_src.shape[1:]))
    if form.update_args:
        out = self.update(out, **{a: kwargs.get(a) for a in form.update_args})
    return out
