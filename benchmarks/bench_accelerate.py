"""``sparsejit.accelerate(model)`` against the unmodified PyG model, side by side in one process.

Two models, forward + backward (loss = sum of outputs; gradients for x and every parameter),
the accelerated copy holding a deep copy's weights (outputs checked equal first), steps of
the sides interleaved (runtime.timing.paired_median_ms), medians, 2 threads:

* native:  GCNConv -> ReLU -> SAGEConv -> ReLU -> GATConv (4 heads), layers sparsejit.nn
  implements; PyG eager against accelerated.
* generic: SGConv(K=2) -> Linear -> ReLU -> APPNP(K=10) -> TAGConv(K=3), layers sparsejit.nn
  does not implement (the SpMM propagate path); PyG eager, PyG under torch.compile and
  accelerated. ``--cached`` builds SGConv / APPNP with cached=True (the normalised graph
  kept, as in a transductive training loop); by default each forward normalises again on
  both sides (PyG's gcn_norm runs in both).
* genconv: GENConv -> ReLU -> GENConv (softmax aggregation, DeeperGCN's layer; the per-edge
  path: PyG's message, sparsejit's aggregation). PyG eager against accelerated.
* attention: a user's own two-head attention layer (GAT-like scores, PyG's ``softmax``)
  twice: the per-edge path with the message's softmax on sj.edge_softmax.
* edgeconv (once, not per graph): DGCNN's EdgeConv stack, EdgeConv(MLP([8, 64, 64, 64])) ->
  EdgeConv(MLP([128, 128])), on a k = 20 nearest-neighbour graph (coordinates) of
  ``--points`` points of a real KITTI scan ($SPARSEJIT_DATA/pointclouds/kitti_pointpillars,
  random points when absent). PyG's DynamicEdgeConv needs pyg-lib's knn (not installed), so
  the graph is built once, outside the timing, and both sides run EdgeConv on it.

* minibatch (``--minibatch``, not in the default run): NeighborLoader-style training of a
  2-layer SAGE and a 2-layer GCN (PyG modules, accelerated) on a new sampled subgraph every
  step (bench_minibatch.py's sampler: seeds first, edges sorted by target as PyG's samplers
  give them; random features, F = 64), forward + cross-entropy on the seeds + backward + Adam,
  on Cora- and PubMed-sized batches: PyG, accelerated, and accelerated with the sorted-edges
  path off (the structure built by the sorting op), every sparsejit step on a graph it has
  not seen (caches cleared); plus the structure work alone (CSR and transpose) and its share.

* hetero (once): ``to_hetero`` of a 2-layer SAGE model (lazy sizes) on a generated graph of
  two node types (authors, papers; ``--hetero-nodes`` papers, half as many authors) and
  three edge types (writes, its reverse, cites; ~10 edges per target), summed per node type;
  accelerated (writes + cites into papers as one RGMS call per layer) and accelerated with
  ``group_edge_types=False`` (one call per edge type).

``--models`` picks among native, generic, genconv, attention, edgeconv, hetero (default: all).

    python benchmarks/bench_accelerate.py --quick     # one small generated graph, smoke run
    python benchmarks/bench_accelerate.py             # generated + real graphs, F = 64

Writes benchmarks/results/accelerate.json (and a .md table). On a shared 2-core machine the
times are noisy: read the ratios.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from pathlib import Path

import torch

import sparsejit as sj
from sparsejit.info import cpu_line
from sparsejit.runtime.timing import CLOCKS, paired_median_ms
from sparsejit.tools.data import load_graph
from torch_geometric import nn as pnn
from torch_geometric.nn import MessagePassing
from torch_geometric.utils import softmax

GRAPHS = ["powerlaw:n=100000,avg=10,alpha=2.1,seed=1", "uniform:n=100000,avg=10,seed=2",
          "cora", "pubmed", "facebook"]
QUICK = ["uniform:n=3000,avg=8,seed=0"]
MODELS = ("native", "generic", "genconv", "attention", "attention_v2", "edgeconv", "hetero")


class NativeModel(torch.nn.Module):
    def __init__(self, f: int, h: int):
        super().__init__()
        self.c1 = pnn.GCNConv(f, h)
        self.c2 = pnn.SAGEConv(h, h)
        self.c3 = pnn.GATConv(h, h // 4, heads=4)

    def forward(self, x, ei):
        return self.c3(self.c2(self.c1(x, ei).relu(), ei).relu(), ei)


class GenericModel(torch.nn.Module):
    def __init__(self, f: int, h: int, cached: bool):
        super().__init__()
        self.sg = pnn.SGConv(f, h, K=2, cached=cached)
        self.lin = torch.nn.Linear(h, h)
        self.appnp = pnn.APPNP(K=10, alpha=0.1, cached=cached)
        self.tag = pnn.TAGConv(h, h, K=3)

    def forward(self, x, ei):
        return self.tag(self.appnp(self.lin(self.sg(x, ei)).relu(), ei), ei)


class GenModel(torch.nn.Module):
    def __init__(self, f: int):
        super().__init__()
        self.c1, self.c2 = pnn.GENConv(f, f), pnn.GENConv(f, f)

    def forward(self, x, ei):
        return self.c2(self.c1(x, ei).relu(), ei)


class UserAttention(MessagePassing):
    """A user's attention layer, written against PyG's API (not a PyG built-in)."""

    def __init__(self, f: int, heads: int = 2):
        super().__init__(aggr="add", node_dim=0)
        self.heads, self.out = heads, f // heads
        self.lin = torch.nn.Linear(f, f)
        self.att = torch.nn.Parameter(torch.randn(1, heads, 2 * self.out) * 0.1)

    def forward(self, x, edge_index):
        h = self.lin(x).view(-1, self.heads, self.out)
        return self.propagate(edge_index, x=h).reshape(x.shape[0], -1)

    def message(self, x_i, x_j, index, ptr, size_i):
        a = torch.nn.functional.leaky_relu((torch.cat([x_i, x_j], -1) * self.att).sum(-1), 0.2)
        return x_j * softmax(a, index, ptr, size_i).unsqueeze(-1)


class UserAttentionV2(UserAttention):
    """The same with GATv2's score (att . LeakyReLU(x_i + x_j))."""

    def message(self, x_i, x_j, index, ptr, size_i):
        a = (torch.nn.functional.leaky_relu(x_i + x_j, 0.2) * self.att[..., :self.out]).sum(-1)
        return x_j * softmax(a, index, ptr, size_i).unsqueeze(-1)


