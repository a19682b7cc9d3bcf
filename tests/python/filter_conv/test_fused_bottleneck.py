"""The fused bottleneck of filter-sparse layers (``filter_conv_bottleneck``, ``FusedBottleneck``,
sparsify's bottleneck pass): fresh random pruned blocks, outputs poisoned, against a float64
dense reference and bitwise against the three layer calls it replaces; bands of every size
(one row, not dividing the image, the whole image), images split between threads, empty /
one-element / skewed patterns, bad arguments, torch.compile / torch.export, and the fx pass."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparsejit.families.filter_conv.fused import (FusedBottleneck, bottleneck_candidates,
                                                  bottleneck_problem, fuse_bottlenecks)
from sparsejit.families.filter_conv.layers import ResidualPrunedConv2d, PrunedConv2d
from sparsejit.families.filter_conv.tuner import sparsify

from test_filter_conv_jit import Bottleneck, randomize_bn

PLAN = torch.ops.sparsejit.filter_conv_plan
BLOCK = torch.ops.sparsejit.filter_conv_bottleneck
CONV = torch.ops.sparsejit.filter_conv


def pruned(shape, sparsity, g):
    w = torch.randn(shape, generator=g)
    return w * (torch.rand(shape, generator=g) >= sparsity)


def block(c, m1, m2, k=(3, 3), sparsity=0.8, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    ws = [pruned((m1, c, 1, 1), sparsity, g), pruned((m2, m1) + k, sparsity, g),
          pruned((c, m2, 1, 1), sparsity, g)]
    bs = [torch.randn(n, generator=g) if bias else None for n in (m1, m2, c)]
    return ws, bs


def reference(ws, bs, x, k):
    d = [None if b is None else b.double() for b in bs]
    a = F.relu(F.conv2d(x.double(), ws[0].double(), d[0]))
    a = F.relu(F.conv2d(a, ws[1].double(), d[1], padding=(k[0] // 2, k[1] // 2)))
    return F.relu(F.conv2d(a, ws[2].double(), d[2]) + x.double())


def args_of(plans, bs):
    out = []
    for p, b in zip(plans, bs):
        out += [*p, b]
    return out


def layer_calls(plans, bs, x, k):
    """The three unfused layer calls the fused op replaces."""
    pad = [k[0] // 2, k[1] // 2]
    a = CONV(*plans[0], x, bs[0], [1, 1], [1, 1], [0, 0], [1, 1], 1, True)
    a = CONV(*plans[1], a, bs[1], list(k), [1, 1], pad, [1, 1], 1, True)
    return CONV(*plans[2], a, bs[2], [1, 1], [1, 1], [0, 0], [1, 1], 1, True, residual=x)


CASES = [  # (c, m1, m2, h, w, kernel, batch)
    (16, 8, 8, 14, 14, (3, 3), 1),
    (16, 8, 8, 14, 14, (3, 3), 3),
    (32, 8, 16, 9, 23, (3, 3), 2),   # rows that no band size divides, wide rows
    (8, 4, 4, 6, 5, (5, 5), 3),      # a halo of two rows
    (8, 4, 4, 7, 7, (1, 3), 2),      # no vertical halo
    (8, 4, 4, 1, 1, (3, 3), 2),      # one pixel
    (8, 4, 4, 1, 9, (3, 3), 1),      # one row
    (4, 2, 2, 5, 5, (3, 3), 0),      # empty batch
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("band", [0, 1, 2, 100])
@pytest.mark.parametrize("threads", [1, 2])
def test_matches_reference_and_layer_calls_bitwise(case, band, threads, poison_empty):
    c, m1, m2, h, w, k, batch = case
    ws, bs = block(c, m1, m2, k, seed=band + 7 * threads)
    x = torch.randn(batch, c, h, w)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for variant in (5, 2, 1):  # vec8x8, vec8x1, scalar: the tile shapes the planner has
            plans = [PLAN(wt, 0.0, variant) for wt in ws]
            y = BLOCK(x, *args_of(plans, bs), band=band)
            assert y.shape == x.shape and not y.isnan().any()
            torch.testing.assert_close(y.double(), reference(ws, bs, x, k), atol=1e-4,
                                       rtol=1e-4)
            # the same products in the same order as the layer calls (same tile variant)
            assert torch.equal(y, layer_calls(plans, bs, x, k)), variant
    finally:
        torch.set_num_threads(old)


def test_strips_recompute_the_halo_where_two_threads_meet():
    # batch 1 on 2 threads: the image is cut into one strip per thread; bands of one row
    # make every band boundary and the strip cut meet conv1's rolling buffer
    ws, bs = block(16, 8, 8, seed=3)
    x = torch.randn(1, 16, 11, 10)
    plans = [PLAN(wt, 0.0, 5) for wt in ws]
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        outs = [BLOCK(x, *args_of(plans, bs), band=b) for b in (1, 2, 3, 4, 11)]
    finally:
        torch.set_num_threads(old)
    for y in outs:
        assert torch.equal(y, outs[-1])
    torch.testing.assert_close(outs[0].double(), reference(ws, bs, x, (3, 3)), atol=1e-4,
                               rtol=1e-4)


@pytest.mark.parametrize("pattern", ["empty", "one", "skewed", "dense"])
def test_empty_one_element_and_skewed_patterns(pattern, poison_empty):
    ws, bs = block(8, 4, 6, sparsity=0.5, seed=1)
    if pattern == "empty":  # every weight pruned: y = relu(b3 + x) through the chain
        ws = [torch.zeros_like(wt) for wt in ws]
    elif pattern == "one":  # one stored weight per layer
        for wt in ws:
            keep = wt.flatten()[0].item() or 1.0
            wt.zero_()
            wt.view(-1)[0] = keep
    elif pattern == "skewed":  # all of conv2's weights in one output channel
        ws[1] = torch.zeros_like(ws[1])
        ws[1][2] = torch.randn(ws[1].shape[1:])
    else:
        ws = [torch.randn(wt.shape) for wt in ws]
    x = torch.randn(2, 8, 9, 7)
    plans = [PLAN(wt, 0.0, 4) for wt in ws]
    y = BLOCK(x, *args_of(plans, bs), band=2)
    torch.testing.assert_close(y.double(), reference(ws, bs, x, (3, 3)), atol=1e-4, rtol=1e-4)
    assert torch.equal(y, layer_calls(plans, bs, x, (3, 3)))


def test_dtypes_and_channels_last_through_float32():
    ws, bs = block(8, 4, 4, seed=2)
    plans = [PLAN(wt, 0.0, 3) for wt in ws]
    x = torch.randn(2, 8, 6, 6)
    y32 = BLOCK(x, *args_of(plans, bs))
    ycl = BLOCK(x.contiguous(memory_format=torch.channels_last), *args_of(plans, bs))
    assert ycl.is_contiguous(memory_format=torch.channels_last) and torch.equal(ycl, y32)
    for dt in (torch.float64, torch.bfloat16, torch.float16):
        y = BLOCK(x.to(dt), *args_of(plans, bs))
        assert y.dtype == dt
        want = BLOCK(x.to(dt).float(), *args_of(plans, bs)).to(dt)
        assert torch.equal(y, want)


def _plans(c=8, m1=4, m2=4, k=(3, 3)):
    ws, bs = block(c, m1, m2, k, seed=4)
    return [list(PLAN(wt, 0.0, 2)) for wt in ws], bs


@pytest.mark.parametrize("what, match", [
    ("x_rank", "x must be 4-D"),
    ("x_channels", "conv1 takes 4 channels but x has 5|conv1 takes"),
    ("chain", "conv2 takes"),
    ("residual", "conv3 gives"),
    ("even", "odd"),
    ("not_1x1", "1x1"),
    ("band", "band must be >= 0"),
    ("values", "values2 must have shape"),
    ("rowptr", "rowptr3 must have"),
    ("taps", "taps"),
    ("plan", "plan1"),
    ("bias", "bias2 must have shape"),
])
def test_bad_arguments_name_the_problem(what, match):
    plans, bs = _plans()
    x = torch.randn(1, 8, 5, 5)
    band = 0
    if what == "x_rank":
        x = x[0]
    elif what == "x_channels":
        x = torch.randn(1, 5, 5, 5)
        plans[0] = list(PLAN(torch.ones(4, 5, 1, 1), 0.0, 2))
        plans[2] = list(PLAN(torch.ones(8, 4, 1, 1), 0.0, 2))
        x = torch.randn(1, 8, 5, 5)
        x = torch.cat([x, x[:, :1]], 1)  # 9 channels: conv1 takes 5
        match = "conv1 takes 5 channels but x has 9"
    elif what == "chain":
        plans[1] = list(PLAN(torch.ones(4, 5, 3, 3), 0.0, 2))
    elif what == "residual":
        plans[2] = list(PLAN(torch.ones(9, 4, 1, 1), 0.0, 2))
        bs[2] = None
    elif what == "even":
        plans[1] = list(PLAN(torch.ones(4, 4, 2, 2), 0.0, 2))
    elif what == "not_1x1":
        plans[2] = list(PLAN(torch.ones(8, 4, 3, 3), 0.0, 2))
    elif what == "band":
        band = -1
    elif what == "values":
        plans[1][3] = torch.cat([plans[1][3], torch.ones(1)])
    elif what == "rowptr":
        plans[2][1] = plans[2][1][:-1]
    elif what == "taps":
        plans[0][2] = plans[0][2].clone()
        plans[0][2][0] = 10**6
    elif what == "plan":
        plans[0][0] = plans[0][0].clone()
        plans[0][0][0] += 1
    elif what == "bias":
        bs[1] = torch.randn(7)
    with pytest.raises((ValueError, RuntimeError), match=match):
        BLOCK(x, *args_of(plans, bs), band=band)


# ---- the module, compile / export, the fx pass -------------------------------------------

def sparse_block(c=16, m=8, seed=0, sparsity=0.8):
    ws, bs = block(c, m, m, seed=seed, sparsity=sparsity)
    return (PrunedConv2d(ws[0], bs[0], relu=True), PrunedConv2d(ws[1], bs[1], padding=1, relu=True),
            ResidualPrunedConv2d(PrunedConv2d(ws[2], bs[2]))), ws, bs


def test_module_matches_chain_and_falls_back_where_the_op_does_not_apply():
    (c1, c2, c3), ws, bs = sparse_block()
    fused = FusedBottleneck(c1, c2, c3)
    x = torch.randn(2, 16, 10, 10)
    chain = c3(c2(c1(x)), residual=x)
    assert torch.equal(fused(x), chain)
    # a gradient asked of the input: the layer calls (inference ops: no gradient, same values)
    xg = x.clone().requires_grad_()
    torch.testing.assert_close(fused(xg), chain)
    assert "band=auto" in repr(fused)


def test_module_rejects_what_it_cannot_fuse():
    (c1, c2, c3), ws, bs = sparse_block()
    assert bottleneck_problem(c1, c2, c3) is None
    strided = PrunedConv2d(ws[1], bs[1], stride=2, padding=1, relu=True)
    no_relu = PrunedConv2d(ws[0], bs[0])
    with pytest.raises(ValueError, match="a strided block needs its projection shortcut"):
        FusedBottleneck(c1, strided, c3)
    even = PrunedConv2d(torch.randn(8, 8, 2, 2), None, padding=1, relu=True)
    with pytest.raises(ValueError, match="conv2 must be an odd convolution"):
        FusedBottleneck(c1, even, c3)
    with pytest.raises(ValueError, match="ReLU"):
        FusedBottleneck(no_relu, c2, c3)
    with pytest.raises(ValueError, match="must be PrunedConv2d"):
        FusedBottleneck(c1, c2, c2)
    with pytest.raises(ValueError, match="band must be >= 0"):
        FusedBottleneck(c1, c2, c3, band=-1)


def test_compile_fullgraph_and_export():
    (c1, c2, c3), _, _ = sparse_block()
    fused = FusedBottleneck(c1, c2, c3, band=3).eval()
    x = torch.randn(2, 16, 8, 8)
    want = fused(x)
    torch._dynamo.reset()
    got = torch.compile(fused, fullgraph=True, dynamic=False)(x)
    assert torch.equal(got, want)
    ep = torch.export.export(fused, (x,))
    assert torch.equal(ep.module()(x), want)
    assert any("filter_conv_bottleneck" in str(n.target) for n in ep.graph.nodes)


class TwoBlocks(nn.Module):
    """Two identity bottlenecks, the second's residual from the first (fusable), and a block
    whose residual is not its own input (not a bottleneck: left alone)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = Bottleneck(16), Bottleneck(16)
        self.c1 = nn.Conv2d(16, 8, 1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = nn.Conv2d(8, 16, 1)

    def forward(self, x):
        y = self.b(self.a(x))
        z = self.c3(F.relu(self.c2(F.relu(self.c1(y)))))
        return F.relu(z + x)  # the residual skips a block: not c1's input


def _pruned_model(seed=0):
    torch.manual_seed(seed)
    model = TwoBlocks().eval()
    randomize_bn(model)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                m.weight.mul_(torch.rand(m.weight.shape) > 0.85)
    return model


def test_fx_pass_fuses_the_identity_blocks_only(tmp_path):
    model = _pruned_model()
    x = torch.randn(2, 16, 12, 12)
    sparse = sparsify(copy.deepcopy(model), x, min_speedup=0.0, fold_bn=True, verbose=False,
                      progress=False, fuse_groups=False, cache_dir=tmp_path)
    gm = copy.deepcopy(sparse)
    found = bottleneck_candidates(gm)
    assert [(n3.target, n4) for _, _, n3, n4 in found] == [("a.conv3", None), ("b.conv3", None)]
    shapes = {"a.conv1": ((2, 16, 12, 12), torch.float32), "b.conv1": ((2, 16, 12, 12),
                                                                      torch.float32)}
    seen = []

    def rewrite(name, before, after, shape, dtype):
        xi = torch.randn(shape, dtype=dtype)
        assert torch.equal(before(xi), after(xi))  # what the pass times is the same block
        seen.append(name)
        return name.startswith("b ")  # a measurement that keeps only the second
    assert fuse_bottlenecks(gm, shapes, rewrite) == ["b.conv3"]
    gm.recompile()
    assert seen == ["a bottleneck", "b bottleneck"]
    assert isinstance(gm.get_submodule("b.conv3"), FusedBottleneck)
    assert not hasattr(gm.b, "conv1") and isinstance(gm.a.conv1, PrunedConv2d)
    assert torch.equal(gm(x), sparse(x))
    torch.testing.assert_close(gm(x), model(x), atol=1e-4, rtol=1e-4)


def test_sparsify_fuses_measured_blocks_caches_and_explains(tmp_path):
    from sparsejit.families.filter_conv import tuner
    model = _pruned_model(seed=1)
    x = torch.randn(2, 16, 12, 12)
    opts = dict(fold_bn=True, verbose=False, progress=False, cache_dir=tmp_path)
    plain = sparsify(copy.deepcopy(model), x, min_speedup=0.0, fuse_groups=False, **opts)
    # min_speedup 0: every measured block is kept, whatever the timings say
    fused = sparsify(copy.deepcopy(model), x, min_speedup=0.0, **opts)
    rows = {r["name"]: r for r in tuner.LAST_REPORT}
    assert rows["a bottleneck"]["fused"] == "fused bottleneck" and not rows["a bottleneck"][
        "cached"]
    assert rows["a bottleneck"]["dense_ms"] > 0 and rows["a bottleneck"]["sparse_ms"] > 0
    assert "c bottleneck" not in rows  # its residual is not its input
    blocks = [m for m in fused.modules() if isinstance(m, FusedBottleneck)]
    assert len(blocks) == 2
    assert torch.equal(fused(x), plain(x))
    torch.testing.assert_close(fused(x), model(x), atol=1e-4, rtol=1e-4)
    assert "fused bottleneck" in tuner.format_report()
    # the next process converts from the stored decisions, without measuring
    again = sparsify(copy.deepcopy(model), x, min_speedup=0.0, **opts)
    assert [r["cached"] for r in tuner.LAST_REPORT if r["name"].endswith("bottleneck")] == \
        [True, True]
    assert torch.equal(again(x), fused(x))
    # a block whose stored measurement says slower stays three layers (layers still sparse)
    store = tuner._store(tmp_path)
    table = store.load(tuner._TABLE)
    keys = [k for k in table if k.startswith("bottleneck|")]
    assert len(keys) == 2
    for k in keys:
        table[k] = dict(dense_ms=1.0, sparse_ms=1e6)
    store.update(tuner._TABLE, table)
    # (min_speedup 1e-3 keeps every layer sparse, as above, but not a block 1e6x slower)
    slower = sparsify(copy.deepcopy(model), x, min_speedup=1e-3, **opts)
    assert not any(isinstance(m, FusedBottleneck) for m in slower.modules())
    assert any(isinstance(m, PrunedConv2d) for m in slower.modules())
    assert torch.equal(slower(x), plain(x))
    for k in keys:
        del table[k]
    store.update(tuner._TABLE, table)
    out = tuner.explain(copy.deepcopy(model), x, fold_bn=True, cache_dir=tmp_path,
                        min_speedup=0.0, file=open(tmp_path / "explain.txt", "w"))
    assert any(r["name"] == "b bottleneck" and r.get("fused") for r in out["layers"])


def test_sparsified_model_with_fused_blocks_compiles_and_exports(tmp_path):
    model = _pruned_model(seed=2)
    x = torch.randn(2, 16, 12, 12)
    fused = sparsify(model, x, min_speedup=0.0, fold_bn=True, cache_dir=tmp_path,
                     progress=False, verbose=False, repeat=1)
    assert sum(isinstance(m, FusedBottleneck) for m in fused.modules()) == 2
    with torch.no_grad():
        want = fused(x)
        torch._dynamo.reset()
        assert torch.equal(torch.compile(fused, fullgraph=True)(x), want)
    ep = torch.export.export(fused, (x,))
    blocks = [n for n in ep.graph.nodes
              if str(n.target) == "sparsejit.filter_conv_bottleneck.default"]
    assert len(blocks) == 2
    with torch.no_grad():
        assert torch.equal(ep.module()(x), want)


# ---- the projection shortcut (a stage's first block, stride 1) ------------------------------

def shortcut_case(c=8, m=4, c_out=16, seed=5, sparsity=0.7):
    g = torch.Generator().manual_seed(seed)
    ws = [pruned((m, c, 1, 1), sparsity, g), pruned((m, m, 3, 3), sparsity, g),
          pruned((c_out, m, 1, 1), sparsity, g), pruned((c_out, c, 1, 1), sparsity, g)]
    bs = [torch.randn(n, generator=g) for n in (m, m, c_out, c_out)]
    return ws, bs


def shortcut_reference(ws, bs, x):
    d = [b.double() for b in bs]
    a = F.relu(F.conv2d(x.double(), ws[0].double(), d[0]))
    a = F.relu(F.conv2d(a, ws[1].double(), d[1], padding=1))
    return F.relu(F.conv2d(a, ws[2].double(), d[2]) + F.conv2d(x.double(), ws[3].double(), d[3]))


@pytest.mark.parametrize("batch, h, w, band", [(1, 9, 7, 0), (3, 6, 11, 2), (2, 1, 1, 0),
                                               (0, 4, 4, 0), (2, 13, 5, 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_shortcut_matches_reference_and_layer_calls_bitwise(batch, h, w, band, threads,
                                                            poison_empty):
    ws, bs = shortcut_case(seed=batch + h)
    x = torch.randn(batch, 8, h, w)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for variant in (5, 3, 1):
            plans = [PLAN(wt, 0.0, variant) for wt in ws]
            y = BLOCK(x, *args_of(plans[:3], bs[:3]), band=band, plan4=plans[3][0],
                      rowptr4=plans[3][1], taps4=plans[3][2], values4=plans[3][3], bias4=bs[3])
            assert y.shape == (batch, 16, h, w) and not y.isnan().any()
            torch.testing.assert_close(y.double(), shortcut_reference(ws, bs, x), atol=1e-4,
                                       rtol=1e-4)
            r = CONV(*plans[3], x, bs[3], [1, 1], [1, 1], [0, 0], [1, 1], 1, False)
            a = CONV(*plans[0], x, bs[0], [1, 1], [1, 1], [0, 0], [1, 1], 1, True)
            a = CONV(*plans[1], a, bs[1], [3, 3], [1, 1], [1, 1], [1, 1], 1, True)
            want = CONV(*plans[2], a, bs[2], [1, 1], [1, 1], [0, 0], [1, 1], 1, True, residual=r)
            assert torch.equal(y, want), variant
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("what, match", [
    ("partial", "plan4, rowptr4, taps4 and values4 together"),
    ("bias_only", "bias4 given without the shortcut"),
    ("channels_out", "the shortcut gives 15 channels but conv3 gives 16"),
    ("channels_in", "the shortcut takes 9 channels but x has 8"),
    ("not_1x1", "the shortcut .layer 4. must be 1x1"),
    ("bias4", "bias4 must have shape"),
])
def test_shortcut_bad_arguments(what, match):
    ws, bs = shortcut_case()
    plans = [list(PLAN(wt, 0.0, 2)) for wt in ws]
    x = torch.randn(1, 8, 5, 5)
    kw = dict(plan4=plans[3][0], rowptr4=plans[3][1], taps4=plans[3][2], values4=plans[3][3],
              bias4=bs[3])
    if what == "partial":
        del kw["taps4"]
    elif what == "bias_only":
        kw = dict(bias4=bs[3])
    elif what == "channels_out":
        p = PLAN(torch.ones(15, 8, 1, 1), 0.0, 2)
        kw.update(plan4=p[0], rowptr4=p[1], taps4=p[2], values4=p[3], bias4=None)
    elif what == "channels_in":
        p = PLAN(torch.ones(16, 9, 1, 1), 0.0, 2)
        kw.update(plan4=p[0], rowptr4=p[1], taps4=p[2], values4=p[3])
    elif what == "not_1x1":
        p = PLAN(torch.ones(16, 8, 3, 3), 0.0, 2)
        kw.update(plan4=p[0], rowptr4=p[1], taps4=p[2], values4=p[3])
    elif what == "bias4":
        kw["bias4"] = torch.randn(3)
    with pytest.raises((ValueError, RuntimeError), match=match):
        BLOCK(x, *args_of(plans[:3], bs[:3]), **kw)
    if what != "bias_only":  # an identity residual needs conv3 to give x's channels
        with pytest.raises((ValueError, RuntimeError), match="identity residual needs 8"):
            BLOCK(x, *args_of(plans[:3], bs[:3]))


class ProjectionBlock(nn.Module):
    """A stage's first bottleneck with its 1x1 projection shortcut: at stride 1 ResNet-50's
    layer1.0, at stride 2 v1.5's layer2.0 .. layer4.0 (the stride on the 3x3 and the shortcut)."""

    def __init__(self, c=8, m=4, out=16, stride=1):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, m, 1, bias=False), nn.BatchNorm2d(m)
        self.conv2 = nn.Conv2d(m, m, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(m)
        self.conv3, self.bn3 = nn.Conv2d(m, out, 1, bias=False), nn.BatchNorm2d(out)
        self.downsample = nn.Sequential(nn.Conv2d(c, out, 1, stride=stride, bias=False),
                                        nn.BatchNorm2d(out))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + self.downsample(x))


@pytest.mark.parametrize("stride, shape", [(1, (2, 8, 10, 10)), (2, (2, 8, 15, 14))])
def test_sparsify_fuses_a_projection_block_compiles_and_exports(stride, shape, tmp_path):
    torch.manual_seed(3 + stride)
    model = nn.Sequential(ProjectionBlock(stride=stride), Bottleneck(16)).eval()
    randomize_bn(model)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                m.weight.mul_(torch.rand(m.weight.shape) > 0.8)
    x = torch.randn(shape)
    opts = dict(fold_bn=True, verbose=False, progress=False, cache_dir=tmp_path)
    plain = sparsify(copy.deepcopy(model), x, min_speedup=0.0, fuse_groups=False, **opts)
    fused = sparsify(copy.deepcopy(model), x, min_speedup=0.0, **opts)
    blocks = [m for m in fused.modules() if isinstance(m, FusedBottleneck)]
    assert len(blocks) == 2 and isinstance(blocks[0].shortcut, PrunedConv2d)
    assert blocks[0].conv2.stride == (stride, stride) and blocks[1].shortcut is None
    assert torch.equal(fused(x), plain(x))
    torch.testing.assert_close(fused(x), model(x), atol=1e-4, rtol=1e-4)
    # the unfused fallback (a gradient asked of the input) gives the same values
    torch.testing.assert_close(blocks[0](x.clone().requires_grad_()), blocks[0](x))
    with torch.no_grad():
        torch._dynamo.reset()
        assert torch.equal(torch.compile(fused, fullgraph=True)(x), fused(x))
    ep = torch.export.export(fused, (x,))
    assert sum(str(n.target) == "sparsejit.filter_conv_bottleneck.default"
               for n in ep.graph.nodes) == 2
    with torch.no_grad():
        assert torch.equal(ep.module()(x), fused(x))


# ---- a strided block (ResNet-50 v1.5's layer2.0 .. layer4.0: the stride on the 3x3) ----------

def strided_reference(ws, bs, x, stride, k=(3, 3)):
    d = [b.double() for b in bs]
    a = F.relu(F.conv2d(x.double(), ws[0].double(), d[0]))
    a = F.relu(F.conv2d(a, ws[1].double(), d[1], stride, padding=(k[0] // 2, k[1] // 2)))
    sc = F.conv2d(x.double(), ws[3].double(), d[3], stride)
    return F.relu(F.conv2d(a, ws[2].double(), d[2]) + sc)


@pytest.mark.parametrize("batch, h, w, band, stride, k", [
    (1, 12, 12, 0, 2, (3, 3)), (3, 11, 9, 1, 2, (3, 3)), (2, 13, 7, 2, 2, (3, 3)),
    (2, 1, 1, 0, 2, (3, 3)), (1, 2, 5, 0, 2, (3, 3)), (2, 10, 9, 2, 3, (3, 3)),
    (2, 9, 9, 1, 2, (5, 5)), (2, 8, 6, 0, 2, (1, 1)), (0, 6, 6, 0, 2, (3, 3))])
@pytest.mark.parametrize("threads", [1, 2])
def test_strided_matches_reference_and_layer_calls_bitwise(batch, h, w, band, stride, k,
                                                           threads, poison_empty):
    g = torch.Generator().manual_seed(batch * 7 + h)
    ws = [pruned((4, 8, 1, 1), 0.6, g), pruned((4, 4) + k, 0.6, g),
          pruned((16, 4, 1, 1), 0.6, g), pruned((16, 8, 1, 1), 0.6, g)]
    bs = [torch.randn(n, generator=g) for n in (4, 4, 16, 16)]
    x = torch.randn(batch, 8, h, w)
    pad = [k[0] // 2, k[1] // 2]
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for variant in (5, 2, 1):
            plans = [PLAN(wt, 0.0, variant) for wt in ws]
            y = BLOCK(x, *args_of(plans[:3], bs[:3]), band=band, plan4=plans[3][0],
                      rowptr4=plans[3][1], taps4=plans[3][2], values4=plans[3][3], bias4=bs[3],
                      stride2=stride)
            want = strided_reference(ws, bs, x, stride, k)
            assert y.shape == want.shape and not y.isnan().any()
            torch.testing.assert_close(y.double(), want, atol=1e-4, rtol=1e-4)
            r = CONV(*plans[3], x, bs[3], [1, 1], [stride] * 2, [0, 0], [1, 1], 1, False)
            a = CONV(*plans[0], x, bs[0], [1, 1], [1, 1], [0, 0], [1, 1], 1, True)
            a = CONV(*plans[1], a, bs[1], list(k), [stride] * 2, pad, [1, 1], 1, True)
            layers = CONV(*plans[2], a, bs[2], [1, 1], [1, 1], [0, 0], [1, 1], 1, True,
                          residual=r)
            assert torch.equal(y, layers), variant
    finally:
        torch.set_num_threads(old)


def test_strided_bad_arguments():
    ws, bs = shortcut_case()
    plans = [list(PLAN(wt, 0.0, 2)) for wt in ws]
    x = torch.randn(1, 8, 6, 6)
    with pytest.raises((ValueError, RuntimeError), match="needs the projection shortcut"):
        BLOCK(x, *args_of(plans[:3], bs[:3]), stride2=2)
    for bad in (0, -1, 9, 2**40):
        with pytest.raises((ValueError, RuntimeError), match="stride2 must be in"):
            BLOCK(x, *args_of(plans[:3], bs[:3]), plan4=plans[3][0], rowptr4=plans[3][1],
                  taps4=plans[3][2], values4=plans[3][3], stride2=bad)



@pytest.mark.parametrize("kinds", [(0, 0, 0, 0), (6, 8, 6, 6), (8, 8, 8, 8)])
@pytest.mark.parametrize("stride", [1, 2])
def test_planner_tiles_follow_the_whole_layer_not_the_band(kinds, stride):
    # bands of one to three rows hold fewer pixels than the layer's tile: each layer keeps the
    # tile its own call gets on the whole image (auto / jit / generic plans), so the block
    # still gives the layer calls' bits (a 5x5 ResNet-50 layer4.0 once differed by 1 ulp)
    ws, bs = shortcut_case(c=16, m=8, c_out=32, seed=9)
    x = torch.randn(2, 16, 14, 14)
    plans = [PLAN(wt, 0.0, k) for wt, k in zip(ws, kinds)]
    r = CONV(*plans[3], x, bs[3], [1, 1], [stride] * 2, [0, 0], [1, 1], 1, False)
    a = CONV(*plans[0], x, bs[0], [1, 1], [1, 1], [0, 0], [1, 1], 1, True)
    a = CONV(*plans[1], a, bs[1], [3, 3], [stride] * 2, [1, 1], [1, 1], 1, True)
    want = CONV(*plans[2], a, bs[2], [1, 1], [1, 1], [0, 0], [1, 1], 1, True, residual=r)
    for band in (0, 1, 2, 3):
        y = BLOCK(x, *args_of(plans[:3], bs[:3]), band=band, plan4=plans[3][0],
                  rowptr4=plans[3][1], taps4=plans[3][2], values4=plans[3][3], bias4=bs[3],
                  stride2=stride)
        assert torch.equal(y, want), band
