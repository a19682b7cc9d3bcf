"""A PyG model, unchanged, moved onto sparsejit with one line and trained.

    python examples/accelerate_pyg.py [--graph cora] [--epochs 50] [--threads 2] [--plot out.png]

The model is written against torch_geometric alone (an APPNP-style network: two Linears, then
APPNP propagation, with a GCN branch added; SGConv and TAGConv would do as well). After
``sparsejit.accelerate(model, verbose=True)`` the GCN layer is sparsejit's GCNConv holding the
same weights and APPNP keeps its class but propagates on sparsejit's SpMM. Both the original
(a deep copy made before) and the accelerated model train side by side from the same weights,
with a progress bar; the script prints both losses and times per epoch and, when matplotlib is
installed, plots loss against time. The graph is Cora's from the data folder with its
features and labels; without the data folder it falls back to a generated graph with random
features and labels.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import torch
import torch.nn.functional as F
from torch_geometric.nn import APPNP, GCNConv

import sparsejit as sj
from sparsejit.runtime.timing import Progress
from sparsejit.tools.data import load_graph
from sparsejit.tools.plot import loss_curves


class Net(torch.nn.Module):
    """Plain PyG: nothing here knows about sparsejit."""

    def __init__(self, in_channels, hidden, classes, K=10, alpha=0.1, dropout=0.5):
        super().__init__()
        self.lin1 = torch.nn.Linear(in_channels, hidden)
        self.lin2 = torch.nn.Linear(hidden, classes)
        self.gcn = GCNConv(in_channels, classes, cached=True)
        self.prop = APPNP(K, alpha, cached=True)
        self.dropout = dropout

    def forward(self, x, edge_index):
        h = F.dropout(x, self.dropout, self.training)
        h = self.lin2(F.dropout(self.lin1(h).relu(), self.dropout, self.training))
        return self.prop(h, edge_index) + self.gcn(x, edge_index)


def load(name: str):
    try:
        g = load_graph(name)
        if g.x is not None and g.y is not None:
            return g.x, g.y, g.edge_index, g.name
    except (OSError, ValueError, KeyError) as e:
        print(f"{name}: not loaded ({e}); using a generated graph", file=sys.stderr)
    g = load_graph("uniform:n=3000,avg=8,seed=0")
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(g.num_nodes, 64, generator=gen),
            torch.randint(0, 7, (g.num_nodes,), generator=gen), g.edge_index, g.name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", default="cora")
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--plot", default="accelerate_pyg.png", help="loss / time plot (PNG)")
    args = ap.parse_args(argv)
    if args.epochs < 1:
        raise SystemExit("--epochs must be at least 1")
    torch.set_num_threads(args.threads)
    x, y, edge_index, name = load(args.graph)
    labelled = (y >= 0).nonzero().view(-1)
    train_idx = labelled[torch.randperm(labelled.numel(), generator=torch.Generator()
                                        .manual_seed(1))[: labelled.numel() // 2]]
    test_mask = torch.zeros_like(y, dtype=torch.bool)
    test_mask[labelled] = True
    test_mask[train_idx] = False
    torch.manual_seed(0)
    pyg_model = Net(x.shape[1], 64, int(y.max()) + 1)
    model = sj.accelerate(copy.deepcopy(pyg_model), verbose=True)  # the one line

    runs = {}
    for label, m in (("PyG", pyg_model), ("sparsejit.accelerate", model)):
        torch.manual_seed(1)  # the same dropout masks on both sides
        opt = torch.optim.Adam(m.parameters(), lr=0.01, weight_decay=5e-4)
        bar = Progress(args.epochs, f"{label:>20}", enabled=True)
        losses, clock, t = [], [], 0.0
        for _ in range(args.epochs):
            m.train()
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = F.cross_entropy(m(x, edge_index)[train_idx], y[train_idx])
            loss.backward()
            opt.step()
            t += time.perf_counter() - t0
            losses.append(loss.item())
            clock.append(t)
            bar.step(f"loss {losses[-1]:.3f}")
        m.eval()
        with torch.no_grad():
            acc = float((m(x, edge_index).argmax(-1)[test_mask] == y[test_mask]).float().mean())
        runs[label] = (losses, clock, acc)
        print(f"{label:>20}: final loss {losses[-1]:.4f}, held-out accuracy {acc:.3f}, "
              f"{1e3 * clock[-1] / args.epochs:.1f} ms per epoch")
    (_, c0, _), (_, c1, _) = runs.values()
    print(f"{name}: accelerated epochs {c0[-1] / c1[-1]:.2f}x the PyG model's speed")
    loss_curves(runs, f"{name}: PyG model, unchanged vs sparsejit.accelerate", args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
