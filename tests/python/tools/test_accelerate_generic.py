"""sparsejit.accelerate's generic path: PyG MessagePassing layers sparsejit.nn lacks, whose
message is a per-edge scaled gather, run propagate on sj.spmm. Outputs and gradients (input,
parameters, learnable edge weights) against the untouched PyG layer in float64, on random,
skewed, empty and one-node graphs; PyG's own propagate is made to fail, so a pass proves the
SpMM path ran. Calls the path cannot serve (sparse adjacency) go to PyG's propagate."""

import copy

import pytest
import torch

import sparsejit as sj
import sparsejit.convert.message_passing as mpp
from conftest import same_outputs_and_input_grads

pyg = pytest.importorskip("torch_geometric")
from torch_geometric import nn as pnn  # noqa: E402
from torch_geometric.nn.conv import MessagePassing  # noqa: E402

TOL = dict(atol=1e-9, rtol=1e-9)


class ScaledMean(MessagePassing):
    """A user's layer: mean of -0.5 * w * x_j."""

    def __init__(self):
        super().__init__(aggr="mean")

    def forward(self, x, ei, w):
        return self.propagate(ei, x=x, w=w)

    def message(self, x_j, w):
        return -0.5 * w.view(-1, 1) * x_j


class PlainMax(MessagePassing):
    def __init__(self, aggr="max"):
        super().__init__(aggr=aggr)

    def forward(self, x, ei):
        return self.propagate(ei, x=x)

    def message(self, x_j):
        return x_j


class DiffSum(MessagePassing):
    """sum_j (x_j + 2 x_i), with an update that adds the input."""

    def __init__(self, aggr="add"):
        super().__init__(aggr=aggr)

    def forward(self, x, ei):
        return self.propagate(ei, x=x, skip=x)

    def message(self, x_j, x_i):
        return x_j + 2 * x_i

    def update(self, inputs, skip):
        return inputs + skip


class Nonlinear(MessagePassing):
    def forward(self, x, ei):
        return self.propagate(ei, x=x)

    def message(self, x_j):
        return x_j.relu()


LAYERS = {
    "sgconv": (lambda: pnn.SGConv(8, 5, K=2), False),
    "appnp": (lambda: pnn.APPNP(K=3, alpha=0.2), False),
    "tagconv": (lambda: pnn.TAGConv(8, 5, K=2), False),
    "tagconv_raw": (lambda: pnn.TAGConv(8, 5, K=2, normalize=False), False),
    "chebconv": (lambda: pnn.ChebConv(8, 5, K=3), False),
    "clustergcn": (lambda: pnn.ClusterGCNConv(8, 5), False),
    "leconv": (lambda: pnn.LEConv(8, 5), True),
    "user_scaled_mean": (ScaledMean, True),
    "user_max": (PlainMax, False),
    "user_min": (lambda: PlainMax("min"), False),
    "user_diff_sum": (DiffSum, False),
    "user_diff_mean": (lambda: DiffSum("mean"), False),
}


