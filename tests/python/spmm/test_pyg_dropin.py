"""sparsejit.nn's PyG-signature layers against torch_geometric itself: a PyG layer's
state_dict loads, and outputs and gradients (input and every parameter) match to 1e-5 on
fresh random graphs, for every adjacency form, bipartite inputs, cached structure and
torch.compile."""

import copy

import pytest
import torch

import sparsejit as sj

pyg = pytest.importorskip("torch_geometric")
from torch_geometric import EdgeIndex  # noqa: E402
from torch_geometric import nn as pnn  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)


def random_graph(n, e, seed, loops=True, dups=True, n_dst=None):
    """Random edges with some self-loops, duplicate edges and at least one node without
    in-edges (n_dst: bipartite targets)."""
    g = torch.Generator().manual_seed(seed)
    n_dst = n if n_dst is None else n_dst
    src = torch.randint(0, n, (e,), generator=g)
    dst = torch.randint(0, max(n_dst - 1, 1), (e,), generator=g)  # the last target: no edges
    ei = torch.stack([src, dst])
    if loops and n_dst == n:
        ei = torch.cat([ei, torch.tensor([[0, 3], [0, 3]])], 1)
    if dups:
        ei = torch.cat([ei, ei[:, :5]], 1)
    else:
        ei = torch.unique(ei, dim=1)
        if not loops:
            ei = ei[:, ei[0] != ei[1]]
    return ei


