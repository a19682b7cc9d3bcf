"""Filter-sparse convolution (sparsejit.families.filter_conv: PrunedConv2d, SparseLinear,
sparsify and the filter_conv ops) against torch.nn.functional.conv2d on fresh random pruned weights."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sparsejit as sj
from sparsejit.families.filter_conv.layers import PrunedConv2d, SparseLinear
from sparsejit.families.filter_conv.tuner import sparsify
from sparsejit.families.filter_conv.ops import VARIANTS

torch.manual_seed(0)


def pruned_weight(shape, kind, seed):
    """A weight [C_out, C_in/groups, R, S] with a named pruning pattern."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g)
    if kind == "unstructured":
        w[torch.rand(shape, generator=g) < 0.8] = 0
    elif kind == "channel":  # whole input channels pruned, as channel pruning leaves them
        w[:, torch.rand(shape[1], generator=g) < 0.5] = 0
    elif kind == "zero_filters":  # some output channels entirely zero
        w[torch.rand(shape[0], generator=g) < 0.5] = 0
        w[torch.rand(shape, generator=g) < 0.5] = 0
    elif kind == "all_zero":
        w.zero_()
    elif kind == "dense":
        pass
    elif kind == "skewed":  # one output channel dense, the rest nearly empty
        keep = torch.rand(shape, generator=g) < 0.03
        keep[0] = True
        w[~keep] = 0
    else:
        raise ValueError(kind)
    return w


def reference(x, w, b, stride, padding, dilation, groups, relu=False):
    y = F.conv2d(x.double(), w.double(), None if b is None else b.double(), stride, padding,
                 dilation, groups)
    return y.relu() if relu else y


def run_op(mod, x, kernel):
    # Poison the allocator's recent blocks: a pixel the kernel does not write would likely
    # show a NaN left here (the op allocates its output with at::empty).
    junk = torch.full((mod.out_channels * 4096 + x.numel(),), float("nan"))
    del junk
    return mod(x, variant=kernel)


GEOMETRIES = [
    # (c_in, c_out, h, w, k, stride, padding, dilation, groups)
    (8, 12, 9, 9, 1, 1, 0, 1, 1),     # 1x1 in place, partial tile
    (16, 8, 8, 8, 1, 2, 0, 1, 1),     # 1x1 stride 2
    (6, 10, 11, 13, 3, 1, 1, 1, 1),   # 3x3 pad 1
    (6, 10, 12, 12, 3, 2, 1, 1, 1),   # 3x3 stride 2
    (8, 8, 10, 10, 3, 1, 2, 2, 2),    # dilation 2, groups 2
    (12, 12, 7, 7, 3, 1, 1, 1, 12),   # depthwise
    (1, 5, 9, 9, 3, 1, 0, 1, 1),      # single input channel
    (3, 6, 20, 20, 7, 2, 3, 1, 1),    # stem-like 7x7 stride 2
]


