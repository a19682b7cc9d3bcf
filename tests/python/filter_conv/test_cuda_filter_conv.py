"""The CUDA filter-sparse convolution (kernels/cuda/filter_conv.cuh through
``sparsejit::filter_conv``) against a float64 dense convolution of the pruned weight and
against the CPU op, and ``sparsify`` on a CUDA model. Inference only (no backward: the op
has no autograd formula on any device).

Everything here is skipped without a CUDA device (run by scripts/gpu_check.sh). The
kernel-level poison and guard-band checks are in tests/cpp (CudaEmulated / CudaGpu).
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparsejit.families.filter_conv import PrunedConv2d, SparseLinear, sparsify

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DEV = "cuda"
TOL = {torch.float32: 1e-4, torch.float64: 1e-6, torch.bfloat16: 3e-2, torch.float16: 4e-3}
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]

# (c_in, c_out, k, stride, padding, dilation, groups, h, w)
GEOMETRIES = [
    (8, 16, 1, 1, 0, 1, 1, 9, 7),     # 1x1
    (6, 10, 3, 1, 1, 1, 1, 12, 11),   # 3x3 same
    (3, 8, 7, 2, 3, 1, 1, 17, 15),    # 7x7 stride 2 (a ResNet stem)
    (8, 8, 3, 2, 2, 2, 2, 10, 9),     # dilated, strided, grouped
    (6, 6, 3, 1, 1, 1, 6, 8, 8),      # depthwise
    (5, 7, 3, 1, 1, 1, 1, 1, 1),      # 1x1 image through a padded 3x3
    (16, 12, 5, 1, 0, 1, 1, 5, 6),    # output of one row
]


def _pruned(c_out, cin_g, k, density, gen, zero_channel=None):
    w = torch.randn(c_out, cin_g, k, k, generator=gen, dtype=torch.float64)
    w = w * (torch.rand(w.shape, generator=gen, dtype=torch.float64) < density)
    if zero_channel is not None:
        w[zero_channel] = 0
    return w


def _reference(x, w, b, stride, padding, dilation, groups, relu):
    y = F.conv2d(x.double().cpu(), w, None if b is None else b.double().cpu(), stride, padding,
                 dilation, groups)
    return y.clamp_min(0) if relu else y


def _close(got, ref, dtype, taps):
    scale = max(1.0, float(ref.abs().max())) if ref.numel() else 1.0
    tol = TOL[dtype] * max(1.0, taps ** 0.5)
    torch.testing.assert_close(got.double().cpu(), ref, atol=tol * scale, rtol=TOL[dtype])


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("density", [0.0, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [1, 3])
def test_cuda_filter_conv_matches_dense_reference(geometry, density, dtype, batch):
    c_in, c_out, k, stride, padding, dilation, groups, h, w = geometry
    gen = torch.Generator().manual_seed(hash((geometry, density, batch)) % (1 << 31))
    weight = _pruned(c_out, c_in // groups, k, density, gen, zero_channel=c_out // 2)
    bias = torch.randn(c_out, generator=gen)
    x = torch.randn(batch, c_in, h, w, generator=gen).to(dtype)
    for relu in (False, True):
        m = PrunedConv2d(weight.float().to(DEV), bias.to(DEV), stride, padding, dilation, groups,
                         relu)
        assert m.values.is_cuda and m.rowptr.is_cuda
        got = m(x.to(DEV))
        assert got.is_cuda and got.dtype == dtype
        ref = _reference(x, weight.float().double(), bias, stride, padding, dilation, groups, relu)
        assert got.shape == ref.shape
        _close(got, ref, dtype, c_in // groups * k * k)
        # The CPU op on the same plan (computed in float32) agrees too.
        cpu = PrunedConv2d(weight.float(), bias, stride, padding, dilation, groups, relu)
        _close(got, cpu(x.float()).double(), dtype, c_in // groups * k * k)


def test_cuda_filter_conv_without_bias_and_empty_batch():
    gen = torch.Generator().manual_seed(3)
    weight = _pruned(4, 3, 3, 0.5, gen).float()
    m = PrunedConv2d(weight.to(DEV), None, padding=1)
    x = torch.randn(2, 3, 5, 6, generator=gen)
    _close(m(x.to(DEV)), _reference(x, weight.double(), None, 1, 1, 1, 1, False), torch.float32, 27)
    empty = m(torch.empty(0, 3, 5, 6, device=DEV))
    assert empty.shape == (0, 4, 5, 6) and empty.is_cuda


def test_cuda_filter_conv_channels_last_in_channels_last_out():
    gen = torch.Generator().manual_seed(4)
    weight = _pruned(8, 6, 3, 0.4, gen).float()
    m = PrunedConv2d(weight.to(DEV), None, padding=1)
    x = torch.randn(2, 6, 7, 9, generator=gen)
    got = m(x.to(DEV).contiguous(memory_format=torch.channels_last))
    assert got.is_contiguous(memory_format=torch.channels_last)
    _close(got, _reference(x, weight.double(), None, 1, 1, 1, 1, False), torch.float32, 54)


def test_cuda_filter_conv_sees_values_updated_in_place():
    gen = torch.Generator().manual_seed(5)
    weight = _pruned(5, 4, 3, 0.6, gen).float()
    m = PrunedConv2d(weight.to(DEV), None, padding=1)
    x = torch.randn(1, 4, 6, 6, generator=gen, device="cpu").to(DEV)
    y1 = m(x)
    m.values.mul_(2)  # a new version: the device copy of the plan is refreshed
    torch.testing.assert_close(m(x), 2 * y1, atol=1e-4, rtol=1e-4)


def test_cuda_filter_conv_plan_on_the_host_is_accepted():
    gen = torch.Generator().manual_seed(6)
    weight = _pruned(6, 3, 3, 0.5, gen).float()
    cpu = PrunedConv2d(weight, None, padding=1)
    x = torch.randn(2, 3, 5, 5, generator=gen)
    y = torch.ops.sparsejit.filter_conv(cpu.plan, cpu.rowptr, cpu.taps, cpu.values, x.to(DEV),
                                        None, [3, 3], [1, 1], [1, 1], [1, 1], 1, False)
    _close(y, cpu(x).double(), torch.float32, 27)


def test_cuda_filter_conv_refuses_a_host_input_for_a_device_plan():
    m = PrunedConv2d(torch.randn(4, 3, 3, 3, device=DEV), None, padding=1)
    with pytest.raises((ValueError, RuntimeError), match="x must be on the GPU"):
        m(torch.randn(1, 3, 5, 5))


def test_cuda_sparse_linear():
    gen = torch.Generator().manual_seed(7)
    lin = nn.Linear(32, 24)
    with torch.no_grad():
        lin.weight.mul_(torch.rand(lin.weight.shape, generator=gen) < 0.2)
    lin = lin.to(DEV)
    s = SparseLinear(lin)
    x = torch.randn(5, 32, generator=gen).to(DEV)
    torch.testing.assert_close(s(x), lin(x), atol=1e-4, rtol=1e-4)


def _pruned_model(density=0.1):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                      nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                      nn.Conv2d(32, 32, 1)).eval()
    with torch.no_grad():
        for mod in m:
            if isinstance(mod, nn.Conv2d):
                mod.weight.mul_(torch.rand(mod.weight.shape) < density)
    return m


def test_cuda_sparsify_measures_on_the_gpu_and_converts(tmp_path):
    m = _pruned_model().to(DEV)
    x = torch.randn(2, 3, 32, 32, device=DEV)
    with torch.no_grad():
        ref = m(x)
    out = sparsify(m, x, min_speedup=0.0, cache_dir=tmp_path, progress=False, verbose=False)
    sparse = [mod for mod in out.modules() if isinstance(mod, PrunedConv2d)]
    assert len(sparse) == 3
    assert all(s.values.is_cuda for s in sparse)
    from sparsejit.families.filter_conv.tuner import LAST_REPORT
    assert all(r["kernel"] == "cuda" and r["dense_ms"] > 0 and r["sparse_ms"] > 0
               for r in LAST_REPORT)
    with torch.no_grad():
        torch.testing.assert_close(out(x), ref, atol=1e-4, rtol=1e-4)
    # The decisions are cached under the GPU model: a second process would not measure.
    m2 = _pruned_model().to(DEV)
    sparsify(m2, x, min_speedup=0.0, cache_dir=tmp_path, progress=False, verbose=False)
    assert all(r["cached"] for r in LAST_REPORT)


def test_cuda_sparsify_keeps_dense_layers_that_are_faster(tmp_path):
    m = _pruned_model().to(DEV)
    x = torch.randn(1, 3, 16, 16, device=DEV)
    out = sparsify(m, x, min_speedup=1e9, cache_dir=tmp_path, progress=False, verbose=False)
    assert not any(isinstance(mod, PrunedConv2d) for mod in out.modules())
