"""PyG-signature message-passing layers on sparsejit's SpMM: GCNConv, SAGEConv, GraphConv,
GINConv and GINEConv.

Constructors, defaults, parameter names and shapes follow torch_geometric 2.8 (so
``load_state_dict(pyg_layer.state_dict())`` works); ``forward`` takes PyG's arguments and any
adjacency form of :mod:`sparsejit.families.spmm.graph`. Aggregations run as one
``sparsejit.spmm`` with the bias fused; when a layer's Linear shrinks the features it runs
before the aggregation (linear maps commute with sum and mean), so the sparse pass moves fewer
bytes.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _m

from sparsejit.families.dense.ops import linear as dense_linear, linear_add_, relu_linear
from sparsejit.families.spmm.spmm import spmm
from sparsejit.families.spmm import graph as G
from sparsejit.families.spmm.matrix import SparseMatrix, _Structure
from sparsejit.runtime.autograd import composite


def linear(in_channels: int, out_channels: int, bias: bool = True,
           glorot: bool = False) -> nn.Module:
    """torch's Linear with PyG's names (``weight``, ``bias``); in_channels -1 is lazy."""
    if in_channels == -1:
        return nn.LazyLinear(out_channels, bias=bias)
    lin = nn.Linear(in_channels, out_channels, bias=bias)
    if glorot:
        glorot_(lin.weight)
        if bias:
            nn.init.zeros_(lin.bias)
    return lin


def glorot_(t: Optional[torch.Tensor]) -> None:
    if t is not None:
        bound = math.sqrt(6.0 / (t.size(-2) + t.size(-1)))
        with torch.no_grad():
            t.uniform_(-bound, bound)


def pair(x) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """PyG's ``x`` or ``(x_src, x_dst)`` as a pair."""
    if isinstance(x, torch.Tensor):
        return x, x
    if isinstance(x, (tuple, list)) and len(x) == 2:
        return x[0], x[1]
    raise TypeError(f"x must be a tensor or a pair (x_src, x_dst); got {type(x).__name__}")


def sizes(x_src: torch.Tensor, x_dst: Optional[torch.Tensor], size=None) -> Tuple[int, int]:
    if size is not None:
        return int(size[0]), int(size[1])
    return x_src.size(0), (x_dst if x_dst is not None else x_src).size(0)


def _unhooked(m: nn.Module) -> bool:
    """No forward / backward hooks on `m` nor global ones: calling its parts directly is
    then the same as calling it."""
    return not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or
                m._backward_pre_hooks or _m._global_forward_hooks or
                _m._global_forward_pre_hooks or _m._global_backward_hooks or
                _m._global_backward_pre_hooks)


