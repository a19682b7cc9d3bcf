"""Graph neural network layers built on sparsejit ops.

Each layer takes node features and a SparseMatrix whose rows are targets and columns are
sources (``SparseMatrix.from_edge_index``), so they drop in where PyG layers take
``edge_index``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .ops import edge_softmax, spmm
from .matrix import SparseMatrix


def gcn_norm(A: SparseMatrix, add_self_loops: bool = True, dtype=torch.float32) -> SparseMatrix:
    """A with GCN's symmetric normalisation ``D^-1/2 (A + I) D^-1/2`` as values.

    Existing values are used as edge weights (1 when absent)."""
    n = A.shape[0]
    if A.shape[0] != A.shape[1]:
        raise ValueError(f"gcn_norm needs a square matrix; got shape {A.shape}")
    row = A.row_indices()
    col = A.indices.to(torch.long)
    w = A.values if A.values is not None else torch.ones(A.nnz, dtype=dtype, device=A.device)
    if w.dim() != 1:
        raise ValueError("gcn_norm needs single-head values ([nnz])")
    if add_self_loops:
        loop = torch.arange(n, device=A.device)
        edge_index = torch.stack([torch.cat([col, loop]), torch.cat([row, loop])])
        w = torch.cat([w, torch.ones(n, dtype=w.dtype, device=A.device)])
        A = SparseMatrix.from_edge_index(edge_index, n, values=w)
        row, col, w = A.row_indices(), A.indices.to(torch.long), A.values
    deg = torch.zeros(n, dtype=w.dtype, device=A.device).index_add_(0, row, w)
    dinv = deg.pow(-0.5)
    dinv = torch.where(torch.isinf(dinv), torch.zeros_like(dinv), dinv)
    return A.with_values(dinv[row] * w * dinv[col])


class GCNConv(nn.Module):
    """Graph convolution (Kipf & Welling): ``A_hat X W + b``, with A_hat from gcn_norm."""

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True):
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        nn.init.xavier_uniform_(self.lin.weight)

    def forward(self, x: torch.Tensor, A_hat: SparseMatrix) -> torch.Tensor:
        out = spmm(A_hat, self.lin(x), "sum")
        return out + self.bias if self.bias is not None else out


class SAGEConv(nn.Module):
    """GraphSAGE: ``W_self x_i + W_neigh reduce_{j -> i} x_j``."""

    def __init__(self, in_channels: int, out_channels: int, aggr: str = "mean"):
        super().__init__()
        self.aggr = aggr
        self.lin_neigh = nn.Linear(in_channels, out_channels)
        self.lin_self = nn.Linear(in_channels, out_channels, bias=False)

    def forward(self, x: torch.Tensor, A: SparseMatrix) -> torch.Tensor:
        return self.lin_neigh(spmm(A, x, self.aggr)) + self.lin_self(x)


class GATConv(nn.Module):
    """Graph attention (Veličković et al.) with `heads` heads, outputs concatenated.

    Logits ``e_ij = LeakyReLU(a_dst . W x_i + a_src . W x_j)`` per stored entry, softmax
    over each target's in-edges (edge_softmax), then a multi-head weighted sum (spmm)."""

    def __init__(self, in_channels: int, out_channels: int, heads: int = 1,
                 negative_slope: float = 0.2, bias: bool = True):
        super().__init__()
        self.heads, self.out_channels = heads, out_channels
        self.negative_slope = negative_slope
        self.lin = nn.Linear(in_channels, heads * out_channels, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_channels))
        self.bias = nn.Parameter(torch.zeros(heads * out_channels)) if bias else None
        nn.init.xavier_uniform_(self.lin.weight)
        bound = math.sqrt(6.0 / (heads + out_channels))
        nn.init.uniform_(self.att_src, -bound, bound)
        nn.init.uniform_(self.att_dst, -bound, bound)

    def forward(self, x: torch.Tensor, A: SparseMatrix,
                return_attention: bool = False):
        h = self.lin(x).view(-1, self.heads, self.out_channels)
        a_src = (h * self.att_src).sum(-1)  # [N, H]
        a_dst = (h * self.att_dst).sum(-1)
        row = A.row_indices()
        col = A.indices.to(torch.long)
        logits = F.leaky_relu(a_dst[row] + a_src[col], self.negative_slope)
        alpha = edge_softmax(A, logits)
        out = spmm(A.with_values(alpha), h, "sum").reshape(-1, self.heads * self.out_channels)
        if self.bias is not None:
            out = out + self.bias
        return (out, alpha) if return_attention else out


__all__ = ["gcn_norm", "GCNConv", "SAGEConv", "GATConv"]
