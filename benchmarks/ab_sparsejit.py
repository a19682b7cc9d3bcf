"""A/B timing of sparsejit alone (no peers) for comparing two builds on one machine.

    PYTHONPATH=<build A>/python python3 benchmarks/ab_sparsejit.py --out a.json
    PYTHONPATH=<build B>/python python3 benchmarks/ab_sparsejit.py --out b.json
    python3 benchmarks/ab_sparsejit.py --compare a.json b.json

Run the two builds alternately (several rounds) on a quiet machine: each run times every
(graph, F, op, reduce) case as the median of --repeat calls after warm-ups. --compare prints
per op/reduce the geometric mean of B / A over the cases, using each case's best run.
Works with the package layout before and after sparsejit.tools existed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections import defaultdict

GRAPHS = ["cora", "pubmed", "facebook", "blogcatalog",
          "powerlaw:n=200000,avg=12,alpha=2.1,seed=1", "rmat:scale=18,ef=10,seed=2"]


def _median_ms(fn, warmup=3, repeat=7):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def run(out: str, features, repeat: int) -> None:
    import torch
    import sparsejit as sj
    try:
        from sparsejit.tools import data
    except ImportError:  # the layout before sparsejit.tools
        from sparsejit import data
    records = []
    for spec in GRAPHS:
        try:
            g = data.load_graph(spec)
        except Exception as e:  # noqa: BLE001 - a missing data folder skips real graphs
            print(f"skip {spec}: {e}")
            continue
        A = sj.SparseMatrix.from_edge_index(g.edge_index, g.num_nodes)
        for F in features:
            X = torch.randn(A.shape[1], F)
            Q = torch.randn(A.shape[0], F)
            for red in ("sum", "mean", "max", "min"):
                t = _median_ms(lambda: sj.spmm(A, X, red), repeat=repeat)
                records.append({"graph": spec, "F": F, "op": "spmm", "reduce": red, "ms": t})
            t = _median_ms(lambda: sj.sddmm(A, Q, X), repeat=repeat)
            records.append({"graph": spec, "F": F, "op": "sddmm", "reduce": "-", "ms": t})
        print(f"{spec} done", flush=True)
    with open(out, "w") as f:
        json.dump(records, f)


def compare(a_files, b_files) -> None:
    def best(files):
        d = {}
        for fn in files:
            for r in json.load(open(fn)):
                k = (r["graph"], r["F"], r["op"], r["reduce"])
                d[k] = min(d.get(k, math.inf), r["ms"])
        return d
    a, b = best(a_files), best(b_files)
    groups = defaultdict(list)
    for k in a.keys() & b.keys():
        groups[(k[2], k[3])].append(b[k] / a[k])
    print("| op | reduce | cases | time B / A (geomean) | min | max |")
    print("|---|---|---|---|---|---|")
    for (op, red), xs in sorted(groups.items()):
        gm = math.exp(sum(map(math.log, xs)) / len(xs))
        print(f"| {op} | {red} | {len(xs)} | {gm:.3f} | {min(xs):.2f} | {max(xs):.2f} |")
    allx = [x for xs in groups.values() for x in xs]
    print(f"\nall {len(allx)} cases: geomean {math.exp(sum(map(math.log, allx)) / len(allx)):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--features", nargs="+", type=int, default=[32, 128])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--compare", nargs=2, metavar=("A_GLOB", "B_GLOB"))
    args = ap.parse_args()
    if args.compare:
        import glob
        compare(sorted(glob.glob(args.compare[0])), sorted(glob.glob(args.compare[1])))
    else:
        run(args.out, args.features, args.repeat)


if __name__ == "__main__":
    main()
