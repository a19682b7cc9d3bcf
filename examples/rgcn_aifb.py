"""R-GCN entity classification on AIFB (Schlichtkrull et al. 2018), with sparsejit's RGCNConv
and, side by side with the same initial weights, PyG's RGCNConv.

    python examples/rgcn_aifb.py [--seeds 5] [--epochs 50] [--threads 2]

The graph: every subject / object of the N-Triples dump is a node, every predicate a relation
plus its inverse (90 relations); nodes are featureless (one-hot ids), as in the paper and in
PyG's example. The R-GCN paper's self-connection is the layers' root weight. Model: 2 layers,
16 hidden units, basis decomposition with 30 bases, Adam (lr 0.01, weight decay 5e-4), 50
full-batch epochs. Prints test accuracy (mean over seeds; the paper reports 95.83%) and the
time per epoch of both implementations.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import sparsejit as sj
from sparsejit.tools.data import data_dir
from sparsejit.tools.rdf import load_rdf


class Net(torch.nn.Module):
    def __init__(self, conv_cls, num_nodes, num_relations, num_classes, hidden=16, bases=30):
        super().__init__()
        self.conv1 = conv_cls(num_nodes, hidden, num_relations, num_bases=bases)
        self.conv2 = conv_cls(hidden, num_classes, num_relations, num_bases=bases)

    def forward(self, edge_index, edge_type):
        x = F.relu(self.conv1(None, edge_index, edge_type))
        return self.conv2(x, edge_index, edge_type)


def train(model, g, epochs):
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        model.train()
        opt.zero_grad()
        out = model(g.edge_index, g.edge_type)
        loss = F.cross_entropy(out[g.train_idx], g.train_y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    model.eval()
    with torch.no_grad():
        pred = model(g.edge_index, g.edge_type).argmax(-1)
    acc = float((pred[g.test_idx] == g.test_y).float().mean())
    return acc, statistics.median(times) * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-pyg", action="store_true", help="skip PyG's RGCNConv")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    root = data_dir()
    folder = root / "hetero" / "rgcn" / "aifb" if root else None
    if folder is None or not (folder / "aifb_stripped.nt.gz").exists():
        print("AIFB not found under $SPARSEJIT_DATA/hetero/rgcn/aifb", file=sys.stderr)
        return 1
    g = load_rdf(folder)
    print(f"AIFB: {g.num_nodes} nodes, {g.edge_index.shape[1]} edges, {g.num_relations} "
          f"relations, {len(g.train_idx)} train / {len(g.test_idx)} test, {g.num_classes} classes")
    pyg_cls = None
    if not args.no_pyg:
        try:
            from torch_geometric.nn import RGCNConv as pyg_cls
        except Exception as exc:  # PyG is optional for the example
            print(f"(PyG unavailable: {exc})")
    results = {"sparsejit": [], "pyg": []}
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        ours = Net(sj.nn.RGCNConv, g.num_nodes, g.num_relations, g.num_classes)
        init = {k: v.clone() for k, v in ours.state_dict().items()}
        results["sparsejit"].append(train(ours, g, args.epochs))
        if pyg_cls is not None:
            theirs = Net(pyg_cls, g.num_nodes, g.num_relations, g.num_classes)
            theirs.load_state_dict(init)
            torch.manual_seed(seed)
            results["pyg"].append(train(theirs, g, args.epochs))
        line = f"seed {seed}: sparsejit acc {results['sparsejit'][-1][0]:.4f} " \
               f"({results['sparsejit'][-1][1]:.2f} ms/epoch)"
        if results["pyg"]:
            line += f", PyG acc {results['pyg'][-1][0]:.4f} ({results['pyg'][-1][1]:.2f} ms/epoch)"
        print(line, flush=True)
    for name, rs in results.items():
        if rs:
            accs = [a for a, _ in rs]
            ms = statistics.median(t for _, t in rs)
            print(f"{name}: test accuracy {100 * statistics.mean(accs):.2f}% "
                  f"(± {100 * statistics.pstdev(accs):.2f}, {len(rs)} seeds), "
                  f"median epoch {ms:.2f} ms")
    if results["pyg"]:
        ratio = statistics.median(t for _, t in results["pyg"]) / \
            statistics.median(t for _, t in results["sparsejit"])
        print(f"epoch time: sparsejit is {ratio:.1f}x faster than PyG's RGCNConv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
