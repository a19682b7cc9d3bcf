"""The filter_conv family: pruned Conv2d inference (``SparseConv2d``, ``SparseLinear``) and
``sparsify`` with BatchNorm folding (its tuner: ``sj.tune`` / ``sj.explain`` on a model with a
dense example input)."""

from sparsejit.families.filter_conv.layers import SparseConv2d, SparseLinear
from sparsejit.families.filter_conv.tuner import sparsify
from sparsejit.families.filter_conv.fused import FusedBottleneck

__all__ = ["FusedBottleneck", "SparseConv2d", "SparseLinear", "sparsify"]
