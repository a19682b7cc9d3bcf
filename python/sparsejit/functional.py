"""The op wrappers, re-exported (they live in ``sparsejit.ops``; kept for existing imports)."""

from .ops import edge_softmax, sddmm, spmm  # noqa: F401
