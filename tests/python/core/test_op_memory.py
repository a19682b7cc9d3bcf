"""Ops called over and over keep no memory: the forward of each family, and forward +
backward. Under torch 2.13's stable ABI every `str` argument leaked the 48-byte std::string its
conversion allocated (pytorch/pytorch#190493; sparsejit now converts its str arguments itself,
torch_ext/tensor_api_stable.h). The blocks were small, but glibc placed them inside the holes
that freed [N, F] outputs leave, so the next output never fit there: a loop of spmm calls
interleaved with other allocations grew the heap by one output per call (a SAGEConv training
loop on PubMed: +28 MB of RSS a step, 5.5 GB after 225 steps). Measured with glibc's
mallinfo2 (bytes in use) and the process's RSS; skipped elsewhere."""

import ctypes
import ctypes.util

import pytest
import torch

import sparsejit as sj
from sparsejit.families.point_conv.ops import point_conv_plan, point_conv
from sparsejit.families.filter_conv.layers import PrunedConv2d


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
                .split()]


def _mallinfo2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


MALLINFO2 = _mallinfo2()
needs_glibc = pytest.mark.skipif(MALLINFO2 is None, reason="needs glibc's mallinfo2 (>= 2.33)")


def _ops():
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 50, (2, 300), generator=g)
    A = sj.SparseMatrix.from_edge_index(ei, 50)
    x = torch.randn(50, 8, generator=g)
    T = sj.TypedSparseMatrix.from_edge_index(ei, 50, edge_type=torch.randint(0, 3, (300,),
                                                                            generator=g),
                                             num_relations=3)
    w = torch.randn(3, 8, 8, generator=g)
    coords = torch.cat([torch.zeros(40, 1, dtype=torch.int32),
                        torch.randint(0, 6, (40, 3), generator=g, dtype=torch.int32)], 1)
    coords = torch.unique(coords, dim=0)
    plan, _ = point_conv_plan(coords, [6, 6, 6], 1, "subm", 3)
    feats = torch.randn(coords.shape[0], 8, generator=g)
    cw = torch.randn(27, 8, 8, generator=g)
    fconv = PrunedConv2d(torch.randn(8, 4, 3, 3, generator=g) *
                         (torch.rand(8, 4, 3, 3, generator=g) > 0.7), padding=1)
    img = torch.randn(1, 4, 9, 9, generator=g)
    q = torch.randn(50, 2, 4, generator=g)
    scores = torch.randn(A.nnz, generator=g)

    def with_grad(fn, *leaves):
        def run():
            ls = [t.detach().requires_grad_() for t in leaves]
            fn(*ls).square().sum().backward()
        return run

    return {
        "spmm sum (str reduce, activation)": lambda: sj.spmm(A, x, "sum"),
        "spmm max + backward": with_grad(lambda t: sj.spmm(A, t, "max"), x),
        "rgms + backward": with_grad(lambda t, u: sj.rgms(T, t, u, reduce="sum"), x, w),
        "sddmm + backward": with_grad(lambda a, b: sj.sddmm(A, a, b), x, x),
        "edge_softmax + backward": with_grad(lambda s: sj.edge_softmax(A, s), scores),
        "sparse_attention + backward": with_grad(lambda a: sj.sparse_attention(A, a, a, a), q),
        "point_conv + backward": with_grad(lambda f, k: point_conv(f, k, None, plan,
                                                                     coords.shape[0]),
                                            feats, cw),
        "filter_conv": lambda: fconv(img),
        "spmm mean": lambda: sj.spmm(A, x, "mean"),
        "spmm raw op": lambda: torch.ops.sparsejit.spmm(A.indptr, A.indices, None, x, "max",
                                                        50, activation="relu"),
        "rgms (str reduce)": lambda: sj.rgms(T, x, w, reduce="mean"),
        "point_conv_plan (str kind)": lambda: point_conv_plan(coords, [6, 6, 6], 1, "subm", 3),
        "sddmm (no str)": lambda: sj.sddmm(A, x, x),
    }


@needs_glibc
@pytest.mark.parametrize("name", list(_ops()))
def test_op_calls_keep_no_heap_bytes(name):
    fn = _ops()[name]
    for _ in range(100):  # caches, plans, JIT kernels and the thread pool settle
        fn()
    calls, grown = 1000, []
    for _ in range(2):  # a leak grows both windows; a one-off allocation (a cache) only one
        before = MALLINFO2().uordblks
        for _ in range(calls):
            fn()
        grown.append(MALLINFO2().uordblks - before)
    # The leak was 48 bytes per str argument per call (96 for spmm): 48k / 96k a window.
    assert min(grown) < 8 * calls, f"{name}: {min(grown) / calls:.1f} bytes kept per call"


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


@needs_glibc
def test_outputs_freed_between_calls_are_reused():
    """spmm's 10 MB output and another 10 MB tensor, alternately allocated and freed (as a
    layer's forward and backward do): the heap reuses the freed outputs. Before the fix RSS
    grew by ~10 MB a round here (+1.1 GB over 120 rounds)."""
    g = torch.Generator().manual_seed(1)
    n, f = 20000, 128
    A = sj.SparseMatrix.from_edge_index(torch.randint(0, n, (2, 90000), generator=g), n)
    x = torch.randn(n, f, generator=g)
    for _ in range(10):
        y, _ = torch.ops.sparsejit.spmm(A.indptr, A.indices, None, x, "sum", n)
        c = torch.empty(n, f)
    start = _rss_mib()
    for _ in range(120):
        y, _ = torch.ops.sparsejit.spmm(A.indptr, A.indices, None, x, "sum", n)
        c = torch.empty(n, f)
    grown = _rss_mib() - start
    del y, c
    assert grown < 200, f"RSS grew by {grown:.0f} MiB over 120 rounds"
