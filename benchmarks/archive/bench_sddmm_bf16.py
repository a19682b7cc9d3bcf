"""bfloat16 SDDMM alone, for comparing builds (run it once per build, alternating, with
PYTHONPATH=<build>/python): medians of --repeat calls of sj.sddmm(A, Q, K) with bfloat16 Q and
K on power-law graphs in and out of cache, one line per case, prefixed by --label. Set
SPARSEJIT_JIT=0 to time the precompiled generic kernel instead of the JIT's.

    PYTHONPATH=<build>/python python3 benchmarks/archive/bench_sddmm_bf16.py --label before
"""

from __future__ import annotations

import argparse

import torch

import sparsejit as sj
from sparsejit.info import cpu_line
from sparsejit.runtime.timing import median_ms
from sparsejit.tools.data import load_graph

GRAPHS = ("powerlaw:n=20000,avg=12,alpha=2.1,seed=1", "powerlaw:n=200000,avg=12,alpha=2.1,seed=1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="build")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--features", type=int, nargs="+", default=[16, 64, 128])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# {cpu_line()}; {args.threads} threads", flush=True)
    for spec in GRAPHS:
        g = load_graph(spec)
        A = sj.SparseMatrix.from_edge_index(g.edge_index, g.num_nodes)
        for F in args.features:
            gen = torch.Generator().manual_seed(0)
            q = torch.randn(g.num_nodes, F, generator=gen).bfloat16()
            k = torch.randn(g.num_nodes, F, generator=gen).bfloat16()
            ms = median_ms(lambda: sj.sddmm(A, q, k), args.repeat, 3)
            print(f"{args.label} {spec.split(',')[0]} F={F} {ms:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
