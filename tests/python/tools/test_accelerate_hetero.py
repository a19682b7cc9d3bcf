"""accelerate on heterogeneous PyG models: to_hetero of SAGE / GraphConv / GAT models (lazy
sizes, known after the first forward pass) and HeteroConv. Every per-edge-type conv becomes
its sparsejit layer; in to_hetero models, a layer's SAGEConv / GraphConv (sum, mean) edge
types summed into one node type run as one RGMS call (convert/hetero.py); outputs and the
gradients of every input and parameter equal PyG's in float64; restore."""

import copy

import pytest
import torch

import sparsejit as sj

pyg = pytest.importorskip("torch_geometric")
from torch_geometric import nn as pnn  # noqa: E402

TYPES = (["author", "paper"], [("author", "writes", "paper"),
                               ("paper", "rev_writes", "author"),
                               ("paper", "cites", "paper")])
TOL = dict(atol=1e-9, rtol=1e-9)


def hetero_data(seed=0, empty_type=False):
    g = torch.Generator().manual_seed(seed)
    x = {"author": torch.randn(30, 8, generator=g, dtype=torch.float64),
         "paper": torch.randn(50, 12, generator=g, dtype=torch.float64)}
    writes = torch.stack([torch.randint(0, 30, (120,), generator=g),
                          torch.randint(0, 45, (120,), generator=g)])
    cites = torch.randint(0, 50, (2, 200), generator=g)
    cites[1, :100] = 3  # skewed: half the citations into one paper
    if empty_type:
        cites = cites[:, :0]
    ei = {TYPES[1][0]: writes, TYPES[1][1]: writes.flip(0), TYPES[1][2]: cites}
    return x, ei


class Net(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        make = {"sage": lambda: pnn.SAGEConv((-1, -1), 16),
                "graphconv": lambda: pnn.GraphConv((-1, -1), 16, aggr="max"),
                "gat": lambda: pnn.GATConv((-1, -1), 8, heads=2, add_self_loops=False)}[kind]
        self.c1, self.c2 = make(), make()

    def forward(self, x, edge_index):
        return self.c2(self.c1(x, edge_index).relu(), edge_index)


def _run(model, x, ei):
    xs = {k: v.detach().clone().requires_grad_(True) for k, v in x.items()}
    model.zero_grad()
    out = model(xs, ei)
    sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum()
        for o in out.values()).backward()
    return ({k: v.detach() for k, v in out.items()}, {k: v.grad for k, v in xs.items()},
            {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})


def _assert_same(got, want):
    for a, b in zip(got, want):
        assert a.keys() == b.keys()
        for k in b:
            torch.testing.assert_close(a[k], b[k], **TOL, msg=str(k))


@pytest.mark.parametrize("empty_type", [False, True])
@pytest.mark.parametrize("kind", ["sage", "graphconv", "gat"])
def test_to_hetero_model(kind, empty_type):
    torch.manual_seed(0)
    x, ei = hetero_data(empty_type=empty_type)
    model = pnn.to_hetero(Net(kind), TYPES, aggr="sum").double()
    with torch.no_grad():
        model(x, ei)  # sizes the lazy Linears
    ref = copy.deepcopy(model)
    before = model.state_dict(keep_vars=True)
    _, rep = sj.accelerate(model, return_report=True)
    assert len(rep.converted) == 6 and not rep.left, rep
    assert all(e.became.startswith("sparsejit.") for e in rep.entries), rep
    after = model.state_dict(keep_vars=True)
    assert list(after) == list(before) and all(after[k] is before[k] for k in before)
    _assert_same(_run(model, x, ei), _run(ref, x, ei))
    sj.restore(model)
    assert all(type(m).__module__.startswith("torch_geometric") for m in
               (model.c1[t] for t in model.c1.keys()))


def test_hetero_conv():
    torch.manual_seed(0)
    x, ei = hetero_data(seed=1)
    conv = pnn.HeteroConv({TYPES[1][0]: pnn.SAGEConv((8, 12), 16),
                           TYPES[1][1]: pnn.GATConv((12, 8), 16, add_self_loops=False),
                           TYPES[1][2]: pnn.GCNConv(12, 16)}, aggr="sum").double()
    ref = copy.deepcopy(conv)
    _, rep = sj.accelerate(conv, return_report=True)
    assert [e.became for e in rep.entries] == ["sparsejit.SAGEConv", "sparsejit.GATConv",
                                               "sparsejit.GCNConv"], rep
    _assert_same(_run(conv, x, ei), _run(ref, x, ei))


