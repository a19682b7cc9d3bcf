"""accelerate's per-edge path against PyG itself: layers whose messages are not a scaled
gather keep PyG's message; their aggregation (sum / mean / max / min, GENConv's softmax and
power mean) and the ``softmax(alpha, index)`` a message calls run on sj.spmm /
sj.edge_softmax. Outputs, input and parameter gradients equal in float64 on random, skewed,
one-node and empty graphs; a user's own attention layer (one head and several); restore;
compile; calls the path cannot serve go to PyG."""

import copy

import pytest
import torch
import torch.nn.functional as F

import sparsejit as sj
from conftest import edge_index_cases, same_outputs_and_input_grads
from sparsejit.convert import edge_path as ep

pyg = pytest.importorskip("torch_geometric")
from torch_geometric import nn as pnn  # noqa: E402
from torch_geometric.nn import MessagePassing  # noqa: E402
from torch_geometric.utils import softmax  # noqa: E402

TOL = dict(atol=1e-9, rtol=1e-9)
N, C = 40, 8


class UserAttention(MessagePassing):
    """A user's attention layer (not a PyG built-in): PyG's softmax over scores that mix both
    endpoints inside a tanh, so they cannot be split per node (attention layers whose scores
    can be run fused: test_accelerate_attention.py)."""

    def __init__(self, cin, cout, heads=1):
        super().__init__(aggr="add", node_dim=0)
        self.heads, self.cout = heads, cout
        self.lin = torch.nn.Linear(cin, heads * cout)
        self.att = torch.nn.Parameter(torch.randn(1, heads, 2 * cout))

    def forward(self, x, edge_index):
        h = self.lin(x).view(-1, self.heads, self.cout)
        out = self.propagate(edge_index, x=h)
        return out.reshape(out.shape[0], -1)

    def message(self, x_i, x_j, index, ptr, size_i):
        a = F.leaky_relu((torch.tanh(torch.cat([x_i, x_j], -1)) * self.att).sum(-1), 0.2)
        a = softmax(a if self.heads > 1 else a.squeeze(-1), index, ptr, size_i)
        return x_j * (a if self.heads > 1 else a.unsqueeze(-1)).unsqueeze(-1)


GRAPHS = edge_index_cases(N)

LAYERS = {  # name: (factory, takes edge_attr, aggregation the report names)
    "gen_softmax": (lambda: pnn.GENConv(C, C), True, "softmax"),
    "gen_softmax_learn_t_msg_norm": (lambda: pnn.GENConv(C, 6, edge_dim=C, learn_t=True,
                                                         msg_norm=True, learn_msg_scale=True),
                                     True, "softmax"),
    "gen_softmax_sg": (lambda: pnn.GENConv(C, C, aggr="softmax_sg", t=0.5), True, "softmax"),
    "gen_powermean_learn_p": (lambda: pnn.GENConv(C, C, aggr="powermean", learn_p=True,
                                                  p=1.5), True, "powermean"),
    "gen_powermean_fixed": (lambda: pnn.GENConv(C, C, aggr="powermean", p=2.0), True,
                            "powermean"),
    "gen_add": (lambda: pnn.GENConv(C, C, aggr="add"), True, "sum"),
    # without edge features: GENConv's aggregation on node rows (convert/gen_conv.py)
    "gen_nodes_softmax": (lambda: pnn.GENConv(C, C), False, "on node rows"),
    "gen_nodes_softmax_learn_t": (lambda: pnn.GENConv(C, 6, learn_t=True, t=0.7,
                                                      msg_norm=True), False, "softmax"),
    "gen_nodes_softmax_sg": (lambda: pnn.GENConv(C, C, aggr="softmax_sg", t=2.0), False,
                             "softmax"),
    "gen_nodes_powermean": (lambda: pnn.GENConv(C, C, aggr="powermean", learn_p=True, p=1.5),
                            False, "powermean"),
    "gen_nodes_add": (lambda: pnn.GENConv(C, C, aggr="add"), False, "sum"),
    "gen_max": (lambda: pnn.GENConv(C, C, aggr="max"), False, "max"),
    "gen_mean": (lambda: pnn.GENConv(C, C, aggr="mean"), False, "mean"),
    "feast": (lambda: pnn.FeaStConv(C, 6, heads=2), False, "mean"),
    "user_attention": (lambda: UserAttention(C, 5), False, "edge_softmax in message"),
    "user_attention_heads": (lambda: UserAttention(C, 3, heads=2), False,
                             "edge_softmax in message"),
}


