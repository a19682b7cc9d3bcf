"""bfloat16 against float32, per family that takes bfloat16, same inputs, inputs cast
beforehand (the issue's target: bfloat16 at least 1.5x its own float32 on a CPU with
AVX512-BF16 / AMX). Forward only; medians of --repeat calls; prints the CPU line.

    python3 benchmarks/bench_bf16.py [--repeat 15]
"""

from __future__ import annotations

import argparse

import torch

import sparsejit as sj
from sparsejit.info import cpu_line
from sparsejit.runtime.timing import median_ms
from sparsejit.tools.data import load_graph


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", default="powerlaw:n=200000,avg=12,alpha=2.1,seed=1")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = load_graph(args.graph)
    A = sj.SparseMatrix.from_edge_index(g.edge_index, g.num_nodes)
    gen = torch.Generator().manual_seed(0)
    rows = []

    def pair(name, f32, bf16, rep=args.repeat):
        a, b = median_ms(f32, rep, 3), median_ms(bf16, rep, 3)
        rows.append((name, a, b))

    for F in (64, 128):
        X, Q = torch.randn(g.num_nodes, F, generator=gen), torch.randn(g.num_nodes, F, generator=gen)
        Xb, Qb = X.bfloat16(), Q.bfloat16()
        for red in ("sum", "max"):
            pair(f"spmm {red}, F={F}", lambda: sj.spmm(A, X, red), lambda: sj.spmm(A, Xb, red))
        pair(f"sddmm, F={F}", lambda: sj.sddmm(A, Q, X), lambda: sj.sddmm(A, Qb, Xb))
    q = torch.randn(g.num_nodes, 4, 32, generator=gen)
    qb = q.bfloat16()
    pair("sparse_attention, H=4, D=32", lambda: sj.sparse_attention(A, q, q, q),
         lambda: sj.sparse_attention(A, qb, qb, qb), max(args.repeat // 3, 3))
    n, e, r = 100_000, 1_000_000, 50
    ei, et = torch.randint(0, n, (2, e), generator=gen), torch.randint(0, r, (e,), generator=gen)
    T = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    for f in (16, 64):
        x, w = torch.randn(n, f, generator=gen), torch.randn(r, f, f, generator=gen)
        xb, wb = x.bfloat16(), w.bfloat16()
        pair(f"rgms mean, 100k nodes / 1M edges / 50 relations, F={f}",
             lambda: sj.rgms(T, x, w, reduce="mean"), lambda: sj.rgms(T, xb, wb, reduce="mean"),
             max(args.repeat // 2, 3))
    print(f"CPU: {cpu_line()}; {args.threads} threads; graph {args.graph} "
          f"({g.num_nodes} nodes, {A.nnz} entries)\n")
    print("| op | float32 | bfloat16 | bfloat16 speed-up |")
    print("|---|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a:.2f} ms | {b:.2f} ms | {a / b:.2f}x |")


if __name__ == "__main__":
    main()
