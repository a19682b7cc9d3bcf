"""accelerate recognises attention inside a PyG layer's message (convert/attention_message.py):
GAT-style additive scores (one concatenation, or one term per side), GATv2's, dot-product scores
(scaled, or by a parameter as AGNN does), one-sided scores, edge-feature terms, several heads,
bipartite inputs;
each runs as one fused sj.gat_attention / gatv2_attention / sparse_attention call. Outputs, input and
parameter gradients equal PyG's in float64 on random, skewed, one-node and empty graphs; the
first call's check against the per-edge path catches a wrong form; refusals keep the per-edge
path with a reason; restore; compile and export."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import sparsejit as sj
from conftest import edge_index_cases
from sparsejit.convert import attention_message as am
from sparsejit.convert import edge_path as ep

pyg = pytest.importorskip("torch_geometric")
from torch_geometric import nn as pnn  # noqa: E402
from torch_geometric.nn import MessagePassing  # noqa: E402
from torch_geometric.utils import softmax  # noqa: E402

TOL = dict(atol=1e-9, rtol=1e-9)
N, C = 40, 8


class CatAttention(MessagePassing):
    """GAT's score written as one concatenation: ``(cat([x_i, x_j]) * att).sum(-1)``."""

    def __init__(self, cin, cout, heads=1, slope=0.2):
        super().__init__(aggr="add", node_dim=0)
        self.heads, self.cout, self.slope = heads, cout, slope
        self.lin = torch.nn.Linear(cin, heads * cout)
        self.att = torch.nn.Parameter(torch.randn(1, heads, 2 * cout))

    def forward(self, x, edge_index):
        h = self.lin(x).view(-1, self.heads, self.cout)
        out = self.propagate(edge_index, x=h)
        return out.reshape(out.shape[0], -1)

    def message(self, x_i, x_j, index, ptr, size_i):
        a = F.leaky_relu((torch.cat([x_i, x_j], -1) * self.att).sum(-1), self.slope)
        a = softmax(a if self.heads > 1 else a.squeeze(-1), index, ptr, size_i)
        return x_j * (a if self.heads > 1 else a.unsqueeze(-1)).unsqueeze(-1)


class SplitAttention(MessagePassing):
    """GAT's score as one term per side, value transformed per source, weights first."""

    def __init__(self, cin, cout, heads=2):
        super().__init__(aggr="add", node_dim=0)
        self.heads, self.cout = heads, cout
        self.lin = torch.nn.Linear(cin, heads * cout)
        self.att_dst = torch.nn.Parameter(torch.randn(1, heads, cout))
        self.att_src = torch.nn.Parameter(torch.randn(1, heads, cout))

    def forward(self, x, edge_index):
        if isinstance(x, tuple):
            h = (self.lin(x[0]).view(-1, self.heads, self.cout),
                 self.lin(x[1]).view(-1, self.heads, self.cout))
        else:
            h = self.lin(x).view(-1, self.heads, self.cout)
        out = self.propagate(edge_index, x=h)
        return out.reshape(out.shape[0], -1)

    def message(self, x_i, x_j, index, ptr, size_i):
        s = (x_i * self.att_dst).sum(dim=-1) + (torch.tanh(x_j) * self.att_src).sum(-1)
        a = softmax(F.leaky_relu(s, 0.1), index, ptr, size_i)
        return a.unsqueeze(-1) * (2.0 * x_j).relu()


class DotAttention(MessagePassing):
    """Transformer-style: queries at targets, keys and values at sources, 1/sqrt(d)."""

    def __init__(self, cin, d, heads=2):
        super().__init__(aggr="add", node_dim=0)
        self.heads, self.d = heads, d
        self.q, self.k = torch.nn.Linear(cin, heads * d), torch.nn.Linear(cin, heads * d)
        self.v = torch.nn.Linear(cin, heads * d)

    def forward(self, x, edge_index):
        H, D = self.heads, self.d
        out = self.propagate(edge_index, q=self.q(x).view(-1, H, D),
                             k=self.k(x).view(-1, H, D), v=self.v(x).view(-1, H, D))
        return out.reshape(out.shape[0], -1)

    def message(self, q_i, k_j, v_j, index, ptr, size_i):
        a = (q_i * k_j).sum(-1) / math.sqrt(self.d)
        return v_j * softmax(a, index, ptr, size_i).unsqueeze(-1)


