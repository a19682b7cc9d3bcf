"""Does a batch make the pruned ResNet-50's sparse layers cheaper per image? Every sparse layer
of the `sparsify(fold_bn=True)`-ed model of bench_resnet50_sparse.py (fusion pass on, fused
bottlenecks off: it times the layers one by one), run on
the input it receives in a forward at batch B, against B calls on one-image slices of that
input; then the whole model at batch B against the same batch in chunks, and against the
early stages alone in chunks (`--prefix-stages`: the model split after the last node of each
named stage, the stem and those stages run chunk by chunk so that their activations stay in
cache, the rest on the whole batch; the outputs checked equal). Alternated in one process,
medians; prints a table with each layer's useful GMAC/s (stored taps x output pixels), and
each stage's time in the batch-B forward against B one-image forwards (forward hooks on the
model's top-level modules).

    PYTHONPATH=python python3 benchmarks/archive/bench_filter_conv_batch.py [--sparsity 0.9]
        [--batch 8] [--repeat 7] [--limit N] [--chunks 1 2 4] [--prefix-stages layer1 layer2]

Writes benchmarks/results/filter_conv_batch.json (CPU named)."""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import sparsejit as sj  # noqa: E402
from sparsejit.families.filter_conv.layers import ResidualPrunedConv2d, PrunedConv2d  # noqa: E402
from sparsejit.families.filter_conv.ops import output_size  # noqa: E402
import bench_filter_conv as B  # noqa: E402
import bench_resnet50_sparse as R  # noqa: E402


def alternated(fns: dict, repeat: int) -> dict:
    for f in fns.values():
        f()
    times = {k: [] for k in fns}
    keys = list(fns)
    for r in range(repeat):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            t0 = time.perf_counter()
            fns[k]()
            times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    B.add_layer_args(ap, "only the first N sparse layers")
    ap.add_argument("--chunks", type=int, nargs="*", default=[1, 2, 4])
    ap.add_argument("--prefix-stages", nargs="*", default=["layer1", "layer2"],
                    help="stages after which the model is split for the chunked-prefix runs")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/filter_conv_batch.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dense = R.ResNet50().eval()
    R.randomize_bn(dense)
    R.prune_by_magnitude(dense, args.sparsity)
    x = torch.randn(args.batch, 3, 224, 224)
    rows = []
    with torch.no_grad():
        model = sj.sparsify(copy.deepcopy(dense), x, min_speedup=1.05, progress=None,
                            fold_bn=True, verbose=False, repeat=args.repeat, fuse_groups=False)
        captured = {}

        def hook(name):
            def h(mod, a, kw):
                captured.setdefault(name, (mod, tuple(a) + tuple(kw.values())))
            return h
        layers = [(n, m) for n, m in model.named_modules()
                  if isinstance(m, ResidualPrunedConv2d) or
                  (isinstance(m, PrunedConv2d) and not n.endswith(".conv"))]
        hooks = [m.register_forward_pre_hook(hook(n), with_kwargs=True) for n, m in layers]
        model(x)
        for h in hooks:
            h.remove()
        for name, _ in layers[:args.limit]:
            mod, a = captured[name]
            b = a[0].shape[0]
            med = alternated({"batch": lambda: mod(*a),
                              "slices": lambda: [mod(*[t[i:i + 1] for t in a])
                                                 for i in range(b)]}, args.repeat)
            conv = mod.conv if isinstance(mod, ResidualPrunedConv2d) else mod
            oh, ow = output_size(a[0].shape[2], a[0].shape[3], conv.kernel_size, conv.stride,
                                 conv.padding, conv.dilation)
            macs = conv.nnz * b * oh * ow
            rows.append(dict(layer=name, input=list(a[0].shape), c_out=conv.out_channels,
                             kernel=list(conv.kernel_size), stride=list(conv.stride),
                             nnz=conv.nnz, residual=isinstance(mod, ResidualPrunedConv2d),
                             batch_ms=med["batch"], slices_ms=med["slices"],
                             gmacs=macs / med["batch"] / 1e6))
        stages = stage_times(model, x, args.repeat)
        fns = {"whole": lambda: model(x)}
        for c in args.chunks:
            if c < args.batch:
                fns[f"chunks of {c}"] = lambda c=c: torch.cat(
                    [model(x[i:i + c]) for i in range(0, args.batch, c)])
        want = model(x)
        for stage in args.prefix_stages:
            head, tail = split_after(model, stage)
            for c in args.chunks:
                if c < args.batch:
                    def run(c=c, head=head, tail=tail):
                        return tail(torch.cat([head(x[i:i + c])
                                               for i in range(0, args.batch, c)]))
                    assert torch.equal(run(), want), f"split after {stage} changed the result"
                    fns[f"stem..{stage} in chunks of {c}"] = run
        whole = alternated(fns, args.repeat)
    from sparsejit.info import cpu_line
    cpu = cpu_line()
    print(f"CPU: {cpu}, {args.threads} threads; {args.sparsity:.0%}, batch {args.batch}\n")
    print(f"| layer | input | C_out | k / s | taps | batch {args.batch} ms | {args.batch} x "
          f"batch 1 ms | ratio | useful GMAC/s |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layer']}{' (+res)' if r['residual'] else ''} | {tuple(r['input'])} | "
              f"{r['c_out']} | {r['kernel'][0]} / {r['stride'][0]} | {r['nnz']} | "
              f"{r['batch_ms']:.2f} | {r['slices_ms']:.2f} | "
              f"{r['slices_ms'] / r['batch_ms']:.2f} | {r['gmacs']:.1f} |")
    tb, ts = sum(r["batch_ms"] for r in rows), sum(r["slices_ms"] for r in rows)
    print(f"\nsum over {len(rows)} layers: batch {args.batch} {tb:.1f} ms, {args.batch} x "
          f"batch 1 {ts:.1f} ms")
    print(f"\n| stage | batch {args.batch}, per image | {args.batch} one-image forwards, per "
          f"image | ratio |\n|---|---|---|---|")
    for k, (tb, t1) in stages.items():
        print(f"| {k} | {tb:.2f} ms | {t1:.2f} ms | {t1 / tb:.2f} |")
    print("\nwhole model: " + ", ".join(f"{k} {v:.1f} ms" for k, v in whole.items()))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(cpu=cpu, args=vars(args), layers=rows,
                                              stages=stages, whole=whole), indent=1))


