"""Data-parallel training of sparsejit models with torch.distributed (DDP, gloo on the CPU).

    torchrun --nproc-per-node 2 examples/ddp_train.py --model gnn --steps 20
    torchrun --nproc-per-node 2 examples/ddp_train.py --model rgcn
    torchrun --nproc-per-node 2 examples/ddp_train.py --model conv

Each rank trains on its own mini-batches: sampled subgraphs of one large generated graph
(`--model gnn`: two sparsejit GCN layers and a SAGE layer, taking `edge_index`), typed
subgraphs whose relations differ between ranks (`--model rgcn`: a rank's batch may hold no
edge of some relation, whose weights then get a zero gradient on that rank), or generated point
clouds (`--model conv`: submanifold sparse convolutions through `sparsejit.spconv`). Gradients
are averaged by DDP as usual; sparsejit's ops need nothing special: the JIT cache is safe
for concurrent processes and plans are per-structure tensors.

The loss of a rank is its batch's summed error scaled by world_size / rows of every rank's
batch, so the averaged gradient equals that of one process training on the union of the
batches (tests/python/core/test_ddp.py checks that: `--batches` names the batches a process takes,
`--out` saves the trained parameters).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import sparsejit as sj
from sparsejit import spconv

NODES, FEATURES, RELATIONS = 20_000, 16, 6


@functools.lru_cache(maxsize=1)
def _full_graph(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    e = NODES * 8
    src = (torch.rand(e, generator=g) ** 2 * NODES).long().clamp_(max=NODES - 1)
    dst = torch.randint(0, NODES, (e,), generator=g)
    x = torch.randn(NODES, FEATURES, generator=g)
    y = torch.randn(NODES, 4, generator=g)
    etype = torch.randint(0, RELATIONS, (e,), generator=g)
    return torch.stack([src, dst]), x, y, etype


def sample_subgraph(batch: int, step: int, size: int = 2000):
    """Node-induced subgraph of `size` sampled nodes (a sampler's mini-batch), relabelled."""
    ei, x, y, etype = _full_graph()
    g = torch.Generator().manual_seed(1000 * step + batch)
    nodes = torch.randperm(NODES, generator=g)[:size]
    relabel = torch.full((NODES,), -1, dtype=torch.long)
    relabel[nodes] = torch.arange(size)
    keep = (relabel[ei[0]] >= 0) & (relabel[ei[1]] >= 0)
    sub = relabel[ei[:, keep]]
    # relations differ between batches: batch b keeps relations of its parity only
    rel = etype[keep]
    typed = rel % 2 == batch % 2
    return {"edge_index": sub, "x": x[nodes], "y": y[nodes], "typed_edge_index": sub[:, typed],
            "edge_type": rel[typed]}


def sample_cloud(batch: int, step: int, points: int = 3000):
    g = torch.Generator().manual_seed(5000 + 1000 * step + batch)
    xyz = torch.unique((torch.rand(points, 3, generator=g) * 48).int(), dim=0)
    coords = torch.cat([torch.zeros(xyz.shape[0], 1, dtype=torch.int32), xyz], 1)
    feats = torch.randn(xyz.shape[0], 4, generator=g)
    target = torch.randn(xyz.shape[0], 4, generator=g)
    return {"coords": coords, "feats": feats, "y": target}


class GNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = sj.nn.GCNConv(FEATURES, 32)
        self.conv2 = sj.nn.SAGEConv(32, 32)
        self.conv3 = sj.nn.GCNConv(32, 4)

    def forward(self, b):
        h = self.conv1(b["x"], b["edge_index"]).relu()
        h = self.conv2(h, b["edge_index"]).relu()
        return self.conv3(h, b["edge_index"])


class RGCN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = sj.nn.RGCNConv(FEATURES, 16, RELATIONS)
        self.conv2 = sj.nn.RGCNConv(16, 4, RELATIONS)

    def forward(self, b):
        h = self.conv1(b["x"], b["typed_edge_index"], b["edge_type"]).relu()
        return self.conv2(h, b["typed_edge_index"], b["edge_type"])


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = spconv.SparseSequential(
            spconv.SubMConv3d(4, 16, 3, indice_key="s1"), torch.nn.ReLU(),
            spconv.SubMConv3d(16, 4, 3, indice_key="s1"))

    def forward(self, b):
        x = spconv.SparseConvTensor(b["feats"], b["coords"], [48, 48, 48], 1)
        return self.net(x).features


MODELS = {"gnn": (GNN, sample_subgraph), "rgcn": (RGCN, sample_subgraph),
          "conv": (ConvNet, sample_cloud)}


def train(model_name: str, steps: int, batches_of_rank, all_batches, lr: float = 0.05):
    """Trains on this rank's batches; returns the model (unwrapped)."""
    world = dist.get_world_size()
    make, sample = MODELS[model_name]
    torch.manual_seed(0)  # the same initial parameters everywhere (DDP also broadcasts rank 0's)
    model = make()
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    for step in range(steps):
        data = [sample(b, step) for b in batches_of_rank]
        rows = sum(sample(b, step)["y"].shape[0] for b in all_batches)
        opt.zero_grad()
        loss = sum(((ddp(d) - d["y"]) ** 2).sum() for d in data) * (world / rows)
        loss.backward()
        opt.step()
        if dist.get_rank() == 0:
            print(f"{model_name} step {step}: loss {loss.item() * rows / world:.4f}", flush=True)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="gnn")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batches", type=int, nargs="*",
                    help="batch ids this process trains on (default: its rank)")
    ap.add_argument("--all-batches", type=int, default=None,
                    help="number of batches over every rank (default: world size)")
    ap.add_argument("--out", help="save the trained parameters here (state_dict)")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = args.batches if args.batches else [rank]
    everyone = list(range(args.all_batches if args.all_batches else world))
    model = train(args.model, args.steps, mine, everyone)
    if args.out:
        torch.save(model.state_dict(), args.out.replace("{rank}", str(rank)))
    # Every rank done with its collectives before any tears the group down: rank 0 hosts the
    # store, and a peer still talking to it when it closes aborts in gloo's teardown
    # ("terminate called without an active exception", about one run in three here).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    main()
    # torch 2.13's gloo backend can still abort in its static teardown after the group is
    # destroyed (also with the sparsejit build of the previous session, so not sparsejit's
    # code): everything is written and the group is gone, so leave without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
