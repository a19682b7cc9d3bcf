"""MinkowskiEngine 0.5-compatible API on sparsejit's point-cloud convolution:
``import sparsejit.minkowski as ME`` replaces ``import MinkowskiEngine as ME`` (same names,
arguments, coordinate keys and parameter layouts, so ME state dicts load). See
docs/SPARSE_CONV.md, "MinkowskiEngine and TorchSparse APIs"."""

from sparsejit.minkowski import utils  # noqa: F401
from sparsejit.minkowski.field import TensorField
from sparsejit.minkowski.modules import (NONLINEARITIES, MinkowskiAvgPooling, MinkowskiBatchNorm,
                                         MinkowskiConvolution, MinkowskiConvolutionBase,
                                         MinkowskiConvolutionTranspose,
                                         MinkowskiGlobalAvgPooling, MinkowskiGlobalMaxPooling,
                                         MinkowskiGlobalPooling, MinkowskiGlobalSumPooling,
                                         MinkowskiLinear, MinkowskiMaxPooling,
                                         MinkowskiModuleBase, MinkowskiNetwork,
                                         MinkowskiNonlinearityBase, MinkowskiPoolingTranspose,
                                         MinkowskiSumPooling, PoolingMode)
from sparsejit.minkowski.tensor import (CoordinateManager, CoordinateMapKey, SparseTensor,
                                        SparseTensorQuantizationMode, cat)

globals().update(NONLINEARITIES)  # MinkowskiReLU, MinkowskiLeakyReLU, ..., MinkowskiDropout

__all__ = [
    "SparseTensor", "SparseTensorQuantizationMode", "CoordinateManager", "CoordinateMapKey",
    "cat", "utils", "TensorField", "MinkowskiModuleBase", "MinkowskiNetwork",
    "MinkowskiConvolutionBase",
    "MinkowskiConvolution", "MinkowskiConvolutionTranspose", "MinkowskiBatchNorm",
    "MinkowskiLinear", "MinkowskiNonlinearityBase", "MinkowskiAvgPooling",
    "MinkowskiSumPooling", "MinkowskiMaxPooling", "MinkowskiPoolingTranspose",
    "MinkowskiGlobalPooling", "MinkowskiGlobalAvgPooling", "MinkowskiGlobalSumPooling",
    "MinkowskiGlobalMaxPooling", "PoolingMode", *NONLINEARITIES,
]
