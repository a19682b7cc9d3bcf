"""The attention family: fused sparse attention (softmax over each row's entries times V in
one pass) and the GAT / GATv2 / Transformer layers."""

from sparsejit.families.attention.ops import gat_attention, gatv2_attention, sparse_attention

__all__ = ["sparse_attention", "gat_attention", "gatv2_attention"]