class SourceScore(MessagePassing):
    """A score of the source alone (softmax over each target's in-edges)."""

    def __init__(self, cin):
        super().__init__(aggr="add", node_dim=0)
        self.lin = torch.nn.Linear(cin, cin)
        self.att = torch.nn.Parameter(torch.randn(cin))

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=self.lin(x))

    def message(self, x_j, index, ptr, size_i):
        return x_j * softmax((x_j * self.att).sum(-1), index, ptr, size_i).view(-1, 1)


class V2Attention(MessagePassing):
    """GATv2's score: att . leaky_relu(x_i + x_j), targets and sources transformed apart."""

    def __init__(self, cin, cout, heads=2):
        super().__init__(aggr="add", node_dim=0)
        self.heads, self.cout = heads, cout
        self.lin_l = torch.nn.Linear(cin, heads * cout)
        self.lin_r = torch.nn.Linear(cin, heads * cout)
        self.att = torch.nn.Parameter(torch.randn(1, heads, cout))

    def forward(self, x, edge_index):
        H, D = self.heads, self.cout
        out = self.propagate(edge_index, x=(self.lin_l(x).view(-1, H, D),
                                            self.lin_r(x).view(-1, H, D)))
        return out.reshape(out.shape[0], -1)

    def message(self, x_i, x_j, index, ptr, size_i):
        a = (F.leaky_relu(x_i + x_j, 0.2) * self.att).sum(-1)
        return x_j * softmax(a, index, ptr, size_i).unsqueeze(-1)


class DroppedAttention(CatAttention):
    """Dropout on the attention weights: the fused call's dropout in training."""

    def message(self, x_i, x_j, index, ptr, size_i):
        a = F.leaky_relu((torch.cat([x_i, x_j], -1) * self.att).sum(-1), 0.2)
        a = F.dropout(softmax(a, index, ptr, size_i), p=0.5, training=self.training)
        return x_j * a.unsqueeze(-1)


class DroppedFeatures(CatAttention):
    """Dropout on the gathered features (per edge in PyG): left on the per-edge path."""

    def message(self, x_i, x_j, index, ptr, size_i):
        a = F.leaky_relu((torch.cat([x_i, x_j], -1) * self.att).sum(-1), 0.2)
        v = F.dropout(x_j, 0.5, self.training)
        return v * softmax(a, index, ptr, size_i).unsqueeze(-1)


class MixedAttention(CatAttention):
    """GATv2-like: a nonlinearity of both endpoints, not split per node."""

    def message(self, x_i, x_j, index, ptr, size_i):
        a = (torch.tanh(torch.cat([x_i, x_j], -1)) * self.att).sum(-1)
        return x_j * softmax(a, index, ptr, size_i).unsqueeze(-1)


class RowMixing(CatAttention):
    """A source term that mixes rows (a mean over edges): may not run per node."""

    def message(self, x_i, x_j, index, ptr, size_i):
        a = F.leaky_relu((torch.cat([x_i, x_j - x_j.mean(0)], -1) * self.att).sum(-1), 0.2)
        return x_j * softmax(a, index, ptr, size_i).unsqueeze(-1)


class EdgeFeatureAttention(CatAttention):
    """An edge-feature term in the score (sj.gat_attention's edge_logits)."""

    def forward(self, x, edge_index):
        h = self.lin(x).view(-1, self.heads, self.cout)
        w = torch.linspace(0, 1, edge_index.shape[1], dtype=x.dtype).view(-1, 1)
        return self.propagate(edge_index, x=h, edge_attr=w).reshape(x.shape[0], -1)

    def message(self, x_i, x_j, edge_attr, index, ptr, size_i):
        a = (torch.cat([x_i, x_j], -1) * self.att).sum(-1) + edge_attr
        return x_j * softmax(a, index, ptr, size_i).unsqueeze(-1)


