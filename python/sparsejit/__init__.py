"""sparsejit: sparse neural-network operators for PyTorch.

    import sparsejit as sj
    A = sj.SparseMatrix.from_edge_index(edge_index, num_nodes)
    Y = sj.spmm(A, X, reduce="sum")      # message passing: sum over in-neighbours
    S = sj.sddmm(A, Q, K)                # per-edge dot products
    P = sj.edge_softmax(A, S)            # softmax over each row's entries

Every op is a Torch custom op (``torch.ops.sparsejit.*``) with autograd and a fake
implementation, so it works under torch.compile and torch.export.
"""

from sparsejit import _library  # noqa: F401  (loads the op library)
from sparsejit import _core, runtime
from sparsejit.runtime import caches as _caches  # noqa: F401
from sparsejit.families import attention as _attention, filter_conv as _filter_conv  # noqa: F401
from sparsejit.families import point_conv as _point_conv, rgms as _rgms, spmm as _spmm  # noqa: F401
from sparsejit.families.attention import gat_attention, gatv2_attention, sparse_attention
from sparsejit.families.filter_conv import sparsify
from sparsejit.families.point_conv import SparseTensor, voxelize
from sparsejit.families.dense import gather_matmul, linear, segment_matmul
from sparsejit.families.rgms import TypedSparseMatrix, rgms
from sparsejit.families.spmm import SparseMatrix, edge_softmax, fingerprint, sddmm, spmm
from sparsejit.runtime.tuners import explain, tune
from sparsejit import nn  # noqa: E402
from sparsejit import spconv  # noqa: E402,F401  (spconv-compatible modules)
from sparsejit.convert import accelerate, restore  # noqa: E402  (one-line model conversion)


def clear_caches() -> None:
    """Drops every in-memory cache (each registers with ``sparsejit.runtime.caches``: built
    structures, plans, stored-schedule lookups; and the op library's once-per-tensor
    validation tables) and the loaded JIT functions (shared objects stay mapped; their handles
    are dropped). The disk cache stays. :func:`cache_stats` shows what they hold. What the
    memory allocator then has free goes back to the system (glibc's ``malloc_trim``)."""
    import gc

    runtime.caches.clear_all()
    _core.jit_clear_memory_cache()
    gc.collect()  # structures in reference cycles release their arrays now
    _core.trim_heap()


from sparsejit.runtime.caches import cache_budget, cache_stats, set_cache_budget  # noqa: E402


__version__ = "0.1.0"

# SparseMatrix objects (structure, values, cached transpose and plans) load with
# torch.load's default weights_only=True.
import torch as _torch  # noqa: E402

from sparsejit.families.spmm.matrix import _Structure  # noqa: E402

_torch.serialization.add_safe_globals([SparseMatrix, _Structure])

ops = _library.ops  # torch.ops.sparsejit: the raw ops


def row_stats(A: SparseMatrix) -> dict:
    """Inspector statistics of A's structure (see SparseMatrix.row_stats)."""
    return A.row_stats()


__all__ = ["nn", "sparsify", "tune", "explain", "clear_caches", "cache_stats", "cache_budget",
           "set_cache_budget", "fingerprint", "SparseMatrix",
           "spmm", "sddmm", "edge_softmax", "rgms", "segment_matmul", "gather_matmul", "linear",
           "TypedSparseMatrix", "row_stats", "ops", "__version__", "sparse_attention",
           "gat_attention", "gatv2_attention", "SparseTensor", "voxelize", "spconv",
           "accelerate", "restore"]


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