class AttentionModel(torch.nn.Module):
    def __init__(self, f: int, layer=UserAttention):
        super().__init__()
        self.a1, self.a2 = layer(f), layer(f)

    def forward(self, x, ei):
        return self.a2(self.a1(x, ei).relu(), ei)


class DGCNN(torch.nn.Module):
    def __init__(self, f: int):
        super().__init__()
        self.c1 = pnn.EdgeConv(pnn.MLP([2 * f, 64, 64, 64]))
        self.c2 = pnn.EdgeConv(pnn.MLP([128, 128]))

    def forward(self, x, ei):
        return self.c2(self.c1(x, ei), ei)


def scan_points(n: int, seed: int = 0):
    """(name, [n, 4] float32 points: x, y, z, intensity) of KITTI scan 000000, n of them
    drawn at random; random points when the data is absent."""
    from sparsejit.tools.data import data_dir
    g = torch.Generator().manual_seed(seed)
    root = data_dir()
    path = None if root is None else root / "pointclouds/kitti_pointpillars/000000.bin"
    if path is not None and path.exists():
        pts = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.float32).view(-1, 4)
        pick = torch.randperm(pts.shape[0], generator=g)[:n]
        return f"kitti000000[{len(pick)}]", pts[pick].clone()
    return f"random_points[{n}]", torch.randn(n, 4, generator=g)


def knn_graph(pos: torch.Tensor, k: int) -> torch.Tensor:
    """[2, n k] edges j -> i for the k nearest points j of every point i (itself included, as
    PyG's knn for DynamicEdgeConv), sorted by target."""
    nb = torch.cdist(pos, pos).topk(min(k, pos.shape[0]), largest=False).indices
    dst = torch.arange(pos.shape[0]).repeat_interleave(nb.shape[1])
    return torch.stack([nb.reshape(-1), dst])


SPLIT = [0]  # --split: profiled steps per side (0: none)
_GRAPH_OPS = {"scatter_add_", "scatter_add", "scatter_reduce_", "scatter_reduce", "index_select",
              "gather", "index_add_", "index_add", "segment_reduce", "_segment_reduce_backward",
              "index", "index_put_", "_index_put_impl_", "sort", "argsort", "bincount",
              "scatter_", "scatter", "unique_consecutive", "_unique2", "repeat_interleave"}
