"""Where the time of one PyG-signature layer goes (forward + backward), sparsejit's and
PyG's side by side: dense products (aten::mm / addmm / bmm: the Linear layers both sides
share), sparsejit's own ops (sparsejit::*), and everything else (elementwise ops, index
gathers and scatters, copies, autograd and Python overhead = wall time minus profiled ops).

From the split follows the bound the shared dense work puts on the speedup: with sparsejit's
sparse side at zero cost the ratio would be PyG's time over sparsejit's dense time,
    bound = t_pyg / t_sj_dense.

    python benchmarks/archive/pyg_time_split.py --graphs powerlaw:n=200000,avg=10,alpha=2.1,seed=1

Totals are medians of plain timed runs; the fractions come from one torch.profiler run of
--repeats steps, applied to the medians. Shared 2-core machine: read ratios, not times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import sparsejit as sj
from sparsejit.tools.data import load_graph
from torch_geometric import nn as pnn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from bench_pyg_layers import layers, step  # noqa: E402

DENSE = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}


def _median_step(layer, x, ei, repeats):
    ts = []
    for _ in range(repeats):
        layer.zero_grad(set_to_none=True)
        x.grad = None
        t0 = time.perf_counter()
        step(layer, x, ei)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def split(layer, x, ei, repeats):
    """(median wall s, {category: fraction of the profiled wall}, top sparse-side ops)."""
    step(layer, x, ei)  # warm-up: caches, plans, JIT
    wall = _median_step(layer, x, ei, repeats)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(repeats):
            layer.zero_grad(set_to_none=True)
            x.grad = None
            step(layer, x, ei)
        prof_wall = time.perf_counter() - t0
    cats = {"dense": 0.0, "sparsejit_ops": 0.0, "other_ops": 0.0}
    per_op = {}
    for ev in prof.key_averages():
        us = ev.self_cpu_time_total
        if ev.key in DENSE:
            cats["dense"] += us
        elif ev.key.startswith("sparsejit::"):
            cats["sparsejit_ops"] += us
        else:
            cats["other_ops"] += us
            per_op[ev.key] = per_op.get(ev.key, 0.0) + us
    total_us = prof_wall * 1e6
    frac = {k: v / total_us for k, v in cats.items()}
    frac["overhead"] = max(0.0, 1.0 - sum(frac.values()))
    top = sorted(per_op.items(), key=lambda kv: -kv[1])[:5]
    return wall, frac, [(k, v / total_us) for k, v in top]


def main(argv=None) -> int:
    from sparsejit.info import cpu_line
    print(f"CPU: {cpu_line()}", flush=True)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", nargs="*", default=["powerlaw:n=200000,avg=10,alpha=2.1,seed=1"])
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--layers", nargs="*", default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" /
                                         "pyg_time_split.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for spec in args.graphs:
        g = load_graph(spec)
        f = args.features
        x = torch.randn(g.num_nodes, f, requires_grad=True)
        print(f"# {g.name}: {g.num_nodes} nodes, {g.num_edges} edges, F={f}", flush=True)
        for name, make in layers(f):
            if args.layers and name not in args.layers:
                continue
            torch.manual_seed(0)
            ref = make(pnn)
            ours = make(sj.nn)
            ours.load_state_dict(ref.state_dict(), strict=False)
            t_p, f_p, top_p = split(ref, x, g.edge_index, args.repeats)
            t_s, f_s, top_s = split(ours, x, g.edge_index, args.repeats)
            sj_dense = f_s["dense"] * t_s
            row = dict(graph=g.name, layer=name, F=f, pyg_s=t_p, sparsejit_s=t_s,
                       speedup=t_p / t_s, pyg_split=f_p, sparsejit_split=f_s,
                       bound=t_p / sj_dense if sj_dense > 0 else None,
                       pyg_top_other=top_p, sparsejit_top_other=top_s)
            rows.append(row)
            fmt = lambda d: " ".join(f"{k} {v * 100:4.1f}%" for k, v in d.items())  # noqa
            print(f"{name:<16} pyg {t_p * 1e3:8.2f} ms [{fmt(f_p)}]\n{'':16} sj  "
                  f"{t_s * 1e3:8.2f} ms [{fmt(f_s)}]\n{'':16} x{t_p / t_s:.2f}, dense-bound "
                  f"x{row['bound'] or float('nan'):.1f}; sj other ops: "
                  + ", ".join(f"{k} {v * 100:.1f}%" for k, v in top_s), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(threads=args.threads, repeats=args.repeats,
                                              load_average=os.getloadavg(), rows=rows),
                                         indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