@pytest.mark.parametrize("geom", GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
@pytest.mark.parametrize("batch", [1, 8])
def test_every_variant_against_conv2d(geom, batch):
    c_in, c_out, h, w_, k, stride, padding, dilation, groups = geom
    weight = pruned_weight((c_out, c_in // groups, k, k), "unstructured", seed=sum(geom))
    bias = torch.randn(c_out)
    x = torch.randn(batch, c_in, h, w_)
    mod = PrunedConv2d(weight, bias, stride, padding, dilation, groups)
    want = reference(x, weight, bias, stride, padding, dilation, groups)
    for name, kid in VARIANTS.items():
        y = run_op(mod, x, kid)
        assert y.shape == want.shape
        torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("kind", ["unstructured", "channel", "zero_filters", "all_zero",
                                  "dense", "skewed"])
@pytest.mark.parametrize("relu", [False, True])
def test_pruning_patterns(kind, relu):
    weight = pruned_weight((24, 16, 3, 3), kind, seed=len(kind))
    bias = torch.randn(24)
    x = torch.randn(2, 16, 14, 14)
    mod = PrunedConv2d(weight, bias, 1, 1, relu=relu)
    expected_nnz = int((weight != 0).sum())
    assert mod.nnz == expected_nnz
    torch.testing.assert_close(run_op(mod, x, -1).double(),
                               reference(x, weight, bias, 1, 1, 1, 1, relu), rtol=1e-4, atol=1e-4)


def test_threshold_drops_small_entries():
    weight = torch.randn(8, 4, 3, 3)
    mod = PrunedConv2d(weight, threshold=0.5)
    kept = weight * (weight.abs() > 0.5)
    assert mod.nnz == int((weight.abs() > 0.5).sum())
    x = torch.randn(1, 4, 6, 6)
    torch.testing.assert_close(mod(x).double(), reference(x, kept, None, 1, 0, 1, 1),
                               rtol=1e-4, atol=1e-4)


def test_from_dense_with_batchnorm_matches_eval_module():
    conv = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=True)
    with torch.no_grad():
        conv.weight.mul_(torch.rand_like(conv.weight) > 0.7)
    bn = nn.BatchNorm2d(16)
    with torch.no_grad():
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.normal_()
        bn.bias.normal_()
    ref = nn.Sequential(conv, bn, nn.ReLU()).eval()
    sparse = PrunedConv2d.from_dense(conv, bn, relu=True)
    x = torch.randn(3, 8, 15, 15)
    with torch.no_grad():
        torch.testing.assert_close(sparse(x), ref(x), rtol=1e-4, atol=1e-4)


def test_channels_last_and_dtypes():
    weight = pruned_weight((12, 8, 3, 3), "unstructured", seed=3)
    mod = PrunedConv2d(weight, torch.randn(12), 1, 1)
    x = torch.randn(2, 8, 10, 10)
    want = reference(x, weight, mod.bias, 1, 1, 1, 1)
    y = mod(x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)
    yb = mod(x.bfloat16())
    assert yb.dtype == torch.bfloat16
    torch.testing.assert_close(yb.double(), reference(x.bfloat16().float(), weight, mod.bias, 1,
                                                      1, 1, 1), rtol=3e-2, atol=3e-2)
    y64 = mod(x.double())
    assert y64.dtype == torch.float64
    torch.testing.assert_close(y64, want, rtol=1e-4, atol=1e-4)


def test_empty_batch_and_one_pixel():
    mod = PrunedConv2d(pruned_weight((4, 3, 1, 1), "unstructured", 1))
    assert mod(torch.randn(0, 3, 5, 5)).shape == (0, 4, 5, 5)
    x = torch.randn(2, 3, 1, 1)
    torch.testing.assert_close(mod(x).double(), reference(x, mod_weight(mod), None, 1, 0, 1, 1),
                               rtol=1e-4, atol=1e-4)


def mod_weight(mod):
    """The dense weight back from a PrunedConv2d's plan arrays."""
    k = mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
    w = torch.zeros(mod.out_channels * k)
    rows = torch.repeat_interleave(torch.arange(mod.out_channels), mod.rowptr.diff())
    w[rows * k + mod.taps] = mod.values
    return w.view(mod.out_channels, -1, *mod.kernel_size)


def test_linear_as_1x1():
    lin = nn.Linear(40, 24)
    with torch.no_grad():
        lin.weight.mul_(torch.rand_like(lin.weight) > 0.8)
    sparse = SparseLinear(lin)
    x = torch.randn(5, 7, 40)
    with torch.no_grad():
        torch.testing.assert_close(sparse(x), lin(x), rtol=1e-4, atol=1e-4)
    assert sparse(torch.randn(0, 40)).shape == (0, 24)
    one = torch.randn(1, 40)  # a single row: one pixel, the scalar tail of every variant
    with torch.no_grad():
        torch.testing.assert_close(sparse(one), lin(one), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad, err, match", [
    (lambda m: m(torch.randn(3, 8, 8)), ValueError, "x must be 4-D"),
    (lambda m: m(torch.randn(1, 5, 8, 8)), ValueError, "x has 5 channels"),
    (lambda m: m(torch.randint(0, 3, (1, 4, 8, 8))), TypeError, "x must be float"),
    (lambda m: m(torch.randn(1, 4, 1, 1)), ValueError, "smaller than the dilated kernel"),
])
def test_bad_input_names_the_argument(bad, err, match):
    mod = PrunedConv2d(torch.randn(6, 4, 3, 3))
    with pytest.raises(err, match=match):
        bad(mod)


def test_bad_construction_and_raw_op_arguments():
    with pytest.raises(ValueError, match="groups"):
        PrunedConv2d(torch.randn(6, 2, 3, 3), groups=4)
    with pytest.raises(ValueError, match="weight must be"):
        PrunedConv2d(torch.randn(6, 2, 3))
    mod = PrunedConv2d(torch.randn(6, 4, 3, 3), groups=1)
    x = torch.randn(1, 8, 6, 6)
    with pytest.raises(ValueError, match="groups"):  # 8 channels, weight for 4 per group x 3
        torch.ops.sparsejit.filter_conv(mod.plan, mod.rowptr, mod.taps, mod.values, x, None,
                                        [3, 3], [1, 1], [0, 0], [1, 1], 3, False)
    with pytest.raises(ValueError, match="kernel_size"):
        torch.ops.sparsejit.filter_conv(mod.plan, mod.rowptr, mod.taps, mod.values,
                                        x[:, :4], None, [1, 1], [1, 1], [0, 0], [1, 1], 1, False)
    with pytest.raises(ValueError, match="bias must have shape"):
        torch.ops.sparsejit.filter_conv(mod.plan, mod.rowptr, mod.taps, mod.values,
                                        x[:, :4], torch.randn(5), [3, 3], [1, 1], [0, 0], [1, 1],
                                        1, False)
    bad_taps = mod.taps.clone()
    bad_taps[-1] = 10_000
    with pytest.raises(ValueError, match="out of range"):
        torch.ops.sparsejit.filter_conv(mod.plan, mod.rowptr, bad_taps, mod.values, x[:, :4],
                                        None, [3, 3], [1, 1], [0, 0], [1, 1], 1, False)
    w2 = torch.randn(6, 4, 3, 3)
    w2[:3] = 0  # another pattern of the same shape
    other = PrunedConv2d(w2)
    with pytest.raises(ValueError, match="plan"):  # plan stamped for mod's pattern
        torch.ops.sparsejit.filter_conv(mod.plan, other.rowptr, other.taps, other.values,
                                        x[:, :4], None, [3, 3], [1, 1], [0, 0], [1, 1], 1, False)
    with pytest.raises(ValueError, match="variant"):
        mod(x[:, :4], variant=17)


def test_in_place_change_of_the_pattern_is_seen():
    mod = PrunedConv2d(pruned_weight((6, 4, 3, 3), "unstructured", 9))
    x = torch.randn(1, 4, 6, 6)
    mod(x)
    with torch.no_grad():
        mod.taps[-1] = 10_000  # bumps the version: validated again, not a stale cache hit
    with pytest.raises(ValueError, match="out of range"):
        mod(x)


def test_opcheck():
    mod = PrunedConv2d(pruned_weight((6, 4, 3, 3), "unstructured", 5), torch.randn(6))
    x = torch.randn(2, 4, 7, 7)
    torch.library.opcheck(torch.ops.sparsejit.filter_conv.default,
                          (mod.plan, mod.rowptr, mod.taps, mod.values, x, mod.bias, [3, 3],
                           [2, 2], [1, 1], [1, 1], 1, True, -1))
    torch.library.opcheck(torch.ops.sparsejit.filter_conv_plan.default,
                          (torch.randn(6, 4, 3, 3), 0.5, 0),
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor"))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.c3 = nn.Conv2d(32, 32, 1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.c1(x))
        x = F.relu(self.c2(x))
        x = self.c3(x)
        return self.fc(x.mean((2, 3)))


def pruned_cnn(seed=0):
    torch.manual_seed(seed)
    m = SmallCNN().eval()
    with torch.no_grad():
        for p in (m.c1.weight, m.c2.weight, m.c3.weight, m.fc.weight):
            p.mul_(torch.rand_like(p) > 0.85)
    return m


def convert_all(m):
    for name in ("c1", "c2", "c3"):
        setattr(m, name, PrunedConv2d.from_dense(getattr(m, name)))
    m.fc = SparseLinear(m.fc)
    return m


def test_torch_compile_fullgraph():
    m = pruned_cnn()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        want = m(x)
        sm = convert_all(m)
        got = torch.compile(sm, fullgraph=True)(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_torch_export():
    m = pruned_cnn(1)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        want = m(x)
    sm = convert_all(m)
    ep = torch.export.export(sm, (x,))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert "sparsejit.filter_conv.default" in targets
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), want, rtol=1e-4, atol=1e-4)


def test_sparsify_decides_and_caches(tmp_path, monkeypatch, capsys):
    import sparsejit.families.filter_conv.tuner as fc
    calls = []
    real = fc.measure

    def counting(dense, sparse, shape, dtype, repeat=7, clock="wall", variants=()):
        calls.append(shape)
        return real(dense, sparse, shape, dtype, repeat=3, clock=clock, variants=variants)

    monkeypatch.setattr(fc, "measure", counting)
    x = torch.randn(1, 3, 16, 16)
    m = pruned_cnn(2)
    with torch.no_grad():
        want = m(x)
    out = sparsify(m, x, min_speedup=0.0, cache_dir=tmp_path, progress=True)
    assert out is m
    assert len(calls) == 4  # c1, c2, c3, fc measured
    table = capsys.readouterr()
    assert "sparse ms" in table.out and "sparsify [" in table.err
    assert all(r["choice"] == "sparse" for r in fc.LAST_REPORT)  # min_speedup 0: all convert
    assert isinstance(m.c2, PrunedConv2d) and isinstance(m.fc, SparseLinear)
    with torch.no_grad():
        torch.testing.assert_close(m(x), want, rtol=1e-4, atol=1e-4)

    # A fresh model with the same weights: decisions come from the disk cache.
    m2 = pruned_cnn(2)
    sparsify(m2, x, min_speedup=1e9, cache_dir=tmp_path, progress=False, verbose=False)
    assert len(calls) == 4
    assert all(r["cached"] for r in fc.LAST_REPORT)
    assert all(r["choice"] == "dense" for r in fc.LAST_REPORT)  # unreachable margin
    assert isinstance(m2.c2, nn.Conv2d)


def test_sparsify_skips_dense_layers(tmp_path):
    m = SmallCNN().eval()  # unpruned: nothing is measured, nothing converted
    sparsify(m, torch.randn(1, 3, 8, 8), cache_dir=tmp_path, progress=False, verbose=False)
    assert all(type(getattr(m, n)) in (nn.Conv2d, nn.Linear) for n in ("c1", "c2", "c3", "fc"))
    assert sj.sparsify is sparsify
    assert sj.nn.PrunedConv2d is PrunedConv2d


def test_random_geometries():
    """Non-square kernels, unequal strides / paddings / dilations, groups, odd sizes."""
    g = torch.Generator().manual_seed(11)
    for case in range(24):
        ri = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))  # noqa: E731
        groups = [1, 1, 2, 3][ri(0, 3)]
        c_in, c_out = groups * ri(1, 6), groups * ri(1, 5)
        r, s = ri(1, 4), ri(1, 4)
        stride, dil = (ri(1, 3), ri(1, 3)), (ri(1, 2), ri(1, 2))
        pad = (ri(0, 3), ri(0, 3))
        h = max(ri(1, 17), dil[0] * (r - 1) + 1 - 2 * pad[0])
        w_ = max(ri(1, 17), dil[1] * (s - 1) + 1 - 2 * pad[1])
        weight = torch.randn(c_out, c_in // groups, r, s, generator=g)
        weight[torch.rand(weight.shape, generator=g) < 0.6] = 0
        bias = torch.randn(c_out, generator=g)
        x = torch.randn(ri(1, 3), c_in, h, w_, generator=g)
        mod = PrunedConv2d(weight, bias, stride, pad, dil, groups)
        want = reference(x, weight, bias, stride, pad, dil, groups)
        for name, kid in VARIANTS.items():
            if name.startswith("jit") and case % 4:  # compiles: every 4th case (test_*_jit.py)
                continue
            torch.testing.assert_close(mod(x, variant=kid).double(), want, rtol=1e-4, atol=1e-4,
                                       msg=f"case {case} {name}")


# ---- regressions found by the fuzz test (fuzz/cases_filter_conv.py) ------------------------------

def _small_layer():
    w = torch.randn(3, 2, 1, 2)
    return torch.ops.sparsejit.filter_conv_plan(w, 0.0, 1), torch.randn(2, 2, 7, 3)


@pytest.mark.parametrize("arg,value", [
    ("padding", [2**63 - 1, 0]),  # h + 2 * padding wrapped to 5: an all-zero 2x1 output
    ("padding", [2**62, 0]),
    ("dilation", [1, 2**62]),     # dilation * (S - 1) wrapped negative: "fits"
    ("stride", [2**63 - 1, 1]),
])
def test_geometry_past_int32_is_refused(arg, value):
    (plan, rowptr, taps, values), x = _small_layer()
    geo = dict(kernel_size=[1, 2], stride=[1, 1], padding=[0, 0], dilation=[1, 1])
    geo[arg] = value
    with pytest.raises(ValueError, match=arg):
        torch.ops.sparsejit.filter_conv(plan, rowptr, taps, values, x, None, groups=1,
                                        relu=False, **geo)


def test_groups_times_channels_overflow_is_refused():
    (plan, rowptr, taps, values), x = _small_layer()  # C_in/groups = 2, x has 2 channels
    p = plan.clone()
    p[11] = 2**62 + 1  # C_in/groups word: (2^62 + 1) * 4 wraps to 4
    with pytest.raises(ValueError, match="channels"):
        torch.ops.sparsejit.filter_conv(p, rowptr, taps, values, torch.randn(1, 4, 7, 3), None,
                                        [1, 2], [1, 1], [0, 0], [1, 1], 4, False)


@pytest.mark.parametrize("name", ["bias", "values", "taps"])
def test_argument_on_meta_is_refused(name):
    (plan, rowptr, taps, values), x = _small_layer()
    a = dict(plan=plan, rowptr=rowptr, taps=taps, values=values, x=x, bias=torch.zeros(3))
    a[name] = a[name].to("meta")  # the fake returned an uninitialized CPU tensor
    with pytest.raises(ValueError, match=f"{name} on meta"):
        torch.ops.sparsejit.filter_conv(**a, kernel_size=[1, 2], stride=[1, 1],
                                        padding=[0, 0], dilation=[1, 1], groups=1, relu=False)
