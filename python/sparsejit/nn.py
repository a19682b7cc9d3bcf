"""Graph and image layers built on sparsejit ops, one import for all of them: each lives in its
family (``sparsejit.families.<family>.layers``) and is re-exported here.

GCNConv, SAGEConv, GraphConv, GINConv, GINEConv, EdgeConv, DynamicEdgeConv (spmm family),
GATConv, GATv2Conv, TransformerConv (attention family) and RGCNConv / FastRGCNConv (rgms family) are drop-ins for
torch_geometric's layers: same constructors, parameter names and ``forward(x, edge_index,
...)``, so a PyG model switches by changing its import and a PyG layer's ``state_dict()``
loads. ``edge_index`` may be a ``[2, E]`` tensor, PyG's ``EdgeIndex``, a torch.sparse adjacency
or a ``SparseMatrix`` (rows = targets). See docs/MIGRATING_FROM_PYG.md. ``PrunedConv2d`` and
``SparseLinear`` (filter_conv family) run pruned convolutions; ``ResidualPrunedConv2d`` adds a
residual and ReLU in the output write, ``FusedBottleneck`` runs a pruned ResNet bottleneck as
one op over bands of rows (what ``sparsify`` makes of them where faster).
"""

from sparsejit.families.attention.layers import GATConv, GATv2Conv, TransformerConv
from sparsejit.families.filter_conv.fused import FusedBottleneck
from sparsejit.families.filter_conv.layers import ResidualPrunedConv2d, PrunedConv2d, SparseLinear
from sparsejit.families.rgms.layers import FastRGCNConv, RGCNConv
from sparsejit.families.spmm.edge_conv import DynamicEdgeConv, EdgeConv
from sparsejit.families.spmm.layers import (GCNConv, GINConv, GINEConv, GraphConv, SAGEConv,
                                            gcn_norm)

__all__ = ["gcn_norm", "GCNConv", "SAGEConv", "GraphConv", "GINConv", "GINEConv", "EdgeConv",
           "DynamicEdgeConv", "GATConv", "GATv2Conv", "TransformerConv", "RGCNConv",
           "FastRGCNConv", "PrunedConv2d", "SparseLinear", "ResidualPrunedConv2d",
           "FusedBottleneck"]
