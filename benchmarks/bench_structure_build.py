"""Structure building from an edge_index, per call, on the mini-batch benchmark's sampled
subgraphs: `csr_from_edge_index` on the edges, on the edges plus one self-loop per node, on
2.5M random edges, `gcn_adjacency`, and `csr_transpose` of the sampled subgraphs' GCN
matrices and of the 2.5M-edge CSR (what a backward needs), the content hash of the
sampled `edge_index` and `spmm_plan` on a new structure. Runs against whichever build
is on PYTHONPATH, so two builds compare by running it twice.

    PYTHONPATH=<build>/python python3 benchmarks/bench_structure_build.py --label before
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_minibatch import NeighborSampler  # noqa: E402
from sparsejit.tools.data import load_graph  # noqa: E402


def median_ms(fn, cases, warmup=3):
    for args in cases[:warmup]:
        fn(*args)
    ts = []
    for args in cases:
        t0 = time.perf_counter()
        fn(*args)
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def main() -> None:
    from sparsejit.info import cpu_line
    print(f"CPU: {cpu_line()}", flush=True)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="this build")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--graph", default="powerlaw:n=100000,avg=30,alpha=2.1,seed=0",
                    help="the graph the subgraphs are sampled from")
    ap.add_argument("--batch", type=int, default=1024, help="seed nodes per subgraph")
    ap.add_argument("--big-edges", type=int, default=2_500_000,
                    help="edges of the large random graph (on big-edges / 12.5 nodes)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import sparsejit  # noqa: F401  (registers the ops)
    op = torch.ops.sparsejit
    g = load_graph(args.graph)
    s = NeighborSampler(g.edge_index, g.num_nodes, [15, 10])
    subs = [(ei, n.numel()) for n, ei in (s.sample(args.batch) for _ in range(args.batches))]
    loops = [(torch.cat([ei, torch.arange(n).expand(2, n)], 1), n) for ei, n in subs]
    big_n = max(int(args.big_edges / 12.5), 1)
    big = [(torch.randint(0, big_n, (2, args.big_edges)), big_n)] * 5
    big_name = f"{args.big_edges / 1e6:g}M" if args.big_edges >= 10**6 else str(args.big_edges)
    rows = [("csr_from_edge_index, sampled subgraph", median_ms(op.csr_from_edge_index, subs)),
            ("csr_from_edge_index, + self-loops", median_ms(op.csr_from_edge_index, loops)),
            (f"csr_from_edge_index, {big_name} random edges",
             median_ms(op.csr_from_edge_index, big, 1))]
    rows.append(("gcn_adjacency, sampled subgraph",
                 median_ms(lambda ei, n: op.gcn_adjacency(ei, n, torch.float32), subs)))
    gcn = [op.gcn_adjacency(ei, n, torch.float32)[:2] + (n,) for ei, n in subs]
    rows.append(("csr_transpose, sampled GCN matrix", median_ms(op.csr_transpose, gcn)))
    rp, col, _ = op.csr_from_edge_index(*big[0])
    rows.append((f"csr_transpose, {big_name} entries", median_ms(op.csr_transpose,
                                                               [(rp, col, big_n)] * 5, 1)))
    # What a structure seen once also pays: the content key of its edge_index (the cache
    # lookup of every layer) and a plan for a new structure (fingerprint, statistics, cost
    # model; the clone gives the op tensors it has not validated).
    from sparsejit.runtime.caches import _hash_bytes
    rows.append(("content hash of edge_index", median_ms(_hash_bytes, [(ei,) for ei, _ in subs])))
    rows.append(("spmm_plan, new structure", median_ms(
        lambda rp, col, n: op.spmm_plan(rp.clone(), col.clone(), n, 64, torch.float32), gcn)))
    for name, ms in rows:
        print(f"{args.label:10s} {args.threads} thr {name:40s} {ms:8.3f} ms")


if __name__ == "__main__":
    main()