def apply_linear(lin: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``lin(x)``; a plain ``nn.Linear`` (no hooks) runs through :func:`sparsejit.linear`
    (the faster of sparsejit's GEMM layer and torch's on this machine, for large float32
    inputs)."""
    if type(lin) is nn.Linear and _unhooked(lin):
        return dense_linear(x, lin.weight, lin.bias)
    return lin(x)


def apply_module(mod: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``mod(x)`` for a user's module (GIN's ``nn``): a plain ``nn.Sequential`` (no hooks)
    runs its children one by one so that its plain ``nn.Linear``s take
    :func:`apply_linear`, and a plain ``nn.ReLU`` right after one of them runs in place on
    that Linear's fresh output (no one else holds it, and neither GEMM's backward reads it):
    one [N, F] tensor fewer to allocate and to keep for the backward. A ReLU followed by a
    plain Linear runs with it as :func:`sparsejit.families.dense.ops.relu_linear` (the ReLU's
    gradient applied in place). Any other module is called as it is."""
    if type(mod) is nn.Sequential and _unhooked(mod):
        children = list(mod)
        fresh = False  # x is the output of an unhooked Linear of this walk
        i = 0
        while i < len(children):
            child = children[i]
            if fresh and type(child) is nn.ReLU and _unhooked(child):
                after = children[i + 1] if i + 1 < len(children) else None
                if _plain_linear(after):  # ReLU then Linear: the ReLU's gradient in place
                    x = relu_linear(x, after.weight, after.bias)
                    i += 2
                    continue  # x: that Linear's fresh output
                x = torch.relu_(x)
            else:
                x = apply_linear(child, x)
            fresh = _plain_linear(child)
            i += 1
        return x
    return mod(x)


def _plain_linear(m: Optional[nn.Module]) -> bool:
    return type(m) is nn.Linear and _unhooked(m)


def aggregate(A, x: torch.Tensor, reduce: str, lin: Optional[nn.Module] = None):
    """``lin(reduce_j x_j)`` (``lin`` optional): for sum / mean with a Linear that does not
    widen the features, ``reduce_j lin_w(x_j) + b`` instead, the bias fused into the SpMM."""
    if lin is None:
        return spmm(A, x, reduce)
    linear_ok = reduce in ("sum", "mean") and isinstance(lin, nn.Linear)
    if linear_ok and lin.out_features <= lin.in_features:
        return spmm(A, dense_linear(x, lin.weight), reduce, bias=lin.bias)
    return apply_linear(lin, spmm(A, x, reduce))


def add_linear(out: torch.Tensor, lin: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``out + lin(x)`` for a fresh ``out`` that autograd has not saved (the aggregation's
    result); for a plain 2-D Linear the product accumulates onto ``out`` in place
    (``addmm_``, or sparsejit's GEMM with beta = 1 where :func:`sparsejit.linear` would take
    it: no [N, F] add, copy or temporary, forward or backward)."""
    if type(lin) is nn.Linear and out.dim() == 2 and x.dim() == 2 and \
            out.dtype == x.dtype == lin.weight.dtype and out.is_contiguous():
        if lin.bias is not None:
            out = out.add_(lin.bias)
        return linear_add_(out, x, lin.weight)
    return out + lin(x)


# The order of a Linear and an aggregation over A's occupied rows is chosen by counting work
# in multiply-adds of a dense product: a gathered element of a sparse aggregation costs about
# _GATHER_MADDS of them, an element a dense product streams in or out _STREAM_MADDS (narrow
# products are bound by those bytes, not by their multiply-adds). On the AMD EPYC with
# AVX-512, 2 threads, torch.mm on [52k, 64] x [64, 64] against sparsejit.spmm at width 64 put
# a gathered element at ~23 multiply-adds; 16 and 8 are the values with which the model
# picks the faster order in both layers of benchmarks/bench_minibatch.py (the narrowing
# 64 -> 16 layer measured ~5% faster aggregating first). Only a choice between two orders
# within a factor of a few of each other depends on them.
_GATHER_MADDS = 16
_STREAM_MADDS = 8

# Skip the empty tail only when it is at least this share of the rows: below that, the
# extra pass that adds the aggregated rows into the root term costs more than it saves.
_MIN_EMPTY_TAIL = 0.25


def tail_free_rows(A: SparseMatrix, x_src: torch.Tensor, lin: nn.Module, reduce: str,
                   x_dst: Optional[torch.Tensor], root: Optional[nn.Module]) -> Optional[int]:
    """Rows holding entries, when ``lin(aggr_j x_j) [+ root(x_i)]`` can skip A's empty tail.

    The rows past the last non-empty one (a sampled mini-batch's last hop, relabelled seeds
    first as PyG's NeighborLoader does) aggregate to zero under every reduce, so their output
    is ``lin.bias [+ root(x_i)]``: the aggregation and ``lin`` run on the occupied rows only,
    which is what dominates a sampled step's dense products. None where that does not apply
    (plain 2-D Linears of one dtype, eager mode) or the tail is too short to pay."""
    if torch.compiler.is_compiling() or type(lin) is not nn.Linear or x_src.dim() != 2:
        return None
    if x_src.dtype != lin.weight.dtype or reduce not in ("sum", "mean", "max", "min"):
        return None
    if root is not None and (type(root) is not nn.Linear or x_dst is None or x_dst.dim() != 2
                             or x_dst.dtype != x_src.dtype):
        return None
    n = A.shape[0]
    m = A.occupied_rows()
    if n == 0 or m > n * (1.0 - _MIN_EMPTY_TAIL):
        return None
    return m


def aggregate_rows(A: SparseMatrix, m: int, x_src: torch.Tensor, reduce: str, lin: nn.Linear,
                   x_dst: Optional[torch.Tensor], root: Optional[nn.Linear]) -> torch.Tensor:
    """``lin(aggr_j x_j) + root(x_i)`` (root optional) for all of A's rows, computing the
    aggregation and ``lin`` on the first `m` (every later row is empty; see
    :func:`tail_free_rows`). Same values as the full computation; the Linear runs after the
    aggregation or before it, whichever costs less for these row counts and widths."""
    Am = A.leading_rows(m)
    n, n_src = A.shape[0], x_src.shape[0]
    c_in, c_out = lin.in_features, lin.out_features
    # Forward work: transform first runs the Linear on every source row and gathers at the
    # output width; aggregating first gathers at the input width and runs the Linear on the
    # m occupied rows. Both write m aggregated rows. (The backward scales alike.)
    nnz = Am.nnz
    dense = c_in * c_out + _STREAM_MADDS * (c_in + c_out)
    first = n_src * dense + _GATHER_MADDS * (nnz + m) * c_out
    after = m * dense + _GATHER_MADDS * (nnz + m) * c_in
    if reduce in ("sum", "mean") and first < after:
        h = spmm(Am, dense_linear(x_src, lin.weight), reduce)
    else:
        h = dense_linear(spmm(Am, x_src, reduce), lin.weight)
    bias = lin.bias
    if root is not None:
        if root.bias is not None:
            bias = root.bias if bias is None else bias + root.bias
        out = dense_linear(x_dst, root.weight, bias)
    elif bias is not None:
        out = bias.expand(n, c_out).clone()
    else:
        out = h.new_zeros(n, c_out)
    return _add_leading_rows(out, h)


def aggregate_and_root(A: SparseMatrix, x_src: torch.Tensor, reduce: str, lin: nn.Module,
                       x_dst: Optional[torch.Tensor], root: Optional[nn.Module]) -> torch.Tensor:
    """``lin(aggr_j x_j) [+ root(x_i)]``: over A's occupied rows only when an empty tail
    pays (:func:`tail_free_rows`), else the whole aggregation with the root term accumulated
    in place."""
    m = tail_free_rows(A, x_src, lin, reduce, x_dst, root)
    if m is not None:
        return aggregate_rows(A, m, x_src, reduce, lin, x_dst, root)
    out = aggregate(A, x_src, reduce, lin)
    return out if root is None else add_linear(out, root, x_dst)


def _add_leading_rows_forward(ctx, out, h):
    """``out[:len(h)] += h`` in place on a fresh ``out`` that autograd has not saved; the
    backward hands the gradient through (no copy: autograd's in-place slice update would
    clone and zero-fill the whole gradient)."""
    out[: h.shape[0]].add_(h)
    ctx.mark_dirty(out)
    ctx.m = h.shape[0]
    return out


def _add_leading_rows_backward(ctx, grad):
    return grad, grad[: ctx.m]


_add_leading_rows = composite("AddLeadingRows", _add_leading_rows_forward,
                              _add_leading_rows_backward)


_REDUCE = {"add": "sum", "sum": "sum", "mean": "mean", "max": "max", "min": "min"}


def _reduce_of(aggr: str, layer: str) -> str:
    if aggr not in _REDUCE:
        raise ValueError(f"{layer}: aggr must be one of {tuple(_REDUCE)}; got {aggr!r}")
    return _REDUCE[aggr]


# ---- GCNConv -------------------------------------------------------------------------------


def gcn_matrix(edges: G.Edges, improved: bool, add_self_loops: bool, dtype: torch.dtype):
    """``D^-1/2 (A + fill I) D^-1/2`` as a SparseMatrix with values, exactly as PyG 2.8's
    ``gcn_norm`` computes it for an edge_index (self-loop weights included)."""
    if edges.num_src != edges.num_dst:
        raise ValueError(f"GCNConv needs a square adjacency; got {edges.num_src} sources and "
                         f"{edges.num_dst} targets")
    n = edges.num_dst
    w = edges.weight
    given = w is not None
    if add_self_loops and not given:
        # The common case (no edge weights) in one pass: the same structure, entry order and
        # values as below (tests/python/spmm/test_pyg_dropin.py checks both against PyG).
        indptr, indices, _, values = torch.ops.sparsejit.gcn_adjacency(edges.edge_index(), n, dtype)
        return SparseMatrix(_Structure(indptr, indices, (n, n)), values)
    if w is None:
        w = torch.ones(edges.src.shape[0], dtype=dtype, device=edges.src.device)
    if add_self_loops:
        A, perm, row, col, old_loop = G.with_self_loops(edges)
        old = old_loop[: w.shape[0]]
        if given:
            # PyG's add_remaining_self_loops: a node's existing self-loop (the last one, if
            # repeated) keeps its weight; the others get 2 if improved else 1.
            slot = torch.where(old, edges.src, n)
            pos = torch.where(old, torch.arange(w.shape[0], device=w.device), -1)
            last = torch.full((n + 1,), -1, dtype=pos.dtype, device=w.device).scatter_reduce(
                0, slot, pos, "amax")[:n]
            fill = torch.full((n,), 2.0 if improved else 1.0, dtype=w.dtype, device=w.device)
            # PyG assigns with index_put, whose backward sends the loop's gradient to every
            # repeated self-loop: the value of the last one, the gradient of their sum.
            total = torch.zeros(n + 1, dtype=w.dtype, device=w.device).index_add(0, slot, w)[:n]
            kept = w[last.clamp(min=0)].detach() + (total - total.detach())
            loop_w = torch.where(last >= 0, kept, fill)
        else:
            # Without edge weights PyG gives every self-loop weight 1 (even when improved).
            loop_w = torch.ones(n, dtype=w.dtype, device=w.device)
        w_all = torch.cat([torch.where(old, torch.zeros_like(w), w), loop_w])
        w_csr = w_all.index_select(0, perm)
    else:
        A, perm, row, col = G.structure(edges)
        w_csr = G.in_csr_order(w, perm)
    deg = torch.zeros(n, dtype=w_csr.dtype, device=w_csr.device).index_add_(0, row, w_csr)
    dinv = deg.pow(-0.5)
    dinv = torch.where(torch.isinf(dinv), torch.zeros_like(dinv), dinv)
    return A.with_values(dinv[row] * w_csr * dinv[col])


class GCNConv(nn.Module):
    """PyG's ``GCNConv`` (Kipf & Welling): ``D^-1/2 (A + I) D^-1/2 X W + b``.

    ``cached=True`` keeps the normalised matrix of the first graph (PyG's semantics: later
    graphs are ignored); otherwise it comes from the content-keyed cache of
    :mod:`sparsejit.families.spmm.graph`, so it is computed once per distinct graph."""

    def __init__(self, in_channels: int, out_channels: int, improved: bool = False,
                 cached: bool = False, add_self_loops: Optional[bool] = None,
                 normalize: bool = True, bias: bool = True, **kwargs):
        super().__init__()
        if add_self_loops is None:
            add_self_loops = normalize
        if add_self_loops and not normalize:
            raise ValueError("'GCNConv' does not support adding self-loops to the graph when "
                             "no on-the-fly normalization is applied")
        _no_kwargs("GCNConv", kwargs)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.improved, self.cached = improved, cached
        self.add_self_loops, self.normalize = add_self_loops, normalize
        self._cached_adj = None
        self.lin = linear(in_channels, out_channels, bias=False, glorot=True)
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None

    def reset_parameters(self) -> None:
        glorot_(self.lin.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)
        self._cached_adj = None

    def forward(self, x: torch.Tensor, edge_index, edge_weight: Optional[torch.Tensor] = None):
        if isinstance(x, (tuple, list)):
            raise ValueError("'GCNConv' received a tuple of node features as input while this "
                             "layer does not support bipartite message passing. Please try "
                             "other layers such as 'SAGEConv' or 'GraphConv' instead")
        A = self._cached_adj
        if A is None:
            edges = G.edges_of(edge_index, (x.size(0), x.size(0)), edge_weight)
            if self.normalize:
                A = G.prepared(edges, "gcn", lambda e: gcn_matrix(
                    e, self.improved, self.add_self_loops, x.dtype), self.improved,
                    self.add_self_loops, x.dtype)
            else:
                A, perm, _, _ = G.structure(edges)
                A = A.with_values(G.in_csr_order(edges.weight, perm))
            if self.cached:
                self._cached_adj = A
        if A.values is not None and A.values.dtype != x.dtype:
            A = A.with_values(A.values.to(x.dtype))
        if self.out_channels <= self.in_channels:
            return spmm(A, apply_linear(self.lin, x), "sum", bias=self.bias)
        out = apply_linear(self.lin, spmm(A, x, "sum"))
        return out + self.bias if self.bias is not None else out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels})"


def _no_kwargs(layer: str, kwargs: dict) -> None:
    # PyG forwards these to MessagePassing; the ones that change the maths are not supported.
    allowed = {"aggr": ("add", "sum"), "flow": ("source_to_target",), "node_dim": (-2, 0)}
    for k, v in kwargs.items():
        if k not in allowed or v not in allowed[k]:
            raise ValueError(f"{layer}: argument {k}={v!r} is not supported by sparsejit.nn")


# ---- SAGEConv ------------------------------------------------------------------------------


class SAGEConv(nn.Module):
    """PyG's ``SAGEConv``: ``lin_l(aggr_j x_j) + lin_r(x_i)``, optionally projected (``lin``,
    ReLU) and L2-normalised. aggr: 'mean' (default), 'sum'/'add', 'max', 'min'."""

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int,
                 aggr: str = "mean", normalize: bool = False, root_weight: bool = True,
                 project: bool = False, bias: bool = True, **kwargs):
        super().__init__()
        self.reduce = _reduce_of(aggr, "SAGEConv")
        _no_kwargs("SAGEConv", kwargs)
        self.in_channels, self.out_channels, self.aggr = in_channels, out_channels, aggr
        self.normalize, self.root_weight, self.project = normalize, root_weight, project
        if isinstance(in_channels, int):
            in_channels = (in_channels, in_channels)
        if project:
            if in_channels[0] <= 0:
                raise ValueError("'SAGEConv' does not support lazy initialization with "
                                 "`project=True`")
            self.lin = linear(in_channels[0], in_channels[0], bias=True)
        self.lin_l = linear(in_channels[0], out_channels, bias=bias)
        if root_weight:
            self.lin_r = linear(in_channels[1], out_channels, bias=False)

    def forward(self, x, edge_index, size=None) -> torch.Tensor:
        x_src, x_dst = pair(x)
        if self.project:
            x_src = apply_linear(self.lin, x_src).relu()
        edges = G.edges_of(edge_index, sizes(x_src, x_dst, size))
        A, _, _, _ = G.structure(edges)
        root = self.lin_r if self.root_weight and x_dst is not None else None
        out = aggregate_and_root(A, x_src, self.reduce, self.lin_l, x_dst, root)
        if self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, "
                f"aggr={self.aggr})")


# ---- GraphConv -----------------------------------------------------------------------------


class GraphConv(nn.Module):
    """PyG's ``GraphConv`` (Morris et al.): ``lin_rel(aggr_j e_ji x_j) + lin_root(x_i)``."""

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int,
                 aggr: str = "add", bias: bool = True, **kwargs):
        super().__init__()
        self.reduce = _reduce_of(aggr, "GraphConv")
        _no_kwargs("GraphConv", {k: v for k, v in kwargs.items()})
        self.in_channels, self.out_channels, self.aggr = in_channels, out_channels, aggr
        if isinstance(in_channels, int):
            in_channels = (in_channels, in_channels)
        self.lin_rel = linear(in_channels[0], out_channels, bias=bias)
        self.lin_root = linear(in_channels[1], out_channels, bias=False)

    def forward(self, x, edge_index, edge_weight: Optional[torch.Tensor] = None,
                size=None) -> torch.Tensor:
        x_src, x_dst = pair(x)
        edges = G.edges_of(edge_index, sizes(x_src, x_dst, size), edge_weight)
        A, perm, _, _ = G.structure(edges)
        w = G.in_csr_order(edges.weight, perm)
        A = A.with_values(None if w is None else w.to(x_src.dtype))
        root = self.lin_root if x_dst is not None else None
        out = aggregate_and_root(A, x_src, self.reduce, self.lin_rel, x_dst, root)
        return out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels})"