_DENSE_OPS = {"mm", "addmm", "addmm_", "bmm", "baddbmm", "matmul", "linear", "_addmm_activation"}


def split_ms(fn, steps: int) -> dict:
    """Per-step milliseconds of `fn`'s operators by kind, from the profiler's self times:
    ``graph`` (gathers, scatters, sorts and sparsejit's graph ops), ``dense`` (matrix
    products: torch's and sparsejit.linear / segment_matmul) and ``rest`` (elementwise,
    normalisation, the optimizer, autograd and Python overhead between operators)."""
    fn()
    with torch.profiler.profile() as prof:
        for _ in range(steps):
            fn()
    out = dict(graph_ms=0.0, dense_ms=0.0, rest_ms=0.0)
    for ev in prof.key_averages():
        ns, _, op = ev.key.partition("::")
        if ns == "sparsejit" and op.startswith(("linear", "segment_matmul", "dense")) or \
                ns == "aten" and op in _DENSE_OPS:
            kind = "dense_ms"
        elif ns == "sparsejit" or ns == "aten" and op in _GRAPH_OPS:
            kind = "graph_ms"
        else:
            kind = "rest_ms"
        out[kind] += ev.self_cpu_time_total / 1e3 / steps
    return out


def _with_split(row: dict, ref_fn, acc_fn) -> dict:
    """Adds the split of both sides, and the bound it sets: PyG's step over its step without
    its graph operators (the speed-up if those cost nothing and the rest stayed as it is)."""
    if SPLIT[0]:
        a, b = split_ms(ref_fn, SPLIT[0]), split_ms(acc_fn, SPLIT[0])
        bound = sum(a.values()) / max(a["dense_ms"] + a["rest_ms"], 1e-9)
        row.update(split_pyg=a, split_accelerated=b, bound_without_pyg_graph_ops=bound)
        print("      split per step (graph / dense / rest ms): pyg " +
              " / ".join(f"{v:.2f}" for v in a.values()) + ", accelerated " +
              " / ".join(f"{v:.2f}" for v in b.values()) +
              f"; PyG without its graph ops: x{bound:.2f} at most", flush=True)
    return row


def _pair(name, spec_name, n, e, f, ref, acc, x, ei, repeats, label):
    err = _check_equal(ref, acc, x, ei, name)
    t_pyg, t_sj = paired_median_ms([_step(ref, x, ei), _step(acc, x, ei)], repeats,
                                    clock=CLOCK[0])
    print(f"{spec_name:>44} {label:<8} pyg {t_pyg:9.2f} ms  accelerated {t_sj:9.2f} ms  "
          f"x{t_pyg / t_sj:5.2f}", flush=True)
    return _with_split(dict(graph=spec_name, nodes=n, edges=e, F=f, model=name, pyg_ms=t_pyg,
                            accelerated_ms=t_sj, speedup=t_pyg / t_sj, max_rel_err=err),
                       _step(ref, x, ei), _step(acc, x, ei))


def bench_dgcnn(points: int, repeats: int, k: int = 20):
    name, pts = scan_points(points)
    ei = knn_graph(pts[:, :3], k)
    x = pts.clone().requires_grad_(True)
    torch.manual_seed(0)
    ref = DGCNN(4)
    acc = sj.accelerate(copy.deepcopy(ref))
    return [_pair("edgeconv", name, pts.shape[0], ei.shape[1], 4, ref, acc, x, ei, repeats,
                  "edgeconv")]


CLOCK = ["wall"]  # --clock: "cpu" counts this process's CPU time (robust to other jobs)
MINIBATCH = {"cora": (256, (10, 10)), "pubmed": (1024, (15, 10))}
MINIBATCH_QUICK = {"uniform:n=3000,avg=8,seed=0": (128, (5, 5))}


def _minibatch_model(kind: str, f: int, classes: int):
    c1, c2 = ((pnn.SAGEConv(f, f), pnn.SAGEConv(f, classes)) if kind == "sage" else
              (pnn.GCNConv(f, f), pnn.GCNConv(f, classes)))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = c1, c2

        def forward(self, x, ei):
            return self.c2(self.c1(x, ei).relu(), ei)

    return Net()


