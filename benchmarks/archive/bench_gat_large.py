"""A full 2-layer GAT training epoch (forward + backward + Adam step) on a large generated
power-law graph, sparsejit.nn.GATConv against torch_geometric's, each side in a fresh
subprocess: epoch time and peak resident memory (VmHWM, the whole process, graph included).

    python benchmarks/archive/bench_gat_large.py                    # 2M nodes / 20M edges
    python benchmarks/archive/bench_gat_large.py --nodes 20000 --edges 200000   # quick check

Layers: GATConv(F, F / 4, heads=4) -> ReLU -> GATConv(F, classes, heads=1), F = 64, full
batch, cross-entropy on random labels. `--epochs 2` also times a second epoch (structure
caches warm on both sides: PyG has none to warm, sparsejit reuses its sorted CSR, self-loops
and transpose). Each child runs under an address-space limit (`--limit-gib`, default 24,
this machine's memory) so that a side that does not fit fails with an out-of-memory error
instead of waking the kernel's OOM killer on a shared machine (the limit is on address
space, which runs about 0.5 GiB above the resident size for torch's own libraries); a child
killed anyway is reported as such. The first epoch includes each side's one-off work (for
sparsejit: sorting to CSR, self-loops, the transpose, and JIT compiles on a cold cache). Writes benchmarks/results/gat_large.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def child(side: str, nodes: int, edges: int, f: int, classes: int, epochs: int,
          threads: int) -> None:
    """One side's epochs; prints one JSON line."""
    import torch

    torch.set_num_threads(threads)
    from sparsejit.tools.data import load_graph

    if side == "pyg":
        from torch_geometric import nn as m
    else:
        import sparsejit as sj
        m = sj.nn
    spec = f"powerlaw:n={nodes},avg={edges / nodes},alpha=2.1,seed=1"
    g = load_graph(spec)
    torch.manual_seed(0)
    x = torch.randn(g.num_nodes, f)
    y = torch.randint(0, classes, (g.num_nodes,))
    conv1, conv2 = m.GATConv(f, f // 4, heads=4), m.GATConv(f, classes, heads=1)
    params = list(conv1.parameters()) + list(conv2.parameters())
    opt = torch.optim.Adam(params, lr=0.01)
    rss_loaded = _status_kib("VmRSS")
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        opt.zero_grad()
        out = conv2(torch.relu(conv1(x, g.edge_index)), g.edge_index)
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        del out, loss
    print(json.dumps({"side": side, "graph": spec, "nodes": g.num_nodes, "edges": g.num_edges,
                      "epoch_s": times, "peak_rss_mib": _status_kib("VmHWM") / 1024.0,
                      "rss_after_load_mib": rss_loaded / 1024.0}), flush=True)


def run_side(side: str, args) -> dict:
    cmd = [sys.executable, __file__, "--child", side, "--nodes", str(args.nodes), "--edges",
           str(args.edges), "--features", str(args.features), "--classes", str(args.classes),
           "--epochs", str(args.epochs), "--threads", str(args.threads)]
    limit = int(args.limit_gib * 2**30) if args.limit_gib > 0 else None

    def set_limit():
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=set_limit)
    wall = time.perf_counter() - t0
    if r.returncode == 0:
        return json.loads(r.stdout.strip().splitlines()[-1])
    tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
    oom = (r.returncode in (-9, 137) or any(
        s in " ".join(tail) for s in ("MemoryError", "out of memory", "DefaultCPUAllocator",
                                      "std::bad_alloc", "Cannot allocate memory")))
    return {"side": side, "failed": True, "out_of_memory": oom, "returncode": r.returncode,
            "wall_s": wall, "stderr_tail": tail}


def main(argv=None) -> int:
    from sparsejit.info import cpu_line
    print(f"CPU: {cpu_line()}", flush=True)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=2_000_000)
    ap.add_argument("--edges", type=int, default=20_000_000)
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit-gib", type=float, default=24.0,
                    help="address-space limit per child (0: none)")
    ap.add_argument("--sides", nargs="*", default=["sparsejit", "pyg"])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results"
                                         / "gat_large.json"))
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.nodes, args.edges, args.features, args.classes, args.epochs,
              args.threads)
        return 0
    result = {"nodes": args.nodes, "edges": args.edges, "features": args.features,
              "heads": 4, "threads": args.threads, "limit_gib": args.limit_gib,
              "load_average": os.getloadavg(), "sides": {}}
    for side in args.sides:
        got = run_side(side, args)
        result["sides"][side] = got
        print(json.dumps(got), flush=True)
    ok = {s: r for s, r in result["sides"].items() if not r.get("failed")}
    if "pyg" in ok and "sparsejit" in ok:
        result["peak_rss_ratio_pyg_over_sparsejit"] = (ok["pyg"]["peak_rss_mib"] /
                                                       ok["sparsejit"]["peak_rss_mib"])
        result["epoch_ratio_pyg_over_sparsejit"] = [a / b for a, b in zip(
            ok["pyg"]["epoch_s"], ok["sparsejit"]["epoch_s"])]
        print(f"peak RSS pyg / sparsejit: {result['peak_rss_ratio_pyg_over_sparsejit']:.2f}; "
              f"epoch time pyg / sparsejit: "
              f"{', '.join(f'{r:.2f}' for r in result['epoch_ratio_pyg_over_sparsejit'])}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
