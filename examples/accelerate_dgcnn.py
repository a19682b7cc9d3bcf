"""A DGCNN-style point-cloud model written in PyG (EdgeConv), moved onto sparsejit with one line
and trained on a real lidar scan, side by side with the original.

    python examples/accelerate_dgcnn.py [--points 4096] [--k 20] [--epochs 30] [--plot out.png]

The model: EdgeConv(MLP([8, 64, 64])) -> EdgeConv(MLP([128, 64])) -> a per-point head, on a
k-nearest-neighbour graph of the coordinates (built once: PyG's DynamicEdgeConv needs
pyg-lib's knn; ``sparsejit.nn.DynamicEdgeConv`` builds its own graph every call). The task is
per-point: is the point on the ground (the lowest 30% of heights)? from the points' x, y, z
and intensity, with the height column masked to zero, so the network must infer it from its
neighbourhood. After ``sparsejit.accelerate`` the EdgeConvs are sparsejit's: the first
Linear of each MLP runs per point (two GEMMs on N rows instead of one on N k rows), the
second layer's MLP is a single Linear, so it is one SpMM over the points. Both models train
from the same weights with a progress bar; losses and times are printed and, with
matplotlib, plotted. Without the data folder the points are random.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import torch
import torch.nn.functional as F
from torch_geometric.nn import MLP, EdgeConv

import sparsejit as sj
from sparsejit.families.spmm.edge_conv import knn_graph
from sparsejit.runtime.timing import Progress
from sparsejit.tools.data import data_dir
from sparsejit.tools.plot import loss_curves


class DGCNN(torch.nn.Module):
    """Plain PyG: nothing here knows about sparsejit."""

    def __init__(self, f: int = 4, classes: int = 2):
        super().__init__()
        self.conv1 = EdgeConv(MLP([2 * f, 64, 64]))
        self.conv2 = EdgeConv(MLP([128, 64]))
        self.head = MLP([128, 64, classes])

    def forward(self, x, edge_index):
        h1 = self.conv1(x, edge_index)
        h2 = self.conv2(h1, edge_index)
        return self.head(torch.cat([h1, h2], 1))


def scan(n: int):
    g = torch.Generator().manual_seed(0)
    root = data_dir()
    path = None if root is None else root / "pointclouds/kitti_pointpillars/000000.bin"
    if path is not None and path.exists():
        pts = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.float32).view(-1, 4)
        return "KITTI 000000", pts[torch.randperm(pts.shape[0], generator=g)[:n]].clone()
    print("no data folder: random points", file=sys.stderr)
    return "random points", torch.randn(n, 4, generator=g)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=4096)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--plot", default="accelerate_dgcnn.png", help="loss / time plot (PNG)")
    args = ap.parse_args(argv)
    if args.epochs < 1 or args.points < 2 or args.k < 1:
        raise SystemExit("--epochs and --k must be at least 1, --points at least 2")
    torch.set_num_threads(args.threads)
    name, pts = scan(args.points)
    z = pts[:, 2]
    y = (z <= z.quantile(0.3)).long()
    x = pts.clone()
    x[:, 2] = 0.0  # the height is what the network must infer
    x = (x - x.mean(0)) / x.std(0).clamp(min=1e-6)
    edge_index = knn_graph(pts[:, :3], pts[:, :3], args.k)  # sparsejit's own k-NN
    torch.manual_seed(0)
    pyg_model = DGCNN()
    model = sj.accelerate(copy.deepcopy(pyg_model), verbose=True)  # the one line

    runs = {}
    for label, m in (("PyG", pyg_model), ("sparsejit.accelerate", model)):
        opt = torch.optim.Adam(m.parameters(), lr=0.01)
        bar = Progress(args.epochs, f"{label:>20}", enabled=True)
        losses, clock, t = [], [], 0.0
        for _ in range(args.epochs):
            m.train()
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = F.cross_entropy(m(x, edge_index), y)
            loss.backward()
            opt.step()
            t += time.perf_counter() - t0
            losses.append(loss.item())
            clock.append(t)
            bar.step(f"loss {losses[-1]:.3f}")
        m.eval()
        with torch.no_grad():
            acc = float((m(x, edge_index).argmax(-1) == y).float().mean())
        runs[label] = (losses, clock, acc)
        print(f"{label:>20}: final loss {losses[-1]:.4f}, accuracy {acc:.3f}, "
              f"{1e3 * clock[-1] / args.epochs:.1f} ms per epoch")
    (_, c0, _), (_, c1, _) = runs.values()
    print(f"{name} ({args.points} points, k = {args.k}): accelerated epochs "
          f"{c0[-1] / c1[-1]:.2f}x the PyG model's speed")
    loss_curves(runs, f"DGCNN on {name}: PyG model, unchanged vs sparsejit.accelerate", args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
