"""Pruned ResNet-50 (or VGG-16) inference against DeepSparse (Neural Magic's sparse CPU engine), side by
side in one process: the model of bench_resnet50_sparse.py (v1.5, magnitude-pruned per layer,
BatchNorm folded), `sj.sparsify`-ed for sparsejit and exported to ONNX for DeepSparse, the
same input, calls alternated (each round starting one model further), medians.

DeepSparse is a benchmark peer only, never a dependency of sparsejit. It needs its own virtual
environment (deepsparse 1.8.0 has a cp311 wheel; 1.9.0 is an empty stub; onnx 1.14.1):

    python3 -m venv --system-site-packages /work/ds_venv
    /work/ds_venv/bin/pip install deepsparse==1.8.0 onnx==1.14.1
    PYTHONPATH=python /work/ds_venv/bin/python benchmarks/bench_deepsparse.py \\
        [--model resnet50|vgg16] [--sparsities 0.8 0.9] [--batches 1 8] [--threads 2]
        [--processes 3] [--singles]

Writes benchmarks/results/deepsparse.json and prints a markdown table (CPU named).
`--processes N` runs the whole measurement in N fresh processes, one after the other, and
reports each cell's ratio in every process and their median: on a shared machine a single
process's ratio moved by up to 1.3x between runs (heap history, neighbours' load).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import sparsejit as sj  # noqa: E402
import bench_resnet50_sparse as R  # noqa: E402
from sparsejit.families.filter_conv.fold import fold_batchnorm  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["resnet50", "vgg16"], default="resnet50",
                    help="resnet50: v1.5 (bottlenecks, residuals); vgg16: VGG-16 with "
                         "BatchNorm (a plain chain of 3x3s, pruned classifier)")
    ap.add_argument("--sparsities", type=float, nargs="+", default=[0.8, 0.9])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/deepsparse.json"))
    ap.add_argument("--processes", type=int, default=1,
                    help="repeat the measurement in this many fresh processes; medians")
    ap.add_argument("--split", action="store_true",
                    help="also time sparsejit's model stage by stage (stem, layer1..4, head: "
                         "forward hooks around every module the graph calls) with the "
                         "activation bytes each stage reads and writes per image")
    ap.add_argument("--singles", action="store_true",
                    help="at batch B > 1 also time B one-image calls on each side (sparsejit's "
                         "model sparsified for batch 1, DeepSparse's engine compiled for batch "
                         "1): how much each gains from the batch")
    args = ap.parse_args()
    if args.processes > 1:
        across_processes(args)
        return
    try:
        from deepsparse import Engine
    except ImportError:
        sys.exit("deepsparse is not installed in this interpreter (see the docstring)")
    torch.set_num_threads(args.threads)
    from sparsejit.info import cpu_line
    rows = []
    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        for sparsity in args.sparsities:
            dense, folded = build_model(args.model, sparsity)
            onnx_path = str(Path(tmp) / f"{args.model}_{int(sparsity * 100)}.onnx")
            torch.onnx.export(folded, (torch.randn(1, 3, 224, 224),), onnx_path,
                              opset_version=13, dynamo=False, input_names=["x"],
                              output_names=["y"], dynamic_axes={"x": {0: "b"}, "y": {0: "b"}})
            for batch in args.batches:
                x = torch.randn(batch, 3, 224, 224)
                sparse = sj.sparsify(copy.deepcopy(dense), x, min_speedup=1.05, progress=None,
                                     fold_bn=True)
                # the same decisions without the fusion pass (residual add + ReLU in the
                # conv's output write, the stem's conv + pool on channels_last, fused
                # bottlenecks), and without the fused bottlenecks only
                unfused = sj.sparsify(copy.deepcopy(dense), x, min_speedup=1.05, progress=None,
                                      fold_bn=True, fuse=False, verbose=False)
                layers_only = sj.sparsify(copy.deepcopy(dense), x, min_speedup=1.05,
                                          progress=None, fold_bn=True, fuse_groups=False,
                                          verbose=False)
                engine = Engine(model=onnx_path, batch_size=batch, num_cores=args.threads)
                xn = x.numpy()
                want = folded(x)
                got_ds = torch.from_numpy(engine.run([xn])[0])
                got_sj = sparse(x)
                scale = float(want.abs().max())
                err_ds = float((got_ds - want).abs().max()) / scale
                err_sj = float((got_sj - want).abs().max()) / scale
                assert torch.equal(unfused(x), got_sj), "the fusion pass changed the result"
                assert torch.equal(layers_only(x), got_sj), "fused groups changed the result"
                fns = {"dense": lambda: folded(x), "sparsejit": lambda: sparse(x),
                       "unfused": lambda: unfused(x), "no groups": lambda: layers_only(x),
                       "deepsparse": lambda: engine.run([xn])}
                if args.singles and batch > 1:
                    one = sj.sparsify(copy.deepcopy(dense), x[:1], min_speedup=1.05,
                                      progress=None, fold_bn=True, verbose=False)
                    engine1 = Engine(model=onnx_path, batch_size=1, num_cores=args.threads)
                    xs, xns = [x[i:i + 1] for i in range(batch)], [xn[i:i + 1] for i in
                                                                    range(batch)]
                    fns["sparsejit singles"] = lambda: [one(v) for v in xs]
                    fns["deepsparse singles"] = lambda: [engine1.run([v]) for v in xns]
                for fn in fns.values():
                    fn()
                times = {k: [] for k in fns}
                names = list(fns)
                for r in range(args.repeat):
                    # each round starts one further along: every model follows every other
                    # as often (the one after the dense model pays for the memory it freed)
                    order = names[r % len(names):] + names[:r % len(names)]
                    for k in order:
                        t0 = time.perf_counter()
                        fns[k]()
                        times[k].append((time.perf_counter() - t0) * 1e3)
                med = {k: statistics.median(v) for k, v in times.items()}
                row = dict(sparsity=sparsity, batch=batch, threads=args.threads,
                           dense_folded_ms=med["dense"], sparsejit_ms=med["sparsejit"],
                           sparsejit_unfused_ms=med["unfused"],
                           sparsejit_no_groups_ms=med["no groups"], model=args.model,
                           deepsparse_ms=med["deepsparse"],
                           sparsejit_vs_deepsparse=med["deepsparse"] / med["sparsejit"],
                           rel_error_sparsejit=err_sj, rel_error_deepsparse=err_ds)
                if "sparsejit singles" in med:
                    row.update(sparsejit_singles_ms=med["sparsejit singles"],
                               deepsparse_singles_ms=med["deepsparse singles"])
                    print(f"  {batch} one-image calls: sparsejit {med['sparsejit singles']:.1f} "
                          f"ms (batch gain {med['sparsejit singles'] / med['sparsejit']:.2f}x), "
                          f"DeepSparse {med['deepsparse singles']:.1f} ms (batch gain "
                          f"{med['deepsparse singles'] / med['deepsparse']:.2f}x)", flush=True)
                if args.split:
                    row["split"] = stage_split(sparse, x, args.repeat)
                    print_split(row["split"], med["sparsejit"], batch)
                rows.append(row)
                print(f"{args.model} {sparsity:.0%} batch {batch}: dense {med['dense']:.1f} ms, "
                      f"sparsejit {med['sparsejit']:.1f} ms (no fused groups "
                      f"{med['no groups']:.1f}, unfused {med['unfused']:.1f}), DeepSparse "
                      f"{med['deepsparse']:.1f} ms -> "
                      f"sparsejit {row['sparsejit_vs_deepsparse']:.2f}x DeepSparse (max rel. "
                      f"error vs dense: sparsejit {err_sj:.1e}, DeepSparse {err_ds:.1e})",
                      flush=True)
                del engine
    cpu = cpu_line()
    print(f"\nCPU: {cpu}, {args.threads} threads\n")
    print(f"{args.model}\n\n| sparsity | batch | dense (BN folded) | sparsejit `sparsify` | "
          "same, `fuse_groups=False` | same, `fuse=False` | DeepSparse 1.8 | "
          "sparsejit vs DeepSparse |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['sparsity']:.0%} | {r['batch']} | {r['dense_folded_ms']:.1f} ms | "
              f"{r['sparsejit_ms']:.1f} ms | {r['sparsejit_no_groups_ms']:.1f} ms | "
              f"{r['sparsejit_unfused_ms']:.1f} ms | "
              f"{r['deepsparse_ms']:.1f} ms | {r['sparsejit_vs_deepsparse']:.2f}x |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(cpu=cpu, args=vars(args), rows=rows), indent=1))


def stage_split(model: torch.fx.GraphModule, x: torch.Tensor, repeat: int) -> dict:
    """{stage: (median ms of one call, activation MB read + written per image)}: every module
    the traced graph calls is timed by forward hooks and charged to its stage (its name up to
    the first dot; a fused block counts as one module); "other" is the rest of the call (the
    functional ops between modules)."""
    called = {n.target for n in model.graph.nodes if n.op == "call_module"}
    per_call, mb, t0 = {}, {}, {}

    def stage(name):
        return name.split(".")[0]

    def pre(m, a, name):
        t0[name] = time.perf_counter()

    def post(m, a, out, name):
        st = stage(name)
        per_call[st] = per_call.get(st, 0.0) + (time.perf_counter() - t0[name]) * 1e3
        moved = sum(t.numel() for t in a if isinstance(t, torch.Tensor)) + out.numel()
        mb[st] = mb.get(st, 0.0) + 4 * moved / x.shape[0] / 1e6
    hooks = []
    for name, m in model.named_modules():
        if name in called:
            hooks.append(m.register_forward_pre_hook(lambda m, a, n=name: pre(m, a, n)))
            hooks.append(m.register_forward_hook(lambda m, a, o, n=name: post(m, a, o, n)))
    samples = {}
    try:
        for r in range(repeat + 1):
            per_call.clear()
            mb.clear()
            t = time.perf_counter()
            model(x)
            total = (time.perf_counter() - t) * 1e3
            per_call["other"] = total - sum(per_call.values())
            if r:  # the first call warms up
                for k, v in per_call.items():
                    samples.setdefault(k, []).append(v)
    finally:
        for h in hooks:
            h.remove()
    return {k: (statistics.median(v), mb.get(k, 0.0)) for k, v in samples.items()}


def print_split(split: dict, total_ms: float, batch: int) -> None:
    print(f"  stage split (sparsejit, batch {batch}; hooks add a little):")
    for k, (ms, moved) in split.items():
        print(f"    {k:<8} {ms:8.2f} ms {100 * ms / total_ms:5.1f}%   {moved:7.2f} MB/image moved")


def vgg16_bn(num_classes=1000) -> nn.Module:
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512,
           "M"]
    layers, c = [], 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
            c = v
    return nn.Sequential(nn.Sequential(*layers), nn.Flatten(),
                         nn.Linear(512 * 7 * 7, 4096), nn.ReLU(inplace=True),
                         nn.Linear(4096, 4096), nn.ReLU(inplace=True),
                         nn.Linear(4096, num_classes))


def build_model(name: str, sparsity: float):
    """(the pruned dense model in eval mode, the same with BatchNorm folded)."""
    torch.manual_seed(0)
    if name == "resnet50":
        dense = R.ResNet50().eval()
        R.randomize_bn(dense)
        R.prune_by_magnitude(dense, sparsity)
        return dense, R.fold_batchnorm(copy.deepcopy(dense)).eval()
    dense = vgg16_bn().eval()
    R.randomize_bn(dense)
    first = dense[0][0]
    for m in dense.modules():  # every layer but the first conv, by magnitude
        if isinstance(m, (nn.Conv2d, nn.Linear)) and m is not first:
            w = m.weight.data
            cut = w.abs().flatten().kthvalue(int(w.numel() * sparsity)).values
            w.mul_(w.abs() > cut)
    folded, _, _ = fold_batchnorm(copy.deepcopy(dense))
    return dense, folded.eval()


def across_processes(args) -> None:
    """Runs this script with --processes 1 in args.processes fresh processes, one after the
    other, and writes every process's rows with each cell's median ratio."""
    import subprocess
    from sparsejit.info import cpu_line
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.processes):
            out = str(Path(tmp) / f"p{i}.json")
            cmd = [sys.executable, __file__, "--model", args.model,
                   "--sparsities", *map(str, args.sparsities),
                   "--batches", *map(str, args.batches), "--threads", str(args.threads),
                   "--repeat", str(args.repeat), "--processes", "1", "--out", out]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"process {i} failed:\n{r.stderr[-3000:]}")
            runs.append(json.loads(Path(out).read_text())["rows"])
            print(f"process {i}: " + ", ".join(
                f"{row['sparsity']:.0%}/b{row['batch']} {row['sparsejit_vs_deepsparse']:.2f}x"
                for row in runs[-1]), flush=True)
    cpu = cpu_line()
    cells = []
    for j, first in enumerate(runs[0]):
        ratios = [run[j]["sparsejit_vs_deepsparse"] for run in runs]
        cells.append(dict(sparsity=first["sparsity"], batch=first["batch"],
                          sparsejit_ms=[run[j]["sparsejit_ms"] for run in runs],
                          deepsparse_ms=[run[j]["deepsparse_ms"] for run in runs],
                          ratios=ratios, median_ratio=statistics.median(ratios)))
    print(f"\nCPU: {cpu}, {args.threads} threads, {args.processes} processes\n")
    print("| sparsity | batch | sparsejit vs DeepSparse, each process | median |\n"
          "|---|---|---|---|")
    for c in cells:
        print(f"| {c['sparsity']:.0%} | {c['batch']} | "
              f"{', '.join(f'{x:.2f}x' for x in c['ratios'])} | {c['median_ratio']:.2f}x |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(cpu=cpu, args=vars(args), cells=cells,
                                              processes=runs), indent=1))


if __name__ == "__main__":
    main()