class EdgeLinearAttention(MessagePassing):
    """GAT with edge features in one concatenation: cat([x_i, x_j, lin_e(e)]) * att."""

    def __init__(self, cin, cout, heads=2, edge_dim=3):
        super().__init__(aggr="add", node_dim=0)
        self.heads, self.cout, self.edge_dim = heads, cout, edge_dim
        self.lin = torch.nn.Linear(cin, heads * cout)
        self.lin_e = torch.nn.Linear(edge_dim, heads * cout, bias=False)
        self.att = torch.nn.Parameter(torch.randn(1, heads, 3 * cout))

    def forward(self, x, edge_index):
        h = self.lin(x).view(-1, self.heads, self.cout)
        e = torch.cos(torch.arange(edge_index.shape[1] * self.edge_dim, dtype=x.dtype)).view(
            -1, self.edge_dim)
        return self.propagate(edge_index, x=h, edge_attr=e).reshape(x.shape[0], -1)

    def message(self, x_i, x_j, edge_attr, index, ptr, size_i):
        e = self.lin_e(edge_attr).view(-1, self.heads, self.cout)
        a = F.leaky_relu((torch.cat([x_i, x_j, e], -1) * self.att).sum(-1), 0.2)
        return x_j * softmax(a, index, ptr, size_i).unsqueeze(-1)


class EdgeTimesNode(EdgeFeatureAttention):
    """A score term of an edge input times a node feature: not split per node."""

    def message(self, x_i, x_j, edge_attr, index, ptr, size_i):
        a = (x_j * self.att[..., :self.cout]).sum(-1) + (x_i * edge_attr.unsqueeze(-1)).sum(-1)
        return x_j * softmax(a, index, ptr, size_i).unsqueeze(-1)


GRAPHS = edge_index_cases(N)

LAYERS = {  # name: (factory, what the report names)
    "cat_one_head": (lambda: CatAttention(C, 5), "sj.gat_attention"),
    "cat_heads": (lambda: CatAttention(C, 3, heads=3, slope=0.05), "sj.gat_attention"),
    "split_heads": (lambda: SplitAttention(C, 4), "sj.gat_attention"),
    "source_score": (lambda: SourceScore(C), "sj.gat_attention"),
    "dot_heads": (lambda: DotAttention(C, 4), "sj.sparse_attention"),
    "agnn": (lambda: pnn.AGNNConv(requires_grad=True), "sj.sparse_attention"),
    "v2_heads": (lambda: V2Attention(C, 3), "sj.gatv2_attention"),
    "edge_term": (lambda: EdgeFeatureAttention(C, 4, heads=2), "sj.gat_attention"),
    "edge_concat": (lambda: EdgeLinearAttention(C, 4), "sj.gat_attention"),
}


def _run(layer, x, ei):
    if isinstance(x, tuple):
        x = tuple(t.detach().clone().requires_grad_(True) for t in x)
    else:
        x = x.detach().clone().requires_grad_(True)
    layer.zero_grad()
    out = layer(x, ei)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    grads = tuple(t.grad for t in x) if isinstance(x, tuple) else (x.grad,)
    return out.detach(), grads, {k: p.grad.clone() for k, p in layer.named_parameters()
                                 if p.grad is not None}


def _same(got, want):
    torch.testing.assert_close(got[0], want[0], **TOL)
    for g, w in zip(got[1], want[1]):
        torch.testing.assert_close(g, w, **TOL)
    assert got[2].keys() == want[2].keys()
    for k in want[2]:
        torch.testing.assert_close(got[2][k], want[2][k], **TOL, msg=k)


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_fused_attention_equals_pyg(name, graph, monkeypatch):
    make, what = LAYERS[name]
    torch.manual_seed(0)
    n, ei = GRAPHS[graph]
    layer = make().double()
    ref = copy.deepcopy(layer)
    before = layer.state_dict(keep_vars=True)
    new, rep = sj.accelerate(layer, return_report=True)
    assert new is layer and am.installed(layer)
    (entry,) = rep.entries
    assert entry.became.endswith("+ fused attention") and what in entry.reason, entry.reason
    after = layer.state_dict(keep_vars=True)
    assert list(after) == list(before) and all(after[k] is before[k] for k in before)
    x = torch.randn(n, C, dtype=torch.float64)
    _same(_run(layer, x, ei), _run(ref, x, ei))  # first call: checked against per edge
    assert layer.__dict__[am.FORM].verified and not layer.__dict__[am.FORM].failed
    per_edge = []
    monkeypatch.setattr(am, "_per_edge", lambda *a: per_edge.append(1))
    x = torch.randn(n, C, dtype=torch.float64)  # fresh inputs, the fused call alone
    _same(_run(layer, x, ei), _run(ref, x, ei))
    assert not per_edge
    assert sj.accelerate(layer) is layer  # idempotent
    assert sj.restore(layer) is layer and not am.installed(layer) and not ep.installed(layer)
    assert "propagate" not in layer.__dict__ and "aggregate" not in layer.__dict__


