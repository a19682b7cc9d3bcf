"""RGMS / R-GCN benchmark: one RGCNConv layer, forward + backward, sparsejit beside PyG's
RGCNConv and FastRGCNConv (and DGL's RelGraphConv when dgl is installed), same weights, in
one process; medians and ratios. Also segment_matmul against a per-segment torch.mm loop.

    python benchmarks/bench_rgms.py                  # AIFB (real + random of its sizes), F=16, 64
    python benchmarks/bench_rgms.py --large          # + 100k nodes / 1M edges / 50 relations
    python benchmarks/bench_rgms.py --quick          # one case, few repeats (smoke test)

Writes benchmarks/results/rgms.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
from pathlib import Path

import torch

import sparsejit as sj
import statistics
import time

from sparsejit.tools.bench import geomean

_CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
CLOCK = "wall"


def median_ms(fn, warmup, repeat, device="cpu"):
    """Median over `repeat` calls after `warmup`, on the chosen clock (--clock cpu: process
    CPU time, for a loaded shared machine with --threads 1)."""
    clock = _CLOCK[CLOCK]
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = clock()
        fn()
        times.append((clock() - t0) * 1e3)
    return statistics.median(times)
from sparsejit.tools.data import data_dir

RESULTS = Path(__file__).resolve().parent / "results" / "rgms.json"


def random_typed(n, e, r, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    et = torch.randint(0, r, (e,), generator=g)
    return ei, et, n, r


def aifb_graph():
    root = data_dir()
    folder = root / "hetero" / "rgcn" / "aifb" if root else None
    if folder is None or not (folder / "aifb_stripped.nt.gz").exists():
        return None
    from sparsejit.tools.rdf import load_rdf
    g = load_rdf(folder)
    return g.edge_index, g.edge_type, g.num_nodes, g.num_relations


def layer_step(layer, x, ei, et, gy):
    """forward + backward of one layer; gradients of x and the parameters."""
    layer.zero_grad(set_to_none=True)
    if x.grad is not None:
        x.grad = None
    y = layer(x, ei, et)
    y.backward(gy)
    return y


def bench_case(name, ei, et, n, r, f, args, peers):
    torch.manual_seed(0)
    x = torch.randn(n, f, requires_grad=True)
    gy = torch.randn(n, f)
    ours = sj.nn.RGCNConv(f, f, r, aggr="mean")
    rows = {}
    ok = {}
    y_ours = layer_step(ours, x, ei, et, gy).detach()
    rows["sparsejit"] = median_ms(lambda: layer_step(ours, x, ei, et, gy), args.warmup,
                                  args.repeat, "cpu")
    fwd = median_ms(lambda: ours(x, ei, et), args.warmup, args.repeat, "cpu")
    for pname, make in peers.items():
        if pname == "pyg_fast" and ei.shape[1] * f * f * 4 > args.max_fast_bytes:
            continue  # FastRGCNConv holds an [E, F_in, F_out] weight tensor
        layer = make(f, r)
        if layer is None:
            continue
        try:
            layer.load_state_dict(ours.state_dict())
        except Exception:
            pass
        try:
            y = layer_step(layer, x, ei, et, gy).detach()
        except Exception as exc:  # a peer that cannot run this case is reported, not fatal
            print(f"  {pname}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        scale = max(1.0, float(y.abs().max()))
        ok[pname] = bool(torch.allclose(y, y_ours, atol=1e-4 * scale, rtol=1e-4))
        reps = max(3, args.repeat // 4) if pname == "pyg_fast" or n > 50000 else args.repeat
        rows[pname] = median_ms(lambda: layer_step(layer, x, ei, et, gy), 1, reps, "cpu")
    peers_ms = {k: v for k, v in rows.items() if k != "sparsejit"}
    best = min(peers_ms.values()) if peers_ms else float("nan")
    rec = {"case": name, "nodes": n, "edges": int(ei.shape[1]), "relations": r, "F": f,
           "ms": rows, "sparsejit_forward_ms": fwd, "agrees": ok,
           "speedup_vs_fastest_peer": best / rows["sparsejit"] if peers_ms else None,
           # forward: gather-reduce E x F plus G x F x F x 2 GEMM flops; backward ~2x.
           "forward_gflop": 2.0 * ei.shape[1] * f * f / 1e9}
    print(f"  {name} F={f}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in rows.items()) +
          (f"  -> {rec['speedup_vs_fastest_peer']:.1f}x" if peers_ms else ""), flush=True)
    return rec


def make_peers():
    peers = {}
    try:
        import torch_geometric.nn as pygnn

        peers["pyg"] = lambda f, r: pygnn.RGCNConv(f, f, r, aggr="mean")
        peers["pyg_fast"] = lambda f, r: pygnn.FastRGCNConv(f, f, r, aggr="mean")
    except Exception as exc:
        print(f"torch_geometric unavailable ({exc}); PyG peers skipped", file=sys.stderr)
    try:
        import dgl  # noqa: F401
        from dgl.nn import RelGraphConv

        class DglLayer(torch.nn.Module):
            def __init__(self, f, r):
                super().__init__()
                self.conv = RelGraphConv(f, f, r, regularizer=None, self_loop=True)
                self._g = None

            def forward(self, x, ei, et):
                if self._g is None:
                    self._g = dgl.graph((ei[0], ei[1]), num_nodes=x.shape[0])
                    # DGL averages per relation only through edge norms: 1 / |N_r(i)|.
                    key = ei[1] * (int(et.max()) + 1) + et
                    cnt = torch.bincount(key)
                    self._norm = (1.0 / cnt[key].float()).unsqueeze(1)
                    self._et = et
                return self.conv(self._g, x, self._et, self._norm)

        peers["dgl"] = lambda f, r: DglLayer(f, r)
    except Exception as exc:
        print(f"dgl unavailable ({type(exc).__name__}); DGL peer skipped", file=sys.stderr)
    return peers


def _dgl_segment_mm():
    try:
        import dgl.ops

        return dgl.ops.segment_mm
    except Exception:
        return None


def bench_segment_matmul(args):
    out = []
    for segs, rows, f in [(90, 8285, 16), (90, 8285, 64), (50, 100000, 64)]:
        g = torch.Generator().manual_seed(1)
        counts = torch.multinomial(torch.ones(segs), rows, True, generator=g).bincount(minlength=segs)
        ptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
        x = torch.randn(rows, f, generator=g)
        w = torch.randn(segs, f, f, generator=g)
        bounds = ptr.tolist()

        def loop():
            return torch.cat([x[bounds[k]:bounds[k + 1]] @ w[k] for k in range(segs)])

        ours = median_ms(lambda: sj.segment_matmul(x, ptr, w), args.warmup, args.repeat, "cpu")
        ref = median_ms(loop, args.warmup, args.repeat, "cpu")
        ok = bool(torch.allclose(sj.segment_matmul(x, ptr, w), loop(), atol=1e-4, rtol=1e-4))
        rec = {"segments": segs, "rows": rows, "F": f, "sparsejit_ms": ours,
               "torch_mm_loop_ms": ref, "speedup": ref / ours, "agrees": ok}
        dgl_mm = _dgl_segment_mm()
        if dgl_mm is not None:  # DGL's segment_mm takes the segment lengths
            seglen = counts.clone()
            rec["dgl_segment_mm_ms"] = median_ms(lambda: dgl_mm(x, w, seglen), args.warmup,
                                                 args.repeat, "cpu")
            rec["dgl_agrees"] = bool(torch.allclose(dgl_mm(x, w, seglen), loop(), atol=1e-4,
                                                    rtol=1e-4))
            rec["speedup_vs_dgl"] = rec["dgl_segment_mm_ms"] / ours
        out.append(rec)
        print(f"  segment_matmul K={segs} N={rows} F={f}: sparsejit {ours:.3f} ms, "
              f"mm loop {ref:.3f} ms ({ref / ours:.2f}x)" +
              (f", DGL segment_mm {rec['dgl_segment_mm_ms']:.3f} ms "
               f"({rec['speedup_vs_dgl']:.2f}x)" if "speedup_vs_dgl" in rec else ""),
              flush=True)
    return out


PEER_NAMES = {"pyg": "PyG RGCNConv", "pyg_fast": "PyG FastRGCNConv", "dgl": "DGL RelGraphConv"}
COLORS = {"pyg": "#4c72b0", "pyg_fast": "#dd8452", "dgl": "#55a868"}


def write_svg(records, path, target=30.0):
    """Grouped bars (log scale) of sparsejit's speed-up over each peer per (graph, F), with
    the issue's 30x target drawn; plain SVG, no plotting library."""
    import math

    groups = [(f"{r['case']}, F={r['F']}", {k: r["ms"][k] / r["ms"]["sparsejit"]
                                             for k in PEER_NAMES if k in r["ms"]})
              for r in records]
    gw, left, top, h = 150, 60, 40, 260
    width, height = left + gw * len(groups) + 20, top + h + 90
    vmax = max([target * 1.5] + [v for _, d in groups for v in d.values()])

    def y(v):  # log axis from 1x to vmax
        return top + h - h * math.log10(max(v, 1.0)) / math.log10(vmax)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           'font-family="sans-serif" font-size="11">',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="13">RGCNConv forward '
           '+ backward: sparsejit speed-up over each peer (log scale)</text>']
    for tick in (1, 2, 5, 10, 20, 50, 100, 200, 500):
        if tick <= vmax:
            out.append(f'<line x1="{left}" x2="{width - 10}" y1="{y(tick):.1f}" '
                       f'y2="{y(tick):.1f}" stroke="#ddd"/><text x="{left - 5}" '
                       f'y="{y(tick) + 4:.1f}" text-anchor="end">{tick}x</text>')
    out.append(f'<line x1="{left}" x2="{width - 10}" y1="{y(target):.1f}" y2="{y(target):.1f}" '
               f'stroke="#c44e52" stroke-dasharray="5,3"/><text x="{width - 12}" '
               f'y="{y(target) - 4:.1f}" text-anchor="end" fill="#c44e52">target {target:g}x'
               '</text>')
    for gi, (label, ratios) in enumerate(groups):
        x0 = left + gi * gw + 15
        for pi, (k, v) in enumerate(ratios.items()):
            bx = x0 + pi * 38
            out.append(f'<rect x="{bx}" y="{y(v):.1f}" width="32" height="{y(1) - y(v):.1f}" '
                       f'fill="{COLORS[k]}"/><text x="{bx + 16}" y="{y(v) - 3:.1f}" '
                       f'text-anchor="middle">{v:.1f}</text>')
        out.append(f'<text x="{x0 + 55}" y="{top + h + 15}" text-anchor="middle">'
                   f'{label[:28]}</text>')
    for pi, (k, name) in enumerate(PEER_NAMES.items()):
        lx = left + pi * 170
        out.append(f'<rect x="{lx}" y="{height - 30}" width="12" height="12" '
                   f'fill="{COLORS[k]}"/><text x="{lx + 16}" y="{height - 20}">{name}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out))


def _rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def memory_child(impl, threads):
    """One layer forward + backward on the 100k / 1M / 50 graph at F = 64 in this (fresh)
    process; prints JSON: peak resident set above the baseline, and the bytes of inputs
    (X, edge_index, edge_type, dY), outputs (Y and the gradients of X and the weights) and
    weights). The inputs include dY, the backward's input, since it lives in the measured
    process like the others."""
    torch.set_num_threads(threads)
    peers = make_peers() if impl != "sparsejit" else {}
    make = (lambda f, r: sj.nn.RGCNConv(f, f, r, aggr="mean")) if impl == "sparsejit" else \
        peers[impl]
    warm = make(8, 3)  # libraries and kernels loaded before the baseline
    ei0, et0, n0, _ = random_typed(50, 200, 3)
    x0 = torch.randn(n0, 8, requires_grad=True)
    layer_step(warm, x0, ei0, et0, torch.randn(n0, 8))
    del warm, x0
    # The resident high-water mark of this process from here on (ru_maxrss would also count
    # the parent's pages at the fork that started this process).
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _rss_mib()
    ei, et, n, r = random_typed(100000, 1000000, 50, seed=3)
    f = 64
    x = torch.randn(n, f, requires_grad=True)
    gy = torch.randn(n, f)
    layer = make(f, r)
    y = layer_step(layer, x, ei, et, gy)
    with open("/proc/self/status") as f:
        peak = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM")) / 1024
    nbytes = lambda *ts: sum(t.numel() * t.element_size() for t in ts) / 2**20  # noqa: E731
    params = list(layer.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    rec = {"impl": impl, "peak_above_baseline_mib": peak - base,
           "inputs_mib": nbytes(x, ei, et, gy), "outputs_mib": nbytes(y, x.grad, *grads),
           "weights_mib": nbytes(*params)}
    rec["ratio_to_io"] = rec["peak_above_baseline_mib"] / (
        rec["inputs_mib"] + rec["outputs_mib"] + rec["weights_mib"])
    print("MEMORY " + json.dumps(rec), flush=True)


def peak_memory(args):
    import subprocess

    out = []
    for impl in ["sparsejit", "pyg"]:
        proc = subprocess.run([sys.executable, __file__, "--memory-child", impl, "--threads",
                               str(args.threads)], capture_output=True, text=True)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("MEMORY ")]
        if proc.returncode != 0 or not line:
            print(f"  peak memory {impl}: failed (rc {proc.returncode}) {proc.stderr[-300:]}",
                  file=sys.stderr)
            continue
        rec = json.loads(line[0][7:])
        out.append(rec)
        print(f"  peak memory {impl}: {rec['peak_above_baseline_mib']:.0f} MiB above baseline; "
              f"inputs {rec['inputs_mib']:.0f} + outputs {rec['outputs_mib']:.0f} + weights "
              f"{rec['weights_mib']:.1f} MiB -> {rec['ratio_to_io']:.2f}x", flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--large", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-fast-bytes", type=float, default=2e9)
    ap.add_argument("--peak-memory", action="store_true",
                    help="peak resident memory of the large case, each side in a fresh process")
    ap.add_argument("--memory-child", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: process CPU time (use with --threads 1 on a loaded machine)")
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = args.clock
    if args.memory_child:
        return memory_child(args.memory_child, args.threads)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.warmup, args.repeat = 1, 3
    peers = make_peers()
    cases = []
    real = aifb_graph()
    if real is not None:
        cases.append(("aifb", *real))
    cases.append(("aifb-sized random", *random_typed(8285, 58086, 90)))
    widths = [16] if args.quick else [16, 64]
    if args.quick:
        cases = cases[:1]
    records = []
    for name, ei, et, n, r in cases:
        for f in widths:
            records.append(bench_case(name, ei, et, n, r, f, args, peers))
    if args.large:
        ei, et, n, r = random_typed(100000, 1000000, 50, seed=3)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        records.append(bench_case("100k/1M/50 random", ei, et, n, r, 64, args,
                                  {k: v for k, v in peers.items() if k != "pyg_fast"}))
        records[-1]["maxrss_mib_after"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        records[-1]["maxrss_mib_before"] = before / 1024
    memory = peak_memory(args) if args.peak_memory else []
    seg = [] if args.quick else bench_segment_matmul(args)
    speedups = [r["speedup_vs_fastest_peer"] for r in records if r["speedup_vs_fastest_peer"]]
    summary = {"machine": platform.processor() or platform.machine(), "threads": args.threads,
               "clock": args.clock,
               "torch": torch.__version__, "gemm_backend": sj._core.gemm_backend(),
               "geomean_speedup_vs_fastest_peer": geomean(speedups) if speedups else None}
    print("\n| case | F | sparsejit ms | PyG RGCNConv ms | PyG FastRGCNConv ms | DGL ms | vs fastest |")
    print("|---|---|---|---|---|---|---|")
    for r in records:
        ms = r["ms"]
        cell = lambda k: f"{ms[k]:.2f}" if k in ms else "-"  # noqa: E731
        sp = r["speedup_vs_fastest_peer"]
        print(f"| {r['case']} | {r['F']} | {ms['sparsejit']:.2f} | {cell('pyg')} | "
              f"{cell('pyg_fast')} | {cell('dgl')} | {sp:.1f}x |" if sp else "| - |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "layers": records,
                                    "segment_matmul": seg, "peak_memory": memory}, indent=1))
    if not args.quick:
        write_svg(records, args.out.with_suffix(".svg"))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