def bench_minibatch(specs: dict, steps: int, f: int = 64, classes: int = 16):
    """Rows of per-step medians: PyG, accelerated, accelerated without the sorted path."""
    import statistics
    from sparsejit.families.spmm import graph as G
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_minibatch import NeighborSampler

    def timed(fn):
        tick = CLOCKS[CLOCK[0]]
        t0 = tick()
        fn()
        return (tick() - t0) * 1e3

    def train_step(model, opt, x, ei, y):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x, ei)[: y.shape[0]], y).backward()
        opt.step()

    sorted_csr = G.sorted_csr
    rows = []
    for spec, (batch, fanout) in specs.items():
        g = load_graph(spec)
        feats = torch.randn(g.num_nodes, f)
        labels = torch.randint(0, classes, (g.num_nodes,))
        sampler = NeighborSampler(g.edge_index, g.num_nodes, fanout, seed=0)
        data = [sampler.sample(batch) for _ in range(steps + 2)]
        data = [(feats[n], ei, labels[n[:batch]]) for n, ei in data]
        for kind in ("sage", "gcn"):
            torch.manual_seed(0)
            ref = _minibatch_model(kind, f, classes)
            acc = sj.accelerate(copy.deepcopy(ref))
            off = sj.accelerate(copy.deepcopy(ref))
            opts = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in (ref, acc, off)]
            times = ([], [], [])
            for i, (x, ei, y) in enumerate(data):
                ts = [timed(lambda: train_step(ref, opts[0], x, ei, y))]
                G.clear_cache()
                ts.append(timed(lambda: train_step(acc, opts[1], x, ei, y)))
                G.clear_cache()
                G.sorted_csr = lambda e: None
                try:
                    ts.append(timed(lambda: train_step(off, opts[2], x, ei, y)))
                finally:
                    G.sorted_csr = sorted_csr
                if i >= 2:  # two warm-up steps
                    for t, v in zip(times, ts):
                        t.append(v)
            med = [statistics.median(t) for t in times]
            prep = []
            for x, ei, _ in data[2:]:
                G.clear_cache()
                n = x.shape[0]
                prep.append(timed(lambda: G.structure(G.edges_of(ei, (n, n)))))
            prep_ms = statistics.median(prep)
            edges = statistics.median(d[1].shape[1] for d in data)
            nodes = statistics.median(d[0].shape[0] for d in data)
            rows.append(dict(graph=f"{spec} batch {batch} fanout {fanout}", nodes=nodes,
                             edges=edges, F=f, model=f"minibatch_{kind}", pyg_ms=med[0],
                             accelerated_ms=med[1], accelerated_sorting_op_ms=med[2],
                             speedup=med[0] / med[1], structure_ms=prep_ms,
                             structure_share=prep_ms / med[1], max_rel_err=0.0))
            print(f"{spec:>20} batch {batch} {kind:<5} subgraphs {nodes:.0f} nodes / {edges:.0f} "
                  f"edges: pyg {med[0]:8.2f} ms  accelerated {med[1]:8.2f} ms  "
                  f"x{med[0] / med[1]:5.2f}"
                  f"  (sorting op {med[2]:8.2f} ms; structure {prep_ms:.2f} ms = "
                  f"{100 * prep_ms / med[1]:.0f}% of the step)", flush=True)

            def cycling(model, opt):
                it = iter(range(10 ** 9))
                return lambda: train_step(model, opt, *data[2 + next(it) % (len(data) - 2)])
            _with_split(rows[-1], cycling(ref, opts[0]), cycling(acc, opts[1]))
    return rows


class HeteroSage(torch.nn.Module):
    def __init__(self, f: int):
        super().__init__()
        self.c1, self.c2 = pnn.SAGEConv((-1, -1), f), pnn.SAGEConv((-1, -1), f)

    def forward(self, x, edge_index):
        return self.c2(self.c1(x, edge_index).relu(), edge_index)