def graph(n, e, seed, skew=False):
    g = torch.Generator().manual_seed(seed)
    if n == 0:
        return torch.zeros(2, 0, dtype=torch.long)
    src = torch.randint(0, n, (e,), generator=g)
    dst = torch.randint(0, max(n - 1, 1), (e,), generator=g)
    if skew:
        dst[: e // 2] = 0
    return torch.stack([src, dst])


@pytest.fixture
def no_pyg_propagate(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("the call went to PyG's propagate")
    monkeypatch.setattr(mpp, "_pyg", fail)


@pytest.mark.parametrize("name", sorted(LAYERS))
@pytest.mark.parametrize("n, e, skew", [(30, 150, False), (30, 150, True), (1, 3, False),
                                        (6, 0, False)])
def test_generic_layer_matches_pyg(name, n, e, skew, no_pyg_propagate):
    make, weighted = LAYERS[name]
    torch.manual_seed(0)
    layer = make().double()
    ref = copy.deepcopy(layer)
    sd = layer.state_dict()
    _, rep = sj.accelerate(layer, return_report=True)
    assert "propagate" in layer.__dict__, str(rep)
    assert layer.state_dict().keys() == sd.keys()
    ei = graph(n, e, seed=3, skew=skew)
    x = torch.randn(n, 8, dtype=torch.float64)
    g = torch.Generator().manual_seed(4)
    w = torch.rand(ei.shape[1], generator=g, dtype=torch.float64) + 0.1
    outs = []
    for mod in (ref, layer):
        xi = x.clone().requires_grad_(True)
        wi = w.clone().requires_grad_(True)
        y = mod(xi, ei, wi) if weighted else mod(xi, ei)
        torch.manual_seed(9)
        (y * torch.randn_like(y)).sum().backward()
        grads = {k: p.grad for k, p in mod.named_parameters()}
        outs.append((y.detach(), xi.grad, wi.grad if weighted else None, grads))
    (y0, gx0, gw0, gp0), (y1, gx1, gw1, gp1) = outs
    torch.testing.assert_close(y1, y0, **TOL)
    torch.testing.assert_close(gx1, gx0, **TOL)
    if weighted:
        torch.testing.assert_close(gw1, gw0, **TOL)
    for k in gp0:
        torch.testing.assert_close(gp1[k], gp0[k], **TOL, msg=k)
    sj.restore(layer)
    assert "propagate" not in layer.__dict__


def test_nonlinear_message_left_alone():
    layer = Nonlinear()
    _, rep = sj.accelerate(layer, return_report=True)
    assert "propagate" not in layer.__dict__
    assert "probe" in rep.entries[0].reason


def test_sparse_adjacency_goes_to_pyg_propagate():
    torch.manual_seed(0)
    layer = pnn.SGConv(8, 5, K=2).double()
    ref = copy.deepcopy(layer)
    sj.accelerate(layer)
    ei = graph(30, 150, seed=1)
    adj = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1], dtype=torch.float64),
                                  (30, 30)).coalesce().to_sparse_csr()
    x = torch.randn(30, 8, dtype=torch.float64)
    torch.testing.assert_close(layer(x, adj), ref(x, adj), **TOL)


def test_structure_is_cached_per_edge_index():
    from sparsejit.families.spmm import graph as G
    layer = pnn.APPNP(K=4, alpha=0.1, cached=True)
    sj.accelerate(layer)
    ei = graph(30, 150, seed=2)
    x = torch.randn(30, 8)
    layer(x, ei)
    calls = []
    real = G.csr_of
    try:
        G.csr_of = lambda *a: calls.append(1) or real(*a)
        layer(x, ei)
    finally:
        G.csr_of = real
    assert calls == []  # cached=True: the same normalised edge_index, its CSR reused


def test_compile_fullgraph_generic_model(no_pyg_propagate):
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.sg = pnn.SGConv(8, 8, K=2, cached=True)
            self.ap = pnn.APPNP(K=2, alpha=0.1, cached=True)

        def forward(self, x, ei):
            return self.ap(self.sg(x, ei), ei)

    model = Net()
    ref = copy.deepcopy(model)
    sj.accelerate(model)
    x, ei = torch.randn(30, 8), graph(30, 150, seed=5)
    ref(x, ei)
    model(x, ei)  # cached=True: the normalised graph is stored before tracing
    compiled = torch.compile(model, fullgraph=True)
    same_outputs_and_input_grads(lambda v: compiled(v, ei), lambda v: ref(v, ei), x)


def test_compile_fullgraph_data_dependent_edges_keeps_pyg_propagate():
    # cached=False: gcn_norm's edge count depends on the data under torch.compile; those
    # calls keep PyG's propagate (Inductor cannot compile the SpMM path's backward there)
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"sg": pnn.SGConv(8, 8, K=2)})
    ref = copy.deepcopy(model)
    sj.accelerate(model)
    x, ei = torch.randn(30, 8), graph(30, 150, seed=6)
    compiled = torch.compile(lambda x: model["sg"](x, ei), fullgraph=True)
    same_outputs_and_input_grads(compiled, lambda v: ref["sg"](v, ei), x)
