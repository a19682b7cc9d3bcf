"""Where SpMM's time goes on a graph larger than cache: the same CSR row pointers and entry
count with the column indices changed, so only the locality of the gathered X rows differs.

    python3 benchmarks/archive/bench_spmm_locality.py [--graph SPEC] [--features 64 128]

Rows: the graph's own columns; sequential columns (entry p reads row p mod n: the same bytes,
streamed); random columns within 1/8 of X (a working set that fits a large L3); and the
columns split into 2-4 segments, one SpMM per segment timed apart (what cache blocking by
column could gain at most, before combining the partial outputs). Bytes are counted with no
reuse (one gathered row per entry, the output, the indices); the process's own copy_ of X is
the bandwidth reference.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import sparsejit as sj
from sparsejit.tools.data import load_graph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from ab_sparsejit import _median_ms  # noqa: E402


def median_ms(fn):
    return _median_ms(fn, warmup=3, repeat=9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", default="powerlaw:n=200000,avg=12,alpha=2.1,seed=1")
    ap.add_argument("--features", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = load_graph(args.graph)
    n = g.num_nodes
    A = sj.SparseMatrix.from_edge_index(g.edge_index, n)
    rp, col = A.indptr, A.indices
    nnz = col.numel()
    row = A.row_indices()

    def with_cols(c):
        return sj.SparseMatrix.from_csr(rp, c.to(col.dtype), shape=(n, n))

    def segment(lo, hi):
        keep = (col >= lo) & (col < hi)
        p = torch.zeros(n + 1, dtype=rp.dtype)
        p[1:] = torch.cumsum(torch.bincount(row[keep], minlength=n), 0)
        return sj.SparseMatrix.from_csr(p, col[keep], shape=(n, n))

    cases = [("the graph's own columns", A),
             ("sequential columns", with_cols(torch.arange(nnz) % n)),
             ("random columns within 1/8 of X", with_cols(col % max(n // 8, 1)))]
    from sparsejit.info import cpu_line
    print(f"CPU: {cpu_line()}, {args.threads} threads; graph {args.graph}: {n} nodes, {nnz} "
          "entries\n")
    print("| columns | F | ms | GB/s (no-reuse bytes) |\n|---|---|---|---|")
    for F in args.features:
        X = torch.randn(n, F)
        out = torch.empty(n, F)
        nbytes = nnz * F * 4 + n * F * 4 + nnz * col.element_size()
        for name, M in cases:
            ms = median_ms(lambda: sj.spmm(M, X))
            print(f"| {name} | {F} | {ms:.2f} | {nbytes / ms / 1e6:.1f} |")
        for S in (2, 3, 4):
            parts = [segment(n * s // S, n * (s + 1) // S) for s in range(S)]
            ms = sum(median_ms(lambda P=P: sj.spmm(P, X)) for P in parts)
            print(f"| {S} column segments, one SpMM each (sum of their times) | {F} | "
                  f"{ms:.2f} | {nbytes / ms / 1e6:.1f} |")
        ms = median_ms(lambda: out.copy_(X))
        print(f"| copy_ of X (bandwidth reference) | {F} | {ms:.2f} | "
              f"{2 * n * F * 4 / ms / 1e6:.1f} |")


if __name__ == "__main__":
    main()