def equal_width_data(seed=0, authors=30, empty_type=False):
    """Both node types 10 wide (so every layer's relations into 'paper' group), skewed."""
    g = torch.Generator().manual_seed(seed)
    x = {"author": torch.randn(authors, 10, generator=g, dtype=torch.float64),
         "paper": torch.randn(50, 10, generator=g, dtype=torch.float64)}
    writes = torch.stack([torch.randint(0, authors, (150,), generator=g),
                          torch.randint(0, 50, (150,), generator=g)])
    writes[1, :60] = 7  # skewed
    cites = torch.randint(0, 50, (2, 0 if empty_type else 200), generator=g)
    return x, {TYPES[1][0]: writes, TYPES[1][1]: writes.flip(0), TYPES[1][2]: cites}


class Net3(torch.nn.Module):
    def __init__(self, make):
        super().__init__()
        self.c1, self.c2 = make(), make()

    def forward(self, x, edge_index):
        return self.c2(self.c1(x, edge_index).relu(), edge_index)


GROUPABLE = {"sage": lambda: pnn.SAGEConv((-1, -1), 16),
             "graphconv_add": lambda: pnn.GraphConv((-1, -1), 16, aggr="add"),
             "graphconv_mean": lambda: pnn.GraphConv((-1, -1), 16, aggr="mean")}


@pytest.mark.parametrize("data", ["equal", "one_author", "empty_type", "unequal"])
@pytest.mark.parametrize("kind", sorted(GROUPABLE))
def test_to_hetero_edge_types_grouped(kind, data):
    torch.manual_seed(0)
    x, ei = (hetero_data() if data == "unequal" else
             equal_width_data(authors=1 if data == "one_author" else 30,
                              empty_type=data == "empty_type"))
    model = pnn.to_hetero(Net3(GROUPABLE[kind]), TYPES, aggr="sum").double()
    with torch.no_grad():
        model(x, ei)
    ref = copy.deepcopy(model)
    before = model.state_dict(keep_vars=True)
    _, rep = sj.accelerate(model, return_report=True)
    assert len(rep.converted) == 6 and not rep.left, rep
    # 'paper' gets writes + cites in each layer; in the unequal data, layer 1's sources are
    # 8 and 12 wide: not grouped, and the report says why.
    want = [("c1", data != "unequal"), ("c2", True)]
    assert [(g.path.split("[")[0], g.converted) for g in rep.groups] == want, rep
    assert all("author__writes__paper + paper__cites__paper" in g.path for g in rep.groups)
    if data == "unequal":
        assert "widths [8, 12]" in rep.groups[0].reason, rep
    groups = [n for n, _ in model.named_children() if n.startswith("_sparsejit_hetero_group")]
    assert len(groups) == sum(g.converted for g in rep.groups)
    assert "c2.author__writes__paper" not in model.code and "c2.paper__cites__paper" not in \
        model.code
    after = model.state_dict(keep_vars=True)
    assert list(after) == list(before) and all(after[k] is before[k] for k in before)
    _assert_same(_run(model, x, ei), _run(ref, x, ei))
    # Idempotent: a second call neither converts nor groups again.
    _, rep2 = sj.accelerate(model, return_report=True)
    assert not rep2.groups and all(e.reason == "already accelerated" for e in rep2.entries)
    sj.restore(model)
    assert "_sparsejit_hetero_group" not in model.code and not any(
        n.startswith("_sparsejit_hetero_group") for n, _ in model.named_children())
    _assert_same(_run(model, x, ei), _run(ref, x, ei))


def test_to_hetero_mixed_kinds_not_grouped():
    """GAT's softmax is per relation, GraphConv max does not add up: left per edge type."""
    x, ei = equal_width_data()
    for make, why in ((lambda: pnn.GATConv((-1, -1), 8, add_self_loops=False), "GATConv"),
                      (lambda: pnn.GraphConv((-1, -1), 8, aggr="max"), "aggr='max'")):
        model = pnn.to_hetero(Net3(make), TYPES, aggr="sum").double()
        with torch.no_grad():
            model(x, ei)
        ref = copy.deepcopy(model)
        _, rep = sj.accelerate(model, return_report=True)
        assert len(rep.groups) == 2 and not any(g.converted for g in rep.groups), rep
        assert all(why in g.reason for g in rep.groups), rep
        assert "_sparsejit_hetero_group" not in model.code
        _assert_same(_run(model, x, ei), _run(ref, x, ei))