def _run(layer, x, ei, ea):
    x = x.detach().clone().requires_grad_(True)
    layer.zero_grad()
    out = layer(x, ei) if ea is None else layer(x, ei, ea)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    return out.detach(), x.grad, {k: p.grad.clone() for k, p in layer.named_parameters()
                                  if p.grad is not None}


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_per_edge_path_equals_pyg(name, graph):
    make, with_ea, what = LAYERS[name]
    torch.manual_seed(0)
    n, ei = GRAPHS[graph]
    layer = make().double()
    if graph == "one_node":
        layer.eval()  # GENConv's BatchNorm refuses to train on one row (in PyG alike)
    ref = copy.deepcopy(layer)
    before = layer.state_dict(keep_vars=True)
    new, rep = sj.accelerate(layer, return_report=True)
    assert new is layer and ep.installed(layer)
    (entry,) = rep.entries
    assert entry.became.endswith("+ SpMM aggregate") and what in entry.reason, entry.reason
    after = layer.state_dict(keep_vars=True)
    assert list(after) == list(before) and all(after[k] is before[k] for k in before)
    x = torch.randn(n, C, dtype=torch.float64)
    ea = torch.randn(ei.shape[1], C, dtype=torch.float64) if with_ea else None
    want, got = _run(ref, x, ei, ea), _run(layer, x, ei, ea)
    torch.testing.assert_close(got[0], want[0], **TOL)
    torch.testing.assert_close(got[1], want[1], **TOL)
    assert got[2].keys() == want[2].keys()
    for k in want[2]:
        torch.testing.assert_close(got[2][k], want[2][k], **TOL, msg=k)
    assert sj.accelerate(layer) is layer  # idempotent
    assert sj.restore(layer) is layer and not ep.installed(layer)
    assert "aggregate" not in layer.__dict__ and "propagate" not in layer.__dict__


def test_the_path_runs_sparsejit_ops(monkeypatch):
    seen = []
    spmm, esm = ep.spmm, ep.edge_softmax
    monkeypatch.setattr(ep, "spmm", lambda *a, **k: seen.append(a[2]) or spmm(*a, **k))
    monkeypatch.setattr(ep, "edge_softmax", lambda *a: seen.append("softmax") or esm(*a))
    n, ei = GRAPHS["random"]
    x = torch.randn(n, C)
    gen = sj.accelerate(pnn.GENConv(C, C))
    gen(x, ei, torch.randn(ei.shape[1], C))  # with edge features: per edge
    assert seen == ["max", "sum", "sum"]  # softmax aggregation: maximum, denominator, sum
    seen.clear()
    from sparsejit.convert import gen_conv
    monkeypatch.setattr(gen_conv, "spmm", lambda *a, **k: seen.append(a[2]) or spmm(*a, **k))
    gen(x, ei)  # without: on node rows
    assert seen == ["max", "sum", "sum"] and gen_conv.installed(gen)
    seen.clear()
    seen.clear()
    layer = sj.accelerate(UserAttention(C, 4))
    layer(x, ei)
    assert seen == ["softmax", "sum"]
    seen.clear()
    sj.restore(layer)(x, ei)
    assert seen == []


def test_restore_gives_the_message_module_back_pyg_softmax():
    import sys
    from torch_geometric.utils._softmax import softmax as pyg_softmax
    here = sys.modules[__name__]
    a, b = UserAttention(C, 4), UserAttention(C, 4)
    sj.accelerate(a)
    sj.accelerate(b)
    assert here.softmax is ep.softmax
    sj.restore(a)
    assert here.softmax is ep.softmax  # b still uses it
    sj.restore(b)
    assert here.softmax is pyg_softmax