def stage_times(model, x, repeat):
    """{stage: (ms per image in the batch forward, ms per image in one-image forwards)}:
    forward hooks time every module the traced graph calls, summed per stage (the first
    component of its name: conv1, layer1, ...); the batch forward and the B one-image
    forwards alternate, medians over the repeats. Element-wise nodes between modules (the
    unfused adds) are not counted."""
    spent = {}

    def pre(name):
        def h(mod, args):
            mod._sj_t0 = time.perf_counter()
        return h

    def post(name):
        def h(mod, args, out):
            stage = name.split(".")[0]
            spent[stage] = spent.get(stage, 0.0) + time.perf_counter() - mod._sj_t0
        return h
    hooks = []
    targets = {str(n.target) for n in model.graph.nodes if n.op == "call_module"}
    for name in sorted(targets):
        mod = model.get_submodule(name)
        hooks += [mod.register_forward_pre_hook(pre(name)), mod.register_forward_hook(post(name))]
    b = x.shape[0]
    per = {"batch": [], "single": []}
    try:
        for r in range(repeat + 1):
            for kind in (("batch", "single") if r % 2 == 0 else ("single", "batch")):
                spent.clear()
                if kind == "batch":
                    model(x)
                else:
                    for i in range(b):
                        model(x[i:i + 1])
                if r > 0:  # the first round warms up
                    per[kind].append({k: v * 1e3 / b for k, v in spent.items()})
    finally:
        for h in hooks:
            h.remove()
    names = list(per["batch"][0])
    return {n: (statistics.median(d[n] for d in per["batch"]),
                statistics.median(d[n] for d in per["single"])) for n in names}


def split_after(model, stage):
    """(head, tail) GraphModules: the traced model cut after the last node of `stage` (a
    top-level module name) and the element-wise nodes that follow it; one tensor crosses."""
    from torch.fx.passes.split_module import split_module
    nodes = list(model.graph.nodes)
    last = max(i for i, n in enumerate(nodes)
               if n.op == "call_module" and str(n.target).split(".")[0] == stage)
    while nodes[last + 1].op in ("call_function", "call_method"):
        last += 1
    head_names = {n.name for n in nodes[: last + 1]}
    parts = split_module(model, None, lambda n: 0 if n.name in head_names else 1)
    return parts.submod_0, parts.submod_1


if __name__ == "__main__":
    main()
