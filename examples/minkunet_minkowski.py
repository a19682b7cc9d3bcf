"""A MinkUNet written against MinkowskiEngine's API (residual blocks, four stride-2 levels,
transposed convolutions back with skip concatenations, as in ME's examples/minkunet.py, with
fewer channels), run by sparsejit through ``import sparsejit.minkowski as ME``. It trains a
few steps of per-voxel segmentation on a KITTI scan (the labels are four height bands, a
stand-in task) and prints the loss and the step time.

    python examples/minkunet_minkowski.py [--scan 000000] [--voxel 0.1] [--steps 10]
        [--engine sparsejit|minkowskiengine|accelerate]

``minkowskiengine`` runs the same model code on ME itself; ``accelerate`` builds it with ME's
modules and hands it to ``sparsejit.accelerate`` (the one-line path for an existing ME model:
ME's tensors go in, sparsejit's modules run). Both need MinkowskiEngine installed
(benchmarks/peers/build_minkowski.sh).

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
from sparsejit.runtime.timing import Progress  # noqa: E402
from sparsejit.tools.data import data_dir  # noqa: E402


def make_model(ME, in_channels: int, classes: int, D: int = 3) -> nn.Module:
    """The model code, written as for MinkowskiEngine (`ME` is the module)."""

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.conv1 = ME.MinkowskiConvolution(cin, cout, kernel_size=3, dimension=D)
            self.norm1 = ME.MinkowskiBatchNorm(cout)
            self.conv2 = ME.MinkowskiConvolution(cout, cout, kernel_size=3, dimension=D)
            self.norm2 = ME.MinkowskiBatchNorm(cout)
            self.relu = ME.MinkowskiReLU(inplace=True)
            self.downsample = None if cin == cout else nn.Sequential(
                ME.MinkowskiConvolution(cin, cout, kernel_size=1, dimension=D),
                ME.MinkowskiBatchNorm(cout))

        def forward(self, x):
            out = self.relu(self.norm1(self.conv1(x)))
            out = self.norm2(self.conv2(out))
            residual = x if self.downsample is None else self.downsample(x)
            out += residual
            return self.relu(out)

    def down(cin, cout):
        return nn.Sequential(ME.MinkowskiConvolution(cin, cout, kernel_size=2, stride=2,
                                                     dimension=D),
                             ME.MinkowskiBatchNorm(cout), ME.MinkowskiReLU(inplace=True))

    def up(cin, cout):
        return nn.Sequential(ME.MinkowskiConvolutionTranspose(cin, cout, kernel_size=2,
                                                              stride=2, dimension=D),
                             ME.MinkowskiBatchNorm(cout), ME.MinkowskiReLU(inplace=True))

    class MinkUNet(nn.Module):
        ENC = (16, 32, 48, 64, 96)
        DEC = (64, 48, 32, 32)

        def __init__(self):
            super().__init__()
            e, d = self.ENC, self.DEC
            self.stem = nn.Sequential(
                ME.MinkowskiConvolution(in_channels, e[0], kernel_size=5, dimension=D),
                ME.MinkowskiBatchNorm(e[0]), ME.MinkowskiReLU(inplace=True))
            self.downs = nn.ModuleList(down(e[i], e[i]) for i in range(4))
            self.enc = nn.ModuleList(BasicBlock(e[i], e[i + 1]) for i in range(4))
            skips = (e[3], e[2], e[1], e[0])
            ins = (e[4],) + d[:-1]
            self.ups = nn.ModuleList(up(ins[i], d[i]) for i in range(4))
            self.dec = nn.ModuleList(BasicBlock(d[i] + skips[i], d[i]) for i in range(4))
            self.final = ME.MinkowskiConvolution(d[3], classes, kernel_size=1, bias=True,
                                                 dimension=D)

        def forward(self, x):
            out = self.stem(x)
            skips = [out]
            for dn, blk in zip(self.downs, self.enc):
                out = blk(dn(out))
                skips.append(out)
            skips.pop()
            for u, blk in zip(self.ups, self.dec):
                out = blk(ME.cat(u(out), skips.pop()))
            return self.final(out)

    return MinkUNet()


def load_points(scan: str) -> torch.Tensor:
    d = data_dir()
    f = None if d is None else d / "pointclouds" / "kitti_pointpillars" / f"{scan}.bin"
    if f is not None and f.exists():
        return torch.from_numpy(np.fromfile(f, dtype=np.float32).reshape(-1, 4))
    print("no KITTI data found; using a random cloud")
    return torch.rand(20000, 4) * torch.tensor([40.0, 40.0, 3.0, 1.0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scan", default="000000")
    ap.add_argument("--voxel", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--engine", choices=["sparsejit", "minkowskiengine", "accelerate"],
                    default="sparsejit")
    args = ap.parse_args()
    if args.engine in ("minkowskiengine", "accelerate"):
        import MinkowskiEngine as ME  # the real engine
    else:
        import sparsejit.minkowski as ME

    torch.manual_seed(0)
    pts = load_points(args.scan)
    cells = torch.floor(pts[:, :3] / args.voxel).int()
    coords = torch.cat([torch.zeros(cells.shape[0], 1, dtype=torch.int32), cells], 1)
    feats = torch.cat([pts[:, 3:], pts[:, 2:3]], 1)  # intensity, height
    z = pts[:, 2]
    labels = torch.bucketize(z, torch.quantile(z, torch.tensor([0.25, 0.5, 0.75])))
    model = make_model(ME, feats.shape[1], 4)
    if args.engine == "accelerate":
        import sparsejit
        sparsejit.accelerate(model, verbose=True)  # ME's model, one line
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    times = []
    bar = Progress(args.steps, f"MinkUNet on {args.engine}")
    for step in range(args.steps):
        t0 = time.perf_counter()
        # A new SparseTensor (and coordinate manager) each step: the maps are rebuilt, as in
        # training on a stream of scans. Duplicate voxels keep one point (ME's default).
        x = ME.SparseTensor(feats, coordinates=coords,
                            quantization_mode=ME.SparseTensorQuantizationMode.UNWEIGHTED_AVERAGE)
        y = model(x)
        # One label per voxel: the points' labels averaged the same way, rounded.
        target = ME.SparseTensor(labels[:, None].float(), coordinates=coords,
                                 quantization_mode=ME.SparseTensorQuantizationMode
                                 .UNWEIGHTED_AVERAGE).F[:, 0].round().long()
        loss = nn.functional.cross_entropy(y.F, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
        bar.step(f"loss {loss.item():.3f}")
        if not bar.enabled:
            print(f"step {step}: loss {loss.item():.4f}, {times[-1]:.0f} ms")
    print(f"{len(x)} voxels at {args.voxel} m, {torch.get_num_threads()} threads: median step "
          f"{statistics.median(times[1:] or times):.0f} ms (forward + backward + maps)")


if __name__ == "__main__":
    main()
