"""The rgms family: relational gather-matmul-scatter on a typed structure
(``TypedSparseMatrix``) and R-GCN (segment_matmul and the Linear: the dense family)."""

from sparsejit.families.rgms.ops import TypedSparseMatrix, rgms
from sparsejit.families.rgms import tuner  # noqa: F401  (registers sj.tune for TypedSparseMatrix)

__all__ = ["TypedSparseMatrix", "rgms"]
