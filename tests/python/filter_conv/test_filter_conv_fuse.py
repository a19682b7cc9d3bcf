"""Filter-sparse convolution with a fused residual (``filter_conv(..., residual=)``,
``ResidualPrunedConv2d``) and sparsify's fusion pass (``fuse``, on with ``fold_bn``): the
residual add + ReLU of a ResNet block in the sparse kernel's output write, and a dense stem
convolution + max pool on channels_last (``ConvPool``). Fresh random pruned weights, outputs
poisoned, against float64 references and bitwise against the unfused ops."""

import json
import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparsejit.families.filter_conv.fold import ChannelsLastPool, ConvPool, ConvReLU
from sparsejit.families.filter_conv.layers import ResidualPrunedConv2d, PrunedConv2d
from sparsejit.families.filter_conv.tuner import sparsify
from sparsejit.families.filter_conv.ops import VARIANTS

from test_filter_conv import GEOMETRIES, pruned_weight, reference
from test_filter_conv_jit import Bottleneck, randomize_bn

from sparsejit._library import restores_type_errors

PRECOMPILED = ("scalar", "vec8x1", "vec8x2", "vec8x4", "vec8x8", "generic")


@restores_type_errors  # as the modules do: the op's TypeErrors reach Python as TypeError
def conv_op(mod, x, relu, residual, variant=-1):
    junk = torch.full((mod.out_channels * 4096 + x.numel(),), float("nan"))  # poison
    del junk
    return torch.ops.sparsejit.filter_conv(
        mod.plan, mod.rowptr, mod.taps, mod.values, x, mod.bias, list(mod.kernel_size),
        list(mod.stride), list(mod.padding), list(mod.dilation), mod.groups, relu, variant,
        residual)


