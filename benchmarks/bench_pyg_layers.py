"""sparsejit.nn's PyG-signature layers against torch_geometric's, side by side in one process.

One layer, forward + backward (loss = sum of outputs, gradients for x and every parameter),
the same weights (state_dict copied), median of --repeats after a warm-up, 2 threads. Structure
work is excluded on both sides as a training loop amortises it: PyG gets its self-loop /
normalisation caches where it has them (GCNConv cached=True) and sparsejit its content-keyed
cache (warm after the warm-up).

    python benchmarks/bench_pyg_layers.py                 # default graphs, F = 64 and 128
    python benchmarks/bench_pyg_layers.py --large         # adds the 2M-node / 20M-edge graph
    python benchmarks/bench_pyg_layers.py --peak-memory   # GATConv peak RSS, each side in a
                                                          # fresh subprocess

Writes benchmarks/results/pyg_layers.json. Timings on a shared 2-core machine are noisy: read
the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import sparsejit as sj
from sparsejit.info import cpu_line
from sparsejit.tools.data import load_graph
from torch_geometric import nn as pnn

GRAPHS = ["cora", "pubmed", "facebook", "ca-astroph",
          "powerlaw:n=200000,avg=10,alpha=2.1,seed=1"]
LARGE = "powerlaw:n=2000000,avg=10,alpha=2.1,seed=1"


def layers(f: int):
    """(name, constructor over the nn module); output width f (4 heads of f / 4 for GAT-like)."""
    mlp = lambda m: torch.nn.Sequential(torch.nn.Linear(f, f), torch.nn.ReLU(),  # noqa: E731
                                        torch.nn.Linear(f, f))
    return [
        ("GCNConv", lambda m: m.GCNConv(f, f, cached=(m is pnn))),
        ("SAGEConv", lambda m: m.SAGEConv(f, f)),
        ("GINConv", lambda m: m.GINConv(mlp(m))),
        ("GraphConv", lambda m: m.GraphConv(f, f)),
        ("GATConv", lambda m: m.GATConv(f, f // 4, heads=4)),
        ("GATv2Conv", lambda m: m.GATv2Conv(f, f // 4, heads=4)),
        ("TransformerConv", lambda m: m.TransformerConv(f, f // 4, heads=4)),
    ]


def step(layer, x, ei):
    out = layer(x, ei)
    out.sum().backward()


def timed_pair(ref, ours, x, ei, repeats):
    """Medians for the two layers, their steps interleaved (pyg, sparsejit, pyg, ...) so that
    both see the same background load."""
    times = ([], [])
    for layer in (ref, ours):
        step(layer, x, ei)  # warm-up: caches, plans, JIT
    for _ in range(repeats):
        for layer, ts in zip((ref, ours), times):
            layer.zero_grad(set_to_none=True)
            x.grad = None
            t0 = time.perf_counter()
            step(layer, x, ei)
            ts.append(time.perf_counter() - t0)
    return statistics.median(times[0]), statistics.median(times[1])


def _dense(lin, x, repeats):
    """Forward + backward of one dense Linear on all nodes: work both sides share, which
    bounds the achievable ratio."""
    lin(x).sum().backward()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        lin(x).sum().backward()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def peak_rss_child(side: str, spec: str, f: int) -> None:
    """One GATConv (4 heads, f // 4 per head) forward + backward, structure work included on
    both sides (the first call): prints the growth of the resident set's high-water mark over
    the resident size before the step (MiB). Linux only (/proc/self/clear_refs resets it)."""
    g = load_graph(spec)
    x = torch.randn(g.num_nodes, f, requires_grad=True)
    torch.manual_seed(0)
    layer = (pnn if side == "pyg" else sj.nn).GATConv(f, f // 4, heads=4)
    import gc

    gc.collect()
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # resets VmHWM to the current resident size
    before = _status_kib("VmRSS")
    step(layer, x, g.edge_index)
    peak = _status_kib("VmHWM")
    print(json.dumps({"peak_growth_mib": (peak - before) / 1024.0, "rss_before_mib":
                      before / 1024.0, "nodes": g.num_nodes, "edges": g.num_edges}))


def gat_epoch(side: str, spec: str, f: int = 64, classes: int = 16) -> None:
    """One full-batch training epoch of a 2-layer GAT (4 heads, then 1) with Adam: prints the
    time and the growth of the resident high-water mark (MiB) over the loaded graph."""
    g = load_graph(spec)
    m = pnn if side == "pyg" else sj.nn
    torch.manual_seed(0)
    x = torch.randn(g.num_nodes, f)
    y = torch.randint(0, classes, (g.num_nodes,))
    conv1, conv2 = m.GATConv(f, f // 4, heads=4), m.GATConv(f, classes, heads=1)
    params = list(conv1.parameters()) + list(conv2.parameters())
    opt = torch.optim.Adam(params, lr=0.01)
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    before = _status_kib("VmRSS")
    t0 = time.perf_counter()
    opt.zero_grad()
    out = conv2(torch.relu(conv1(x, g.edge_index)), g.edge_index)
    torch.nn.functional.cross_entropy(out, y).backward()
    opt.step()
    print(json.dumps({"side": side, "graph": g.name, "nodes": g.num_nodes, "edges": g.num_edges,
                      "epoch_s": time.perf_counter() - t0,
                      "peak_growth_mib": (_status_kib("VmHWM") - before) / 1024.0,
                      "rss_before_mib": before / 1024.0}))


def peak_memory(spec: str, f: int, threads: int) -> dict:
    out = {}
    for side in ("pyg", "sparsejit"):
        r = subprocess.run([sys.executable, __file__, "--threads", str(threads), "--peak-child",
                            side, spec, str(f)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            out[side] = {"error": r.stderr.strip().splitlines()[-1:]}
        else:
            out[side] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


TARGETS = {"GCNConv": 8, "SAGEConv": 4, "GINConv": 4, "GraphConv": 4, "GATConv": 6,
           "GATv2Conv": 6, "TransformerConv": 6}


def markdown(rows, geo) -> str:
    """Speedup (PyG time / sparsejit time) per layer and graph, F = 64 / 128, geomeans."""
    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    short = lambda g: g.split(",seed")[0]  # noqa: E731
    head = "| layer | " + " | ".join(short(g) for g in graphs) + " | geomean | target |"
    lines = [head, "|---" * (len(graphs) + 3) + "|"]
    for name in geo:
        cells = []
        for g in graphs:
            by_f = {r["F"]: r["speedup"] for r in rows if r["layer"] == name and r["graph"] == g}
            cells.append(" / ".join(f"{by_f[f]:.1f}" for f in sorted(by_f)))
        lines.append(f"| {name} | " + " | ".join(cells) +
                     f" | {geo[name]:.2f} | {TARGETS.get(name, '')} |")
    return f"CPU: {cpu_line()}\n\n" + "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", nargs="*", default=None)
    ap.add_argument("--features", nargs="*", type=int, default=[64, 128])
    ap.add_argument("--layers", nargs="*", default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--large", action="store_true", help="add the 2M-node / 20M-edge graph")
    ap.add_argument("--peak-memory", action="store_true")
    ap.add_argument("--peak-only", action="store_true", help="only the peak-memory runs")
    ap.add_argument("--peak-child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--gat-epoch", nargs=2, metavar=("SIDE", "GRAPH"),
                    help="one 2-layer GAT training epoch for SIDE (pyg or sparsejit) on GRAPH "
                         "(e.g. the --large graph); prints time and peak memory")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "pyg_layers.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.peak_child:
        peak_rss_child(args.peak_child[0], args.peak_child[1], int(args.peak_child[2]))
        return 0
    if args.gat_epoch:
        gat_epoch(*args.gat_epoch)
        return 0
    graphs = args.graphs or (GRAPHS + ([LARGE] if args.large else []))
    rows, peaks = [], {}
    for spec in graphs:
        g = load_graph(spec)
        print(f"# {g.name}: {g.num_nodes} nodes, {g.num_edges} edges", flush=True)
        for f in ([] if args.peak_only else args.features):
            x = torch.randn(g.num_nodes, f, requires_grad=True)
            dense = _dense(torch.nn.Linear(f, f), x.detach().requires_grad_(), 3)
            for name, make in layers(f):
                if args.layers and name not in args.layers:
                    continue
                torch.manual_seed(0)
                ref = make(pnn)
                ours = make(sj.nn)
                ours.load_state_dict(ref.state_dict(), strict=False)
                t_pyg, t_sj = timed_pair(ref, ours, x, g.edge_index, args.repeats)
                rows.append(dict(graph=g.name, nodes=g.num_nodes, edges=g.num_edges, F=f,
                                 layer=name, pyg_s=t_pyg, sparsejit_s=t_sj,
                                 speedup=t_pyg / t_sj, dense_linear_s=dense))
                print(f"{g.name:>40} F={f:<4} {name:<16} pyg {t_pyg * 1e3:9.2f} ms  "
                      f"sparsejit {t_sj * 1e3:9.2f} ms  x{t_pyg / t_sj:5.2f}  "
                      f"(one dense Linear {dense * 1e3:.2f} ms)", flush=True)
        if args.peak_memory:
            peaks[g.name] = peak_memory(spec, 64, args.threads)
            print(f"  GATConv peak memory: {json.dumps(peaks[g.name])}", flush=True)
    geo = {}
    for name in sorted({r["layer"] for r in rows}):
        s = [r["speedup"] for r in rows if r["layer"] == name]
        geo[name] = math.exp(sum(map(math.log, s)) / len(s))
        print(f"geomean {name:<16} x{geo[name]:.2f} over {len(s)} runs")
    result = dict(cpu=cpu_line(), threads=args.threads, load_average=os.getloadavg(),
                  repeats=args.repeats, torch=torch.__version__,
                  note="forward+backward of one layer, medians; shared noisy 2-core machine",
                  rows=rows, geomean_speedup=geo, gat_peak_memory=peaks)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    Path(args.out).with_suffix(".md").write_text(markdown(rows, geo))
    print(f"CPU: {cpu_line()}; wrote {args.out} and its .md table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
