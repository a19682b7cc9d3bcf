"""A MinkUNet-style sparse UNet (submanifold + strided + inverse convolutions) and a
SECOND-style middle encoder (SubMConv3d / SparseConv3d down to a BEV map) on a KITTI scan
voxelized at 5 cm; forward + backward time per step, next to spconv-CPU when installed
(the same model code: only the import changes). With both libraries, their steps run in
blocks of 4, alternated block by block (the first step of each block untimed), and the
ratio of the medians is printed.

    python examples/pointcloud_unet.py [--scan 000000] [--steps 3] [--voxel 0.05]
        [--processes N]   # the whole comparison in N fresh processes; median ratios

Reads $SPARSEJIT_DATA/pointclouds/kitti_pointpillars/<scan>.bin (default data folder:
<repo>/../shared/data); with no data it uses a random cloud.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import sparsejit as sj  # noqa: E402
import sparsejit.spconv as sjspconv  # noqa: E402
from sparsejit.info import cpu_line  # noqa: E402
from sparsejit.tools.data import data_dir  # noqa: E402


def block(sp, cin, cout, key):
    return sp.SparseSequential(sp.SubMConv3d(cin, cout, 3, bias=False, indice_key=key),
                               nn.BatchNorm1d(cout), nn.ReLU())


class MinkUNet(nn.Module):
    """Two-level sparse UNet: stem, two strided downs, inverse ups with skip concatenation."""

    def __init__(self, sp, cin=4, c=16, classes=20):
        super().__init__()
        self.sp = sp
        self.stem = block(sp, cin, c, "s0")
        self.down1 = sp.SparseConv3d(c, 2 * c, 2, 2, indice_key="d1")
        self.enc1 = block(sp, 2 * c, 2 * c, "s1")
        self.down2 = sp.SparseConv3d(2 * c, 4 * c, 2, 2, indice_key="d2")
        self.enc2 = block(sp, 4 * c, 4 * c, "s2")
        self.up2 = sp.SparseInverseConv3d(4 * c, 2 * c, 2, indice_key="d2")
        self.dec1 = block(sp, 4 * c, 2 * c, "s1")
        self.up1 = sp.SparseInverseConv3d(2 * c, c, 2, indice_key="d1")
        self.dec0 = block(sp, 2 * c, c, "s0")
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        cat = lambda a, b: a.replace_feature(torch.cat([a.features, b.features], 1))  # noqa: E731
        s0 = self.stem(x)
        s1 = self.enc1(self.down1(s0))
        s2 = self.enc2(self.down2(s1))
        d1 = self.dec1(cat(self.up2(s2), s1))
        d0 = self.dec0(cat(self.up1(d1), s0))
        return self.head(d0.features)


class SecondMiddleEncoder(nn.Module):
    """SECOND's sparse middle extractor, shortened: SubM blocks and strided SparseConv3d,
    then the z axis folded into channels of a bird's-eye-view map."""

    def __init__(self, sp, cin=4, c=16):
        super().__init__()
        self.net = sp.SparseSequential(
            block(sp, cin, c, "m0"),
            sp.SparseConv3d(c, 2 * c, 3, 2, 1, bias=False), nn.BatchNorm1d(2 * c), nn.ReLU(),
            block(sp, 2 * c, 2 * c, "m1"),
            sp.SparseConv3d(2 * c, 4 * c, 3, 2, 1, bias=False), nn.BatchNorm1d(4 * c), nn.ReLU(),
            block(sp, 4 * c, 4 * c, "m2"),
            sp.ToDense())

    def forward(self, x):
        d = self.net(x)  # [B, C, X, Y, Z]
        b, c, nx, ny, nz = d.shape
        return d.permute(0, 1, 4, 2, 3).reshape(b, c * nz, nx, ny)


def load_scan(name: str, voxel: float):
    d = data_dir()
    f = None if d is None else d / "pointclouds" / "kitti_pointpillars" / f"{name}.bin"
    if f is not None and f.exists():
        pts = torch.from_numpy(np.fromfile(f, dtype=np.float32).reshape(-1, 4))
    else:
        print("no KITTI data found; using a random cloud")
        pts = torch.rand(20000, 4) * torch.tensor([40.0, 40.0, 3.0, 1.0])
    return pts


