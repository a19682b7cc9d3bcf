"""The rgms family: relational gather-matmul-scatter on a typed structure
(``TypedSparseMatrix``), segment_matmul / gather_matmul, R-GCN, and ``linear`` (a Linear on the
same dense GEMM layer, which the PyG-signature layers use where it is faster)."""

from sparsejit.families.rgms.ops import (TypedSparseMatrix, gather_matmul, linear, rgms,
                                         segment_matmul)
from sparsejit.families.rgms import tuner  # noqa: F401  (registers sj.tune for TypedSparseMatrix)

__all__ = ["TypedSparseMatrix", "rgms", "segment_matmul", "gather_matmul", "linear"]