@pytest.mark.parametrize("geom", GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
@pytest.mark.parametrize("batch", [1, 3])
def test_residual_matches_reference_and_unfused_bitwise(geom, batch):
    c_in, c_out, h, w, k, stride, padding, dilation, groups = geom
    wt = pruned_weight((c_out, c_in // groups, k, k), "unstructured", 11 + batch)
    bias = torch.randn(c_out)
    mod = PrunedConv2d(wt, bias, stride, padding, dilation, groups)
    x = torch.randn(batch, c_in, h, w)
    y0 = reference(x, wt, bias, stride, padding, dilation, groups)
    res = torch.randn(y0.shape)
    for relu in (False, True):
        want = y0 + res.double()
        want = want.relu() if relu else want
        for v in PRECOMPILED:
            got = conv_op(mod, x, relu, res, VARIANTS[v])
            torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
            unfused = conv_op(mod, x, False, None, VARIANTS[v]) + res
            unfused = unfused.relu() if relu else unfused
            assert torch.equal(got, unfused), (v, relu)


def test_residual_layouts_dtypes_and_empty():
    wt = pruned_weight((6, 4, 3, 3), "skewed", 3)
    mod = PrunedConv2d(wt, torch.randn(6), padding=1)
    x = torch.randn(2, 4, 7, 5)
    res = torch.randn(2, 6, 7, 5)
    want = (reference(x, wt, mod.bias, 1, 1, 1, 1) + res.double()).relu()
    # channels_last x and residual: channels_last out, same values
    got = conv_op(mod, x.contiguous(memory_format=torch.channels_last), True,
                  res.contiguous(memory_format=torch.channels_last))
    assert got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    # a strided (non-contiguous) residual
    big = torch.randn(2, 6, 7, 10)
    big[..., ::2] = res
    torch.testing.assert_close(conv_op(mod, x, True, big[..., ::2]).double(), want,
                               rtol=1e-4, atol=1e-4)
    # bfloat16: computed in float32, one rounding at the end
    got = conv_op(mod, x.bfloat16(), True, res.bfloat16())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=5e-2)
    # empty batch; one pixel; an all-zero weight adds bias + residual only
    assert conv_op(mod, x[:0], True, res[:0]).shape == (0, 6, 7, 5)
    w1 = pruned_weight((3, 2, 1, 1), "unstructured", 4)
    one = PrunedConv2d(w1)
    x1, r1 = torch.randn(1, 2, 1, 1), torch.randn(1, 3, 1, 1)
    torch.testing.assert_close(conv_op(one, x1, False, r1).double(),
                               reference(x1, w1, None, 1, 0, 1, 1) + r1.double(),
                               rtol=1e-5, atol=1e-5)
    zero = PrunedConv2d(torch.zeros(4, 2, 3, 3), torch.randn(4), padding=1)
    xz, rz = torch.randn(1, 2, 5, 5), torch.randn(1, 4, 5, 5)
    torch.testing.assert_close(conv_op(zero, xz, True, rz),
                               (zero.bias.view(1, 4, 1, 1) + rz).relu())


@pytest.mark.parametrize("bad, err, match", [
    (lambda y: y[:, :, :-1], ValueError, "residual must have the output's shape"),
    (lambda y: y[0], ValueError, "residual must have the output's shape"),
    (lambda y: y.int(), TypeError, "residual must be float"),
])
def test_bad_residual_names_the_argument(bad, err, match):
    mod = PrunedConv2d(torch.randn(6, 4, 3, 3))
    x = torch.randn(2, 4, 8, 8)
    y = mod(x)
    with pytest.raises(err, match=match):
        conv_op(mod, x, True, bad(y))
    with pytest.raises(err, match=match):  # the fake (meta) checks the same
        conv_op(mod.to("meta"), x.to("meta"), True, bad(y).to("meta"))


def test_residual_on_another_device_is_refused():
    mod = PrunedConv2d(torch.randn(6, 4, 3, 3))
    x = torch.randn(1, 4, 8, 8)
    with pytest.raises(ValueError, match="residual"):
        conv_op(mod, x, True, torch.empty(1, 6, 6, 6, device="meta"))


def test_opcheck_with_residual():
    mod = PrunedConv2d(pruned_weight((6, 4, 3, 3), "unstructured", 5), torch.randn(6))
    x = torch.randn(2, 4, 7, 7)
    res = torch.randn(2, 6, 4, 4)
    torch.library.opcheck(torch.ops.sparsejit.filter_conv.default,
                          (mod.plan, mod.rowptr, mod.taps, mod.values, x, mod.bias, [3, 3],
                           [2, 2], [1, 1], [1, 1], 1, True, -1, res))


def test_residual_module_falls_back_on_broadcasting_add():
    conv = PrunedConv2d(pruned_weight((6, 4, 1, 1), "unstructured", 8), torch.randn(6))
    mod = ResidualPrunedConv2d(conv)
    x = torch.randn(2, 4, 5, 5)
    for res in (torch.randn(1, 6, 1, 1), torch.randn(6, 1, 1), torch.randn(2, 6, 5, 5).double()):
        torch.testing.assert_close(mod(x, res), torch.relu(conv(x) + res))
    full = torch.randn(2, 6, 5, 5)
    assert torch.equal(mod(x, full), torch.relu(conv(x) + full))
    with pytest.raises(ValueError, match="without its own ReLU"):
        ResidualPrunedConv2d(PrunedConv2d(torch.randn(6, 4, 1, 1), relu=True))


def _adds(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is operator.add]


def test_sparsify_fuses_residual_and_relu(tmp_path):
    m = randomize_bn(nn.Sequential(Bottleneck(), Bottleneck()))
    x = torch.randn(2, 16, 12, 12)
    with torch.no_grad():
        want = m(x)
    kw = dict(min_speedup=0.0, fold_bn=True, cache_dir=tmp_path, progress=False,
              verbose=False, repeat=1)
    plain = sparsify(m, x, fuse=False, **kw)
    fused = sparsify(m, x, **kw)  # fuse defaults to fold_bn
    assert len(_adds(plain)) == 2 and not _adds(fused)
    res = [mod for mod in fused.modules() if isinstance(mod, ResidualPrunedConv2d)]
    assert len(res) == 2 and all(r.relu and not r.conv.relu for r in res)
    from sparsejit.families.filter_conv.tuner import LAST_REPORT, format_report
    assert sum(r.get("fused") == "+ residual, ReLU" for r in LAST_REPORT) == 2
    assert "+ residual, ReLU" in format_report()
    with torch.no_grad():
        assert torch.equal(fused(x), plain(x))  # the same sums, one pass fewer
        torch.testing.assert_close(fused(x), want, rtol=1e-4, atol=1e-4)
    # a dense conv3 (unreachable margin) keeps the add
    dense = sparsify(m, x, **{**kw, "min_speedup": 1e9})
    assert len(_adds(dense)) == 2
    assert not any(isinstance(mod, ResidualPrunedConv2d) for mod in dense.modules())


def test_fused_model_compiles_and_exports(tmp_path):
    m = randomize_bn(nn.Sequential(Bottleneck(), Bottleneck()))
    x = torch.randn(2, 16, 12, 12)
    # the residual fusion alone (fused bottlenecks: test_fused_bottleneck.py)
    fused = sparsify(m, x, min_speedup=0.0, fold_bn=True, cache_dir=tmp_path, progress=False,
                     verbose=False, repeat=1, fuse_groups=False)
    with torch.no_grad():
        want = fused(x)
        torch.testing.assert_close(torch.compile(fused, fullgraph=True)(x), want)
    ep = torch.export.export(fused, (x,))
    calls = [n for n in ep.graph.nodes if str(n.target) == "sparsejit.filter_conv.default"]
    assert sum(n.args[-1] is not None for n in calls if len(n.args) == 14) == 2
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), want)


