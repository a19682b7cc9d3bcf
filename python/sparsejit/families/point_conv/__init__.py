"""The point_conv family: sparse convolution on point clouds (kernel maps by merging sorted
coordinate keys), ``SparseTensor`` / ``voxelize``, and the spconv-compatible modules."""

from sparsejit.families.point_conv.ops import point_conv_plan, point_conv
from sparsejit.families.point_conv.tensor import SparseTensor, voxelize
from sparsejit.families.point_conv import spconv  # noqa: F401
from sparsejit.families.point_conv import tuner  # noqa: F401  (registers sj.tune for conv plans and models)

__all__ = ["point_conv_plan", "point_conv", "SparseTensor", "voxelize"]
