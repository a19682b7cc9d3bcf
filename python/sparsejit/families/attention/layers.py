"""PyG-signature attention layers: GATConv and TransformerConv on the fused sparse attention
and GATv2Conv on the fused sparse attention (``sparsejit.gat_attention`` /
``sparse_attention`` / ``gatv2_attention``: no per-edge logits, probabilities or messages in
the forward). With edge features, GATv2Conv and TransformerConv run unfused (the features
enter each entry's score and message: per-edge tensors, like PyG).

Self-loops (``add_self_loops=True``) are appended once per graph (cached); existing ones stay
in the structure with a score of -inf, which removes them from the softmax exactly as PyG's
``remove_self_loops`` does, with static shapes (torch.compile traces it).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from sparsejit.families.spmm.edge_softmax import edge_softmax
from sparsejit.families.spmm.spmm import spmm
from sparsejit.families.attention.ops import gat_attention, gatv2_attention, sparse_attention
from sparsejit.families.spmm import graph as G
from sparsejit.families.spmm.layers import _no_kwargs, apply_linear, glorot_, linear, pair, sizes


def _loop_structure(edges: G.Edges):
    """Cached: the structure with self-loops, and the -inf score mask of old self-loops in
    CSR order (None when there are none; always a tensor under torch.compile)."""

    def build(e):
        A, perm, row, col, old_loop = G.with_self_loops(e)
        mask = old_loop.index_select(0, perm)
        if not torch.compiler.is_compiling() and not bool(mask.any()):
            mask = None
        return A, perm, row, col, old_loop, mask

    return G.prepared(edges, "self_loops", build)


def _graph(edges: G.Edges, add_self_loops: bool, edge_attr, fill_value):
    """(A, perm, row, col, old_loop or None, loop mask or None, edge_attr in CSR order)."""
    if add_self_loops:
        A, perm, row, col, old_loop, mask = _loop_structure(edges)
        if edge_attr is not None:
            if edge_attr.dim() == 1:
                edge_attr = edge_attr.view(-1, 1)
            n = min(edges.num_src, edges.num_dst)
            loop_attr = G.loop_fill(edge_attr, edges, old_loop[: edge_attr.shape[0]],
                                    fill_value, n)
            edge_attr = torch.cat([edge_attr, loop_attr.to(edge_attr.dtype)])
        return A, perm, row, col, old_loop, mask, G.in_csr_order(edge_attr, perm)
    A, perm, row, col = G.structure(edges)
    if edge_attr is not None and edge_attr.dim() == 1:
        edge_attr = edge_attr.view(-1, 1)
    return A, perm, row, col, None, None, G.in_csr_order(edge_attr, perm)


def _masked(logits: Optional[torch.Tensor], mask: Optional[torch.Tensor], nnz: int, heads: int,
            like: torch.Tensor):
    """Per-entry score term with -inf on masked entries (None when there is nothing)."""
    if mask is None:
        return logits
    neg = torch.zeros(nnz, heads, dtype=like.dtype, device=like.device).masked_fill(
        mask.view(-1, 1), float("-inf"))
    return neg if logits is None else logits + neg


def _weights_out(edges: G.Edges, perm, old_loop, alpha_csr: torch.Tensor):
    """(edge_index, alpha) in PyG's order: the input edges without their self-loops, then
    the added loops (or just the input edges without add_self_loops)."""
    n_loops = 0 if old_loop is None else old_loop.shape[0] - edges.src.shape[0]
    loops = torch.arange(n_loops, device=edges.src.device)
    src, dst = torch.cat([edges.src, loops]), torch.cat([edges.dst, loops])
    alpha = alpha_csr if perm is None else torch.empty_like(alpha_csr).index_copy_(
        0, perm, alpha_csr)
    ei = torch.stack([src, dst])
    if old_loop is not None:
        keep = ~old_loop
        ei, alpha = ei[:, keep], alpha[keep]
    return ei, alpha


def _head_dots(x: torch.Tensor, *atts: torch.Tensor) -> torch.Tensor:
    """``(x * att).sum(-1)`` for each ``att`` ``[1, H, C]``, side by side as ``[N, H * len]``,
    as one matrix product ``x.view(N, H C) @ W`` with W block-diagonal (``[H C, H]`` per att):
    one pass over x instead of a product and a sum per att, and the same in the backward."""
    H, C = x.shape[1], x.shape[2]
    eye = torch.eye(H, dtype=x.dtype, device=x.device)
    w = torch.cat([(a.reshape(H, C, 1) * eye.unsqueeze(1)).reshape(H * C, H) for a in atts],
                  dim=1)
    return x.reshape(x.shape[0], H * C) @ w


def _finish(out, concat, res, bias):
    out = out.reshape(out.shape[0], -1) if concat else out.mean(dim=1)
    if res is not None:
        out = out + res
    return out + bias if bias is not None else out


class GATConv(nn.Module):
    """PyG's ``GATConv`` (Veličković et al.), on the fused additive attention.

    Differences: attention dropout is drawn from sparsejit's own counter-based mask (same
    distribution, different draws than PyG); the weights returned with
    ``return_attention_weights`` are before dropout and carry no gradient."""

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int,
                 heads: int = 1, concat: bool = True, negative_slope: float = 0.2,
                 dropout: float = 0.0, add_self_loops: bool = True,
                 edge_dim: Optional[int] = None, fill_value="mean", bias: bool = True,
                 residual: bool = False, **kwargs):
        super().__init__()
        _no_kwargs("GATConv", kwargs)
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope, self.dropout = concat, negative_slope, dropout
        self.add_self_loops, self.edge_dim, self.fill_value = add_self_loops, edge_dim, fill_value
        self.residual = residual
        self.lin = self.lin_src = self.lin_dst = None
        if isinstance(in_channels, int):
            self.lin = linear(in_channels, heads * out_channels, False, glorot=True)
        else:
            self.lin_src = linear(in_channels[0], heads * out_channels, False, glorot=True)
            self.lin_dst = linear(in_channels[1], heads * out_channels, False, glorot=True)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_channels))
        if edge_dim is not None:
            self.lin_edge = linear(edge_dim, heads * out_channels, False, glorot=True)
            self.att_edge = nn.Parameter(torch.empty(1, heads, out_channels))
        else:
            self.lin_edge = None
            self.register_parameter("att_edge", None)
        total = out_channels * (heads if concat else 1)
        if residual:
            res_in = in_channels if isinstance(in_channels, int) else in_channels[1]
            self.res = linear(res_in, total, False, glorot=True)
        else:
            self.register_parameter("res", None)
        self.bias = nn.Parameter(torch.zeros(total)) if bias else None
        for t in (self.att_src, self.att_dst, self.att_edge):
            glorot_(t)

    def forward(self, x, edge_index, edge_attr: Optional[torch.Tensor] = None, size=None,
                return_attention_weights: Optional[bool] = None):
        H, C = self.heads, self.out_channels
        res = None
        if isinstance(x, torch.Tensor):
            if self.res is not None:
                res = self.res(x)
            if self.lin is not None:
                x_src = x_dst = apply_linear(self.lin, x).view(-1, H, C)
            else:
                x_src = apply_linear(self.lin_src, x).view(-1, H, C)
                x_dst = apply_linear(self.lin_dst, x).view(-1, H, C)
        else:
            x_src, x_dst = pair(x)
            if x_dst is not None and self.res is not None:
                res = self.res(x_dst)
            lin_s = self.lin if self.lin is not None else self.lin_src
            lin_d = self.lin if self.lin is not None else self.lin_dst
            x_src = lin_s(x_src).view(-1, H, C)
            x_dst = lin_d(x_dst).view(-1, H, C) if x_dst is not None else None
        n_src, n_dst = sizes(x_src, x_dst, size)
        if x_dst is x_src:  # both scores in one product over the shared features
            a_src, a_dst = _head_dots(x_src, self.att_src, self.att_dst).split(H, dim=1)
        else:
            a_src = _head_dots(x_src, self.att_src)
            a_dst = _head_dots(x_dst, self.att_dst) if x_dst is not None else \
                a_src.new_zeros(n_dst, H)
        edges = G.edges_of(edge_index, (n_src, n_dst))
        A, perm, row, col, old_loop, mask, e = _graph(edges, self.add_self_loops, edge_attr,
                                                      self.fill_value)
        logits = None
        if e is not None and self.lin_edge is not None:
            logits = (self.lin_edge(e).view(-1, H, C) * self.att_edge).sum(-1)
        logits = _masked(logits, mask, A.nnz, H, a_src)
        p = self.dropout if self.training else 0.0
        got = gat_attention(A, a_dst, a_src, x_src, self.negative_slope, logits, p,
                            return_attention_weights=bool(return_attention_weights))
        out, alpha = got if return_attention_weights else (got, None)
        out = _finish(out, self.concat, res, self.bias)
        if return_attention_weights:
            return out, _weights_out(edges, perm, old_loop, alpha)
        return out

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, "
                f"heads={self.heads})")


class GATv2Conv(nn.Module):
    """PyG's ``GATv2Conv`` (Brody et al.): ``e_ij = att . LeakyReLU(W_r x_i + W_l x_j)``, on
    the fused ``gatv2_attention`` (unfused with ``edge_dim``). Same differences from PyG as
    :class:`GATConv` (dropout draws; returned weights before dropout, without gradient)."""

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int,
                 heads: int = 1, concat: bool = True, negative_slope: float = 0.2,
                 dropout: float = 0.0, add_self_loops: bool = True,
                 edge_dim: Optional[int] = None, fill_value="mean", bias: bool = True,
                 share_weights: bool = False, residual: bool = False, **kwargs):
        super().__init__()
        _no_kwargs("GATv2Conv", kwargs)
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope, self.dropout = concat, negative_slope, dropout
        self.add_self_loops, self.edge_dim, self.fill_value = add_self_loops, edge_dim, fill_value
        self.residual, self.share_weights = residual, share_weights
        ins = (in_channels, in_channels) if isinstance(in_channels, int) else in_channels
        self.lin_l = linear(ins[0], heads * out_channels, bias, glorot=True)
        self.lin_r = self.lin_l if share_weights else linear(ins[1], heads * out_channels,
                                                             bias, glorot=True)
        self.att = nn.Parameter(torch.empty(1, heads, out_channels))
        self.lin_edge = (linear(edge_dim, heads * out_channels, False, glorot=True)
                         if edge_dim is not None else None)
        total = out_channels * (heads if concat else 1)
        if residual:
            self.res = linear(ins[1], total, False, glorot=True)
        else:
            self.register_parameter("res", None)
        self.bias = nn.Parameter(torch.zeros(total)) if bias else None
        glorot_(self.att)

    def forward(self, x, edge_index, edge_attr: Optional[torch.Tensor] = None,
                return_attention_weights: Optional[bool] = None):
        H, C = self.heads, self.out_channels
        x_in_l, x_in_r = pair(x)
        res = self.res(x_in_r) if self.res is not None and x_in_r is not None else None
        x_l = apply_linear(self.lin_l, x_in_l).view(-1, H, C)
        x_r = x_l if (self.share_weights and isinstance(x, torch.Tensor)) else \
            apply_linear(self.lin_r, x_in_r).view(-1, H, C)
        edges = G.edges_of(edge_index, (x_l.size(0), x_r.size(0)))
        A, perm, row, col, old_loop, mask, e = _graph(edges, self.add_self_loops, edge_attr,
                                                      self.fill_value)
        p = self.dropout if self.training else 0.0
        want = bool(return_attention_weights)
        if e is None:  # fused: the O(C) score is recomputed per entry, never stored
            got = gatv2_attention(A, x_r, x_l, self.att, None, self.negative_slope,
                                  _masked(None, mask, A.nnz, H, x_l), p,
                                  return_attention_weights=want)
            out, alpha = got if want else (got, None)
        else:  # edge features enter inside the LeakyReLU: per-edge [nnz, H, C], like PyG
            z = x_r.index_select(0, row) + x_l.index_select(0, col) + \
                self.lin_edge(e).view(-1, H, C)
            logits = (F.leaky_relu(z, self.negative_slope) * self.att).sum(-1)
            alpha = edge_softmax(A, _masked(logits, mask, A.nnz, H, logits))
            alpha = F.dropout(alpha, p=self.dropout, training=self.training)
            out = spmm(A.with_values(alpha), x_l, "sum")
        out = _finish(out, self.concat, res, self.bias)
        if want:
            return out, _weights_out(edges, perm, old_loop, alpha)
        return out

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, "
                f"heads={self.heads})")


class TransformerConv(nn.Module):
    """PyG's ``TransformerConv`` (Shi et al.): dot-product attention over each node's
    in-edges on the fused ``sparse_attention``, plus the ``lin_skip`` root term (gated with
    ``beta``). With ``edge_dim`` the edge features enter keys and values per edge, which runs
    unfused (SDDMM, edge_softmax, SpMM)."""

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int,
                 heads: int = 1, concat: bool = True, beta: bool = False, dropout: float = 0.0,
                 edge_dim: Optional[int] = None, bias: bool = True, root_weight: bool = True,
                 **kwargs):
        super().__init__()
        _no_kwargs("TransformerConv", kwargs)
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.beta, self.root_weight = beta and root_weight, root_weight
        self.concat, self.dropout, self.edge_dim = concat, dropout, edge_dim
        ins = (in_channels, in_channels) if isinstance(in_channels, int) else in_channels
        self.lin_key = linear(ins[0], heads * out_channels, bias)
        self.lin_query = linear(ins[1], heads * out_channels, bias)
        self.lin_value = linear(ins[0], heads * out_channels, bias)
        self.lin_edge = linear(edge_dim, heads * out_channels, False) if edge_dim else None
        out_total = heads * out_channels if concat else out_channels
        self.lin_skip = linear(ins[1], out_total, bias)
        self.lin_beta = linear(3 * out_total, 1, False) if self.beta else None

    def forward(self, x, edge_index, edge_attr: Optional[torch.Tensor] = None,
                return_attention_weights: Optional[bool] = None):
        H, C = self.heads, self.out_channels
        x_src, x_dst = pair(x)
        query = apply_linear(self.lin_query, x_dst).view(-1, H, C)
        key = apply_linear(self.lin_key, x_src).view(-1, H, C)
        value = apply_linear(self.lin_value, x_src).view(-1, H, C)
        edges = G.edges_of(edge_index, (key.size(0), query.size(0)))
        A, perm, row, col = G.structure(edges)
        p = self.dropout if self.training else 0.0
        want = isinstance(return_attention_weights, bool)
        if self.lin_edge is not None:
            if edge_attr is None:
                raise ValueError("TransformerConv: edge_attr is required with edge_dim")
            e = self.lin_edge(G.in_csr_order(edge_attr, perm)).view(-1, H, C)
            k_e = key.index_select(0, col) + e
            logits = (query.index_select(0, row) * k_e).sum(-1) / math.sqrt(C)
            alpha = F.dropout(edge_softmax(A, logits), p=p, training=self.training)
            msg = (value.index_select(0, col) + e) * alpha.unsqueeze(-1)
            out = msg.new_zeros((A.shape[0], H, C)).index_add_(0, row, msg)
        else:
            got = sparse_attention(A, query, key, value, 1.0 / math.sqrt(C), None, p,
                                   return_attention_weights=want)
            out, alpha = got if want else (got, None)
        out = out.reshape(-1, H * C) if self.concat else out.mean(dim=1)
        if self.root_weight:
            x_r = apply_linear(self.lin_skip, x_dst)
            if self.lin_beta is not None:
                b = self.lin_beta(torch.cat([out, x_r, out - x_r], dim=-1)).sigmoid()
                out = b * x_r + (1 - b) * out
            else:
                out = out + x_r
        if want:
            return out, _weights_out(edges, perm, None, alpha)
        return out

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, "
                f"heads={self.heads})")