def bench_hetero(papers: int, f: int, repeats: int):
    g = torch.Generator().manual_seed(0)
    authors = papers // 2
    x = {"author": torch.randn(authors, f, generator=g).requires_grad_(True),
         "paper": torch.randn(papers, f, generator=g).requires_grad_(True)}
    writes = torch.stack([torch.randint(0, authors, (10 * papers,), generator=g),
                          torch.randint(0, papers, (10 * papers,), generator=g)])
    ei = {("author", "writes", "paper"): writes,
          ("paper", "rev_writes", "author"): writes.flip(0),
          ("paper", "cites", "paper"): torch.randint(0, papers, (2, 10 * papers), generator=g)}
    meta = (["author", "paper"], list(ei))
    torch.manual_seed(0)
    ref = pnn.to_hetero(HeteroSage(f), meta, aggr="sum")
    with torch.no_grad():
        ref(x, ei)  # sizes the lazy Linears
    acc = sj.accelerate(copy.deepcopy(ref))
    per_type = sj.accelerate(copy.deepcopy(ref), group_edge_types=False)

    def step(model):
        def run():
            model.zero_grad(set_to_none=True)
            for v in x.values():
                v.grad = None
            sum(o.sum() for o in model(x, ei).values()).backward()
        return run

    with torch.no_grad():
        ya, yb = ref(x, ei), acc(x, ei)
    err = max(float((ya[k] - yb[k]).abs().max() / ya[k].abs().max().clamp(min=1e-30))
              for k in ya)
    if err > 1e-4:
        raise SystemExit(f"hetero: accelerated output differs from PyG's (relative {err:.2e})")
    t_pyg, t_sj, t_per = paired_median_ms([step(ref), step(acc), step(per_type)], repeats,
                                          clock=CLOCK[0])
    name = f"hetero:papers={papers},authors={authors}"
    print(f"{name:>44} {'hetero':<8} pyg {t_pyg:9.2f} ms  accelerated {t_sj:9.2f} ms  "
          f"x{t_pyg / t_sj:5.2f}  (one call per edge type: {t_per:9.2f} ms, "
          f"x{t_pyg / t_per:5.2f})", flush=True)
    return [dict(graph=name, nodes=papers + authors, edges=30 * papers, F=f, model="hetero",
                 pyg_ms=t_pyg, accelerated_ms=t_sj, speedup=t_pyg / t_sj,
                 accelerated_per_edge_type_ms=t_per, max_rel_err=err)]


def _step(model, x, ei):
    def run():
        model.zero_grad(set_to_none=True)
        x.grad = None
        model(x, ei).sum().backward()
    return run


def _check_equal(a, b, x, ei, what):
    with torch.no_grad():
        ya, yb = a(x, ei), b(x, ei)
    err = float((ya - yb).abs().max() / ya.abs().max().clamp(min=1e-30))
    if err > 1e-4:
        raise SystemExit(f"{what}: accelerated output differs from PyG's (relative {err:.2e})")
    return err


def bench_graph(spec, f, repeats, compile_pyg, cached, models=("native", "generic")):
    g = load_graph(spec)
    x = torch.randn(g.num_nodes, f, requires_grad=True)
    ei = g.edge_index
    rows = []
    if "native" in models:
        rows += _bench_native(g, f, x, ei, repeats)
    if "generic" in models:
        rows += _bench_generic(g, f, x, ei, repeats, compile_pyg, cached)
    for name, make in (("genconv", GenModel), ("attention", AttentionModel),
                       ("attention_v2", lambda f: AttentionModel(f, UserAttentionV2))):
        if name in models:
            torch.manual_seed(0)
            ref = make(f)
            acc = sj.accelerate(copy.deepcopy(ref))
            rows.append(_pair(name, g.name, g.num_nodes, g.num_edges, f, ref, acc, x, ei,
                              repeats, name))
    return rows


def _bench_native(g, f, x, ei, repeats):
    rows = []
    torch.manual_seed(0)
    ref = NativeModel(f, f)
    acc = sj.accelerate(copy.deepcopy(ref))
    err = _check_equal(ref, acc, x, ei, "native")
    t_pyg, t_sj = paired_median_ms([_step(ref, x, ei), _step(acc, x, ei)], repeats,
                                    clock=CLOCK[0])
    print(f"{g.name:>44} native   pyg {t_pyg:9.2f} ms  accelerated {t_sj:9.2f} ms  "
          f"x{t_pyg / t_sj:5.2f}", flush=True)
    rows.append(_with_split(dict(graph=g.name, nodes=g.num_nodes, edges=g.num_edges, F=f,
                                 model="native", pyg_ms=t_pyg, accelerated_ms=t_sj,
                                 speedup=t_pyg / t_sj, max_rel_err=err),
                            _step(ref, x, ei), _step(acc, x, ei)))
    return rows


