"""The RGMS grad-X pass alone (rgms_backward with need_x only, auto strategy and kernels),
1 and 2 threads, F = 16 / 32 / 64, on AIFB (from $SPARSEJIT_DATA), a random graph of AIFB's
sizes, a 20k-node power-law graph with 8 relations and a random 100k-node / 1M-edge / 50-relation
graph. Prints one JSON object {"graph|threads|F": median ms}. Works with builds whose plans are
one tensor or (older) five, so two builds compare under the A/B rule:

    PYTHONPATH=<build A>/python python3 benchmarks/archive/bench_rgms_grad_x.py > a.json
    PYTHONPATH=<build B>/python python3 benchmarks/archive/bench_rgms_grad_x.py > b.json
"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
import bench_rgms as b  # noqa: E402
from ab_sparsejit import _powerlaw_edges  # noqa: E402

import sparsejit as sj  # noqa: E402
from sparsejit.runtime.timing import median_ms  # noqa: E402

ops = torch.ops.sparsejit


def main():
    from sparsejit.info import cpu_line
    print(f"CPU: {cpu_line()}", flush=True)
    graphs = {}
    aifb = b.aifb_graph()
    if aifb is not None:
        graphs["AIFB"] = aifb
    graphs["AIFB-sized random"] = b.random_typed(8285, 58086, 90)[:4]
    ei, g = _powerlaw_edges(20000, 10, 4)
    graphs["power-law 20k/200k/8"] = (ei, torch.randint(0, 8, (ei.shape[1],), generator=g),
                                      20000, 8)
    graphs["random 100k/1M/50"] = b.random_typed(100000, 1000000, 50)[:4]
    res = {}
    for name, (ei, et, n, r) in graphs.items():
        A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
        plan = (A.plan,) if isinstance(A.plan, torch.Tensor) else tuple(A.plan)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for f in (16, 32, 64):
                g = torch.Generator().manual_seed(0)
                x = torch.randn(n, f, generator=g)
                w = torch.randn(r, f, f, generator=g) / f ** 0.5
                dy = torch.randn(n, f, generator=g)
                rep = 5 if n > 50000 else 15
                res[f"{name}|{threads}|{f}"] = median_ms(lambda: ops.rgms_backward(
                    *plan, x, w, None, dy, "mean", True, False, False, 0, 0, 0), rep, warmup=3)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
