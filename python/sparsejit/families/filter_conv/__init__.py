"""The filter_conv family: pruned Conv2d inference (``PrunedConv2d``, ``SparseLinear``) and
``sparsify`` with BatchNorm folding (its tuner: ``sj.tune`` / ``sj.explain`` on a model with a
dense example input)."""

from sparsejit.families.filter_conv.layers import PrunedConv2d, SparseLinear
from sparsejit.families.filter_conv.tuner import sparsify
from sparsejit.families.filter_conv.fused import FusedBottleneck

__all__ = ["FusedBottleneck", "PrunedConv2d", "SparseLinear", "sparsify"]