def _bench_generic(g, f, x, ei, repeats, compile_pyg, cached):
    rows = []
    torch.manual_seed(0)
    ref = GenericModel(f, f, cached)
    acc = sj.accelerate(copy.deepcopy(ref))
    err = _check_equal(ref, acc, x, ei, "generic")
    fns = [_step(ref, x, ei), _step(acc, x, ei)]
    if compile_pyg:
        fns.append(_step(torch.compile(copy.deepcopy(ref)), x, ei))
    ts = paired_median_ms(fns, repeats, clock=CLOCK[0])
    row = dict(graph=g.name, nodes=g.num_nodes, edges=g.num_edges, F=f, model="generic",
               cached=cached, pyg_ms=ts[0], accelerated_ms=ts[1], speedup=ts[0] / ts[1],
               max_rel_err=err)
    msg = (f"{g.name:>44} generic  pyg {ts[0]:9.2f} ms  accelerated {ts[1]:9.2f} ms  "
           f"x{ts[0] / ts[1]:5.2f}")
    if compile_pyg:
        row.update(pyg_compiled_ms=ts[2], speedup_vs_compiled=ts[2] / ts[1])
        msg += f"  (PyG compiled {ts[2]:9.2f} ms: x{ts[2] / ts[1]:5.2f})"
    rows.append(row)
    print(msg, flush=True)
    return rows


def markdown(rows) -> str:
    lines = [f"CPU: {cpu_line()}", "",
             "| graph | model | PyG ms | PyG compiled ms | accelerated ms | x eager | x compiled |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        comp = r.get("pyg_compiled_ms")
        comp_ms = "" if comp is None else f"{comp:.1f}"
        comp_x = "" if comp is None else f"{r['speedup_vs_compiled']:.2f}"
        graph = r["graph"].split(",seed")[0]
        lines.append(f"| {graph} | {r['model']} | {r['pyg_ms']:.1f} | {comp_ms} | "
                     f"{r['accelerated_ms']:.1f} | {r['speedup']:.2f} | {comp_x} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one small generated graph, F = 32")
    ap.add_argument("--graphs", nargs="*", default=None)
    ap.add_argument("--features", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cached", action="store_true", help="SGConv / APPNP with cached=True")
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled PyG side")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="cpu: this process's CPU time, for a machine others use too")
    ap.add_argument("--minibatch", action="store_true",
                    help="the mini-batch rows (Cora / PubMed-sized sampled batches) only")
    ap.add_argument("--steps", type=int, default=None, help="mini-batch steps (default 20)")
    ap.add_argument("--points", type=int, default=None,
                    help="points of the scan for edgeconv (default 4096; --quick 1024)")
    ap.add_argument("--hetero-nodes", type=int, default=None,
                    help="papers of the hetero graph (default 100000; --quick 2000)")
    ap.add_argument("--split", type=int, default=0, metavar="STEPS",
                    help="also profile STEPS steps of each side: time in graph operators, "
                    "matrix products and the rest, and the speed-up bound that sets")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "accelerate.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    CLOCK[0] = args.clock
    SPLIT[0] = args.split
    graphs = args.graphs or (QUICK if args.quick else GRAPHS)
    f = args.features or (32 if args.quick else 64)
    repeats = args.repeats or (3 if args.quick else 9)
    rows = []
    if args.minibatch:
        specs = MINIBATCH_QUICK if args.quick else {
            k: v for k, v in MINIBATCH.items() if args.graphs is None or k in args.graphs}
        rows += bench_minibatch(specs, args.steps or (4 if args.quick else 20))
        graphs, args.models = [], []
    for spec in graphs:
        rows += bench_graph(spec, f, repeats, not args.no_compile, args.cached, args.models)
    if "edgeconv" in args.models:
        rows += bench_dgcnn(args.points or (1024 if args.quick else 4096), repeats)
    if "hetero" in args.models:
        rows += bench_hetero(args.hetero_nodes or (2000 if args.quick else 100000), f, repeats)
    result = dict(cpu=cpu_line(), threads=args.threads, clock=args.clock,
                  load_average=os.getloadavg(),
                  repeats=repeats, torch=torch.__version__, quick=args.quick,
                  note="forward+backward of the whole model, medians of interleaved steps",
                  rows=rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(markdown(rows))
    print(f"CPU: {cpu_line()}; wrote {out} and its .md table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
