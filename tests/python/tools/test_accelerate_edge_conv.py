"""sparsejit.nn.EdgeConv against PyG's EdgeConv itself, and its conversion by accelerate:
outputs, input and parameter gradients equal in float64 for every aggregation and every network
shape (a Linear alone and split per node, a Sequential or PyG MLP whose first Linear is split,
a network that is not split), on random graphs with isolated nodes, a skewed graph, a one-node
graph and an empty edge set; same tensors and state_dict keys; restore; compile; bad input."""

import copy

import pytest
import torch

import sparsejit as sj
from conftest import poison_heap, same_outputs_and_input_grads

pyg = pytest.importorskip("torch_geometric")
from torch_geometric import nn as pnn  # noqa: E402

TOL = dict(atol=1e-9, rtol=1e-9)
F_IN = 5

NETS = {
    "linear": lambda: torch.nn.Linear(2 * F_IN, 6),
    "pyg_linear": lambda: pnn.Linear(2 * F_IN, 6),
    "sequential": lambda: torch.nn.Sequential(torch.nn.Linear(2 * F_IN, 7), torch.nn.ReLU(),
                                              torch.nn.Linear(7, 4)),
    "mlp_batchnorm": lambda: pnn.MLP([2 * F_IN, 8, 8, 4]),
    "mlp_one_layer": lambda: pnn.MLP([2 * F_IN, 4], plain_last=True),
    "not_split": lambda: torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Linear(2 * F_IN, 4)),
}


def graphs():
    g = torch.Generator().manual_seed(3)
    n = 40
    src = torch.randint(0, n, (240,), generator=g)
    dst = torch.randint(0, n - 5, (240,), generator=g)  # the last 5 nodes get no in-edges
    skew_dst = dst.clone()
    skew_dst[:160] = 2
    return {
        "random": (n, torch.stack([src, dst])),
        "skewed": (n, torch.stack([src, skew_dst])),
        "one_node": (1, torch.tensor([[0], [0]])),
        "no_edges": (n, torch.zeros(2, 0, dtype=torch.long)),
    }


GRAPHS = graphs()


def _run(layer, x, ei):
    x = x.detach().clone().requires_grad_(True)
    layer.zero_grad()
    poison_heap((x.shape[0], 8), (ei.shape[1], 8))
    out = layer(x, ei)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    return out.detach(), x.grad, {k: p.grad.clone() for k, p in layer.named_parameters()
                                  if p.grad is not None}


def _assert_same(got, want):
    torch.testing.assert_close(got[0], want[0], **TOL)
    torch.testing.assert_close(got[1], want[1], **TOL)
    assert got[2].keys() == want[2].keys()
    for k in want[2]:
        torch.testing.assert_close(got[2][k], want[2][k], **TOL, msg=k)


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("aggr", ["max", "min", "mean", "add"])
@pytest.mark.parametrize("net", sorted(NETS))
def test_accelerated_edge_conv_equals_pyg(net, aggr, graph):
    torch.manual_seed(0)
    n, ei = GRAPHS[graph]
    pyg_layer = pnn.EdgeConv(NETS[net](), aggr=aggr).double()  # training mode: BatchNorm too
    if graph == "one_node" and "batchnorm" in net:
        pyg_layer.eval()  # BatchNorm refuses to train on one row (PyG's layer and ours alike)
    ref = copy.deepcopy(pyg_layer)
    before = pyg_layer.state_dict(keep_vars=True)
    new, rep = sj.accelerate(pyg_layer, return_report=True)
    assert isinstance(new, sj.nn.EdgeConv)
    assert rep.entries[0].became == "sparsejit.EdgeConv" and not rep.left
    after = new.state_dict(keep_vars=True)
    assert list(after) == list(before) and all(after[k] is before[k] for k in before)
    x = torch.randn(n, F_IN, dtype=torch.float64)
    _assert_same(_run(new, x, ei), _run(ref, x, ei))
    if "batchnorm" in net and pyg_layer.training:  # the running statistics moved alike (the same tensors)
        keys = [k for k in ref.state_dict() if k.endswith("running_mean")]
        assert keys
        for k in keys:
            torch.testing.assert_close(new.state_dict()[k], ref.state_dict()[k], **TOL)
    assert sj.accelerate(new) is new
    assert sj.restore(new) is pyg_layer


