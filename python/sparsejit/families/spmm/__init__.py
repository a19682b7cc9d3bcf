"""The spmm family: SpMM, SDDMM, edge softmax on a CSR structure (``SparseMatrix``)."""

from sparsejit.families.spmm import csr  # noqa: F401  (fakes of the structure ops)
from sparsejit.families.spmm.edge_softmax import edge_softmax
from sparsejit.families.spmm.matrix import SparseMatrix
from sparsejit.families.spmm.plans import fingerprint
from sparsejit.families.spmm.sddmm import sddmm
from sparsejit.families.spmm.spmm import spmm
from sparsejit.families.spmm import tuner  # noqa: F401  (registers sj.tune / sj.explain for SparseMatrix)

__all__ = ["SparseMatrix", "spmm", "sddmm", "edge_softmax", "fingerprint"]