@pytest.mark.slow
def test_to_hetero_grouped_compiles_and_exports():
    x, ei = equal_width_data()
    model = pnn.to_hetero(Net3(GROUPABLE["sage"]), TYPES, aggr="sum").double()
    with torch.no_grad():
        model(x, ei)
    ref = copy.deepcopy(model)
    _, rep = sj.accelerate(model, return_report=True)
    assert all(g.converted for g in rep.groups) and len(rep.groups) == 2, rep
    want = ref(x, ei)
    for run in (torch.compile(model, fullgraph=True), torch.export.export(model, (x, ei)).module()):
        got = run(x, ei)
        assert got.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], **TOL)


@pytest.mark.parametrize("kind", sorted(GROUPABLE))
def test_hetero_conv_edge_types_grouped(kind):
    torch.manual_seed(0)
    x, ei = equal_width_data(seed=3)
    make = {"sage": lambda: pnn.SAGEConv(10, 16),
            "graphconv_add": lambda: pnn.GraphConv(10, 16, aggr="add"),
            "graphconv_mean": lambda: pnn.GraphConv(10, 16, aggr="mean")}[kind]
    conv = pnn.HeteroConv({t: make() for t in TYPES[1]}, aggr="sum").double()
    ref = copy.deepcopy(conv)
    before = conv.state_dict(keep_vars=True)
    _, rep = sj.accelerate(conv, return_report=True)
    assert len(rep.converted) == 3, rep
    assert [(g.path, g.converted) for g in rep.groups] == [
        ("(model)[author__writes__paper + paper__cites__paper]", True)], rep
    after = conv.state_dict(keep_vars=True)
    assert list(after) == list(before) and all(after[k] is before[k] for k in before)
    _assert_same(_run(conv, x, ei), _run(ref, x, ei))
    # A node type missing from the call: that group's edge types are skipped, as PyG does.
    x_only_paper = {"paper": x["paper"]}
    ei_cites = {TYPES[1][2]: ei[TYPES[1][2]]}
    _assert_same(_run(conv, x_only_paper, ei_cites), _run(ref, x_only_paper, ei_cites))
    sj.restore(conv)
    assert "forward" not in conv.__dict__
    _assert_same(_run(conv, x, ei), _run(ref, x, ei))


def test_hetero_conv_mean_not_grouped():
    x, ei = equal_width_data()
    conv = pnn.HeteroConv({t: pnn.SAGEConv(10, 16) for t in TYPES[1]}, aggr="mean").double()
    ref = copy.deepcopy(conv)
    _, rep = sj.accelerate(conv, return_report=True)
    assert [g.converted for g in rep.groups] == [False] and "aggr='mean'" in \
        rep.groups[0].reason, rep
    _assert_same(_run(conv, x, ei), _run(ref, x, ei))


def test_group_edge_types_inference_only(monkeypatch):
    """group_edge_types='inference': the rgms call serves passes that record no gradient; a
    training pass runs each relation's layer. Both equal PyG."""
    from sparsejit.families.rgms import ops as rgms_ops
    calls = []
    real = rgms_ops.rgms
    monkeypatch.setattr(rgms_ops, "rgms", lambda *a, **k: calls.append(1) or real(*a, **k))
    x, ei = equal_width_data(seed=5)
    model = pnn.to_hetero(Net3(GROUPABLE["sage"]), TYPES, aggr="sum").double()
    with torch.no_grad():
        model(x, ei)
    ref = copy.deepcopy(model)
    _, rep = sj.accelerate(model, group_edge_types="inference", return_report=True)
    assert all(g.converted and "(inference)" in g.reason for g in rep.groups), rep
    _assert_same(_run(model, x, ei), _run(ref, x, ei))
    assert not calls  # training: the layers
    with torch.no_grad():
        got, want = model(x, ei), ref(x, ei)
    assert len(calls) == 2  # inference: one rgms per grouped layer
    for k in want:
        torch.testing.assert_close(got[k], want[k], **TOL)
    with pytest.raises(ValueError, match="group_edge_types"):
        sj.accelerate(copy.deepcopy(ref), group_edge_types="sometimes")