def test_softmax_outside_an_accelerated_layer_is_pyg_s():
    sj.accelerate(UserAttention(C, 4))
    src = torch.randn(30, dtype=torch.float64)
    index = torch.randint(0, 5, (30,))
    torch.testing.assert_close(ep.softmax(src, index), softmax(src, index), **TOL)


def test_bipartite_and_sparse_adjacency():
    torch.manual_seed(3)
    ref = pnn.GENConv((C, 6), C).double().eval()
    new = sj.accelerate(copy.deepcopy(ref))
    xs, xd = torch.randn(30, C, dtype=torch.float64), torch.randn(12, 6, dtype=torch.float64)
    ei = torch.stack([torch.randint(0, 30, (80,)), torch.randint(0, 12, (80,))])
    torch.testing.assert_close(new((xs, xd), ei), ref((xs, xd), ei), **TOL)
    # a torch.sparse adjacency: PyG hands aggregate a ptr, which the path leaves to PyG
    adj = torch.sparse_coo_tensor(ei.flip(0), torch.ones(80, dtype=torch.float64),
                                  (12, 30)).coalesce().to_sparse_csr()
    torch.testing.assert_close(new((xs, xd), adj), ref((xs, xd), adj), **TOL)


@pytest.mark.slow  # torch.compile: 1-10 s a case
@pytest.mark.parametrize("name", ["gen_softmax", "gen_powermean_learn_p", "user_attention",
                                  "feast"])
def test_compile_fullgraph(name):
    make, with_ea, _ = LAYERS[name]
    torch.manual_seed(0)
    ref = make().eval()
    new = sj.accelerate(copy.deepcopy(ref))
    n, ei = GRAPHS["random"]
    ea = torch.randn(ei.shape[1], C) if with_ea else None
    compiled = torch.compile(new, fullgraph=True)
    extra = () if ea is None else (ea,)
    same_outputs_and_input_grads(lambda x: compiled(x, ei, *extra), lambda x: ref(x, ei, *extra),
                                 torch.randn(n, C))


def test_aggregation_it_does_not_serve_is_left_with_reason():
    layer = pnn.GENConv(C, C, aggr=["softmax", "mean"])
    _, rep = sj.accelerate(layer, return_report=True)
    assert not ep.installed(layer) and "per-edge path" in rep.left[0].reason


@pytest.mark.parametrize("name", ["gen_softmax", "feast", "user_attention"])
def test_export(name):
    make, with_ea, _ = LAYERS[name]
    torch.manual_seed(0)
    ref = make().eval()
    new = sj.accelerate(copy.deepcopy(ref))
    n, ei = GRAPHS["random"]
    x = torch.randn(n, C)
    args = (x, ei) if not with_ea else (x, ei, torch.randn(ei.shape[1], C))
    exported = torch.export.export(new, args)
    torch.testing.assert_close(exported.module()(*args), ref(*args), atol=1e-5, rtol=1e-5)


def test_gen_conv_far_below_the_channel_maximum_goes_per_edge(monkeypatch):
    from sparsejit.convert import gen_conv
    torch.manual_seed(0)
    ref = pnn.GENConv(C, C).double()
    layer = sj.accelerate(copy.deepcopy(ref))
    n, ei = GRAPHS["random"]
    x = torch.randn(n, C, dtype=torch.float64)
    x[n - 1] = 500.0  # a source with no out-edges here: the channel maxima are 500
    ei = ei[:, ei[0] != n - 1]
    fell_back = []
    per_edge = ep.aggregate
    monkeypatch.setattr(ep, "aggregate", lambda *a, **k: fell_back.append(1) or per_edge(*a, **k))
    layer.__dict__["aggregate"] = ep.aggregate.__get__(layer)
    want, got = _run(ref, x, ei, None), _run(layer, x, ei, None)
    assert fell_back and gen_conv.installed(layer)
    torch.testing.assert_close(got[0], want[0], **TOL)
    torch.testing.assert_close(got[1], want[1], **TOL)
