"""Filter-sparse convolution, JIT variants (per-layer compiled loops, baked tap offsets),
BatchNorm folding in sparsify, and channels_last output."""

import glob
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sparsejit as sj
from sparsejit import _core
from sparsejit.families.filter_conv.fold import ConvReLU, fold_batchnorm
from sparsejit.families.filter_conv.layers import PrunedConv2d
from sparsejit.families.filter_conv.tuner import sparsify
from sparsejit.families.filter_conv.ops import VARIANTS

from test_filter_conv import GEOMETRIES, pruned_weight, reference, run_op

JIT = _core.jit_enabled() and bool(
    os.environ.get("SPARSEJIT_CXX") or os.environ.get("CXX") or
    any(os.path.exists(os.path.join(d, "c++")) for d in os.environ["PATH"].split(":")))


def compiled_specs(prefix):
    return glob.glob(os.path.join(_core.cache_dir(), "**", prefix + "*.so"), recursive=True)


@pytest.mark.parametrize("geom", GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
def test_jit_variants_match_reference_and_generic_bitwise(geom):
    c_in, c_out, h, w_, k, stride, padding, dilation, groups = geom
    weight = pruned_weight((c_out, c_in // groups, k, k), "skewed" if c_in == 1 else
                           "unstructured", seed=3 * sum(geom))
    bias = torch.randn(c_out)
    for batch in (1, 3):
        x = torch.randn(batch, c_in, h, w_)
        for relu in (False, True):
            mod = PrunedConv2d(weight, bias, stride, padding, dilation, groups, relu=relu)
            want = reference(x, weight, bias, stride, padding, dilation, groups, relu)
            generic = run_op(mod, x, VARIANTS["generic"])  # the same tile, precompiled loop
            for name in ("jit", "jit_baked", "auto"):
                y = run_op(mod, x, VARIANTS[name])
                torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4, msg=name)
                # Same products in the same order, FMA explicit in both: bit-identical.
                assert torch.equal(y, generic), name
    if JIT:
        assert compiled_specs("filter_conv_baked_") and compiled_specs("filter_conv_v")


@pytest.mark.skipif(not JIT, reason="needs the CPU JIT")
@pytest.mark.parametrize("geom", [(16, 24, 12, 13, 3, 1, 1, 1, 1), (64, 40, 9, 9, 1, 1, 0, 1, 1),
                                  (8, 16, 17, 15, 3, 2, 1, 1, 2)],
                         ids=lambda g: "x".join(map(str, g)))
def test_jit_lane_width_is_bit_identical(geom, monkeypatch):
    """The shaped JIT loop on 16-lane vectors (AVX-512 CPUs) and on 8 lanes
    (SPARSEJIT_FILTER_CONV_WIDE=0, a separate spec) give the same bits as the precompiled
    loop, for every tile size the planner picks here (batch 1 and 4: 8 to 64 pixels)."""
    c_in, c_out, h, w_, k, stride, padding, dilation, groups = geom
    weight = pruned_weight((c_out, c_in // groups, k, k), "unstructured", seed=sum(geom))
    bias = torch.randn(c_out)
    for batch in (1, 4):
        x = torch.randn(batch, c_in, h, w_)
        outs = {}
        for wide in ("0", "1"):
            monkeypatch.setenv("SPARSEJIT_FILTER_CONV_WIDE", wide)
            mod = PrunedConv2d(weight.clone(), bias, stride, padding, dilation, groups)
            outs[wide] = run_op(mod, x, VARIANTS["jit"])
            outs["generic" + wide] = run_op(mod, x, VARIANTS["generic"])
        assert torch.equal(outs["0"], outs["generic0"]) and torch.equal(outs["1"], outs["0"])
        want = reference(x, weight, bias, stride, padding, dilation, groups, False)
        torch.testing.assert_close(outs["1"].double(), want, rtol=1e-4, atol=1e-4)
    assert compiled_specs("filter_conv_v") and any(
        p.endswith(".so") and "_narrow" in p for p in compiled_specs("filter_conv_v"))


def test_jit_on_skewed_empty_and_zero_patterns():
    x = torch.randn(2, 16, 9, 9)
    for kind in ("skewed", "zero_filters", "all_zero", "dense"):
        weight = pruned_weight((12, 16, 3, 3), kind, seed=7)
        mod = PrunedConv2d(weight, torch.randn(12), 1, 1, relu=True)
        want = reference(x, weight, mod.bias, 1, 1, 1, 1, True)
        for name in ("jit", "jit_baked"):
            torch.testing.assert_close(run_op(mod, x, VARIANTS[name]).double(), want,
                                       rtol=1e-4, atol=1e-4, msg=f"{kind} {name}")
    mod = PrunedConv2d(pruned_weight((4, 3, 1, 1), "unstructured", 2), kernel="jit_baked")
    assert mod(torch.randn(0, 3, 5, 5)).shape == (0, 4, 5, 5)
    x = torch.randn(2, 3, 1, 1)  # one pixel
    torch.testing.assert_close(mod(x), run_op(mod, x, VARIANTS["generic"]), rtol=0, atol=0)


def test_jit_off_and_compile_failure_fall_back(monkeypatch, capfd):
    weight = pruned_weight((8, 5, 3, 3), "unstructured", seed=101)
    x = torch.randn(1, 5, 8, 8)
    want = reference(x, weight, None, 1, 1, 1, 1)
    monkeypatch.setenv("SPARSEJIT_JIT", "0")
    _core.jit_refresh_env()
    try:
        mod = PrunedConv2d(weight, None, 1, 1)
        torch.testing.assert_close(mod(x, variant=VARIANTS["jit_baked"]).double(), want,
                                   rtol=1e-4, atol=1e-4)
    finally:
        monkeypatch.delenv("SPARSEJIT_JIT")
        _core.jit_refresh_env()
    # A compiler that fails: one warning, then the precompiled loop (a fresh pattern, so the
    # baked spec is not already loaded).
    monkeypatch.setenv("SPARSEJIT_CXX", "false")
    weight2 = pruned_weight((8, 5, 3, 3), "unstructured", seed=int(torch.randint(10**6, (1,))))
    mod2 = PrunedConv2d(weight2, None, 1, 1)
    y = mod2(x, variant=VARIANTS["jit_baked"])
    torch.testing.assert_close(y.double(), reference(x, weight2, None, 1, 1, 1, 1),
                               rtol=1e-4, atol=1e-4)
    # The JIT loops need AVX2 + FMA: without them (or under SPARSEJIT_MAX_ISA=baseline) none
    # is compiled, so no compiler failure to report.
    if _core.isa_state()["avx2_fma"]:
        assert "sparsejit JIT" in capfd.readouterr().err


def test_set_kernel_and_plan_word():
    weight = pruned_weight((6, 4, 3, 3), "unstructured", seed=5)
    mod = PrunedConv2d(weight, torch.randn(6), 2, 1).set_kernel("jit")
    assert int(mod.plan[3]) == VARIANTS["jit"] and mod.kernel == "jit"
    x = torch.randn(2, 4, 7, 7)
    torch.testing.assert_close(mod(x).double(), reference(x, weight, mod.bias, 2, 1, 1, 1),
                               rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="kernel must be one of"):
        mod.set_kernel("fast")
    torch.library.opcheck(torch.ops.sparsejit.filter_conv.default,
                          (mod.plan, mod.rowptr, mod.taps, mod.values, x, mod.bias, [3, 3],
                           [2, 2], [1, 1], [1, 1], 1, True, VARIANTS["jit_baked"]))


def test_channels_last_in_channels_last_out():
    weight = pruned_weight((12, 8, 3, 3), "unstructured", seed=9)
    mod = PrunedConv2d(weight, torch.randn(12), 2, 1)
    x = torch.randn(2, 8, 10, 10).contiguous(memory_format=torch.channels_last)
    y = mod(x)
    assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
    torch.testing.assert_close(y.double(), reference(x, weight, mod.bias, 2, 1, 1, 1),
                               rtol=1e-4, atol=1e-4)
    assert mod(x.contiguous()).is_contiguous()
    torch.library.opcheck(torch.ops.sparsejit.filter_conv.default,
                          (mod.plan, mod.rowptr, mod.taps, mod.values, x, mod.bias, [3, 3],
                           [2, 2], [1, 1], [1, 1], 1, False, -1))
    with torch.no_grad():
        got = torch.compile(mod, fullgraph=True)(x)
    torch.testing.assert_close(got, y, rtol=1e-5, atol=1e-5)


# ---- sparsify(fold_bn=True) --------------------------------------------------------------

def randomize_bn(m):
    with torch.no_grad():
        for bn in m.modules():
            if isinstance(bn, nn.BatchNorm2d):
                bn.running_mean.normal_()
                bn.running_var.uniform_(0.5, 2.0)
                bn.weight.normal_()
                bn.bias.normal_()
        for conv in m.modules():
            if isinstance(conv, nn.Conv2d):
                conv.weight.mul_(torch.rand_like(conv.weight) > 0.8)
    return m.eval()


class Bottleneck(nn.Module):
    """torchvision's shape: one ReLU module called three times, a residual add."""

    def __init__(self, c=16):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, 8, 1, bias=False), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv3, self.bn3 = nn.Conv2d(8, c, 1, bias=False), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + x)


class Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16))

    def forward(self, x):
        y = self.body(x)
        return y if float(y.sum()) > -1e30 else -y  # data-dependent: fx cannot trace it