class Stem(nn.Module):
    def __init__(self, relu="module"):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 7, stride=2, padding=3, bias=False), \
            nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.mode = relu

    def forward(self, x):
        y = self.bn1(self.conv1(x))
        y = self.relu(y) if self.mode == "module" else y
        return self.bn2(self.conv2(self.pool(y)))


@pytest.mark.parametrize("relu", ["module", "none"])
def test_sparsify_runs_dense_stem_and_pool_on_channels_last(tmp_path, relu):
    torch.manual_seed(3)
    m = randomize_bn(Stem(relu))
    with torch.no_grad():
        m.conv1.weight.copy_(torch.randn_like(m.conv1.weight))  # dense stem: kept dense
    x = torch.randn(2, 3, 30, 26)
    with torch.no_grad():
        want = m(x)
    kw = dict(fold_bn=True, cache_dir=tmp_path, progress=False, verbose=False, repeat=1)
    out = sparsify(m, x, min_speedup=0.0, **kw)
    from sparsejit.families.filter_conv.tuner import LAST_REPORT
    pools = [mod for mod in out.modules() if isinstance(mod, ConvPool)]
    assert len(pools) == 1 and pools[0].relu == (relu == "module")
    assert isinstance(pools[0].conv, nn.Conv2d)
    assert not any(isinstance(mod, nn.MaxPool2d) and mod is not pools[0].pool
                   for mod in out.modules())
    row = [r for r in LAST_REPORT if r["name"] == "conv1 + pool"]
    assert len(row) == 1 and row[0]["fused"] == "+ pool, channels_last" and not row[0]["cached"]
    with torch.no_grad():
        got = out(x)
        assert got.is_contiguous()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        # channels_last input: channels_last result, same values
        xc = x.contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(out(xc), want, rtol=1e-4, atol=1e-4)
    table = json.loads((tmp_path / "decisions.json").read_text())
    assert sum(k.startswith("convpool|") for k in table) == 1
    # the same model again: the decision comes from the cache; an unreachable margin keeps
    # the NCHW pair (the ReLU fused into the dense unit by fold_bn, the pool separate)
    sparsify(m, x, min_speedup=0.0, **kw)
    assert [r["cached"] for r in LAST_REPORT if r["name"] == "conv1 + pool"] == [True]
    kept = sparsify(m, x, min_speedup=1e9, **kw)
    assert not any(isinstance(mod, ConvPool) for mod in kept.modules())
    assert any(isinstance(mod, nn.MaxPool2d) for mod in kept.modules())
    with torch.no_grad():
        torch.testing.assert_close(kept(x), want, rtol=1e-4, atol=1e-4)


