"""The spmm family's op wrappers under their old name (``sparsejit.families.spmm``)."""

from sparsejit.families.spmm import edge_softmax, sddmm, spmm  # noqa: F401
