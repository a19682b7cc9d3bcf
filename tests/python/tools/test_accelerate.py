"""sparsejit.accelerate / restore on PyG models: every native layer it converts keeps the
PyG module's tensors (same objects, same state_dict keys) and gives the same outputs and
gradients in float64; restore brings the PyG modules back; a second call changes nothing;
models and layers it cannot serve are left as they were, with the reason."""

import copy

import pytest
import torch

import sparsejit as sj
from conftest import same_outputs_and_input_grads

pyg = pytest.importorskip("torch_geometric")
from torch_geometric import nn as pnn  # noqa: E402

TOL = dict(atol=1e-9, rtol=1e-9)


def graph(n=40, e=200, seed=0, skew=False):
    """Random edges with self-loops, duplicates and a node without in-edges; `skew`: half
    the edges into node 0."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (e,), generator=g)
    dst = torch.randint(0, n - 1, (e,), generator=g)
    if skew:
        dst[: e // 2] = 0
    ei = torch.cat([torch.stack([src, dst]), torch.tensor([[0, 3], [0, 3]])], 1)
    return torch.cat([ei, ei[:, :5]], 1)


class Wrap(torch.nn.Module):
    """One layer inside a model, called as ``layer(x, edge_index, *extra)``."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer
        self.post = torch.nn.Linear(1, 1)  # a plain module accelerate must leave alone

    def forward(self, x, ei, *extra):
        out = self.layer(x, ei, *extra)
        return out[0] if isinstance(out, tuple) else out


NATIVE = {
    "gcn": (lambda: pnn.GCNConv(8, 6), ()),
    "gcn_improved_cached": (lambda: pnn.GCNConv(8, 6, improved=True, cached=True), ()),
    "sage_mean": (lambda: pnn.SAGEConv(8, 6), ()),
    "sage_max_project": (lambda: pnn.SAGEConv(8, 6, aggr="max", project=True,
                                              normalize=True), ()),
    "graphconv": (lambda: pnn.GraphConv(8, 6, aggr="mean"), ()),
    "gin": (lambda: pnn.GINConv(torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(),
                                                    torch.nn.Linear(6, 6)), train_eps=True), ()),
    "gine": (lambda: pnn.GINEConv(torch.nn.Linear(8, 6), edge_dim=3), ("edge_attr",)),
    "gat": (lambda: pnn.GATConv(8, 3, heads=2), ()),
    "gat_edge": (lambda: pnn.GATConv(8, 3, heads=2, edge_dim=3, concat=False), ("edge_attr",)),
    "gatv2_shared": (lambda: pnn.GATv2Conv(8, 3, heads=2, share_weights=True), ()),
    "transformer": (lambda: pnn.TransformerConv(8, 3, heads=2, beta=True, edge_dim=3),
                    ("edge_attr",)),
    "rgcn": (lambda: pnn.RGCNConv(8, 6, num_relations=3, num_bases=2), ("edge_type",)),
    "fast_rgcn": (lambda: pnn.FastRGCNConv(8, 6, num_relations=3), ("edge_type",)),
}


