"""Filter-sparse convolution vs torch's dense conv2d (oneDNN) on every ResNet-50 convolution,
with the layer's real magnitude-pruning pattern from DLMC (random values on it).

    python3 benchmarks/bench_filter_conv.py [--quick] [--batches 1 8] [--threads 2]
        [--jit] [--out benchmarks/results/filter_conv.json]
    python3 benchmarks/bench_filter_conv.py --blocks [--bands 0 4 8 16] (fused bottlenecks)

Patterns: $SPARSEJIT_DATA/dlmc/rn50/magnitude_pruning/0.8 (default data dir: the repository's
../shared/data). Each file is the layer's im2col weight [C_out, C_in * R * S]; its columns are
read in PyTorch's (c, r, s) order. The 90% patterns drop half of the 80% pattern's entries at
random (seeded). Input sizes are the network's at 224x224 (ResNet-50 v1.5: stride on the 3x3).

Dense and sparse run side by side in one process, alternated, medians of `--repeat` runs.
Reported per layer: medians, speed-up (dense / sparse), useful GFLOP/s of the sparse kernel
(2 * nnz * output pixels) and the dense rate (2 * C_out * C_in/groups * R * S * pixels), and
the per-layer choice (sparse where it measured faster, else dense: speed-up max(1, ratio)).
With `--jit`, the JIT variants run in the same alternation: "jit" (the layer's loop compiled
with its constants) and "jit_baked" (tap offsets as immediates; layers up to `--baked-max`
taps), with their speed-up over the precompiled loop ("generic") and the first call's time
(prepare + compile, or a disk-cache load: set SPARSEJIT_CACHE_DIR to a fresh directory to
time compiles). Timings on a shared machine are noisy: compare ratios, not absolute times. Where other jobs
load the machine, `--clock cpu --threads 1` compares the CPU time each side consumes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

from sparsejit.families.filter_conv.layers import PrunedConv2d  # noqa: E402
from sparsejit.families.filter_conv.tuner import BAKED_MAX_NNZ  # noqa: E402
from sparsejit.families.filter_conv.ops import VARIANTS  # noqa: E402
from sparsejit.families.spmm.plans import _cpu_model  # noqa: E402  (one CPU-model string)


def resnet50_layers():
    """(DLMC file stem, C_in, C_out, k, stride, padding, input H = W) for all 53 convolutions."""
    layers = [("initial_conv", 3, 64, 7, 2, 3, 224)]
    groups = [(1, 64, 256, 3, 56), (2, 128, 512, 4, 56), (3, 256, 1024, 6, 28),
              (4, 512, 2048, 3, 14)]
    c_prev = 64
    for g, mid, out, blocks, h_in in groups:
        stride = 1 if g == 1 else 2
        h_out = h_in // stride
        for b in range(blocks):
            if b == 0:
                tag = f"block_group_projection_block_group{g}"
                layers += [(f"bottleneck_1_{tag}", c_prev, mid, 1, 1, 0, h_in),
                           (f"bottleneck_2_{tag}", mid, mid, 3, stride, 1, h_in),
                           (f"bottleneck_3_{tag}", mid, out, 1, 1, 0, h_out),
                           (f"bottleneck_projection_{tag}", c_prev, out, 1, stride, 0, h_in)]
            else:
                tag = f"block_group{g}_{b}_1"
                layers += [(f"bottleneck_1_{tag}", out, mid, 1, 1, 0, h_out),
                           (f"bottleneck_2_{tag}", mid, mid, 3, 1, 1, h_out),
                           (f"bottleneck_3_{tag}", mid, out, 1, 1, 0, h_out)]
        c_prev = out
    return layers


QUICK = ["initial_conv", "bottleneck_2_block_group1_1_1", "bottleneck_1_block_group2_1_1",
         "bottleneck_2_block_group_projection_block_group3", "bottleneck_2_block_group4_1_1",
         "bottleneck_projection_block_group_projection_block_group4"]


def read_smtx(path: Path):
    with gzip.open(path, "rt") as f:
        rows, cols, nnz = (int(v) for v in f.readline().replace(",", " ").split())
        indptr = [int(v) for v in f.readline().split()]
        indices = [int(v) for v in f.readline().split()] if nnz else []
    assert len(indptr) == rows + 1 and len(indices) == nnz, path
    return rows, cols, torch.tensor(indptr), torch.tensor(indices, dtype=torch.long)


def pattern_weight(path, c_out, c_in, k, keep_fraction, seed):
    rows, cols, indptr, indices = read_smtx(path)
    assert (rows, cols) == (c_out, c_in * k * k), (path, rows, cols, c_out, c_in, k)
    g = torch.Generator().manual_seed(seed)
    row_of = torch.repeat_interleave(torch.arange(rows), indptr.diff())
    if keep_fraction < 1.0:
        keep = torch.rand(indices.numel(), generator=g) < keep_fraction
        row_of, indices = row_of[keep], indices[keep]
    w = torch.zeros(rows * cols)
    w[row_of * cols + indices] = torch.randn(indices.numel(), generator=g)
    return w.view(c_out, c_in, k, k)


def add_layer_args(ap: argparse.ArgumentParser, limit_help: str) -> None:
    """The options the per-layer A/B scripts share (archive/bench_filter_conv_lanes / _batch)."""
    ap.add_argument("--sparsity", type=float, default=0.9)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--limit", type=int, default=None, help=limit_help)


def median_many(fns, repeat, clock=time.perf_counter):
    """Medians (ms) of each function, alternated run by run so all see the same load, the
    order rotated every run: a kernel run right after another one on the same input finds it
    in cache, which favours whoever runs second by up to ~10% on small layers."""
    for _ in range(2):
        for f in fns:
            f()
    times = [[] for _ in fns]
    for rep in range(repeat):
        for j in range(len(fns)):
            i = (rep + j) % len(fns)
            t0 = clock()
            fns[i]()
            times[i].append((clock() - t0) * 1e3)
    return [sorted(t)[len(t) // 2] for t in times]


def first_call_ms(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def geomean(xs):
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="six layers, fewer repeats")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--sparsities", type=float, nargs="+", default=[0.8, 0.9])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="wall: elapsed time (the protocol); cpu: this process's CPU time, "
                         "robust to other jobs on a shared machine (use with --threads 1: "
                         "with more, idle OpenMP threads' spinning is counted)")
    ap.add_argument("--jit", action="store_true", help="also the JIT variants (jit, jit_baked)")
    ap.add_argument("--baked-max", type=int, default=None,
                    help="largest nnz that runs jit_baked (default: sparsify's BAKED_MAX_NNZ, 0)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/filter_conv.json"))
    ap.add_argument("--table", metavar="JSON", help="print the markdown tables of a saved run "
                    "(for benchmarks/RESULTS.md) and exit")
    ap.add_argument("--blocks", action="store_true",
                    help="ResNet-50's identity bottlenecks instead of layers: the fused block "
                         "(filter_conv_bottleneck) against its three layer calls")
    ap.add_argument("--bands", type=int, nargs="+", default=[0],
                    help="with --blocks: band heights to time (0 = the planner's)")
    args = ap.parse_args()
    if args.table:
        print_markdown(json.loads(Path(args.table).read_text()))
        return
    if args.blocks:
        run_blocks(args)
        return
    torch.set_num_threads(args.threads)
    data = Path(os.environ.get("SPARSEJIT_DATA", ROOT.parent / "shared" / "data"))
    pdir = data / "dlmc/rn50/magnitude_pruning/0.8"
    if not pdir.is_dir():
        sys.exit(f"no DLMC patterns at {pdir} (set SPARSEJIT_DATA)")
    layers = resnet50_layers()
    if args.quick:
        layers = [l for l in layers if l[0] in QUICK]
    repeat = args.repeat or (5 if args.quick else 9)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    baked_max = args.baked_max if args.baked_max is not None else BAKED_MAX_NNZ

    records = []
    with torch.no_grad():
        for sparsity in args.sparsities:
            keep = (1 - sparsity) / 0.2  # of the 80% pattern's entries
            for batch in args.batches:
                print(f"\n== sparsity {sparsity:.0%}, batch {batch}, {args.threads} threads")
                print(f"{'layer':<52} {'shape':<22} {'dense ms':>9} {'sparse ms':>9} "
                      f"{'speedup':>8} {'GF/s sp':>8} {'GF/s dn':>8}" +
                      (f" {'jit/gen':>8} {'baked/gen':>9} {'compile ms':>10}" if args.jit
                       else ""))
                for i, (name, c_in, c_out, k, stride, pad, h) in enumerate(layers):
                    w = pattern_weight(pdir / f"{name}.smtx.gz", c_out, c_in, k,
                                       min(keep, 1.0), seed=i)
                    b = torch.randn(c_out)
                    x = torch.randn(batch, c_in, h, h)
                    sp = PrunedConv2d(w, b, stride, pad)
                    dense = lambda: F.conv2d(x, w, b, stride, pad)  # noqa: E731
                    # With --jit, "sparse" is the precompiled loop (else the default, "auto").
                    gen = VARIANTS["generic"] if args.jit else -1
                    sparse = lambda: sp(x, variant=gen)  # noqa: E731
                    torch.testing.assert_close(sparse(), dense(), rtol=1e-3, atol=1e-3)
                    fns = [dense, sparse]
                    kinds = []
                    if args.jit:
                        kinds = ["jit"] + (["jit_baked"] if sp.nnz <= baked_max else [])
                    first = {}
                    for kind in kinds:
                        fn = lambda kid=VARIANTS[kind]: sp(x, variant=kid)  # noqa: E731
                        first[kind] = first_call_ms(fn)
                        assert torch.equal(fn(), sparse()), kind  # bit-identical to generic
                        fns.append(fn)
                    d_ms, s_ms, *jit_ms = median_many(fns, repeat, clock)
                    oh = (h + 2 * pad - k) // stride + 1
                    pix = batch * oh * oh
                    useful = 2 * sp.nnz * pix
                    full = 2 * c_out * c_in * k * k * pix
                    rec = dict(layer=name, c_in=c_in, c_out=c_out, k=k, stride=stride,
                               padding=pad, h=h, batch=batch, sparsity=sparsity,
                               actual_sparsity=sp.sparsity, nnz=sp.nnz, dense_ms=d_ms,
                               sparse_ms=s_ms, speedup=d_ms / s_ms,
                               choice_speedup=max(1.0, d_ms / s_ms),
                               sparse_gflops=useful / s_ms / 1e6,
                               dense_gflops=full / d_ms / 1e6, threads=args.threads)
                    for kind, ms in zip(kinds, jit_ms):
                        rec[f"{kind}_ms"] = ms
                        rec[f"{kind}_vs_generic"] = s_ms / ms
                        rec[f"{kind}_first_call_ms"] = first[kind]
                    records.append(rec)
                    shape = f"{c_in}->{c_out} k{k} s{stride} {h}x{h}"
                    print(f"{name:<52} {shape:<22} {d_ms:>9.3f} {s_ms:>9.3f} "
                          f"{rec['speedup']:>7.2f}x {rec['sparse_gflops']:>8.1f} "
                          f"{rec['dense_gflops']:>8.1f}" + (
                              f" {rec['jit_vs_generic']:>7.2f}x "
                              f"{rec.get('jit_baked_vs_generic', float('nan')):>8.2f}x "
                              f"{max(first.values()):>10.0f}" if args.jit else ""),
                          flush=True)
                sel = [r for r in records if r["sparsity"] == sparsity and r["batch"] == batch]
                print(f"geomean speed-up: {geomean([r['speedup'] for r in sel]):.2f}x sparse "
                      f"everywhere, {geomean([r['choice_speedup'] for r in sel]):.2f}x with "
                      f"per-layer choice; sparse faster on "
                      f"{sum(r['speedup'] > 1 for r in sel)}/{len(sel)} layers")
                if args.jit:
                    for kind in ("jit", "jit_baked"):
                        rs = [r[f"{kind}_vs_generic"] for r in sel if f"{kind}_ms" in r]
                        if rs:
                            print(f"{kind} vs generic: geomean {geomean(rs):.3f}x over "
                                  f"{len(rs)} layers, faster by >3% on "
                                  f"{sum(v > 1.03 for v in rs)}, slower by >3% on "
                                  f"{sum(v < 0.97 for v in rs)}")

    summary = []
    for sparsity in args.sparsities:
        for batch in args.batches:
            sel = [r for r in records if r["sparsity"] == sparsity and r["batch"] == batch]
            summary.append(dict(sparsity=sparsity, batch=batch, layers=len(sel),
                                geomean_speedup=geomean([r["speedup"] for r in sel]),
                                geomean_with_choice=geomean([r["choice_speedup"] for r in sel]),
                                sparse_wins=sum(r["speedup"] > 1 for r in sel)))
            for kind in ("jit", "jit_baked") if args.jit else ():
                rs = [r[f"{kind}_vs_generic"] for r in sel if f"{kind}_ms" in r]
                summary[-1][f"{kind}_layers"] = len(rs)
                summary[-1][f"{kind}_geomean_vs_generic"] = geomean(rs)
    print("\n| sparsity | batch | layers | geomean sparse/dense | with per-layer choice | "
          "sparse faster |")
    print("|---|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['sparsity']:.0%} | {s['batch']} | {s['layers']} | "
              f"{s['geomean_speedup']:.2f}x | {s['geomean_with_choice']:.2f}x | "
              f"{s['sparse_wins']}/{s['layers']} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(torch=torch.__version__, threads=args.threads, quick=args.quick, repeat=repeat,
                clock=args.clock, load_average=os.getloadavg(),
                cpu=_cpu_model(), note="dense = torch.nn.functional.conv2d (oneDNN)")
    out.write_text(json.dumps(dict(meta=meta, summary=summary, records=records), indent=1))
    print(f"wrote {out}")


BLOCKS = [(1, 64, 256, 56), (2, 128, 512, 28), (3, 256, 1024, 14), (4, 512, 2048, 7)]


def run_blocks(args):
    """Each stage's first identity bottleneck (its DLMC patterns): the fused op against the
    three layer calls it replaces, alternated; the useful rate (2 * nnz * pixels) and the
    intermediate traffic the fusion keeps in cache: between the layer calls, conv1's output
    is written and read, copied into conv2's padded planes (written, read), and conv2's
    output written and read, all of it per image."""
    torch.set_num_threads(args.threads)
    data = Path(os.environ.get("SPARSEJIT_DATA", ROOT.parent / "shared" / "data"))
    pdir = data / "dlmc/rn50/magnitude_pruning/0.8"
    have = pdir.is_dir()
    if not have:
        print(f"no DLMC patterns at {pdir}: random patterns of the same sparsity")
    repeat = args.repeat or (5 if args.quick else 15)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    plan_op, conv, block = (torch.ops.sparsejit.filter_conv_plan, torch.ops.sparsejit.filter_conv,
                            torch.ops.sparsejit.filter_conv_bottleneck)
    records = []
    print(f"{'block':<10} {'sparsity':>8} {'batch':>5} {'band':>4} {'layers ms':>9} "
          f"{'fused ms':>9} {'speedup':>8} {'GF/s':>6} {'MB/img kept':>11}")
    blocks = BLOCKS[:2] if args.quick else BLOCKS
    with torch.no_grad():
        for sparsity in args.sparsities:
            keep = (1 - sparsity) / 0.2
            for g, m, c, h in blocks:
                tag = f"block_group{g}_1_1"
                shapes = [(m, c, 1), (m, m, 3), (c, m, 1)]
                ws = []
                for i, (co, ci, k) in enumerate(shapes):
                    if have:
                        ws.append(pattern_weight(pdir / f"bottleneck_{i + 1}_{tag}.smtx.gz", co,
                                                 ci, k, min(keep, 1.0), seed=g * 3 + i))
                    else:
                        w = torch.randn(co, ci, k, k)
                        ws.append(w * (torch.rand_like(w) >= sparsity))
                bs = [torch.randn(w.shape[0]) for w in ws]
                plans = [plan_op(w) for w in ws]
                nnz = sum(int(p[2].numel()) for p in plans)
                args3 = [t for p, b in zip(plans, bs) for t in (*p, b)]
                for batch in args.batches:
                    x = torch.randn(batch, c, h, h)

                    def layers():
                        a = conv(*plans[0], x, bs[0], [1, 1], [1, 1], [0, 0], [1, 1], 1, True)
                        a = conv(*plans[1], a, bs[1], [3, 3], [1, 1], [1, 1], [1, 1], 1, True)
                        return conv(*plans[2], a, bs[2], [1, 1], [1, 1], [0, 0], [1, 1], 1,
                                    True, residual=x)
                    fused = [lambda b=b: block(x, *args3, band=b) for b in args.bands]
                    for f in fused:
                        assert torch.equal(f(), layers())
                    t_layers, *t_fused = median_many([layers] + fused, repeat, clock)
                    kept = 4 * (2 * m * h * h + 2 * m * (h + 2) ** 2 + 2 * m * h * h) / 1e6
                    for band, tf in zip(args.bands, t_fused):
                        rec = dict(block=f"layer{g}.1", c=c, m=m, h=h, sparsity=sparsity,
                                   batch=batch, band=band, nnz=nnz, layers_ms=t_layers,
                                   fused_ms=tf, speedup=t_layers / tf,
                                   fused_gflops=2 * nnz * h * h * batch / tf / 1e6,
                                   kept_mb_per_image=kept, threads=args.threads)
                        records.append(rec)
                        print(f"{rec['block']:<10} {sparsity:>8.0%} {batch:>5} {band:>4} "
                              f"{t_layers:>9.3f} {tf:>9.3f} {rec['speedup']:>7.2f}x "
                              f"{rec['fused_gflops']:>6.1f} {kept:>11.2f}", flush=True)
    out = Path(args.out if args.out != str(ROOT / "benchmarks/results/filter_conv.json")
               else ROOT / "benchmarks/results/filter_conv_blocks.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(torch=torch.__version__, threads=args.threads, repeat=repeat, clock=args.clock,
                load_average=os.getloadavg(), cpu=_cpu_model())
    out.write_text(json.dumps(dict(meta=meta, records=records), indent=1))
    print(f"CPU: {meta['cpu']}; wrote {out}")


def print_markdown(run):
    """Summary and per-layer tables of a saved run, as markdown."""
    meta = run["meta"]
    print(f"{meta['threads']} thread(s), clock {meta.get('clock', 'wall')}, medians of "
          f"{meta['repeat']}, torch {meta['torch']}, load average at the end "
          f"{meta.get('load_average')}\n")
    print("| sparsity | batch | layers | geomean sparse/dense | with per-layer choice | "
          "sparse faster |")
    print("|---|---|---|---|---|---|")
    for s in run["summary"]:
        print(f"| {s['sparsity']:.0%} | {s['batch']} | {s['layers']} | "
              f"{s['geomean_speedup']:.2f}x | {s['geomean_with_choice']:.2f}x | "
              f"{s['sparse_wins']}/{s['layers']} |")
    recs = run["records"]
    keys = sorted({(r["sparsity"], r["batch"]) for r in recs})
    print("\nPer layer: speed-up (dense ms / sparse ms) and useful GFLOP/s of the sparse kernel "
          "against the dense rate.\n")
    head = "| layer | shape | " + " | ".join(f"{sp:.0%} b{b}" for sp, b in keys) + " |"
    print(head)
    print("|---|---|" + "---|" * len(keys))
    by = {(r["layer"], r["sparsity"], r["batch"]): r for r in recs}
    for name in dict.fromkeys(r["layer"] for r in recs):
        r0 = by[(name, *keys[0])]
        cells = []
        for sp, b in keys:
            r = by.get((name, sp, b))
            cells.append("-" if r is None else f"{r['speedup']:.2f}x ({r['sparse_gflops']:.0f} / "
                         f"{r['dense_gflops']:.0f})")
        short = name.replace("bottleneck_", "b").replace("block_group_projection_block_group",
                                                         "proj").replace("block_group", "g")
        print(f"| {short} | {r0['c_in']}->{r0['c_out']} k{r0['k']} s{r0['stride']} "
              f"{r0['h']}x{r0['h']} | " + " | ".join(cells) + " |")
    if not any("jit_ms" in r for r in recs):
        return
    print("\nJIT variants: speed-up over the precompiled loop (generic ms / jit ms), jit | "
          "jit_baked (- where nnz is over the baked limit), first call ms (compile).\n")
    print(head)
    print("|---|---|" + "---|" * len(keys))
    for name in dict.fromkeys(r["layer"] for r in recs):
        r0 = by[(name, *keys[0])]
        cells = []
        for sp, b in keys:
            r = by.get((name, sp, b))
            if r is None or "jit_ms" not in r:
                cells.append("-")
                continue
            baked = f"{r['jit_baked_vs_generic']:.2f}x" if "jit_baked_ms" in r else "-"
            first = max(r.get("jit_first_call_ms", 0), r.get("jit_baked_first_call_ms", 0))
            cells.append(f"{r['jit_vs_generic']:.2f}x \\| {baked} ({first:.0f} ms)")
        short = name.replace("bottleneck_", "b").replace("block_group_projection_block_group",
                                                         "proj").replace("block_group", "g")
        print(f"| {short} | {r0['c_in']}->{r0['c_out']} k{r0['k']} s{r0['stride']} "
              f"{r0['h']}x{r0['h']} (nnz {r0['nnz']} at {keys[0][0]:.0%}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