def voxels(pts, voxel):
    coords, feats, _ = sj.voxelize(pts, voxel)
    return coords, feats, (coords[:, 1:].max(0).values + 1).tolist()


def step_ms(sp, model, coords, feats, shape):
    t0 = time.perf_counter()
    x = sp.SparseConvTensor(feats, coords, shape, 1)  # fresh tensor: maps built each step
    out = model(x)
    out.float().square().mean().backward()
    return (time.perf_counter() - t0) * 1e3


def time_steps(runs, coords, feats, shape, steps, block=4):
    """Median step time of each (sp, model) in `runs`. The libraries run in blocks of `block`
    steps, alternated block by block (the order flipped every round), until each has `steps`
    timed steps: every library is timed in its own steady state (the first step of a block,
    after the other library ran, is not timed), and a noisy machine slows them alike."""
    ts = [[] for _ in runs]
    r = 0
    while min(len(t) for t in ts) < steps:
        order = list(range(len(runs))) if r % 2 == 0 else list(reversed(range(len(runs))))
        for i in order:
            sp, model = runs[i]
            for b in range(block):
                ms = step_ms(sp, model, coords, feats, shape)
                if b > 0:
                    ts[i].append(ms)
        r += 1
    return [statistics.median(t) for t in ts]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scan", default="000000")
    ap.add_argument("--voxel", type=float, default=0.05)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--processes", type=int, default=1,
                    help="run the comparison in this many fresh processes and print each "
                         "ratio and the median (a shared machine moves one process's ratio a lot)")
    args = ap.parse_args()
    if args.processes > 1:
        across_processes(args)
        return
    torch.set_num_threads(2)
    print(f"CPU: {cpu_line()}, 2 threads")
    pts = load_scan(args.scan, args.voxel)
    # The UNet at --voxel; the middle encoder (which ends in a dense BEV map) at 4x coarser.
    grids = {"unet": voxels(pts, args.voxel), "second": voxels(pts, 4 * args.voxel)}
    for k, (c, _, shape) in grids.items():
        print(f"{k}: {pts.shape[0]} points -> {c.shape[0]} voxels, grid {shape}")
    libs = [("sparsejit", sjspconv)]
    try:
        import spconv.pytorch as spconv
        import spconv.pytorch.ops as spops
        spops.get_current_stream = lambda: 0  # spconv's CPU backward needs this
        libs.append(("spconv", spconv))
    except ImportError:
        print("spconv not installed: sparsejit only")
    for label, make, grid in (("MinkUNet fwd+bwd", MinkUNet, "unet"),
                              ("SECOND middle fwd+bwd", SecondMiddleEncoder, "second")):
        coords, feats, shape = grids[grid]
        torch.manual_seed(0)
        models = [(name, make(sp)) for name, sp in libs]
        if len(models) == 2:  # same weights: spconv's state dict loads into sparsejit
            models[0][1].load_state_dict(models[1][1].state_dict())
        runs = [(sp, model) for (_, model), (_, sp) in zip(models, libs)]
        times = time_steps(runs, coords, feats, shape, args.steps)
        row = [f"{name} {t:.1f} ms" for (name, _), t in zip(models, times)]
        if len(times) == 2:
            row.append(f"{times[1] / times[0]:.2f}x")
        print(f"{label}: " + ", ".join(row))


def across_processes(args):
    import re
    import subprocess
    print(f"CPU: {cpu_line()}, 2 threads")
    ratios = {}
    for i in range(args.processes):
        r = subprocess.run([sys.executable, __file__, "--scan", args.scan, "--voxel",
                            str(args.voxel), "--steps", str(args.steps)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"process {i} failed:\n{r.stderr[-3000:]}")
        for line in r.stdout.splitlines():
            m = re.match(r"(.+ fwd\+bwd): .*, ([0-9.]+)x$", line)
            if m:
                ratios.setdefault(m.group(1), []).append(float(m.group(2)))
        print(f"process {i}: " + ", ".join(f"{k} {v[-1]:.2f}x" for k, v in ratios.items()),
              flush=True)
    for k, v in ratios.items():
        print(f"{k}: sparsejit over spconv per process {', '.join(f'{x:.2f}x' for x in v)}; "
              f"median {statistics.median(v):.2f}x")
    if not ratios:
        print("no ratios: spconv not installed")


if __name__ == "__main__":
    main()