def _extra(kinds, ei, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in kinds:
        if k == "edge_attr":
            out.append(torch.randn(ei.shape[1], 3, generator=g, dtype=torch.float64))
        else:
            out.append(torch.randint(0, 3, (ei.shape[1],), generator=g))
    return out


def _run(model, x, ei, extra):
    x = x.detach().clone().requires_grad_(True)
    model.zero_grad()
    out = model(x, ei, *extra)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    return out.detach(), x.grad, {n: p.grad.clone() for n, p in model.named_parameters()
                                  if p.grad is not None}


@pytest.mark.parametrize("name", sorted(NATIVE))
@pytest.mark.parametrize("skew", [False, True])
def test_native_layer_same_tensors_outputs_gradients(name, skew):
    make, kinds = NATIVE[name]
    torch.manual_seed(0)
    model = Wrap(make()).double().eval()
    ref = copy.deepcopy(model)
    ei = graph(skew=skew)
    x = torch.randn(40, 8, dtype=torch.float64)
    extra = _extra(kinds, ei)
    before = model.state_dict(keep_vars=True)
    params = dict(model.named_parameters())
    original = model.layer
    out, rep = sj.accelerate(model, return_report=True)
    assert out is model
    assert type(model.layer).__module__.startswith("sparsejit."), rep
    after = model.state_dict(keep_vars=True)
    assert list(after) == list(before)
    assert all(after[k] is before[k] for k in before)  # the same tensor objects
    assert all(p is params[n] for n, p in model.named_parameters())
    want, got = _run(ref, x, ei, extra), _run(model, x, ei, extra)
    torch.testing.assert_close(got[0], want[0], **TOL)
    torch.testing.assert_close(got[1], want[1], **TOL)
    assert got[2].keys() == want[2].keys()
    for k in want[2]:
        torch.testing.assert_close(got[2][k], want[2][k], **TOL, msg=k)
    assert sj.accelerate(model).layer is model.layer  # idempotent
    assert sj.restore(model).layer is original
    torch.testing.assert_close(_run(model, x, ei, extra)[0], want[0], **TOL)


def test_optimizer_and_hooks_keep_working():
    torch.manual_seed(0)
    model = Wrap(pnn.GCNConv(8, 6))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    model.layer.register_forward_hook(lambda m, a, o: seen.append(o.shape))
    w0 = model.layer.lin.weight.detach().clone()
    sj.accelerate(model)
    model(torch.randn(40, 8), graph()).sum().backward()
    opt.step()
    assert seen == [torch.Size([40, 6])]
    assert not torch.equal(w0, model.layer.lin.weight)  # the optimizer moved the shared weight
    sd = copy.deepcopy(model.state_dict())
    back = sj.restore(model)
    assert torch.equal(back.layer.lin.weight, sd["layer.lin.weight"])


def test_dtype_change_after_accelerate_reaches_restored_module():
    model = Wrap(pnn.GINConv(torch.nn.Linear(8, 6)))
    sj.accelerate(model)
    model.double()  # replaces the buffer eps with a float64 one
    back = sj.restore(model)
    assert back.layer.eps.dtype == torch.float64
    assert back.layer.nn[0].weight.dtype == torch.float64 if isinstance(
        back.layer.nn, torch.nn.Sequential) else back.layer.nn.weight.dtype == torch.float64


def test_top_level_layer_is_returned():
    layer = pnn.SAGEConv(8, 6)
    new = sj.accelerate(layer)
    assert isinstance(new, sj.nn.SAGEConv)
    assert sj.restore(new) is layer


def test_model_without_graph_layers_is_unchanged():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Conv2d(3, 3, 1))
    children = list(model)
    sd = model.state_dict()
    out, rep = sj.accelerate(model, return_report=True)
    assert out is model and list(model) == children and len(rep) == 0
    assert all(torch.equal(sd[k], v) for k, v in model.state_dict().items())
    assert "no graph" in str(rep)
    assert sj.restore(model) is model and list(model) == children


@pytest.mark.parametrize("make, reason", [
    (lambda: pnn.GCNConv(8, 6, flow="target_to_source"), "flow"),
    (lambda: pnn.SAGEConv(8, 6, aggr=["mean", "max"]), "aggr"),
    # (EdgeConv, here before, is native now; FeaStConv and GENConv take the per-edge path)
    (lambda: pnn.PNAConv(8, 6, ["mean", "max"], ["identity"], torch.tensor([1, 2, 3])),
     "DegreeScaler"),
    (lambda: pnn.GENConv(8, 8, aggr=["softmax", "mean"]), "per-edge path"),
])
def test_layers_left_alone_with_reason(make, reason):
    torch.manual_seed(0)
    model = Wrap(make())
    layer = model.layer
    _, rep = sj.accelerate(model, return_report=True)
    assert model.layer is layer and "propagate" not in layer.__dict__
    (entry,) = rep.left
    assert entry.path == "layer" and reason in entry.reason, entry.reason