def test_bipartite():
    torch.manual_seed(1)
    ref = SplitAttention(C, 3, heads=2).double()
    layer = sj.accelerate(copy.deepcopy(ref))
    xs, xd = torch.randn(30, C, dtype=torch.float64), torch.randn(12, C, dtype=torch.float64)
    ei = torch.stack([torch.randint(0, 30, (90,)), torch.randint(0, 12, (90,))])
    _same(_run(layer, (xs, xd), ei), _run(ref, (xs, xd), ei))
    assert layer.__dict__[am.FORM].verified


def test_float32_larger_graph_runs_the_fused_op(monkeypatch):
    from sparsejit.families.attention import ops
    calls = []
    gat = ops.gat_attention
    monkeypatch.setattr(ops, "gat_attention", lambda *a, **k: calls.append(1) or gat(*a, **k))
    torch.manual_seed(2)
    ref = CatAttention(16, 8, heads=4)
    layer = sj.accelerate(copy.deepcopy(ref))
    n = 3000
    ei = torch.randint(0, n, (2, 30000))
    x = torch.randn(n, 16)
    got, want = _run(layer, x, ei), _run(ref, x, ei)
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got[1][0], want[1][0], atol=1e-5, rtol=1e-4)
    for k in want[2]:
        torch.testing.assert_close(got[2][k], want[2][k], atol=1e-4, rtol=1e-4, msg=k)
    assert calls == [1]


@pytest.mark.parametrize("make, why", [
    (lambda: DroppedFeatures(C, 4), "may not run per node"),
    (lambda: MixedAttention(C, 4), "neither one side's"),
    (lambda: RowMixing(C, 4), "may not run per node"),
    (lambda: EdgeTimesNode(C, 4), "neither one side's"),
])
def test_refused_forms_stay_per_edge_with_reason(make, why):
    torch.manual_seed(0)
    layer = make().double()
    ref = copy.deepcopy(layer)
    _, rep = sj.accelerate(layer, return_report=True)
    assert not am.installed(layer)
    (entry,) = rep.entries
    assert why in entry.reason, entry.reason
    if ep.installed(layer) and not isinstance(layer, DroppedFeatures):
        n, ei = GRAPHS["random"]
        x = torch.randn(n, C, dtype=torch.float64)
        _same(_run(layer, x, ei), _run(ref, x, ei))


def test_dropout_on_the_weights_is_the_fused_dropout(monkeypatch):
    from sparsejit.families.attention import ops
    seen = []
    gat = ops.gat_attention
    monkeypatch.setattr(ops, "gat_attention",
                        lambda *a, **k: seen.append(k.get("dropout")) or gat(*a, **k))
    torch.manual_seed(0)
    ref = DroppedAttention(C, 4, heads=2).double()
    layer = sj.accelerate(copy.deepcopy(ref))
    n, ei = GRAPHS["random"]
    x = torch.randn(n, C, dtype=torch.float64)
    _, rep = sj.accelerate(layer, return_report=True)
    assert am.installed(layer)
    got = _run(layer, x, ei)  # training: checked without dropout, then run with it
    assert layer.__dict__[am.FORM].verified and seen == [0.0, 0.5]
    assert torch.isfinite(got[0]).all() and all(torch.isfinite(g).all() for g in got[2].values())
    ref.eval(), layer.eval()
    nodrop = _run(ref, x, ei)
    assert not torch.allclose(got[0], nodrop[0])  # weights were dropped
    _same(_run(layer, x, ei), nodrop)  # eval: no dropout, equal to PyG
    assert seen[-1] == 0.0


