"""TorchSparse 2.0-compatible API on sparsejit's point-cloud convolution:
``import sparsejit.torchsparse as torchsparse`` and ``import sparsejit.torchsparse.nn as
spnn`` replace TorchSparse's imports (coords ``[N, 4]`` = x, y, z, batch; ``Conv3d`` kernels
``[K, C_in, C_out]`` in its offset order, so its state dicts load), plus SPVCNN's point-voxel
helpers. See docs/SPARSE_CONV.md, "MinkowskiEngine and TorchSparse APIs"."""

from sparsejit.torchsparse import nn, utils  # noqa: F401
from sparsejit.torchsparse.pointvoxel import initial_voxelize, point_to_voxel, voxel_to_point
from sparsejit.torchsparse.tensor import PointTensor, SparseTensor, cat

__all__ = ["SparseTensor", "PointTensor", "cat", "nn", "initial_voxelize", "point_to_voxel",
           "voxel_to_point", "utils"]
