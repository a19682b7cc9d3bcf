"""PyG's ``EdgeConv`` and ``DynamicEdgeConv`` on sparsejit: ``x'_i = reduce_{j -> i}
h(x_i || x_j - x_i)``, the graph given or the k nearest neighbours in feature space.

The network ``h`` runs per edge. When its first layer is a Linear (``nn.Linear`` or PyG's
``Linear``: alone, first in an ``nn.Sequential``, or first in PyG's ``MLP``) that layer is
split by columns, ``W [x_i || x_j - x_i] + b = (W_1 - W_2) x_i + b + W_2 x_j``, and computed
per node (two GEMMs on N rows instead of one on E rows with twice the width); the per-edge
input of the next layer is the sum of the two rows gathered in CSR order. A network that is
only that Linear needs no per-edge work at all: ``max_j (p_i + q_j) = p_i + max_j q_j``,
so the whole layer is one SpMM over the nodes. Otherwise the per-edge messages (in CSR order,
so each target's edges are contiguous) are reduced by one SpMM over an "edge segments"
matrix (row i holds i's edges, as columns, once each), which gives max / min their gradient
routing and sum / mean theirs. The structure and the segments matrix are built once per
graph (the spmm family's cache).
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from sparsejit.families.spmm import graph as G
from sparsejit.families.spmm.layers import _unhooked, apply_module, pair
from sparsejit.families.spmm.matrix import SparseMatrix, _Structure
from sparsejit.families.spmm.spmm import spmm

_REDUCE = {"add": "sum", "sum": "sum", "mean": "mean", "max": "max", "min": "min"}


def _pyg_class(module: str, name: str):
    mod = sys.modules.get(module)
    return None if mod is None else getattr(mod, name, None)


def _is_linear(m) -> bool:
    """A plain Linear (torch's or PyG's), no hooks, initialised."""
    pyg_linear = _pyg_class("torch_geometric.nn.dense.linear", "Linear")
    ok = type(m) is nn.Linear or (pyg_linear is not None and type(m) is pyg_linear)
    return ok and _unhooked(m) and not isinstance(m.weight, nn.parameter.UninitializedParameter)


def split_first_linear(mod: nn.Module):
    """(first Linear, rest) when `mod`'s first layer is a Linear that may be run apart from
    the rest: ``rest(h)`` then runs everything after it (None: nothing after it). None when
    `mod` is of any other shape."""
    if _is_linear(mod):
        return mod, None
    if type(mod) is nn.Sequential and _unhooked(mod) and len(mod) > 0 and _is_linear(mod[0]):
        tail = list(mod)[1:]
        if not tail:
            return mod[0], None
        return mod[0], lambda h: apply_module(nn.Sequential(*tail), h)
    mlp = _pyg_class("torch_geometric.nn.models.mlp", "MLP")
    if mlp is not None and type(mod) is mlp and _unhooked(mod) and len(mod.lins) > 0 and \
            _is_linear(mod.lins[0]) and all(_unhooked(n) for n in mod.norms):
        if len(mod.lins) == 1 and mod.plain_last and \
                (mod.dropout[-1] == 0.0 or not mod.training):
            return mod.lins[0], None
        return mod.lins[0], lambda h: _mlp_after_first(mod, h)
    return None


def _mlp_after_first(mlp: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """PyG's ``MLP.forward`` (2.8) from the output `h` of its first Linear on (no batch
    argument: EdgeConv calls its network with the features alone)."""
    x = h
    for i, norm in enumerate(mlp.norms):
        if i > 0:
            x = mlp.lins[i](x)
        if mlp.act is not None and mlp.act_first:
            x = mlp.act(x)
        x = norm(x, None, None) if mlp.supports_norm_batch else norm(x)
        if mlp.act is not None and not mlp.act_first:
            x = mlp.act(x)
        x = F.dropout(x, p=mlp.dropout[i], training=mlp.training)
    if mlp.plain_last:
        if len(mlp.norms) > 0:
            x = mlp.lins[-1](x)
        x = F.dropout(x, p=mlp.dropout[-1], training=mlp.training)
    return x


def edge_segments(edges: G.Edges):
    """(A, row, col, S): the structure (rows = targets), the target and source of every CSR
    entry, and S ``[num_dst, nnz]`` whose row i holds i's CSR entries as columns (so
    ``spmm(S, m)`` reduces per-edge rows `m` in CSR order per target). Cached per graph."""

    def build(e: G.Edges):
        A, _, row, col = G.structure(e)
        nnz = A.nnz
        dev = A.indptr.device
        ar = torch.arange(nnz, dtype=A.indices.dtype, device=dev)
        st = _Structure(A.indptr, ar, (A.shape[0], nnz))
        # its transpose: one entry per edge, in the same order
        st.transpose = (torch.arange(nnz + 1, dtype=A.indptr.dtype, device=dev),
                        row.to(A.indices.dtype), ar)
        return A, row, col, SparseMatrix(st)

    return G.prepared(edges, "edge_segments", build)


class EdgeConv(nn.Module):
    """PyG's ``EdgeConv(nn, aggr="max")``: ``x'_i = reduce_j nn(x_i || x_j - x_i)`` over i's
    in-edges, reduce one of ``"max"`` (default), ``"min"``, ``"mean"``, ``"add"`` / ``"sum"``.
    A node without in-edges gets zeros. ``forward(x, edge_index)``; ``x`` may be a pair
    ``(x_src, x_dst)``. The parameters are `nn`'s own, under ``nn.*`` as in PyG."""

    def __init__(self, nn: Callable, aggr: str = "max", **kwargs):
        super().__init__()
        if kwargs:
            raise TypeError(f"EdgeConv: unsupported arguments {sorted(kwargs)} (sparsejit's "
                            "EdgeConv passes messages source to target, node_dim -2)")
        if not isinstance(aggr, str) or aggr not in _REDUCE:
            raise ValueError(f"EdgeConv: aggr must be one of {sorted(_REDUCE)}; got {aggr!r}")
        self.nn = nn
        self.aggr = aggr

    def reset_parameters(self) -> None:
        for m in self.nn.modules():
            if m is not self.nn and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def forward(self, x, edge_index) -> torch.Tensor:
        x_src, x_dst = pair(x)
        if not isinstance(x_src, torch.Tensor) or not isinstance(x_dst, torch.Tensor) or \
                x_src.dim() != 2 or x_dst.dim() != 2:
            raise ValueError("EdgeConv: x must be a [N, F] tensor or a pair of them")
        if x_src.shape[1] != x_dst.shape[1]:
            raise ValueError(f"EdgeConv: x_src has {x_src.shape[1]} features but x_dst has "
                             f"{x_dst.shape[1]}")
        reduce = _REDUCE[self.aggr]
        edges = G.edges_of(edge_index, (x_src.shape[0], x_dst.shape[0]))
        A, row, col, S = edge_segments(edges)
        split = split_first_linear(self.nn)
        fin = x_src.shape[1]
        if split is not None and split[0].weight.shape[1] == 2 * fin:
            lin, rest = split
            w_dst, w_src = lin.weight[:, :fin], lin.weight[:, fin:]
            p = F.linear(x_dst, w_dst - w_src, lin.bias)  # per target node
            q = F.linear(x_src, w_src)                     # per source node
            if rest is None:
                # the whole network is this Linear: p_i + reduce_j q_j, one SpMM over nodes
                deg = A.degree().to(p.dtype).unsqueeze(1)
                out = spmm(A, q, reduce)
                return out + (deg * p if reduce == "sum" else (deg > 0).to(p.dtype) * p)
            h = p.index_select(0, row) + q.index_select(0, col)
            msg = rest(h)
        else:
            xi = x_dst.index_select(0, row)
            msg = self.nn(torch.cat([xi, x_src.index_select(0, col) - xi], dim=-1))
        if not isinstance(msg, torch.Tensor) or msg.dim() != 2 or msg.shape[0] != A.nnz:
            raise ValueError(f"EdgeConv: nn must map [E, 2F] to [E, F_out]; got "
                             f"{tuple(getattr(msg, 'shape', ()))} for {A.nnz} edges")
        return spmm(S, msg, reduce)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(nn={self.nn})"