# ---- GINConv / GINEConv --------------------------------------------------------------------


def _gin_structure(edges: G.Edges):
    """Cached: the structure with one appended self-loop per node (existing self-loops stay
    ordinary neighbours), and a float mask of the appended loops in CSR order."""

    def build(e):
        A, perm, _, _, _ = G.with_self_loops(e)
        return A, (perm >= e.src.shape[0]).to(torch.float32)

    return G.prepared(edges, "gin_loops", build)


class GINConv(nn.Module):
    """PyG's ``GINConv``: ``nn((1 + eps) x_i + sum_j x_j)``; ``eps`` is a buffer, or a
    parameter with ``train_eps=True``."""

    def __init__(self, nn: torch.nn.Module, eps: float = 0.0, train_eps: bool = False,
                 **kwargs):
        super().__init__()
        _no_kwargs("GINConv", kwargs)
        self.nn = nn
        self.initial_eps = eps
        if train_eps:
            self.eps = torch.nn.Parameter(torch.full((1,), float(eps)))
        else:
            self.register_buffer("eps", torch.full((1,), float(eps)))

    def reset_parameters(self) -> None:
        self.eps.data.fill_(self.initial_eps)

    def forward(self, x, edge_index, size=None) -> torch.Tensor:
        x_src, x_dst = pair(x)
        edges = G.edges_of(edge_index, sizes(x_src, x_dst, size))
        if isinstance(x, torch.Tensor) and edges.num_src == edges.num_dst and \
                not self.eps.requires_grad:
            # (A + (1 + eps) I) x in one SpMM over the structure with self-loops (cached):
            # no separate [N, F] scale and add, forward or backward.
            A, is_loop = _gin_structure(edges)
            if not torch.compiler.is_compiling() and float(self.eps) == 0.0:
                # PyG's default eps: no values at all
                return apply_module(self.nn, spmm(A, x, "sum"))
            vals = (is_loop * self.eps.to(x.dtype) + 1).to(x.dtype)
            return apply_module(self.nn, spmm(A.with_values(vals), x, "sum"))
        A, _, _, _ = G.structure(edges)
        out = spmm(A, x_src, "sum")
        if x_dst is not None:
            out = out + (1 + self.eps) * x_dst
        return apply_module(self.nn, out)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(nn={self.nn})"