def _pair_layers(make):
    torch.manual_seed(0)
    ref = make(pnn)
    ours = make(sj.nn)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _outputs(layer, x, adj, kwargs):
    xs = [t.detach().clone().requires_grad_(True) for t in (x if isinstance(x, tuple) else (x,))]
    xin = tuple(xs) if isinstance(x, tuple) else xs[0]
    out = layer(xin, adj, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    torch.manual_seed(5)
    (out * torch.randn_like(out)).sum().backward()
    grads = {n: p.grad for n, p in layer.named_parameters() if p.grad is not None}
    return out, [t.grad for t in xs], grads


def check(make, x, adj_ref, adj_ours=None, kwargs_ref=None, kwargs_ours=None):
    ref, ours = _pair_layers(make)
    kwargs_ref = kwargs_ref or {}
    out_r, gx_r, gp_r = _outputs(ref, x, adj_ref, kwargs_ref)
    out_o, gx_o, gp_o = _outputs(ours, x, adj_ref if adj_ours is None else adj_ours,
                                 kwargs_ref if kwargs_ours is None else kwargs_ours)
    torch.testing.assert_close(out_o, out_r, **TOL)
    for a, b in zip(gx_o, gx_r):
        torch.testing.assert_close(a, b, **TOL)
    assert set(gp_o) == set(gp_r)
    for name in gp_r:
        torch.testing.assert_close(gp_o[name], gp_r[name], **TOL, msg=name)
    return ref, ours


def mlp(m, fin, fout):
    return torch.nn.Sequential(torch.nn.Linear(fin, 16), torch.nn.ReLU(), torch.nn.Linear(16, fout))


N, E, FIN = 40, 200, 8

LAYERS = {
    "gcn": lambda m: m.GCNConv(FIN, 5),
    "gcn_wide_improved": lambda m: m.GCNConv(FIN, 12, improved=True),
    "gcn_no_loops": lambda m: m.GCNConv(FIN, 5, add_self_loops=False, bias=False),
    "sage_mean": lambda m: m.SAGEConv(FIN, 5),
    "sage_sum_norm": lambda m: m.SAGEConv(FIN, 12, aggr="sum", normalize=True),
    "sage_max_project": lambda m: m.SAGEConv(FIN, 5, aggr="max", project=True),
    "sage_min_noroot": lambda m: m.SAGEConv(FIN, 5, aggr="min", root_weight=False, bias=False),
    "graphconv_add": lambda m: m.GraphConv(FIN, 5),
    "graphconv_mean": lambda m: m.GraphConv(FIN, 12, aggr="mean"),
    "graphconv_max": lambda m: m.GraphConv(FIN, 5, aggr="max"),
    "gin": lambda m: m.GINConv(mlp(m, FIN, 5), eps=0.3, train_eps=True),
    "gin_fixed_eps": lambda m: m.GINConv(mlp(m, FIN, 5), eps=-0.4),  # one fused SpMM
    "gat": lambda m: m.GATConv(FIN, 4, heads=3),
    "gat_mean_heads_residual": lambda m: m.GATConv(FIN, 4, heads=2, concat=False, residual=True),
    "gat_no_loops": lambda m: m.GATConv(FIN, 6, add_self_loops=False, negative_slope=0.1),
    "gatv2": lambda m: m.GATv2Conv(FIN, 4, heads=2),
    "gatv2_shared": lambda m: m.GATv2Conv(FIN, 4, heads=2, share_weights=True, concat=False),
    "transformer": lambda m: m.TransformerConv(FIN, 4, heads=2),
    "transformer_beta_mean": lambda m: m.TransformerConv(FIN, 4, heads=3, concat=False,
                                                         beta=True),
    "transformer_noroot": lambda m: m.TransformerConv(FIN, 16, root_weight=False),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_matches_pyg_on_edge_index(name):
    x = torch.randn(N, FIN)
    check(LAYERS[name], x, random_graph(N, E, seed=sum(map(ord, name))))


@pytest.mark.parametrize("name", ["gcn", "sage_mean", "graphconv_add", "gin", "gat",
                                  "transformer", "gatv2"])
@pytest.mark.parametrize("form", ["edge_index_sorted", "csr", "coo", "sparse_matrix"])
def test_adjacency_forms(name, form):
    """The same loop-free, duplicate-free graph in every form PyG users pass."""
    x = torch.randn(N, FIN)
    ei = random_graph(N, E, seed=7, loops=False, dups=False)
    sorted_ei = EdgeIndex(ei, sparse_size=(N, N)).sort_by("col")[0]
    if form == "edge_index_sorted":
        adj = sorted_ei
    else:
        dense = torch.zeros(N, N)
        dense[ei[1], ei[0]] = 1.0  # adj_t: rows are targets
        adj = {"csr": dense.to_sparse_csr(), "coo": dense.to_sparse_coo(),
               "sparse_matrix": sj.SparseMatrix.from_edge_index(ei, N)}[form]
    check(LAYERS[name], x, ei, adj)


def test_edge_index_reuses_its_csc():
    ei = EdgeIndex(random_graph(N, E, seed=2), sparse_size=(N, N)).sort_by("col")[0]
    layer = sj.nn.SAGEConv(FIN, 4)
    layer(torch.randn(N, FIN), ei)
    A = ei._sparsejit_csr
    (colptr, row), _ = ei.get_csc()
    assert torch.equal(A.indptr, colptr.as_subclass(torch.Tensor))
    assert torch.equal(A.indices, row.as_subclass(torch.Tensor))


@pytest.mark.parametrize("name", ["gcn", "graphconv_add", "graphconv_mean", "graphconv_max"])
def test_edge_weight(name):
    x, ei = torch.randn(N, FIN), random_graph(N, E, seed=11)
    w = torch.rand(ei.shape[1]) + 0.1
    check(LAYERS[name], x, ei, kwargs_ref={"edge_weight": w})


def test_gcn_normalize_false_and_weight_gradient():
    x, ei = torch.randn(N, FIN), random_graph(N, E, seed=12)
    check(lambda m: m.GCNConv(FIN, 5, normalize=False), x, ei,
          kwargs_ref={"edge_weight": torch.rand(ei.shape[1])})
    # Gradient w.r.t. a learnable edge weight goes through the normalisation.
    grads = []
    for m in (pnn, sj.nn):
        torch.manual_seed(0)
        layer = m.GCNConv(FIN, 5)
        if m is sj.nn:
            layer.load_state_dict(ref_state)
        ref_state = layer.state_dict()
        w = torch.linspace(0.2, 1.5, ei.shape[1]).requires_grad_(True)
        layer(x, ei, w).square().sum().backward()
        grads.append(w.grad)
    torch.testing.assert_close(grads[1], grads[0], **TOL)


@pytest.mark.parametrize("make", [
    lambda m: m.SAGEConv((FIN, 6), 5), lambda m: m.GraphConv((FIN, 6), 5),
    lambda m: m.GATConv((FIN, 6), 4, heads=2, add_self_loops=False),
    lambda m: m.GATv2Conv((FIN, 6), 4, heads=2, add_self_loops=False),
    lambda m: m.TransformerConv((FIN, 6), 4, heads=2)], ids=["sage", "graph", "gat", "gatv2",
                                                              "transformer"])
def test_bipartite(make):
    ei = random_graph(N, E, seed=3, n_dst=25)
    check(make, (torch.randn(N, FIN), torch.randn(25, 6)), ei)


def test_gin_bipartite_and_gine_edge_features():
    ei = random_graph(N, E, seed=4, n_dst=25)
    check(lambda m: m.GINConv(mlp(m, FIN, 5)), (torch.randn(N, FIN), torch.randn(25, FIN)), ei)
    ei = random_graph(N, E, seed=5)
    attr = torch.randn(ei.shape[1], 3)
    check(lambda m: m.GINEConv(mlp(m, FIN, 5), edge_dim=3, train_eps=True), torch.randn(N, FIN),
          ei, kwargs_ref={"edge_attr": attr})
    check(lambda m: m.GINEConv(mlp(m, FIN, 5)), torch.randn(N, FIN), ei,
          kwargs_ref={"edge_attr": torch.randn(ei.shape[1], FIN)})


@pytest.mark.parametrize("fill", ["mean", "add", "max", 0.5])
@pytest.mark.parametrize("layer", ["GATConv", "GATv2Conv"])
def test_attention_edge_features(layer, fill):
    ei = random_graph(N, E, seed=6)
    attr = torch.randn(ei.shape[1], 3)
    check(lambda m: getattr(m, layer)(FIN, 4, heads=2, edge_dim=3, fill_value=fill),
          torch.randn(N, FIN), ei, kwargs_ref={"edge_attr": attr})


def test_transformer_edge_features():
    ei = random_graph(N, E, seed=8)
    check(lambda m: m.TransformerConv(FIN, 4, heads=2, edge_dim=3), torch.randn(N, FIN), ei,
          kwargs_ref={"edge_attr": torch.randn(ei.shape[1], 3)})


@pytest.mark.parametrize("layer", ["GATConv", "GATv2Conv", "TransformerConv"])
def test_return_attention_weights(layer):
    ei = random_graph(N, E, seed=9)
    x = torch.randn(N, FIN)
    ref, ours = _pair_layers(lambda m: getattr(m, layer)(FIN, 4, heads=2))
    out_r, (ei_r, a_r) = ref(x, ei, return_attention_weights=True)
    out_o, (ei_o, a_o) = ours(x, ei, return_attention_weights=True)
    torch.testing.assert_close(out_o, out_r, **TOL)
    assert torch.equal(ei_o, ei_r)
    torch.testing.assert_close(a_o, a_r, **TOL)


def test_cached_gcn_and_content_cache():
    x, ei = torch.randn(N, FIN), random_graph(N, E, seed=13)
    ref, ours = _pair_layers(lambda m: m.GCNConv(FIN, 5, cached=True))
    torch.testing.assert_close(ours(x, ei), ref(x, ei), **TOL)
    other = random_graph(N, E, seed=14)
    # cached=True: both keep the first graph's normalisation.
    torch.testing.assert_close(ours(x, other), ref(x, other), **TOL)
    # Content-keyed cache: an equal edge_index (a new tensor) finds the same structure.
    sj.families.spmm.graph.clear_cache()
    layer = sj.nn.GCNConv(FIN, 5)
    layer(x, ei)
    assert len(sj.families.spmm.graph._CACHE) == 1
    A = next(iter(sj.families.spmm.graph._CACHE.values()))
    layer(x, ei.clone())
    cache = sj.families.spmm.graph._CACHE
    assert len(cache) == 1 and next(iter(cache.values())) is A
    layer(x, other)
    assert len(sj.families.spmm.graph._CACHE) == 2


class TwoLayer(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.conv1 = m.GCNConv(FIN, 16)
        self.conv2 = m.GATConv(16, 4, heads=2)
        self.conv3 = m.SAGEConv(8, 3)
        self.conv4 = m.TransformerConv(3, 3, heads=2)
        self.conv5 = m.GATv2Conv(6, 2, heads=2)

    def forward(self, x, edge_index):
        h = torch.relu(self.conv1(x, edge_index))
        h = torch.relu(self.conv2(h, edge_index))
        h = self.conv4(torch.relu(self.conv3(h, edge_index)), edge_index)
        return self.conv5(torch.relu(h), edge_index)


def test_compile_fullgraph_model():
    torch.manual_seed(0)
    model = TwoLayer(sj.nn)
    x, ei = torch.randn(N, FIN), random_graph(N, E, seed=15)
    eager = model(x, ei)
    eager.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x, ei)
    out.square().sum().backward()
    torch.testing.assert_close(out, eager, **TOL)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g, **TOL)
    ref = TwoLayer(pnn)
    ref.load_state_dict(model.state_dict())
    torch.testing.assert_close(out, ref(x, ei), **TOL)


def test_bad_inputs_raise():
    layer = sj.nn.GCNConv(FIN, 4)
    x = torch.randn(N, FIN)
    with pytest.raises(ValueError, match="edge_index"):
        layer(x, torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(TypeError, match="integers"):
        layer(x, torch.zeros(2, 5))
    with pytest.raises((ValueError, RuntimeError), match="edge_index|range|node"):
        layer(x, torch.tensor([[0, N + 5], [1, 2]]))
    with pytest.raises(ValueError, match="bipartite"):
        layer((x, x), random_graph(N, E, seed=1))
    with pytest.raises(ValueError, match="aggr"):
        sj.nn.SAGEConv(4, 4, aggr="lstm")


def test_gat_dropout_trains_and_eval_is_deterministic():
    layer = sj.nn.GATConv(FIN, 4, heads=2, dropout=0.5)
    x, ei = torch.randn(N, FIN), random_graph(N, E, seed=16)
    layer.train()
    a, b = layer(x, ei), layer(x, ei)
    assert not torch.allclose(a, b)
    layer.eval()
    torch.testing.assert_close(layer(x, ei), layer(x, ei))


# ---- sampled mini-batches: the empty tail of rows -------------------------------------------

def minibatch_graph(n, occupied, e, seed, n_dst=None):
    """A sampled subgraph's shape: edges only into the first `occupied` targets (the seeds
    and earlier hops, relabelled first), sources anywhere; duplicates and self-loops kept."""
    g = torch.Generator().manual_seed(seed)
    n_dst = n if n_dst is None else n_dst
    if occupied == 0:
        return torch.zeros(2, 0, dtype=torch.long)
    src = torch.randint(0, n, (e,), generator=g)
    # Skewed: half the edges into target 0 (a hub), the rest uniform over the occupied rows.
    dst = torch.where(torch.rand(e, generator=g) < 0.5, 0,
                      torch.randint(0, occupied, (e,), generator=g))
    dst[-1] = occupied - 1  # the last occupied row holds an edge
    ei = torch.stack([src, dst])
    return torch.cat([ei, ei[:, :3], torch.tensor([[0], [0]])], 1)


TAIL_LAYERS = {
    "sage_mean": lambda m: m.SAGEConv(FIN, 5),
    "sage_mean_wide": lambda m: m.SAGEConv(FIN, 12),
    "sage_sum_norm": lambda m: m.SAGEConv(FIN, 6, aggr="sum", normalize=True),
    "sage_max_project": lambda m: m.SAGEConv(FIN, 5, aggr="max", project=True),
    "sage_min_noroot": lambda m: m.SAGEConv(FIN, 5, aggr="min", root_weight=False),
    "sage_noroot_nobias": lambda m: m.SAGEConv(FIN, 5, root_weight=False, bias=False),
    "graphconv_add": lambda m: m.GraphConv(FIN, 5),
    "graphconv_mean_wide": lambda m: m.GraphConv(FIN, 12, aggr="mean"),
    "graphconv_max": lambda m: m.GraphConv(FIN, 5, aggr="max"),
}


@pytest.fixture
def tail_calls(monkeypatch):
    """Counts the calls of the empty-tail path (so a test knows it ran)."""
    from sparsejit.families.spmm import layers

    calls = []
    real = layers.aggregate_rows

    def counted(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(layers, "aggregate_rows", counted)
    return calls


@pytest.mark.parametrize("order", ["aggregate_first", "transform_first"])
@pytest.mark.parametrize("occupied", [0, 1, 9, 30])
@pytest.mark.parametrize("name", sorted(TAIL_LAYERS))
def test_minibatch_empty_tail_matches_pyg(name, occupied, order, tail_calls, monkeypatch):
    """Rows past the last occupied one are skipped by the aggregation and lin (their output
    is the bias plus the root term): outputs and every gradient still equal PyG's, with the
    Linear before or after the aggregation; a tail under a quarter of the rows takes the
    ordinary path."""
    from sparsejit.families.spmm import layers

    # No gather cost: aggregating first always wins; a huge one: transforming first wins
    # wherever the Linear narrows the rows (sum and mean only).
    monkeypatch.setattr(layers, "_GATHER_MADDS", 0 if order == "aggregate_first" else 10**6)
    x = torch.randn(N, FIN)
    ei = minibatch_graph(N, occupied, 3 * max(occupied, 1), seed=occupied + len(name))
    kwargs = {}
    if name.startswith("graphconv") and occupied:
        kwargs["edge_weight"] = torch.rand(ei.shape[1]) + 0.1
    check(TAIL_LAYERS[name], x, ei, kwargs_ref=kwargs)
    assert tail_calls == ([occupied] if occupied <= 0.75 * N else [])


def test_minibatch_empty_tail_bipartite_and_repeat(tail_calls):
    """Bipartite inputs (x_src, x_dst) with an empty tail of targets; the same graph again
    reuses the cached leading-rows matrix (and its plans)."""
    ei = minibatch_graph(N, 6, 40, seed=21, n_dst=25)
    check(lambda m: m.SAGEConv((FIN, 6), 5), (torch.randn(N, FIN), torch.randn(25, 6)), ei)
    check(lambda m: m.GraphConv((FIN, 6), 7, aggr="mean"),
          (torch.randn(N, FIN), torch.randn(25, 6)), ei)
    assert tail_calls == [6, 6]
    A = sj.SparseMatrix.from_edge_index(minibatch_graph(N, 6, 40, seed=21), N)
    assert A.occupied_rows() == 6
    sub = A.leading_rows(6)
    assert sub.shape == (6, N) and sub.nnz == A.nnz and A.leading_rows(6)._s is sub._s
    assert A.leading_rows(N) is A
    with pytest.raises(ValueError, match="leading_rows: m"):
        A.leading_rows(5)
    empty = sj.SparseMatrix.from_edge_index(torch.zeros(2, 0, dtype=torch.long), 7)
    assert empty.occupied_rows() == 0 and empty.leading_rows(0).shape == (0, 7)
