"""Whole-network inference: a ResNet-50 (v1.5, built here: torchvision does not load with the
CPU torch), pruned by magnitude, BatchNorm folded, `sj.sparsify`-ed, against the dense model in
eval mode (and against the dense model with BatchNorm folded), batch 1 by default. sparsify
folds the BatchNorms itself (`fold_bn=True`: torch.fx, ReLUs after conv1/conv2 fused) and
measures the JIT variants per layer; the JIT compile wall time (parallel, cold cache unless
SPARSEJIT_CACHE_DIR holds earlier kernels) and the whole sparsify time are reported.

    python3 benchmarks/bench_resnet50_sparse.py [--sparsities 0.8 0.9] [--batch 1]
        [--threads 2] [--clock wall|cpu] [--out benchmarks/results/filter_conv_resnet50.json]

Every convolution except the first is pruned to the given sparsity by magnitude (per layer);
the first convolution and the classifier stay dense. Weights are random (no pretrained
weights here), so the patterns are unstructured. sparsify measures each layer dense vs sparse
on its real input shape and converts where sparse wins by 5%; the per-layer table it prints is
kept in the JSON. Medians of alternated runs; noisy on a shared machine (see
bench_filter_conv.py for --clock cpu).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

import sparsejit as sj  # noqa: E402
import sparsejit.families.filter_conv.tuner as fc  # noqa: E402
from sparsejit.info import cpu_line  # noqa: E402


class Bottleneck(nn.Module):
    def __init__(self, c_in, mid, out, stride):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c_in, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3, self.bn3 = nn.Conv2d(mid, out, 1, bias=False), nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or c_in != out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, out, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        return self.relu(self.bn3(self.conv3(y)) + idt)


class ResNet50(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        layers, c_in = [], 64
        for mid, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
            out = mid * 4
            blk = [Bottleneck(c_in, mid, out, stride)]
            blk += [Bottleneck(out, mid, out, 1) for _ in range(blocks - 1)]
            layers.append(nn.Sequential(*blk))
            c_in = out
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(x.mean((2, 3), keepdim=True), 1))


def randomize_bn(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)


def prune_by_magnitude(model, sparsity):
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d) and name != "conv1":
            w = m.weight.data
            k = int(w.numel() * sparsity)
            if k > 0:
                cut = w.abs().flatten().kthvalue(k).values
                w.mul_(w.abs() > cut)


def fold_batchnorm(model):
    """Conv followed by BN (the pairs of this ResNet) -> one Conv with bias; BN -> Identity."""
    def fold(conv, bn):
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        conv.weight.data.mul_(scale.view(-1, 1, 1, 1))
        b = conv.bias.data if conv.bias is not None else torch.zeros_like(bn.running_mean)
        conv.bias = nn.Parameter((b - bn.running_mean) * scale + bn.bias)

    fold(model.conv1, model.bn1)
    model.bn1 = nn.Identity()
    for blk in [b for layer in (model.layer1, model.layer2, model.layer3, model.layer4)
                for b in layer]:
        for i in (1, 2, 3):
            fold(getattr(blk, f"conv{i}"), getattr(blk, f"bn{i}"))
            setattr(blk, f"bn{i}", nn.Identity())
        if blk.downsample is not None:
            fold(blk.downsample[0], blk.downsample[1])
            blk.downsample[1] = nn.Identity()
    return model


def median_ms(fns, repeat, clock):
    """Medians of each callable, alternated run by run."""
    for f in fns:
        f()
    times = [[] for _ in fns]
    for _ in range(repeat):
        for i, f in enumerate(fns):
            t0 = clock()
            f()
            times[i].append((clock() - t0) * 1e3)
    return [sorted(t)[len(t) // 2] for t in times]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sparsities", type=float, nargs="+", default=[0.8, 0.9])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/filter_conv_resnet50.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, 224, 224)
    results = []
    with torch.no_grad():
        for sparsity in args.sparsities:
            dense = ResNet50().eval()
            randomize_bn(dense)
            prune_by_magnitude(dense, sparsity)
            folded = fold_batchnorm(copy.deepcopy(dense)).eval()
            t0 = time.perf_counter()
            sparse = sj.sparsify(copy.deepcopy(dense), x, min_speedup=1.05, progress=None,
                                 clock=args.clock, fold_bn=True)
            sparsify_s = time.perf_counter() - t0
            rows = list(fc.LAST_REPORT)
            kernels = {}
            for r in rows:
                if r["choice"] == "sparse":
                    kernels[r["kernel"]] = kernels.get(r["kernel"], 0) + 1
            print(f"sparsify: {sparsify_s:.1f} s, of which JIT compiles "
                  f"{fc.LAST_JIT_WARMUP_S:.1f} s (parallel); kernels chosen {kernels}")
            torch.testing.assert_close(sparse(x), dense(x), rtol=1e-3, atol=1e-3)
            d_ms, f_ms, s_ms = median_ms([lambda: dense(x), lambda: folded(x),
                                          lambda: sparse(x)], args.repeat, clock)
            n_sparse = sum(r["choice"] == "sparse" for r in rows)
            print(f"\nsparsity {sparsity:.0%}, batch {args.batch}, {args.threads} threads: "
                  f"dense (eval, BN) {d_ms:.2f} ms, dense BN-folded {f_ms:.2f} ms, "
                  f"sparsified {s_ms:.2f} ms -> {d_ms / s_ms:.2f}x over dense eval, "
                  f"{f_ms / s_ms:.2f}x over dense folded ({n_sparse}/{len(rows)} layers "
                  f"sparse)", flush=True)
            results.append(dict(sparsity=sparsity, batch=args.batch, threads=args.threads,
                                dense_ms=d_ms, dense_folded_ms=f_ms, sparse_ms=s_ms,
                                speedup=d_ms / s_ms, speedup_vs_folded=f_ms / s_ms,
                                sparse_layers=n_sparse, sparsify_s=sparsify_s,
                                jit_compile_s=fc.LAST_JIT_WARMUP_S, kernels=kernels,
                                layers=rows))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cpu = cpu_line()
    out.write_text(json.dumps(dict(meta=dict(cpu=cpu, torch=torch.__version__,
                                             clock=args.clock,
                                             repeat=args.repeat, load_average=os.getloadavg()),
                                   results=results), indent=1))
    print(f"CPU: {cpu}; wrote {out}")


if __name__ == "__main__":
    main()
