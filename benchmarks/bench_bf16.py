"""bfloat16 against float32, per family that takes bfloat16, same inputs, inputs cast
beforehand (the issue's target: bfloat16 at least 1.5x its own float32 on a CPU with
AVX512-BF16 / AMX). Forward only (the point-cloud convolution also its feature gradient);
medians of --repeat calls; prints the CPU line. The RGMS rows also time bfloat16 with its
bfloat16 products against the same call with SPARSEJIT_RGMS_BF16_GEMM=0, alternated.

    python3 benchmarks/bench_bf16.py [--repeat 15] [--families spmm attention rgms point_conv
                                                               filter_conv]

The point-cloud rows run on KITTI scan 000000 at 5 cm from SPARSEJIT_DATA (default
../shared/data), else on a generated surface cloud of about the same size; the filter-sparse
layer is a 90%-pruned 3x3 of ResNet-50's layer3 shape at batch 8.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import sparsejit as sj
from sparsejit.info import cpu_line
from sparsejit.runtime.timing import median_ms
from sparsejit.tools.data import load_graph

FAMILIES = ("spmm", "attention", "rgms", "point_conv", "filter_conv")


def _cloud():
    """(coords [N, 4] int32, spatial shape, name): KITTI 000000 voxelized at 5 cm, or a
    generated surface cloud (seeded) when the data is not there."""
    import os
    from pathlib import Path
    root = Path(os.environ.get("SPARSEJIT_DATA",
                               Path(__file__).resolve().parent.parent.parent / "shared" / "data"))
    scan = root / "pointclouds" / "kitti_pointpillars" / "000000.bin"
    if scan.exists():
        import numpy as np
        pts = torch.from_numpy(np.fromfile(scan, dtype=np.float32).reshape(-1, 4))
        coords, _, _ = sj.voxelize(pts, 0.05)
        name = "KITTI 000000 at 5 cm"
    else:
        g = torch.Generator().manual_seed(0)
        xy = torch.randint(0, 800, (40000, 2), generator=g)
        z = (xy[:, 0] // 16 + xy[:, 1] // 32) % 64
        coords = torch.unique(torch.stack([torch.zeros_like(z), xy[:, 0], xy[:, 1], z], 1), dim=0)
        name = "generated surface cloud"
    coords = coords.int()
    shape = (coords[:, 1:].max(0).values + 1).tolist()
    return coords, shape, f"{name}, {coords.shape[0]} sites"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", default="powerlaw:n=200000,avg=12,alpha=2.1,seed=1")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--families", nargs="*", default=list(FAMILIES), choices=FAMILIES)
    args = ap.parse_args()
    fam = set(args.families)
    torch.set_num_threads(args.threads)
    graph = ""
    if fam & {"spmm", "attention"}:
        g = load_graph(args.graph)
        A = sj.SparseMatrix.from_edge_index(g.edge_index, g.num_nodes)
        graph = f"; graph {args.graph} ({g.num_nodes} nodes, {A.nnz} entries)"
    gen = torch.Generator().manual_seed(0)
    rows = []

    def pair(name, f32, bf16, rep=args.repeat):
        a, b = median_ms(f32, rep, 3), median_ms(bf16, rep, 3)
        rows.append((name, a, b))

    ab_rows = []

    def products_ab(name, bf16, rep):
        """bfloat16 RGMS with its bfloat16 products (tiles and fused rows) against the same
        call with SPARSEJIT_RGMS_BF16_GEMM=0 (float32 products on widened inputs), calls
        alternated in this process, medians."""
        old = os.environ.get("SPARSEJIT_RGMS_BF16_GEMM")
        times = {"1": [], "0": []}
        try:
            for i in range(rep + 2):
                for k in (("1", "0") if i % 2 == 0 else ("0", "1")):
                    os.environ["SPARSEJIT_RGMS_BF16_GEMM"] = k
                    t0 = time.perf_counter()
                    bf16()
                    if i >= 2:  # two warm-up rounds
                        times[k].append((time.perf_counter() - t0) * 1e3)
        finally:
            if old is None:
                os.environ.pop("SPARSEJIT_RGMS_BF16_GEMM", None)
            else:
                os.environ["SPARSEJIT_RGMS_BF16_GEMM"] = old
        ab_rows.append((name, statistics.median(times["1"]), statistics.median(times["0"])))

    for F in (64, 128) if "spmm" in fam else ():
        X, Q = torch.randn(g.num_nodes, F, generator=gen), torch.randn(g.num_nodes, F, generator=gen)
        Xb, Qb = X.bfloat16(), Q.bfloat16()
        for red in ("sum", "max"):
            pair(f"spmm {red}, F={F}", lambda: sj.spmm(A, X, red), lambda: sj.spmm(A, Xb, red))
        pair(f"sddmm, F={F}", lambda: sj.sddmm(A, Q, X), lambda: sj.sddmm(A, Qb, Xb))
    if "attention" in fam:
        q = torch.randn(g.num_nodes, 4, 32, generator=gen)
        qb = q.bfloat16()
        pair("sparse_attention, H=4, D=32", lambda: sj.sparse_attention(A, q, q, q),
             lambda: sj.sparse_attention(A, qb, qb, qb), max(args.repeat // 3, 3))
    if "rgms" in fam:
        n, e, r = 100_000, 1_000_000, 50
        ei = torch.randint(0, n, (2, e), generator=gen)
        et = torch.randint(0, r, (e,), generator=gen)
        T = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
        for f in (16, 64):
            x, w = torch.randn(n, f, generator=gen), torch.randn(r, f, f, generator=gen)
            xb, wb = x.bfloat16(), w.bfloat16()
            name = f"rgms mean, 100k nodes / 1M edges / 50 relations, F={f}"
            pair(name, lambda: sj.rgms(T, x, w, reduce="mean"),
                 lambda: sj.rgms(T, xb, wb, reduce="mean"), max(args.repeat // 2, 3))
            products_ab(name, lambda: sj.rgms(T, xb, wb, reduce="mean"),
                        max(args.repeat // 2, 3))
        # F = 16 runs the fused rows: the same edges over 10k nodes (X and Y in L2) tell
        # what the rows cost with the random gathers hitting cache.
        n = 10_000
        ei = torch.randint(0, n, (2, e), generator=gen)
        T = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
        x, w = torch.randn(n, 16, generator=gen), torch.randn(r, 16, 16, generator=gen)
        xb, wb = x.bfloat16(), w.bfloat16()
        name = "rgms mean, 10k nodes / 1M edges / 50 relations, F=16"
        pair(name, lambda: sj.rgms(T, x, w, reduce="mean"),
             lambda: sj.rgms(T, xb, wb, reduce="mean"), max(args.repeat // 2, 3))
        products_ab(name, lambda: sj.rgms(T, xb, wb, reduce="mean"), max(args.repeat // 2, 3))
    if "point_conv" in fam:
        from sparsejit.families.point_conv.ops import point_conv_plan
        coords, shape, cloud = _cloud()
        plan, _ = point_conv_plan(coords, shape, 1, "subm", 3)
        n = coords.shape[0]
        conv = torch.ops.sparsejit.point_conv
        back = torch.ops.sparsejit.point_conv_backward
        for c in (16, 32, 64):  # the widths the cost model runs output-stationary
            x, w = torch.randn(n, c, generator=gen), torch.randn(27, c, c, generator=gen) / c
            gy = torch.randn(n, c, generator=gen)
            xb, wb, gb = x.bfloat16(), w.bfloat16(), gy.bfloat16()
            pair(f"SubMConv3d {c} -> {c}, {cloud}: forward",
                 lambda: conv(x, w, None, plan, n, False, 0, False),
                 lambda: conv(xb, wb, None, plan, n, False, 0, False))
            pair(f"SubMConv3d {c} -> {c}, {cloud}: feature gradient",
                 lambda: back(x, w, gy, plan, False, 0, True, False),
                 lambda: back(xb, wb, gb, plan, False, 0, True, False))
        # The layer as a model trains it: sparsejit.spconv.SubMConv3d (its weights in the
        # features' dtype), forward + backward (features and weight gradients), map cached.
        from sparsejit import spconv
        for c in (32, 64):
            feats = torch.randn(n, c, generator=gen)
            layer = spconv.SubMConv3d(c, c, 3, indice_key="bf16")
            layer_b = spconv.SubMConv3d(c, c, 3, indice_key="bf16").bfloat16()
            st = spconv.SparseConvTensor(feats.clone().requires_grad_(), coords, shape, 1)
            st_b = spconv.SparseConvTensor(feats.bfloat16().requires_grad_(), coords, shape, 1)

            def step(mod, t):
                mod(t).features.sum().backward()
            pair(f"SubMConv3d layer {c} -> {c}, {cloud}: forward + backward (map cached)",
                 lambda: step(layer, st), lambda: step(layer_b, st_b))
    if "filter_conv" in fam:
        from sparsejit.families.filter_conv.layers import ResidualPrunedConv2d
        from sparsejit.nn import PrunedConv2d
        wt = torch.randn(256, 256, 3, 3, generator=gen)
        wt = wt * (torch.rand(wt.shape, generator=gen) >= 0.9)
        mod = PrunedConv2d(wt, torch.randn(256, generator=gen), 1, 1)
        x = torch.randn(8, 256, 14, 14, generator=gen)
        xb = x.bfloat16()
        # a first-stage bottleneck's expanding 1x1 with the block's residual fused: bound by
        # the bytes of its input, residual and output (25.7 MB of float32 output at batch 8)
        w1 = torch.randn(256, 64, 1, 1, generator=gen)
        w1 = w1 * (torch.rand(w1.shape, generator=gen) >= 0.9)
        mod1 = ResidualPrunedConv2d(PrunedConv2d(w1, torch.randn(256, generator=gen)))
        x1 = torch.randn(8, 64, 56, 56, generator=gen)
        r1 = torch.randn(8, 256, 56, 56, generator=gen)
        x1b, r1b = x1.bfloat16(), r1.bfloat16()
        with torch.no_grad():
            pair("PrunedConv2d 3x3 256 -> 256, 14 x 14, batch 8, 90% pruned",
                 lambda: mod(x), lambda: mod(xb))
            pair("ResidualPrunedConv2d 1x1 64 -> 256 + residual + ReLU, 56 x 56, batch 8, "
                 "90% pruned", lambda: mod1(x1, r1), lambda: mod1(x1b, r1b))
    print(f"CPU: {cpu_line()}; {args.threads} threads{graph}\n")
    print("| op | float32 | bfloat16 | bfloat16 speed-up |")
    print("|---|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a:.2f} ms | {b:.2f} ms | {a / b:.2f}x |")
    if ab_rows:
        print("\nRGMS in bfloat16: its bfloat16 products against float32 products on widened "
              "inputs (SPARSEJIT_RGMS_BF16_GEMM=0), calls alternated\n")
        print("| op | bfloat16 products | float32 products | speed-up |")
        print("|---|---|---|---|")
        for name, a, b in ab_rows:
            print(f"| {name} | {a:.2f} ms | {b:.2f} ms | {b / a:.2f}x |")


if __name__ == "__main__":
    main()
