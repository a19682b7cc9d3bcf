"""Old location of the op wrappers, kept for existing imports: ``sparsejit.ops.<op>`` names the
module that now lives in ``sparsejit.families.<family>`` (the same module object), and the
wrapper functions are re-exported as before. New code imports from ``sparsejit`` or
``sparsejit.families``. (``sj.ops``, the attribute, is ``torch.ops.sparsejit``: the raw ops.)"""

import sys as _sys

from sparsejit.families.attention import ops as _attention
from sparsejit.families.filter_conv import ops as _filter_conv
from sparsejit.families.point_conv import ops as _point_conv
from sparsejit.families.rgms import ops as _rgms
from sparsejit.families.spmm import _common, csr, edge_softmax as _edge_softmax, sddmm as _sddmm
from sparsejit.families.spmm import spmm as _spmm

for _name, _mod in (("attention", _attention), ("filter_conv", _filter_conv),
                    ("sparse_conv", _point_conv), ("rgms", _rgms), ("_common", _common),
                    ("csr", csr), ("edge_softmax", _edge_softmax), ("sddmm", _sddmm),
                    ("spmm", _spmm)):
    _sys.modules[f"{__name__}.{_name}"] = _mod

from sparsejit.families.attention.ops import gat_attention, gatv2_attention, sparse_attention  # noqa: E402
from sparsejit.families.point_conv.ops import conv_plan, sparse_conv  # noqa: E402,F401
from sparsejit.families.rgms.ops import (TypedSparseMatrix, gather_matmul, rgms,  # noqa: E402
                                         segment_matmul)
from sparsejit.families.spmm.edge_softmax import edge_softmax  # noqa: E402
from sparsejit.families.spmm.sddmm import sddmm  # noqa: E402
from sparsejit.families.spmm.spmm import spmm  # noqa: E402

__all__ = ["spmm", "sddmm", "edge_softmax", "rgms", "segment_matmul", "gather_matmul",
           "TypedSparseMatrix", "sparse_attention", "gat_attention", "gatv2_attention"]
