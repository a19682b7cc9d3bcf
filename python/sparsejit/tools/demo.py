"""The main job: train a 2-layer GCN with sparsejit and with pure PyTorch, side by side.

    python -m sparsejit.demo [GRAPH] [--epochs 5] [--hidden 64]

GRAPH is a name, a file or a generator spec (see sparsejit.data.load_graph); the default is
a generated power-law graph. Both models start from the same weights and see the same
features and labels; the script prints per-epoch loss and time for both and whether the
losses match (exit status 1 if they do not).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from sparsejit.tools import data as sjdata
from sparsejit.families.spmm.matrix import SparseMatrix
from sparsejit.nn import GCNConv, gcn_norm

DEFAULT_GRAPH = "powerlaw:n=50000,avg=10,alpha=2.1,seed=0"


class SparsejitGCN(torch.nn.Module):
    def __init__(self, fin: int, hidden: int, classes: int):
        super().__init__()
        # A_hat is normalised once, up front (gcn_norm), as the baseline's weights are.
        self.conv1 = GCNConv(fin, hidden, normalize=False)
        self.conv2 = GCNConv(hidden, classes, normalize=False)

    def forward(self, x, A_hat: SparseMatrix):
        return self.conv2(torch.relu(self.conv1(x, A_hat)), A_hat)


class TorchGCN(torch.nn.Module):
    """The same model with gather / scatter aggregation (what PyG's GCNConv does)."""

    def __init__(self, fin: int, hidden: int, classes: int):
        super().__init__()
        self.conv1, self.conv2 = GCNConv(fin, hidden), GCNConv(hidden, classes)

    @staticmethod
    def _propagate(conv: GCNConv, x, src, dst, w, n):
        h = conv.lin(x)
        out = torch.zeros(n, h.shape[1], dtype=h.dtype).index_add_(0, dst, h[src] * w[:, None])
        return out + conv.bias

    def forward(self, x, graph):
        src, dst, w, n = graph
        return self._propagate(self.conv2, torch.relu(self._propagate(self.conv1, x, src, dst, w, n)),
                               src, dst, w, n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparsejit.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("graph", nargs="?", default=DEFAULT_GRAPH)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--features", type=int, default=128, help="width of random features")
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    g = sjdata.load_graph(args.graph)
    torch.manual_seed(args.seed)
    x = g.x if g.x is not None else torch.randn(g.num_nodes, args.features)
    if g.y is not None and int(g.y.min()) >= 0:
        y, classes = g.y, int(g.y.max()) + 1
    else:
        y, classes = torch.randint(0, args.classes, (g.num_nodes,)), args.classes
    A_hat = gcn_norm(SparseMatrix.from_edge_index(g.edge_index, g.num_nodes))
    A_hat.transpose_arrays()  # per-graph preprocessing, once
    graph = (A_hat.indices.long(), A_hat.row_indices(), A_hat.values, g.num_nodes)
    print(f"graph {g.name}: {g.num_nodes} nodes, {g.num_edges} edges (+ self loops), "
          f"features {x.shape[1]}, classes {classes}, threads {torch.get_num_threads()}")

    ours = SparsejitGCN(x.shape[1], args.hidden, classes)
    ref = TorchGCN(x.shape[1], args.hidden, classes)
    ref.load_state_dict(ours.state_dict())
    opt_ours = torch.optim.Adam(ours.parameters(), lr=0.01)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=0.01)

    print(f"{'epoch':>5} {'loss sparsejit':>15} {'loss torch':>12} {'ms sparsejit':>13} "
          f"{'ms torch':>10} {'speed-up':>9}")
    worst = 0.0
    t_ours, t_ref = [], []
    for epoch in range(1, args.epochs + 1):
        losses = []
        for model, opt, inp, times in ((ours, opt_ours, A_hat, t_ours), (ref, opt_ref, graph, t_ref)):
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = F.cross_entropy(model(x, inp), y)
            loss.backward()
            opt.step()
            times.append((time.perf_counter() - t0) * 1e3)
            losses.append(float(loss.detach()))
        rel = abs(losses[0] - losses[1]) / max(abs(losses[1]), 1e-12)
        worst = max(worst, rel)
        print(f"{epoch:>5} {losses[0]:>15.6f} {losses[1]:>12.6f} {t_ours[-1]:>13.1f} "
              f"{t_ref[-1]:>10.1f} {t_ref[-1] / t_ours[-1]:>8.2f}x")
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    print(f"median epoch: sparsejit {med(t_ours):.1f} ms, torch gather/scatter {med(t_ref):.1f} ms "
          f"({med(t_ref) / med(t_ours):.2f}x)")
    match = worst <= 1e-4
    print(f"losses match: {'yes' if match else 'no'} (max relative difference {worst:.2e})")
    return 0 if match else 1


if __name__ == "__main__":
    sys.exit(main())
