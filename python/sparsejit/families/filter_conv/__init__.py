"""The filter_conv family: pruned Conv2d inference (``SparseConv2d``, ``SparseLinear``,
``sparsify`` with BatchNorm folding)."""

from sparsejit.families.filter_conv.layers import SparseConv2d, SparseLinear, sparsify
from sparsejit.families.filter_conv.fused import FusedBottleneck

__all__ = ["FusedBottleneck", "SparseConv2d", "SparseLinear", "sparsify"]
