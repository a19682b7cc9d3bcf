# Per-call overhead of the op library on tiny inputs (64 nodes, 256 edges, F = 16), where the
# stable-ABI backend's dispatcher calls by name would show: median of 21 batches of 500 calls,
# microseconds per call. Run it once per build, alternately:
#   PYTHONPATH=<build>/python python3 benchmarks/archive/stable_abi_overhead.py
import statistics
import time

import torch

import sparsejit as sj
from sparsejit import _library
torch.manual_seed(0)
n, e = 64, 256
ei = torch.randint(0, n, (2, e))
A = sj.SparseMatrix.from_edge_index(ei, n)
X = torch.randn(n, 16)
Q, K = torch.randn(n, 16), torch.randn(n, 16)
et = torch.randint(0, 4, (e,))
T = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=4)
W = torch.randn(4, 16, 16)
raw = torch.ops.sparsejit
cases = {
    "spmm sum (public)": lambda: sj.spmm(A, X),
    "spmm raw op": lambda: raw.spmm(A.indptr, A.indices, None, X, "sum", n),
    "sddmm (public)": lambda: sj.sddmm(A, Q, K),
    "rgms (public)": lambda: sj.rgms(T, X, W),
}
def med(fn):
    for _ in range(200): fn()
    ts = []
    for _ in range(21):
        t0 = time.perf_counter()
        for _ in range(500): fn()
        ts.append((time.perf_counter() - t0) / 500 * 1e6)
    return statistics.median(ts)
tag = "stable" if _library.STABLE_ABI else "aten"
for k, fn in cases.items():
    print(f"{tag}\t{k}\t{med(fn):.2f}")