def test_lazy_native_layer_takes_the_generic_path():
    # sparsejit.nn's SAGEConv needs the sizes; PyG's own SAGEConv (its Linears lazy, not
    # initialised yet) keeps its forward and runs its mean aggregation on the SpMM path
    torch.manual_seed(0)
    model = Wrap(pnn.SAGEConv(-1, 6))
    x, ei = torch.randn(40, 8), graph()
    ref = copy.deepcopy(model)
    _, rep = sj.accelerate(model, return_report=True)
    assert "propagate" in model.layer.__dict__ and "lazy" in rep.entries[0].reason
    torch.manual_seed(1)  # the lazy initialisation draws the weights: the same on both
    got = model(x, ei)
    torch.manual_seed(1)
    torch.testing.assert_close(got, ref(x, ei), atol=1e-5, rtol=1e-5)
    # once a forward pass has sized its Linears (as in a to_hetero model), it converts
    layer = sj.restore(model).layer
    assert layer.in_channels == -1 and "propagate" not in layer.__dict__
    _, rep = sj.accelerate(model, return_report=True)
    assert isinstance(model.layer, sj.nn.SAGEConv) and model.layer.in_channels == 8, rep
    torch.testing.assert_close(model(x, ei), ref(x, ei), atol=1e-5, rtol=1e-5)


def test_message_hook_leaves_native_layer_to_pyg():
    model = Wrap(pnn.GCNConv(8, 6))
    model.layer.register_message_forward_hook(lambda m, a, o: o)
    _, rep = sj.accelerate(model, return_report=True)
    # not the native layer (its hook would not run); the generic path serves it, and falls
    # back to PyG's propagate at run time while the hook is there
    assert type(model.layer).__module__.startswith("torch_geometric")
    assert "hook" in rep.entries[0].reason
    ref = copy.deepcopy(model)
    x, ei = torch.randn(40, 8), graph()
    torch.testing.assert_close(model(x, ei), ref(x, ei))


def test_bad_model_argument():
    with pytest.raises(TypeError, match="model"):
        sj.accelerate("not a module")
    with pytest.raises(TypeError, match="model"):
        sj.restore(None)


def test_verbose_prints_the_table(capsys):
    model = torch.nn.ModuleDict({"a": pnn.GCNConv(4, 4),
                                 "b": pnn.GENConv(4, 4, aggr=["softmax", "mean"])})
    sj.accelerate(model, verbose=True)
    text = capsys.readouterr().out
    assert "a " in text and "sparsejit.GCNConv" in text and "left as it was" in text
    assert sj.convert.last_report() is not None


@pytest.mark.slow  # (8-23 s: runs in make test-slow)
def test_compile_fullgraph_native_model():
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = pnn.GCNConv(8, 16), pnn.SAGEConv(16, 16)
            self.c3 = pnn.GATConv(16, 4, heads=2)

        def forward(self, x, ei):
            return self.c3(self.c2(self.c1(x, ei).relu(), ei).relu(), ei)

    model = Net()
    ref = copy.deepcopy(model)
    sj.accelerate(model)
    x, ei = torch.randn(40, 8), graph()
    compiled = torch.compile(model, fullgraph=True)
    same_outputs_and_input_grads(lambda v: compiled(v, ei), lambda v: ref(v, ei), x)


def test_export_native_model():
    torch.manual_seed(0)
    model = Wrap(pnn.GCNConv(8, 6))
    ref = copy.deepcopy(model)
    sj.accelerate(model)
    x, ei = torch.randn(40, 8), graph()
    ep = torch.export.export(model, (x, ei))
    torch.testing.assert_close(ep.module()(x, ei), ref(x, ei), atol=1e-5, rtol=1e-5)
    x2, ei2 = torch.randn(40, 8), graph(seed=7)  # another graph of the same sizes
    torch.testing.assert_close(ep.module()(x2, ei2), ref(x2, ei2), atol=1e-5, rtol=1e-5)
