"""One module per op family: its user-facing wrapper, fake (meta) implementations and
autograd formula. Importing this package registers every fake and autograd formula.

A new op family adds ``ops/<family>.py`` and one import line here.
"""

from . import csr  # noqa: F401  (fakes of the structure ops)
from . import filter_conv as _filter_conv  # noqa: F401  (fakes of the filter-sparse conv ops)
from .attention import gat_attention, gatv2_attention, sparse_attention
from .edge_softmax import edge_softmax
from .rgms import TypedSparseMatrix, gather_matmul, rgms, segment_matmul
from .sddmm import sddmm
from .spmm import spmm
from .sparse_conv import conv_plan, sparse_conv  # noqa: F401

__all__ = ["spmm", "sddmm", "edge_softmax", "rgms", "segment_matmul", "gather_matmul", "TypedSparseMatrix", "sparse_attention",
           "gat_attention", "gatv2_attention"]