@pytest.mark.parametrize("aggr", ["max", "add"])
def test_bipartite_pair_input(aggr):
    torch.manual_seed(1)
    ref = pnn.EdgeConv(torch.nn.Sequential(torch.nn.Linear(2 * F_IN, 6), torch.nn.ReLU()),
                       aggr=aggr).double()
    new = sj.nn.EdgeConv(copy.deepcopy(ref.nn), aggr=aggr)
    new.load_state_dict(ref.state_dict())
    xs = torch.randn(30, F_IN, dtype=torch.float64)
    xd = torch.randn(12, F_IN, dtype=torch.float64)
    ei = torch.stack([torch.randint(0, 30, (90,)), torch.randint(0, 10, (90,))])
    torch.testing.assert_close(new((xs, xd), ei), ref((xs, xd), ei), **TOL)
    same_outputs_and_input_grads(lambda x: new((x, xd), ei), lambda x: ref((x, xd), ei), xs,
                                 **TOL)


def test_inside_a_model_and_restore():
    torch.manual_seed(2)
    model = torch.nn.ModuleDict({"conv": pnn.EdgeConv(torch.nn.Linear(2 * F_IN, 6)),
                                 "head": torch.nn.Linear(6, 2)})
    conv = model["conv"]
    _, rep = sj.accelerate(model, return_report=True)
    assert isinstance(model["conv"], sj.nn.EdgeConv) and model["head"] is not None
    assert [e.path for e in rep.converted] == ["conv"]
    assert sj.restore(model)["conv"] is conv


@pytest.mark.slow  # torch.compile: 1-10 s a case
@pytest.mark.parametrize("net", ["linear", "sequential", "mlp_batchnorm"])
def test_compile_fullgraph(net):
    torch.manual_seed(0)
    ref = pnn.EdgeConv(NETS[net]()).eval()
    new = sj.accelerate(copy.deepcopy(ref))
    n, ei = GRAPHS["random"]
    compiled = torch.compile(new, fullgraph=True)
    same_outputs_and_input_grads(lambda x: compiled(x, ei), lambda x: ref(x, ei),
                                 torch.randn(n, F_IN))


def test_hooked_first_linear_still_runs_its_hook():
    torch.manual_seed(0)
    seen = []
    net = torch.nn.Sequential(torch.nn.Linear(2 * F_IN, 4), torch.nn.ReLU())
    net[0].register_forward_hook(lambda m, a, o: seen.append(o.shape[0]))
    ref = pnn.EdgeConv(copy.deepcopy(net)).double()
    new = sj.accelerate(pnn.EdgeConv(net).double())
    new.nn.load_state_dict(ref.nn.state_dict())
    n, ei = GRAPHS["random"]
    x = torch.randn(n, F_IN, dtype=torch.float64)
    want = ref(x, ei)  # (deepcopy copied the hook)
    seen.clear()
    torch.testing.assert_close(new(x, ei), want, **TOL)
    assert seen == [ei.shape[1]]  # the hook saw the per-edge input: the Linear was not split


def test_bad_input_names_the_argument():
    layer = sj.nn.EdgeConv(torch.nn.Linear(2 * F_IN, 4))
    ei = GRAPHS["random"][1]
    with pytest.raises(ValueError, match="x must be"):
        layer(torch.randn(40, 2, F_IN), ei)
    with pytest.raises(ValueError, match="features"):
        layer((torch.randn(40, F_IN), torch.randn(40, F_IN + 1)), ei)
    with pytest.raises(ValueError, match="edge_index"):
        layer(torch.randn(40, F_IN), torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="aggr"):
        sj.nn.EdgeConv(torch.nn.Linear(2, 2), aggr="softmax")
    with pytest.raises(ValueError, match="nn must map"):
        sj.nn.EdgeConv(lambda t: t.sum())(torch.randn(40, F_IN), ei)


def test_unsupported_aggregation_is_left_with_reason():
    layer = pnn.EdgeConv(torch.nn.Linear(2 * F_IN, 4), aggr=["max", "mean"])
    new, rep = sj.accelerate(layer, return_report=True)
    assert new is layer and "aggr" in rep.left[0].reason


# ---- DynamicEdgeConv -----------------------------------------------------------------------