def test_relu_after_pool_is_exact_with_nan_and_ties():
    conv = nn.Conv2d(2, 3, 3, padding=1).eval()
    pool = nn.MaxPool2d(2)
    x = torch.randn(1, 2, 6, 6)
    x[0, 0, 1, 1] = float("nan")
    with torch.no_grad():
        want = pool(torch.relu(conv(x)))
        got = ConvPool(conv, True, pool)(x)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    torch.testing.assert_close(torch.nan_to_num(got), torch.nan_to_num(want))
    with torch.no_grad():  # an unbatched [C, H, W] input takes the plain order
        torch.testing.assert_close(ConvPool(conv, True, pool)(x[0]), pool(torch.relu(conv(x[0]))),
                                   equal_nan=True)
    assert isinstance(ConvReLU(conv), nn.Module)  # the unit fold_bn makes of conv + ReLU


def test_no_fusion_without_tracing_or_when_off(tmp_path):
    m = randomize_bn(nn.Sequential(Bottleneck(), Bottleneck()))
    x = torch.randn(1, 16, 8, 8)
    out = sparsify(m, x, min_speedup=0.0, cache_dir=tmp_path, progress=False, verbose=False,
                   repeat=1)  # fold_bn off: the model is converted in place, no graph
    assert out is m and not any(isinstance(mod, ResidualPrunedConv2d) for mod in m.modules())
    c = out[0].conv1
    with pytest.raises(ValueError, match="residual must have the output's shape"):
        F.relu(torch.ops.sparsejit.filter_conv(  # residual of the wrong rank, op level
            c.plan, c.rowptr, c.taps, c.values, x, None, [1, 1], [1, 1], [0, 0], [1, 1], 1,
            False, -1, torch.randn(3)))