def test_sparsify_fold_bn_traced(tmp_path):
    m = randomize_bn(nn.Sequential(Bottleneck(), Bottleneck()))
    x = torch.randn(2, 16, 12, 12)
    with torch.no_grad():
        want = m(x)
    out = sparsify(m, x, min_speedup=0.0, fold_bn=True, cache_dir=tmp_path, progress=False,
                   verbose=False, repeat=1)
    assert isinstance(out, torch.fx.GraphModule)
    assert not any(isinstance(mod, nn.BatchNorm2d) for mod in out.modules())
    sparse = [mod for mod in out.modules() if isinstance(mod, PrunedConv2d)]
    assert len(sparse) == 6 and sum(mod.relu for mod in sparse) == 4  # conv1, conv2 per block
    with torch.no_grad():
        torch.testing.assert_close(out(x), want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(m(x), want)  # the original model is left as it was


def test_sparsify_fold_bn_sequential_fallback(tmp_path):
    m = randomize_bn(Untraceable())
    x = torch.randn(1, 3, 10, 10)
    with torch.no_grad():
        want = m(x)
    out = sparsify(m, x, min_speedup=0.0, fold_bn=True, cache_dir=tmp_path, progress=False,
                   verbose=False, repeat=1)
    assert out is m
    assert [type(c).__name__ for c in m.body] == ["PrunedConv2d", "Identity", "Identity",
                                                  "PrunedConv2d", "Identity"]
    assert m.body[0].relu and not m.body[3].relu
    with torch.no_grad():
        torch.testing.assert_close(m(x), want, rtol=1e-4, atol=1e-4)


def test_fold_bn_dense_choice_and_training_mode(tmp_path):
    m = randomize_bn(nn.Sequential(nn.Conv2d(4, 8, 3), nn.BatchNorm2d(8), nn.ReLU()))
    x = torch.randn(1, 4, 6, 6)
    with torch.no_grad():
        want = m(x)
    out = sparsify(m, x, min_speedup=1e9, fold_bn=True, cache_dir=tmp_path, progress=False,
                   verbose=False, repeat=1)  # stays dense, but folded and fused
    assert isinstance(getattr(out, "0"), ConvReLU)
    with torch.no_grad():
        torch.testing.assert_close(out(x), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="eval mode"):
        fold_batchnorm(nn.Sequential(nn.Conv2d(4, 8, 3), nn.BatchNorm2d(8)).train())


def test_sparsify_measures_jit_variants(tmp_path):
    import json
    import sparsejit.families.filter_conv.tuner as fc
    m = randomize_bn(nn.Sequential(nn.Conv2d(8, 12, 3, padding=1), nn.BatchNorm2d(12)))
    x = torch.randn(1, 8, 14, 14)
    with torch.no_grad():
        want = m(x)
    out = sparsify(m, x, min_speedup=0.0, fold_bn=True, cache_dir=tmp_path, progress=False,
                   verbose=False, repeat=3, baked_max_nnz=512)
    row = fc.LAST_REPORT[0]
    assert row["choice"] == "sparse" and row["kernel"] in VARIANTS
    entry = next(iter(json.loads((tmp_path / "decisions.json").read_text()).values()))
    expect = {"generic", "jit", "jit_baked"} if _core.jit_enabled() else {"generic"}
    assert set(entry["kernel_ms"]) == expect and entry["kernel"] == row["kernel"]
    layer = getattr(out, "0")
    assert layer.kernel == row["kernel"] and int(layer.plan[3]) == VARIANTS[row["kernel"]]
    with torch.no_grad():
        torch.testing.assert_close(out(x), want, rtol=1e-4, atol=1e-4)
    assert sj.sparsify is sparsify
