"""Does a batch make the pruned ResNet-50's sparse layers cheaper per image? Every sparse layer
of the `sparsify(fold_bn=True)`-ed model of bench_resnet50_sparse.py (fusion pass on), run on
the input it receives in a forward at batch B, against B calls on one-image slices of that
input; then the whole model at batch B against the same batch in chunks. Alternated in one
process, medians; prints a table with each layer's useful GMAC/s (stored taps x output pixels).

    PYTHONPATH=python python3 benchmarks/bench_filter_conv_batch.py [--sparsity 0.9]
        [--batch 8] [--repeat 7] [--limit N] [--chunks 1 2 4]

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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import sparsejit as sj  # noqa: E402
from sparsejit.filter_conv import ResidualSparseConv2d, SparseConv2d  # noqa: E402
from sparsejit.ops.filter_conv import output_size  # noqa: E402
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
                            fold_bn=True, verbose=False, repeat=args.repeat)
        captured = {}

        def hook(name):
            def h(mod, a, kw):
                captured.setdefault(name, (mod, tuple(a) + tuple(kw.values())))
            return h
        layers = [(n, m) for n, m in model.named_modules()
                  if isinstance(m, ResidualSparseConv2d) or
                  (isinstance(m, SparseConv2d) and not n.endswith(".conv"))]
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
            conv = mod.conv if isinstance(mod, ResidualSparseConv2d) else mod
            oh, ow = output_size(a[0].shape[2], a[0].shape[3], conv.kernel_size, conv.stride,
                                 conv.padding, conv.dilation)
            macs = conv.nnz * b * oh * ow
            rows.append(dict(layer=name, input=list(a[0].shape), c_out=conv.out_channels,
                             kernel=list(conv.kernel_size), stride=list(conv.stride),
                             nnz=conv.nnz, residual=isinstance(mod, ResidualSparseConv2d),
                             batch_ms=med["batch"], slices_ms=med["slices"],
                             gmacs=macs / med["batch"] / 1e6))
        fns = {"whole": lambda: model(x)}
        for c in args.chunks:
            if c < args.batch:
                fns[f"chunks of {c}"] = lambda c=c: torch.cat(
                    [model(x[i:i + c]) for i in range(0, args.batch, c)])
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
    print("whole model: " + ", ".join(f"{k} {v:.1f} ms" for k, v in whole.items()))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(cpu=cpu, args=vars(args), layers=rows,
                                              whole=whole), indent=1))


if __name__ == "__main__":
    main()
