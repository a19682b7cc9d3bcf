"""spconv 2.x-compatible sparse convolution on the CPU: ``import sparsejit.spconv as spconv``
replaces ``import spconv.pytorch as spconv`` (same module names, constructor arguments,
``indice_key`` behaviour and weight layout ``[out, *kernel, in]``, so spconv state dicts load).
"""

from sparsejit.families.point_conv.spconv.conv import (SparseConv1d, SparseConv2d, SparseConv3d, SparseConv4d,
                   SparseConvolution, SparseConvTranspose1d, SparseConvTranspose2d,
                   SparseConvTranspose3d, SparseInverseConv1d, SparseInverseConv2d,
                   SparseInverseConv3d, SparseModule, SubMConv1d, SubMConv2d, SubMConv3d,
                   SubMConv4d)
from sparsejit.families.point_conv.spconv.core import IndiceData, SparseConvTensor
from sparsejit.families.point_conv.spconv.modules import (SparseMaxPool, SparseMaxPool1d, SparseMaxPool2d, SparseMaxPool3d,
                      SparseSequential, ToDense, is_spconv_module)

__all__ = [
    "SparseConvTensor", "IndiceData", "SparseModule", "SparseConvolution", "SparseSequential",
    "ToDense", "SubMConv1d", "SubMConv2d", "SubMConv3d", "SubMConv4d", "SparseConv1d",
    "SparseConv2d", "SparseConv3d", "SparseConv4d", "SparseConvTranspose1d",
    "SparseConvTranspose2d", "SparseConvTranspose3d", "SparseInverseConv1d",
    "SparseInverseConv2d", "SparseInverseConv3d", "SparseMaxPool", "SparseMaxPool1d",
    "SparseMaxPool2d", "SparseMaxPool3d", "is_spconv_module",
]
