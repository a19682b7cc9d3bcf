"""sparsejit: sparse neural-network operators for PyTorch.

    import sparsejit as sj
    A = sj.SparseMatrix.from_edge_index(edge_index, num_nodes)
    Y = sj.spmm(A, X, reduce="sum")      # message passing: sum over in-neighbours
    S = sj.sddmm(A, Q, K)                # per-edge dot products
    P = sj.edge_softmax(A, S)            # softmax over each row's entries

Every op is a Torch custom op (``torch.ops.sparsejit.*``) with autograd and a fake
implementation, so it works under torch.compile and torch.export.
"""

from . import _library  # noqa: F401  (loads the op library)
from .matrix import SparseMatrix
from .ops import TypedSparseMatrix, edge_softmax, gather_matmul, rgms, sddmm, segment_matmul, spmm  # also registers every fake and autograd formula
from .ops import gat_attention, gatv2_attention, sparse_attention  # noqa: E402
from . import nn  # noqa: E402
from . import spconv  # noqa: E402,F401  (spconv-compatible modules)
from .pointcloud import SparseTensor, voxelize  # noqa: E402
from .plans import clear_caches, fingerprint
from .tuning import explain, tune
from .filter_conv import sparsify  # noqa: E402

__version__ = "0.1.0"

# SparseMatrix objects (structure, values, cached transpose and plans) load with
# torch.load's default weights_only=True.
import torch as _torch  # noqa: E402

from .matrix import _Structure  # noqa: E402

_torch.serialization.add_safe_globals([SparseMatrix, _Structure])

ops = _library.ops


def row_stats(A: SparseMatrix) -> dict:
    """Inspector statistics of A's structure (see SparseMatrix.row_stats)."""
    return A.row_stats()


__all__ = ["nn", "sparsify", "tune", "explain", "clear_caches", "fingerprint", "SparseMatrix", "spmm", "sddmm", "edge_softmax", "rgms", "segment_matmul", "gather_matmul", "TypedSparseMatrix", "row_stats", "ops", "__version__", "sparse_attention", "gat_attention",
           "gatv2_attention", "SparseTensor", "voxelize", "spconv"]


def _cmake_prefix_path() -> str:
    """Where find_package(sparsejit) looks: the CMake package inside a pip install, or the
    development build's install tree (like torch.utils.cmake_prefix_path)."""
    from pathlib import Path
    here = Path(__file__).resolve().parent
    for p in (here / "share" / "cmake", here.parent.parent / "build" / "install" / "lib" / "cmake"):
        if (p / "sparsejit" / "sparsejitConfig.cmake").exists():
            return str(p)
    return str(here / "share" / "cmake")


cmake_prefix_path = _cmake_prefix_path()