def knn_graph(x_src: torch.Tensor, x_dst: torch.Tensor, k: int,
              batch_src: Optional[torch.Tensor] = None,
              batch_dst: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``[2, E]`` edges j -> i from each of the (at most) `k` nearest rows j of `x_src` to
    every row i of `x_dst` (Euclidean distance; a row is its own nearest neighbour when the two
    are the same), within the same example of the sorted batch vectors, grouped by target in
    target order (so the mini-batch path builds the CSR without a sort), as PyG's ``knn``
    (pyg-lib) gives DynamicEdgeConv. Brute force per example: ``torch.cdist`` and ``topk``
    (memory n_dst x n_src per example); no gradient flows through the choice."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"knn_graph: k must be a positive int; got {k!r}")
    dev = x_dst.device
    if batch_src is None and batch_dst is None:
        groups = [(0, x_src.shape[0], 0, x_dst.shape[0])]
    else:
        bs = torch.zeros(x_src.shape[0], dtype=torch.long, device=dev) if batch_src is None \
            else batch_src.to(torch.long)
        bd = torch.zeros(x_dst.shape[0], dtype=torch.long, device=dev) if batch_dst is None \
            else batch_dst.to(torch.long)
        for name, b, x in (("batch_src", bs, x_src), ("batch_dst", bd, x_dst)):
            if b.dim() != 1 or b.shape[0] != x.shape[0] or \
                    (b.numel() > 1 and not bool((b[1:] >= b[:-1]).all())):
                raise ValueError(f"knn_graph: {name} must be a sorted [{x.shape[0]}] vector")
        top = int(max(bs.max() if bs.numel() else -1, bd.max() if bd.numel() else -1)) + 1
        ps = torch.searchsorted(bs, torch.arange(top + 1, device=dev)).tolist()
        pd = torch.searchsorted(bd, torch.arange(top + 1, device=dev)).tolist()
        groups = [(ps[g], ps[g + 1], pd[g], pd[g + 1]) for g in range(top)]
    src, dst = [], []
    with torch.no_grad():
        for s0, s1, d0, d1 in groups:
            if s1 == s0 or d1 == d0:
                continue
            dist = torch.cdist(x_dst[d0:d1].float(), x_src[s0:s1].float())
            nb = dist.topk(min(k, s1 - s0), dim=1, largest=False).indices
            src.append(nb.reshape(-1) + s0)
            dst.append(torch.arange(d0, d1, device=dev).repeat_interleave(nb.shape[1]))
    if not src:
        return torch.zeros(2, 0, dtype=torch.long, device=dev)
    return torch.stack([torch.cat(src), torch.cat(dst)])


class DynamicEdgeConv(EdgeConv):
    """PyG's ``DynamicEdgeConv(nn, k, aggr="max")``: :class:`EdgeConv` over the k-nearest-
    neighbour graph of the input features, rebuilt every call (:func:`knn_graph`: brute force,
    sparsejit's own; PyG needs pyg-lib's knn). ``forward(x, batch=None)``, ``x`` and
    ``batch`` tensors or pairs (source, target)."""

    def __init__(self, nn: Callable, k: int, aggr: str = "max", num_workers: int = 1,
                 **kwargs):
        super().__init__(nn, aggr, **kwargs)
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"DynamicEdgeConv: k must be a positive int; got {k!r}")
        self.k = k
        self.num_workers = num_workers

    def forward(self, x, batch=None) -> torch.Tensor:
        x_src, x_dst = pair(x)
        if not isinstance(x_src, torch.Tensor) or x_src.dim() != 2:
            raise ValueError("DynamicEdgeConv: x must be [N, F] (static graphs are not "
                             "supported, as in PyG)")
        b_src, b_dst = (None, None) if batch is None else pair(batch)
        edge_index = knn_graph(x_src, x_dst, self.k, b_src, b_dst)
        return super().forward((x_src, x_dst), edge_index)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(nn={self.nn}, k={self.k})"