def brute_knn(xs, xd, k, bs, bd):
    """The reference k-NN graph, one target at a time in float64: edges j -> i from the k
    nearest sources of the same example (itself included when xs is xd)."""
    src, dst = [], []
    for i in range(xd.shape[0]):
        cand = (bs == bd[i]).nonzero().view(-1)
        d = (xs[cand] - xd[i]).square().sum(1)
        near = cand[d.argsort()[:k]]
        src += near.tolist()
        dst += [i] * len(near)
    return torch.tensor([src, dst], dtype=torch.long).view(2, -1)


def pyg_dynamic_edge_conv(monkeypatch, net, k, aggr):
    """PyG's DynamicEdgeConv, built although pyg-lib (its knn) is not installed here: PyG's
    forward cannot run, the module (its nn, k, aggr) is what accelerate converts."""
    import torch_geometric.typing as pyg_typing
    monkeypatch.setattr(pyg_typing, "WITH_KNN", True)
    layer = pnn.DynamicEdgeConv(net, k=k, aggr=aggr)
    monkeypatch.setattr(pyg_typing, "WITH_KNN", False)
    return layer


@pytest.mark.parametrize("aggr", ["max", "mean", "add"])
@pytest.mark.parametrize("net", ["linear", "sequential", "not_split"])
@pytest.mark.parametrize("batched", [False, True])
def test_dynamic_edge_conv_equals_pyg_edge_conv_on_the_knn_graph(net, aggr, batched,
                                                                  monkeypatch):
    torch.manual_seed(0)
    layer = pyg_dynamic_edge_conv(monkeypatch, NETS[net](), 6, aggr).double()
    ref = pnn.EdgeConv(copy.deepcopy(layer.nn), aggr=aggr).double()
    ref.nn.load_state_dict(layer.nn.state_dict())  # (PyG's constructor reset the copy)
    before = layer.state_dict(keep_vars=True)
    new, rep = sj.accelerate(layer, return_report=True)
    assert isinstance(new, sj.nn.DynamicEdgeConv) and new.k == 6
    assert rep.entries[0].became == "sparsejit.DynamicEdgeConv"
    after = new.state_dict(keep_vars=True)
    assert list(after) == list(before) and all(after[k] is before[k] for k in before)
    x = torch.randn(45, F_IN, dtype=torch.float64)
    # two examples (the second with fewer points than k + 1 would not matter) or one
    batch = torch.tensor([0] * 20 + [1] * 4 + [2] * 21) if batched else None
    b = batch if batched else torch.zeros(45, dtype=torch.long)
    ei = brute_knn(x, x, 6, b, b)
    assert ei.shape[1] == (20 * 6 + 4 * 4 + 21 * 6 if batched else 45 * 6)
    want = _run_fn(lambda v: ref(v, ei), x, ref)
    got = _run_fn(lambda v: new(v, batch), x, new)
    _assert_same(got, want)
    assert sj.restore(new) is layer


def _run_fn(fn, x, layer):
    x = x.detach().clone().requires_grad_(True)
    layer.zero_grad()
    out = fn(x)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    return out.detach(), x.grad, {k: p.grad.clone() for k, p in layer.named_parameters()
                                  if p.grad is not None}


def test_dynamic_edge_conv_bipartite_pair():
    torch.manual_seed(1)
    layer = sj.nn.DynamicEdgeConv(torch.nn.Linear(2 * F_IN, 4), k=3).double()
    xs, xd = torch.randn(30, F_IN, dtype=torch.float64), torch.randn(10, F_IN, dtype=torch.float64)
    bs, bd = torch.tensor([0] * 12 + [1] * 18), torch.tensor([0] * 6 + [1] * 4)
    ref = sj.nn.EdgeConv(layer.nn)
    torch.testing.assert_close(layer((xs, xd), (bs, bd)),
                               ref((xs, xd), brute_knn(xs, xd, 3, bs, bd)), **TOL)


def test_dynamic_edge_conv_bad_input():
    layer = sj.nn.DynamicEdgeConv(torch.nn.Linear(2 * F_IN, 4), k=3)
    with pytest.raises(ValueError, match="k must be"):
        sj.nn.DynamicEdgeConv(torch.nn.Linear(2, 2), k=0)
    with pytest.raises(ValueError, match="static graphs"):
        layer(torch.randn(4, 3, F_IN))
    with pytest.raises(ValueError, match="batch_src must be a sorted"):
        layer(torch.randn(6, F_IN), torch.tensor([1, 0, 0, 1, 1, 1]))
    with pytest.raises(ValueError, match="batch_src must be a sorted"):
        layer(torch.randn(6, F_IN), torch.tensor([0, 0, 1]))