class GINEConv(GINConv):
    """PyG's ``GINEConv``: ``nn((1 + eps) x_i + sum_j ReLU(x_j + lin(e_ji)))`` (``lin`` only
    with ``edge_dim``). The message depends on the edge, so it is gathered per edge and
    reduced in CSR order (no fused kernel yet)."""

    def __init__(self, nn: torch.nn.Module, eps: float = 0.0, train_eps: bool = False,
                 edge_dim: Optional[int] = None, **kwargs):
        super().__init__(nn, eps, train_eps, **kwargs)
        if edge_dim is not None:
            if isinstance(nn, torch.nn.Sequential):
                nn = nn[0]
            if hasattr(nn, "in_features"):
                in_channels = nn.in_features
            elif hasattr(nn, "in_channels"):
                in_channels = nn.in_channels
            else:
                raise ValueError("Could not infer input channels from `nn`.")
            self.lin = linear(edge_dim, in_channels)
        else:
            self.lin = None

    def forward(self, x, edge_index, edge_attr: Optional[torch.Tensor] = None,
                size=None) -> torch.Tensor:
        x_src, x_dst = pair(x)
        if edge_attr is None:
            raise ValueError("GINEConv: edge_attr is required")
        edges = G.edges_of(edge_index, sizes(x_src, x_dst, size))
        A, perm, row, col = G.structure(edges)
        if self.lin is None and x_src.size(-1) != edge_attr.size(-1):
            raise ValueError("Node and edge feature dimensionalities do not match. Consider "
                             "setting the 'edge_dim' attribute of 'GINEConv'")
        e = G.in_csr_order(edge_attr, perm)
        if self.lin is not None:
            e = self.lin(e)
        msg = (x_src.index_select(0, col) + e).relu()
        out = msg.new_zeros((A.shape[0], msg.shape[1])).index_add_(0, row, msg)
        if x_dst is not None:
            out = out + (1 + self.eps) * x_dst
        return apply_module(self.nn, out)


def gcn_norm(A: SparseMatrix, add_self_loops: bool = True, dtype=torch.float32,
             improved: bool = False) -> SparseMatrix:
    """A (rows = targets) with GCN's symmetric normalisation ``D^-1/2 (A + I) D^-1/2`` as
    values, as PyG's ``gcn_norm`` computes it (existing self-loops keep their weight; A's
    values are the edge weights, 1 when absent). For ``GCNConv(normalize=False)``."""
    if A.shape[0] != A.shape[1]:
        raise ValueError(f"gcn_norm needs a square matrix; got shape {A.shape}")
    if A.values is not None and A.values.dim() != 1:
        raise ValueError("gcn_norm needs single-head values ([nnz])")
    edges = G.edges_of(A)
    return gcn_matrix(edges, improved, add_self_loops, A.values.dtype if A.values is not None
                      else dtype)