class SparseThenPool(nn.Module):
    """VGG-style: a pruned conv (converted to sparse), then a max pool, then another conv."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(4, 12, 3, padding=1)
        self.pool = nn.MaxPool2d(2, ceil_mode=True)
        self.conv2 = nn.Conv2d(12, 6, 3, padding=1)

    def forward(self, x):
        return self.conv2(self.pool(F.relu(self.conv1(x))))


def test_sparsify_runs_other_max_pools_on_channels_last(tmp_path):
    m = randomize_bn(SparseThenPool())  # prunes the convolutions (no BatchNorm here)
    x = torch.randn(2, 4, 11, 9)
    with torch.no_grad():
        want = m(x)
    kw = dict(fold_bn=True, cache_dir=tmp_path, progress=False, verbose=False, repeat=1)
    out = sparsify(m, x, min_speedup=0.0, **kw)
    from sparsejit.families.filter_conv.tuner import LAST_REPORT
    assert isinstance(out.pool, ChannelsLastPool) and out.pool.pool is m.pool
    assert isinstance(out.conv1, PrunedConv2d)
    row = [r for r in LAST_REPORT if r["name"] == "pool"]
    assert len(row) == 1 and row[0]["fused"] == "pool on channels_last"
    assert row[0]["input_shape"] == [2, 12, 11, 9] and not row[0]["cached"]
    with torch.no_grad():
        got = out(x)
        assert got.is_contiguous()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        y = torch.randn(2, 12, 7, 5)  # the module alone: the same values as the pool
        assert torch.equal(out.pool(y), m.pool(y))
        assert torch.equal(out.pool(y[0]), m.pool(y[0]))  # unbatched: as is
    table = json.loads((tmp_path / "decisions.json").read_text())
    assert sum(k.startswith("clpool|") for k in table) == 1
    again = sparsify(m, x, min_speedup=0.0, **kw)
    assert [r["cached"] for r in LAST_REPORT if r["name"] == "pool"] == [True]
    assert isinstance(again.pool, ChannelsLastPool)
    kept = sparsify(m, x, min_speedup=1e9, **kw)  # an unreachable margin keeps the pool
    assert type(kept.pool) is nn.MaxPool2d
    plain = sparsify(m, x, min_speedup=0.0, fuse=False, **kw)
    assert type(plain.pool) is nn.MaxPool2d



def test_channels_last_pools_are_checked_in_the_whole_model():
    """The pass's channels_last pools stay only where the whole model runs faster with them
    (timed once, then cached per model and input); reverted otherwise, rows saying so."""
    from sparsejit.families.filter_conv.tuner import _pools_in_the_model
    torch.manual_seed(0)
    m = SparseThenPool()
    x = torch.randn(2, 4, 11, 9)
    with torch.no_grad():
        want = m(x)
    plain = m.pool
    m.pool = ChannelsLastPool(plain)

    def rows():
        return [dict(name="pool", input_shape=[2, 12, 11, 9], choice="dense", kernel=None,
                     fused="pool on channels_last", cached=False)]
    table = {}
    first = rows()
    assert _pools_in_the_model(m, x, table, first, 0.0, 1, "wall")  # measured, stored
    (key,) = table
    assert key.startswith("clpool-model|") and isinstance(m.pool, ChannelsLastPool)
    assert first[-1]["fused"] == "pools on channels_last" and not first[-1]["cached"]
    assert first[-1]["dense_ms"] > 0 and first[-1]["sparse_ms"] > 0
    table[key] = dict(dense_ms=1.0, sparse_ms=2.0)  # the model twice as slow with them
    second = rows()
    assert not _pools_in_the_model(m, x, table, second, 1.0, 1, "wall")  # from the cache
    assert m.pool is plain and second[-1]["cached"] and not second[-1].get("fused")
    assert second[0]["fused"] is None and "slower in the model" in second[0]["choice"]
    with torch.no_grad():
        torch.testing.assert_close(m(x), want)
    m.pool = ChannelsLastPool(plain)  # dry and not stored: left as the pass chose
    third = rows()
    assert not _pools_in_the_model(m, x, {}, third, 1.0, 1, "wall", dry=True)
    assert isinstance(m.pool, ChannelsLastPool) and third[-1]["choice"] == "not measured"


class FunctionalPools(nn.Module):
    """Max pools written as functions: constant arguments in every form, one with indices
    and one whose kernel comes from the input's shape (both stay functions)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(4, 12, 3, padding=1)
        self.conv2 = nn.Conv2d(12, 6, 3, padding=1)

    def forward(self, x):
        y = F.max_pool2d(F.relu(self.conv1(x)), 3, 2, padding=1)           # stem-like
        y = torch.max_pool2d(y, 2, [], 0, 1, True)                          # ATen form
        z, idx = F.max_pool2d(y, kernel_size=1, return_indices=True)        # indices: kept
        y = F.max_pool2d(z, (2, 1), stride=None, dilation=(1, 1), ceil_mode=True)
        y = F.max_pool2d(y, y.shape[-1] // y.shape[-1])                     # traced value: kept
        return self.conv2(y) + idx.float().sum() * 0


def test_pools_off_the_cpu_are_not_measured_or_rewritten():
    """The channels-last pool rewrite is measured on the CPU: a pool whose input was on
    another device (here meta; CUDA in practice) or on an unknown one stays as it is."""
    from sparsejit.families.filter_conv.tuner import _channels_last_pools
    for devices in ({"pool": torch.device("meta")}, {}):
        gm = torch.fx.symbolic_trace(nn.Sequential(nn.Conv2d(4, 4, 3), nn.MaxPool2d(2)))
        pool_name = [n for n, m in gm.named_modules() if isinstance(m, nn.MaxPool2d)][0]
        devs = {pool_name: devices["pool"]} if devices else {}
        table, rows = {}, []
        changed = _channels_last_pools(gm, {pool_name: ((2, 4, 9, 9), torch.float32)}, table,
                                       rows, 0.0, 1, "wall", devs)
        assert not changed and table == {} and rows == []
        assert type(dict(gm.named_modules())[pool_name]) is nn.MaxPool2d
    # the same pool on the CPU is measured (min_speedup 0 applies it)
    gm = torch.fx.symbolic_trace(nn.Sequential(nn.Conv2d(4, 4, 3), nn.MaxPool2d(2)))
    pool_name = [n for n, m in gm.named_modules() if isinstance(m, nn.MaxPool2d)][0]
    table, rows = {}, []
    assert _channels_last_pools(gm, {pool_name: ((2, 4, 9, 9), torch.float32)}, table, rows,
                                0.0, 1, "wall", {pool_name: torch.device("cpu")})
    assert isinstance(dict(gm.named_modules())[pool_name], ChannelsLastPool)


def test_functional_pools_become_modules_with_the_same_values():
    from sparsejit.families.filter_conv.fold import functional_pools_as_modules
    torch.manual_seed(5)
    m = FunctionalPools()
    gm = torch.fx.symbolic_trace(m)
    made = functional_pools_as_modules(gm)
    assert made == ["max_pool2d_fn", "max_pool2d_fn_1", "max_pool2d_fn_2"]
    kept = [n.target for n in gm.graph.nodes if n.op == "call_function" and n.target in
            (F.max_pool2d, torch.max_pool2d, F.max_pool2d_with_indices)]
    assert kept == [F.max_pool2d_with_indices, F.max_pool2d]  # indices; a traced kernel size
    assert [type(getattr(gm, n)) for n in made] == [nn.MaxPool2d] * 3
    assert gm.max_pool2d_fn.stride == 2 and gm.max_pool2d_fn.padding == 1
    assert gm.max_pool2d_fn_1.ceil_mode and gm.max_pool2d_fn_1.stride == 2
    assert gm.max_pool2d_fn_2.stride == (2, 1) and gm.max_pool2d_fn_2.ceil_mode
    for shape in [(2, 4, 15, 13), (1, 4, 9, 9), (3, 4, 8, 16)]:
        x = torch.randn(*shape)
        x[0, 0, 0, :3] = float("nan")
        with torch.no_grad():
            want, got = m(x), gm(x)
        torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    assert functional_pools_as_modules(gm) == []  # nothing left to convert


def test_sparsify_runs_functional_pools_on_channels_last(tmp_path):
    torch.manual_seed(6)
    m = randomize_bn(FunctionalPools())
    x = torch.randn(2, 4, 17, 15)
    with torch.no_grad():
        want = m(x)
    kw = dict(fold_bn=True, cache_dir=tmp_path, progress=False, verbose=False, repeat=1)
    out = sparsify(m, x, min_speedup=0.0, **kw)
    from sparsejit.families.filter_conv.tuner import LAST_REPORT
    made = ["max_pool2d_fn", "max_pool2d_fn_1", "max_pool2d_fn_2"]
    assert [type(getattr(out, n)) for n in made] == [ChannelsLastPool] * 3
    rows = {r["name"]: r for r in LAST_REPORT}
    assert [rows[n]["fused"] for n in made] == ["pool on channels_last"] * 3
    assert rows["max_pool2d_fn"]["input_shape"] == [2, 12, 17, 15]
    with torch.no_grad():
        torch.testing.assert_close(out(x), want, rtol=1e-4, atol=1e-4)
    kept = sparsify(m, x, min_speedup=1e9, **kw)  # pools that do not win: modules, same values
    assert [type(getattr(kept, n)) for n in made] == [nn.MaxPool2d] * 3
    with torch.no_grad():
        torch.testing.assert_close(kept(x), want, rtol=1e-4, atol=1e-4)
    plain = sparsify(m, x, min_speedup=0.0, fuse=False, **kw)  # no pass: functions stay
    assert not any(isinstance(mod, nn.MaxPool2d) for mod in plain.modules())


def _bf16_edges(shape, seed):
    """bfloat16 values with NaN, infinities, signed zeros and subnormals among normal ones."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g)
    flat = t.view(-1)
    edge = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -3e-39])
    if flat.numel() >= 4 * edge.numel():
        at = torch.randperm(flat.numel(), generator=g)[:edge.numel()]
        flat[at] = edge
    return t.bfloat16()


def same_bf16(a, b):
    """The same bfloat16 bits, NaN matching any NaN (torch's own float32 -> bfloat16 keeps a
    NaN's sign and payload on some paths; sparsejit writes the quiet NaN 0x7fc0)."""
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a.view(torch.int16)[~nan],
                                                       b.view(torch.int16)[~nan])


@pytest.mark.parametrize("geom", GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
@pytest.mark.parametrize("batch", [1, 3])
def test_bfloat16_native_equals_float32_rounded(geom, batch):
    """bfloat16 x and residual go through the kernel without float32 copies; each output is
    the float32 call on the widened tensors, rounded once: the same bits, every variant (the
    1x1 in place at batch 3 spans images within one tile), with and without the residual and
    ReLU, NaN / infinity / subnormal inputs included."""
    c_in, c_out, h, w, k, stride, padding, dilation, groups = geom
    wt = pruned_weight((c_out, c_in // groups, k, k), "unstructured", 21 + batch)
    mod = PrunedConv2d(wt, torch.randn(c_out), stride, padding, dilation, groups)
    xb = _bf16_edges((batch, c_in, h, w), 5 + batch)
    y0 = conv_op(mod, xb.float(), False, None)
    rb = _bf16_edges(y0.shape, 7 + batch)
    for v in PRECOMPILED + ("jit",):
        for relu in (False, True):
            for res in (None, rb):
                got = conv_op(mod, xb, relu, res, VARIANTS[v])
                assert got.dtype == torch.bfloat16 and got.shape == y0.shape
                want = conv_op(mod, xb.float(), relu, None if res is None else res.float(),
                               VARIANTS[v]).bfloat16()
                assert same_bf16(got, want), (v, relu)


def test_bfloat16_layouts_mixed_residual_and_empty():
    wt = pruned_weight((6, 4, 3, 3), "skewed", 5)
    mod = PrunedConv2d(wt, torch.randn(6), padding=1)
    xb = torch.randn(2, 4, 7, 5).bfloat16()
    res = torch.randn(2, 6, 7, 5)
    want = conv_op(mod, xb.float(), True, res.bfloat16().float()).bfloat16()
    # channels_last bfloat16 in: channels_last bfloat16 out, the same bits
    got = conv_op(mod, xb.contiguous(memory_format=torch.channels_last), True,
                  res.bfloat16().contiguous(memory_format=torch.channels_last))
    assert got.dtype == torch.bfloat16
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert same_bf16(got.contiguous(), want)
    # a float32 residual with bfloat16 x is added unrounded (the float32 path), then rounded
    mixed = conv_op(mod, xb, True, res)
    assert mixed.dtype == torch.bfloat16
    assert same_bf16(mixed, conv_op(mod, xb.float(), True, res).bfloat16())
    # empty batch, one pixel
    assert conv_op(mod, xb[:0], True, res[:0].bfloat16()).shape == (0, 6, 7, 5)
    one = PrunedConv2d(pruned_weight((3, 2, 1, 1), "unstructured", 4))
    x1 = torch.randn(1, 2, 1, 1).bfloat16()
    assert same_bf16(conv_op(one, x1, False, None), conv_op(one, x1.float(), False, None).bfloat16())
