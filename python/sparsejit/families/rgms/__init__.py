"""The rgms family: relational gather-matmul-scatter on a typed structure
(``TypedSparseMatrix``), segment_matmul / gather_matmul, and R-GCN."""

from sparsejit.families.rgms.ops import (TypedSparseMatrix, gather_matmul, rgms,
                                         segment_matmul)
from sparsejit.families.rgms import tuner  # noqa: F401  (registers sj.tune for TypedSparseMatrix)

__all__ = ["TypedSparseMatrix", "rgms", "segment_matmul", "gather_matmul"]
