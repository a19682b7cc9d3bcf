"""The mini-batch path: edges that arrive sorted by target (PyG's neighbour samplers) get
their CSR without a sort (graph.sorted_csr: row pointers from a count, the sources as they
are); the structure equals the sorting op's, unsorted / out-of-range / empty inputs take the
sorting op; an accelerated PyG model trained on a new sorted subgraph every step equals PyG's
(outputs, gradients, parameters after optimizer steps) and never calls the sorting op."""

import copy

import pytest
import torch

import sparsejit as sj
from sparsejit.families.spmm import graph as G

pyg = pytest.importorskip("torch_geometric")
from torch_geometric import nn as pnn  # noqa: E402


def sampled_batch(n_seeds=30, fanout=(4, 3), n_nodes=400, seed=0):
    """A NeighborLoader-style subgraph: seeds first, each hop's in-edges grouped by target in
    target order (so sorted by target), targets with fewer neighbours than the fanout, nodes
    without in-edges at the end. Returns (num_nodes, edge_index)."""
    g = torch.Generator().manual_seed(seed)
    count, frontier, src, dst = n_seeds, torch.arange(n_seeds), [], []
    for k in fanout:
        new = []
        for t in frontier.tolist():
            d = int(torch.randint(0, k + 1, (1,), generator=g))
            nb = torch.randint(0, count + 2 * k, (d,), generator=g).clamp(max=count + d)
            nb = torch.where(nb >= count, torch.arange(count, count + d), nb)
            new.append(nb[nb >= count])
            count = max(count, int(nb.max()) + 1) if d else count
            src.append(nb)
            dst.append(torch.full((d,), t))
        frontier = torch.unique(torch.cat(new)) if new else torch.zeros(0, dtype=torch.long)
    count = min(max(count, 1), n_nodes)
    ei = torch.stack([torch.cat(src), torch.cat(dst)])
    return count, ei[:, ei[0] < count]


def _csr(A):
    return A.indptr.tolist(), A.indices.tolist()


@pytest.mark.parametrize("seed", range(4))
def test_sorted_csr_equals_the_sorting_op(seed):
    n, ei = sampled_batch(seed=seed)
    assert bool((ei[1][1:] >= ei[1][:-1]).all())
    e = G.edges_of(ei, (n, n))
    A = G.sorted_csr(e)
    B, perm, row, col = G.csr_of(e.src, e.dst, n, n)
    # the same rows; within a row the edge order (the op also sorts by source)
    assert A is not None and A.indptr.tolist() == B.indptr.tolist()
    assert torch.equal(A.indices, e.src) and A.shape == B.shape
    ptr = A.indptr.tolist()
    for i in range(n):
        assert sorted(A.indices[ptr[i]:ptr[i + 1]].tolist()) == \
            B.indices[ptr[i]:ptr[i + 1]].tolist()
    G.clear_cache()
    A2, perm2, row2, col2 = G.structure(e)
    assert perm2 is None and _csr(A2) == _csr(A)
    assert torch.equal(row2, e.dst) and torch.equal(col2, e.src)
    assert torch.equal(row.sort().values, row2)  # (row and col of the op's entries)
    x = torch.randn(n, 5, dtype=torch.float64)
    for reduce in ("sum", "mean", "max", "min"):
        torch.testing.assert_close(sj.spmm(A2, x, reduce), sj.spmm(B, x, reduce))


@pytest.mark.parametrize("case", ["unsorted", "empty", "dst_out_of_range", "src_out_of_range",
                                  "negative"])
def test_other_inputs_take_the_sorting_op(case):
    n, ei = sampled_batch()
    if case == "unsorted":
        ei = ei.flip(1)
    elif case == "empty":
        ei = ei[:, :0]
    elif case == "dst_out_of_range":
        ei = ei.clone()
        ei[1, -1] = n
    elif case == "src_out_of_range":
        ei = ei.clone()
        ei[0, 3] = n + 5
    else:
        ei = ei.clone()
        ei[:, 0] = -1
    e = G.Edges(ei[0], ei[1], None, n, n)
    assert G.sorted_csr(e) is None


def test_sorted_out_of_range_input_still_raises():
    n, ei = sampled_batch()
    ei = ei.clone()
    ei[0, 3] = n + 5
    layer = sj.nn.SAGEConv(4, 3)
    with pytest.raises((ValueError, IndexError, RuntimeError)):
        layer(torch.randn(n, 4), ei)


@pytest.mark.parametrize("kind", ["sage", "graphconv_max", "edgeconv"])
def test_accelerated_training_on_new_sorted_batches_equals_pyg(kind, monkeypatch):
    torch.manual_seed(0)
    f = 6
    if kind == "sage":
        layers = [pnn.SAGEConv(f, 8), pnn.SAGEConv(8, 3)]
    elif kind == "graphconv_max":
        layers = [pnn.GraphConv(f, 8, aggr="max"), pnn.GraphConv(8, 3)]
    else:
        layers = [pnn.EdgeConv(torch.nn.Linear(2 * f, 8)), pnn.EdgeConv(
            torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)))]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = layers

        def forward(self, x, ei):
            return self.c2(self.c1(x, ei).relu(), ei)

    ref = Net().double()
    model = sj.accelerate(copy.deepcopy(ref))
    opt_a = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []
    csr_of = G.csr_of
    monkeypatch.setattr(G, "csr_of", lambda *a: calls.append(1) or csr_of(*a))
    for step in range(4):
        n, ei = sampled_batch(seed=10 + step)
        x = torch.randn(n, f, dtype=torch.float64)
        outs = []
        for net, opt in ((ref, opt_a), (model, opt_b)):
            opt.zero_grad()
            out = net(x, ei)
            out[:30].square().sum().backward()
            opt.step()
            outs.append(out.detach())
        torch.testing.assert_close(outs[1], outs[0], atol=1e-9, rtol=1e-9)
    for (k, a), b in zip(ref.state_dict().items(), model.state_dict().values()):
        torch.testing.assert_close(b, a, atol=1e-9, rtol=1e-9, msg=k)
    assert calls == []  # every structure came from the sorted path
