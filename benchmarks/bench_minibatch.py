"""The mini-batch path: NeighborLoader-style training, a new sampled subgraph every step.

A sampler of our own (pyg-lib has no CPU wheel on the registry): seed nodes drawn at random,
then per hop up to `fanout` distinct in-neighbours of every frontier node, drawn uniformly
without replacement (PyG's default), nodes relabelled in order of
discovery, PyG's layout (seeds first). The subgraphs are sampled ahead, so both peers train
on the same ones and sampling is not in the step time (it is reported on its own).

Per layer type, a 2-layer model (F -> hidden -> classes), `edge_index` input, forward +
cross-entropy on the seeds + backward + Adam step, sparsejit's `sj.nn` layer beside PyG's,
alternating per step. sparsejit's preprocessing (structure, transposes, normalisation: what a
graph seen once costs) is measured two ways: the preparation calls the layers make, timed
alone on unseen subgraphs (a lower bound: plans are made inside the first SpMM), and the step
on a first visit (kernels and stored schedules stay loaded, as in a real loop) minus the step
repeated on the same subgraph (an upper bound: the repeat also finds its data in cache).

    python3 benchmarks/bench_minibatch.py                       # SAGE and GCN, fanout 15,10
    python3 benchmarks/bench_minibatch.py --layers sage --steps 10 --graph rmat:scale=18,ef=8
    python3 benchmarks/bench_minibatch.py --accelerate  # PyG's model, sj.accelerate'd

Writes benchmarks/results/minibatch.json and prints a markdown table (CPU named).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as Fn

import sparsejit as sj
from sparsejit.runtime.timing import Progress
from sparsejit.tools.data import load_graph


class NeighborSampler:
    """In-neighbour sampling on a CSR whose rows are targets."""

    def __init__(self, edge_index: torch.Tensor, num_nodes: int, fanouts, seed: int = 0):
        src, dst = edge_index
        order = torch.argsort(dst, stable=True)
        self.col = src[order].contiguous()
        self.rowptr = torch.zeros(num_nodes + 1, dtype=torch.long)
        self.rowptr[1:] = torch.cumsum(torch.bincount(dst, minlength=num_nodes), 0)
        self.n, self.fanouts = num_nodes, list(fanouts)
        self.local = torch.full((num_nodes,), -1, dtype=torch.long)
        self.gen = torch.Generator().manual_seed(seed)

    def _hop(self, frontier: torch.Tensor, k: int):
        """Up to k distinct in-neighbours of every frontier node, uniformly without
        replacement (a random key per candidate, the k smallest keys of each node kept)."""
        start, deg = self.rowptr[frontier], self.rowptr[frontier + 1] - self.rowptr[frontier]
        seg = torch.repeat_interleave(torch.arange(frontier.numel()), deg)
        seg_start = torch.cumsum(deg, 0) - deg
        pos = start[seg] + torch.arange(seg.numel()) - seg_start[seg]
        order = torch.argsort(seg.double() + torch.rand(seg.numel(), generator=self.gen,
                                                          dtype=torch.float64))
        rank = torch.arange(seg.numel()) - seg_start[seg]  # seg is sorted: ranks after order
        keep = order[rank < k]
        return self.col[pos[keep]], frontier[seg[keep]]

    def sample(self, batch: int):
        seeds = torch.randperm(self.n, generator=self.gen)[:batch]
        self.local[seeds] = torch.arange(batch)
        nodes, frontier, srcs, dsts = [seeds], seeds, [], []
        count = batch
        for k in self.fanouts:
            src, dst = self._hop(frontier, k)
            new = torch.unique(src[self.local[src] < 0])
            self.local[new] = torch.arange(count, count + new.numel())
            count += new.numel()
            nodes.append(new)
            srcs.append(src)
            dsts.append(dst)
            frontier = new
        nodes = torch.cat(nodes)
        src, dst = torch.cat(srcs), torch.cat(dsts)
        edge_index = torch.stack([self.local[src], self.local[dst]])
        self.local[nodes] = -1
        return nodes, edge_index


def make_model(kind: str, lib, f_in: int, hidden: int, classes: int):
    if kind == "sage":
        c1, c2 = lib.SAGEConv(f_in, hidden), lib.SAGEConv(hidden, classes)
    elif kind == "gcn":
        c1, c2 = lib.GCNConv(f_in, hidden), lib.GCNConv(hidden, classes)
    else:
        raise ValueError(f"unknown layer {kind!r} (sage, gcn)")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = c1, c2

        def forward(self, x, edge_index):
            return self.c2(Fn.relu(self.c1(x, edge_index)), edge_index)

    return Net()


def prepare(kind: str, edge_index: torch.Tensor, n: int):
    """What the layers derive from a graph they have not seen (the calls they make, through
    the same content-keyed cache): SAGE the CSR and its transpose, GCN the normalised
    A + I. Plans are made inside the first SpMM and are not included."""
    from sparsejit.families.spmm import graph as G
    from sparsejit.families.spmm.layers import gcn_matrix
    edges = G.edges_of(edge_index, (n, n))
    if kind == "sage":
        return G.structure(edges)
    return G.prepared(edges, "gcn", lambda e: gcn_matrix(e, False, True, torch.float32),
                      False, True, torch.float32)


def step(model, opt, x, edge_index, y, batch):
    opt.zero_grad(set_to_none=True)
    out = model(x, edge_index)
    loss = Fn.cross_entropy(out[:batch], y)
    loss.backward()
    opt.step()
    return loss.detach()


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", default="powerlaw:n=100000,avg=30,alpha=2.1,seed=0")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--fanout", default="15,10")
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--layers", default="sage,gcn")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--accelerate", action="store_true",
                    help="sparsejit's side is the PyG model converted by sj.accelerate (the "
                    "same parameters) instead of sj.nn's layers")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" /
                                         "minibatch.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from torch_geometric import nn as pyg_nn

    g = load_graph(args.graph)
    torch.manual_seed(0)
    feats = torch.randn(g.num_nodes, args.features)
    labels = torch.randint(0, args.classes, (g.num_nodes,))
    sampler = NeighborSampler(g.edge_index, g.num_nodes, map(int, args.fanout.split(",")))
    t0 = time.perf_counter()
    batches = [sampler.sample(args.batch) for _ in range(args.steps + 2)]
    sample_ms = (time.perf_counter() - t0) * 1e3 / len(batches)
    sizes = [(n.numel(), ei.shape[1]) for n, ei in batches]
    print(f"graph {args.graph}: {g.num_nodes} nodes, {g.num_edges} edges; batch {args.batch}, "
          f"fanout {args.fanout}: subgraphs of {statistics.median(s[0] for s in sizes):.0f} "
          f"nodes / {statistics.median(s[1] for s in sizes):.0f} edges (median); sampler "
          f"{sample_ms:.1f} ms a batch", file=sys.stderr)
    data = [(feats[n], ei, labels[n[:args.batch]]) for n, ei in batches]

    rows = []
    for kind in args.layers.split(","):
        torch.manual_seed(1)
        m_sj = make_model(kind, sj.nn, args.features, args.hidden, args.classes)
        torch.manual_seed(1)
        m_pyg = make_model(kind, pyg_nn, args.features, args.hidden, args.classes)
        if args.accelerate:
            m_sj = sj.accelerate(copy.deepcopy(m_pyg))
        o_sj = torch.optim.Adam(m_sj.parameters(), lr=1e-3)
        o_pyg = torch.optim.Adam(m_pyg.parameters(), lr=1e-3)
        for x, ei, y in data[:2]:  # warm-up: JIT compiles, allocator
            step(m_sj, o_sj, x, ei, y, args.batch)
            step(m_pyg, o_pyg, x, ei, y, args.batch)
        t_first, t_again, t_pyg = [], [], []
        bar = Progress(len(data) - 2, kind)  # drawn on a terminal only
        for x, ei, y in data[2:]:
            t_first.append(timed(lambda: step(m_sj, o_sj, x, ei, y, args.batch)))
            t_again.append(timed(lambda: step(m_sj, o_sj, x, ei, y, args.batch)))
            t_pyg.append(timed(lambda: step(m_pyg, o_pyg, x, ei, y, args.batch)))
            bar.step()
        first, again, pyg = (statistics.median(t) for t in (t_first, t_again, t_pyg))
        # The preparation alone, on subgraphs no layer has seen (their own sample).
        fresh = [sampler.sample(args.batch) for _ in range(args.steps)]
        prep = statistics.median(timed(lambda: prepare(kind, ei, n.numel())) for n, ei in fresh)
        rows.append(dict(layer=kind, sparsejit_ms=first, sparsejit_cached_ms=again,
                         pyg_ms=pyg, speedup=pyg / first, preparation_ms=prep,
                         preparation_share=prep / first, first_minus_cached_ms=first - again,
                         first_minus_cached_share=(first - again) / first))

    from sparsejit.info import cpu_line  # here: the sampler also imports on older builds
    cpu = cpu_line()
    side = "sj.accelerate(PyG model)" if args.accelerate else "sj.nn layers"
    print(f"\nCPU: {cpu}, {args.threads} threads; sparsejit: {side}; graph {args.graph}; "
          f"batch {args.batch}, "
          f"fanout {args.fanout}, F={args.features}, hidden {args.hidden}; subgraphs "
          f"{statistics.median(s[0] for s in sizes):.0f} nodes / "
          f"{statistics.median(s[1] for s in sizes):.0f} edges; medians of {args.steps} steps\n")
    print("| layer | PyG step | sparsejit step (new graph) | speed-up | structure preparation "
          "(share) | step on the same graph again | first - again (share) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layer']} | {r['pyg_ms']:.1f} ms | {r['sparsejit_ms']:.1f} ms | "
              f"{r['speedup']:.2f}x | {r['preparation_ms']:.2f} ms "
              f"({100 * r['preparation_share']:.0f}%) | {r['sparsejit_cached_ms']:.1f} ms | "
              f"{r['first_minus_cached_ms']:.2f} ms "
              f"({100 * r['first_minus_cached_share']:.0f}%) |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(cpu=cpu, args=vars(args), sizes=sizes,
                                              sample_ms=sample_ms, rows=rows), indent=1))


if __name__ == "__main__":
    main()