def test_a_wrong_form_is_caught_by_the_first_call():
    torch.manual_seed(0)
    ref = CatAttention(C, 4, heads=2).double()
    layer = sj.accelerate(copy.deepcopy(ref))
    layer.__dict__[am.FORM].slope = 0.5  # plant a wrong form: the check must notice
    n, ei = GRAPHS["random"]
    x = torch.randn(n, C, dtype=torch.float64)
    with pytest.warns(UserWarning, match="did not match"):
        got = _run(layer, x, ei)
    _same(got, _run(ref, x, ei))
    form = layer.__dict__[am.FORM]
    assert form.failed and not form.verified
    _same(_run(layer, x, ei), _run(ref, x, ei))  # and stays on the per-edge path


def test_calls_the_fused_form_cannot_take_go_per_edge():
    torch.manual_seed(0)
    ref = CatAttention(C, 4, heads=2).double()
    layer = sj.accelerate(copy.deepcopy(ref))
    n, ei = GRAPHS["random"]
    x = torch.randn(n, C, dtype=torch.float64)
    adj = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1], dtype=torch.float64),
                                  (n, n)).coalesce().to_sparse_csr()
    torch.testing.assert_close(layer(x, adj), ref(x, adj), **TOL)
    assert not layer.__dict__[am.FORM].verified  # not checked on a call it did not serve
    _same(_run(layer, x, ei), _run(ref, x, ei))
    assert layer.__dict__[am.FORM].verified


def test_inside_a_model_and_restore():
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = CatAttention(C, 4, heads=2), DotAttention(8, 4, heads=1)

        def forward(self, x, ei):
            return self.b(self.a(x, ei).relu(), ei)

    ref = Net().double()
    net = sj.accelerate(copy.deepcopy(ref))
    assert am.installed(net.a) and am.installed(net.b)
    n, ei = GRAPHS["skewed"]
    x = torch.randn(n, C, dtype=torch.float64)
    _same(_run(net, x, ei), _run(ref, x, ei))
    sj.restore(net)
    assert not am.installed(net.a) and not am.installed(net.b)
    _same(_run(net, x, ei), _run(ref, x, ei))


@pytest.mark.slow  # torch.compile: seconds a case
@pytest.mark.parametrize("name", ["cat_heads", "dot_heads", "agnn", "v2_heads"])
def test_compile_fullgraph(name, monkeypatch):
    make, _ = LAYERS[name]
    torch.manual_seed(0)
    ref = make()
    layer = sj.accelerate(copy.deepcopy(ref))
    n, ei = GRAPHS["random"]
    x = torch.randn(n, C)
    layer(x, ei)  # the eager check
    assert layer.__dict__[am.FORM].verified
    per_edge = []
    real = am._per_edge
    monkeypatch.setattr(am, "_per_edge", lambda *a: per_edge.append(1) or real(*a))
    compiled = torch.compile(layer, fullgraph=True)
    got, want = _run(compiled, x, ei), _run(ref, x, ei)
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got[1][0], want[1][0], atol=1e-5, rtol=1e-4)
    assert not per_edge


@pytest.mark.slow
def test_compile_before_any_eager_call_stays_per_edge():
    torch.manual_seed(0)
    ref = CatAttention(C, 4, heads=2)
    layer = sj.accelerate(copy.deepcopy(ref))
    n, ei = GRAPHS["random"]
    x = torch.randn(n, C)
    got = torch.compile(layer, fullgraph=True)(x, ei)
    torch.testing.assert_close(got, ref(x, ei), atol=1e-5, rtol=1e-4)
    assert not layer.__dict__[am.FORM].verified


@pytest.mark.parametrize("name", ["cat_heads", "dot_heads"])
def test_export(name):
    make, _ = LAYERS[name]
    torch.manual_seed(0)
    ref = make().eval()
    layer = sj.accelerate(copy.deepcopy(ref))
    n, ei = GRAPHS["random"]
    x = torch.randn(n, C)
    layer(x, ei)
    exported = torch.export.export(layer, (x, ei))
    text = str(exported.graph)
    assert "sparse_attention" in text, text[:2000]
    torch.testing.assert_close(exported.module()(x, ei), ref(x, ei), atol=1e-5, rtol=1e-5)
