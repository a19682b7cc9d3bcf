"""Point-cloud sparse convolution on CUDA tensors against the CPU op: plan contents (the same
words, so every Python reader works unchanged), forward (bias, ReLU, swap, every dtype, both
dataflows: cuBLAS gather-GEMM-scatter and the output-stationary implicit GEMM) and backward, corrupted plans, and the spconv modules end to end with autograd. The kernel-level
poison and guard-band checks of the gather and row-reduce kernels are in
tests/cpp/cuda_point_conv_checks.h. Skipped without a CUDA device (run by scripts/gpu_check.sh).
"""

import pytest
import torch

import sparsejit.spconv as spconv
from sparsejit.families.point_conv.plan import _FIXED
from sparsejit.families.point_conv.ops import point_conv_plan, point_conv
from conftest import random_sites as _random_sites

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DEV = "cuda"
TOL = {torch.float32: 1e-4, torch.float64: 1e-10, torch.bfloat16: 3e-2, torch.float16: 4e-3}
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
GEOMETRIES = [  # kind, kernel, stride, padding
    ("subm", 3, 1, 0), ("subm", 5, 1, 0), ("spconv", 3, 2, 1), ("coarse", 2, 2, 0),
    ("transposed", 3, 2, 1)]


def random_sites(n, shape, batch_size=2, seed=0, cluster=False):
    if cluster:  # a dense block: every site has every neighbour
        s = int(round(n ** (1 / len(shape))))
        grid = torch.stack(torch.meshgrid(*[torch.arange(s)] * len(shape), indexing="ij"), -1)
        cols = grid.reshape(-1, len(shape))
        return torch.cat([torch.zeros(len(cols), 1, dtype=torch.long), cols], 1).int()
    return _random_sites(n, shape, batch_size, seed)


def _close(got, ref, dtype, scale=1.0):
    ref = ref.double().cpu()
    s = max(scale, float(ref.abs().max())) if ref.numel() else 1.0
    torch.testing.assert_close(got.double().cpu(), ref, atol=TOL[dtype] * s, rtol=TOL[dtype])


def _cpu(t):
    """CPU copy the CPU op accepts (float16 runs there in float32, which holds it exactly)."""
    if t is None:
        return None
    t = t.detach().cpu()
    return t.float() if t.dtype == torch.float16 else t


SITES = {"random": lambda: random_sites(300, [12, 12, 12]),
         "one_point": lambda: random_sites(1, [12, 12, 12]),
         "empty": lambda: torch.zeros(0, 4, dtype=torch.int32),
         "dense_cluster": lambda: random_sites(216, [12, 12, 12], cluster=True),
         "grid_edge": lambda: torch.tensor([[0, 0, 0, 0], [0, 11, 11, 11], [1, 11, 0, 11],
                                            [1, 0, 11, 0]], dtype=torch.int32)}


@pytest.mark.parametrize("sites", list(SITES))
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_plan_matches_cpu(sites, geometry):
    kind, k, s, p = geometry
    coords = SITES[sites]()
    plan, oc = point_conv_plan(coords, [12, 12, 12], 2, kind, k, s, p)
    dplan, doc = point_conv_plan(coords.to(DEV), [12, 12, 12], 2, kind, k, s, p)
    assert dplan.device.type == "cuda" and doc.device.type == "cuda"
    assert torch.equal(dplan.cpu(), plan)
    assert torch.equal(doc.cpu(), oc)


@pytest.mark.parametrize("dataflow", ["auto", "gather_gemm_scatter", "output_stationary"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sites", list(SITES))
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_forward_and_backward_match_cpu(dtype, sites, geometry, dataflow):
    kind, k, s, p = geometry
    coords = SITES[sites]()
    plan, oc = point_conv_plan(coords, [12, 12, 12], 2, kind, k, s, p)
    kv = k ** 3
    g = torch.Generator().manual_seed(1)
    for c_in, c_out, swap, relu, with_bias in [(4, 8, False, False, True), (3, 5, True, True, False),
                                               (16, 16, False, True, True)]:
        n_in, n_out = (oc.shape[0], coords.shape[0]) if swap else (coords.shape[0], oc.shape[0])
        x = torch.randn(n_in, c_in, generator=g).to(dtype)
        w = (torch.randn(kv, c_in, c_out, generator=g) / kv ** 0.5).to(dtype)
        b = torch.randn(c_out, generator=g).to(dtype) if with_bias else None
        xd, wd = x.to(DEV).requires_grad_(), w.to(DEV).requires_grad_()
        bd = b.to(DEV).requires_grad_() if with_bias else None
        y = point_conv(xd, wd, bd, plan.to(DEV), n_out, swap=swap, relu=relu,
                        dataflow=dataflow)
        xc, wc = _cpu(x).requires_grad_(), _cpu(w).requires_grad_()
        bc = _cpu(b).requires_grad_() if with_bias else None
        ref = point_conv(xc, wc, bc, plan, n_out, swap=swap, relu=relu)
        assert y.device.type == "cuda" and y.dtype == dtype and y.shape == ref.shape
        _close(y, ref, dtype, scale=c_in)
        gy = torch.randn(y.shape, generator=g).to(dtype)
        y.backward(gy.to(DEV))
        ref.backward(_cpu(gy))
        _close(xd.grad, xc.grad, dtype, scale=c_out * 4)
        _close(wd.grad, wc.grad, dtype, scale=max(1, n_in))
        if with_bias:
            _close(bd.grad, bc.grad, dtype, scale=max(1, n_out))


@pytest.mark.parametrize("dataflow", ["gather_gemm_scatter", "output_stationary"])
def test_deterministic_bits(dataflow):
    coords = random_sites(2000, [16, 16, 16], seed=3)
    plan, _ = point_conv_plan(coords.to(DEV), [16, 16, 16], 2, "subm", 3)
    x = torch.randn(coords.shape[0], 32, device=DEV)
    w = torch.randn(27, 32, 32, device=DEV)
    a = point_conv(x, w, None, plan, coords.shape[0], dataflow=dataflow)
    assert torch.equal(a, point_conv(x, w, None, plan, coords.shape[0], dataflow=dataflow))


@pytest.mark.parametrize("c_in,c_out", [(64, 64), (128, 96), (200, 3), (1, 256)])
def test_output_stationary_matches_gather_gemm_scatter_on_wide_layers(c_in, c_out):
    """The implicit GEMM's channel tiles (16/32/64 per block, partial tiles) on wide and odd
    widths, forward and feature gradient, against the cuBLAS dataflow on the same device."""
    coords = random_sites(3000, [20, 20, 20], seed=6)
    plan, _ = point_conv_plan(coords.to(DEV), [20, 20, 20], 2, "subm", 3)
    n = coords.shape[0]
    x = torch.randn(n, c_in, device=DEV, dtype=torch.float64)
    w = torch.randn(27, c_in, c_out, device=DEV, dtype=torch.float64) / 27
    outs = []
    for dataflow in ("gather_gemm_scatter", "output_stationary"):
        xd = x.clone().requires_grad_()
        y = point_conv(xd, w, None, plan, n, dataflow=dataflow)
        y.backward(torch.ones_like(y))
        outs.append((y.detach(), xd.grad))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(outs[1][1], outs[0][1], rtol=1e-10, atol=1e-10)


def test_float64_gradcheck():
    coords = random_sites(30, [5, 5, 5], seed=4)
    plan, _ = point_conv_plan(coords.to(DEV), [5, 5, 5], 2, "subm", 3)
    x = torch.randn(30, 2, device=DEV, dtype=torch.float64, requires_grad=True)
    w = torch.randn(27, 2, 3, device=DEV, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, device=DEV, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda x, w, b: point_conv(x, w, b, plan, 30), (x, w, b))


def test_bad_plans_are_named():
    coords = random_sites(50, [8, 8, 8], seed=5)
    plan, _ = point_conv_plan(coords.to(DEV), [8, 8, 8], 1, "subm", 3)
    x = torch.randn(50, 4, device=DEV)
    w = torch.randn(27, 4, 4, device=DEV)
    with pytest.raises(ValueError, match="kernel offsets"):
        point_conv(x, torch.randn(8, 4, 4, device=DEV), None, plan, 50)
    with pytest.raises(ValueError, match="num_out"):
        point_conv(x, w, None, plan, 49)
    bad = plan.clone()
    bad[_FIXED + 27 + 1] = 1 << 40  # in_idx[0] = 0, in_idx[1] = 256: past the 50 sites
    with pytest.raises(ValueError, match="corrupted plan"):
        point_conv(x, w, None, bad, 50)
    with pytest.raises(ValueError, match="plan is on"):
        point_conv(x, w, None, plan.cpu(), 50)


def test_spconv_modules_on_cuda():
    torch.manual_seed(0)
    coords = random_sites(400, [16, 16, 16], seed=6)
    feats = torch.randn(400, 4)

    def net():
        return spconv.SparseSequential(
            spconv.SubMConv3d(4, 8, 3, indice_key="s0"),
            spconv.SparseConv3d(8, 16, 3, 2, 1, indice_key="d0"),
            spconv.SubMConv3d(16, 16, 3, indice_key="s1"),
            spconv.SparseInverseConv3d(16, 8, 3, indice_key="d0"))

    cpu_net = net().double()
    gpu_net = net().double()
    gpu_net.load_state_dict(cpu_net.state_dict())
    gpu_net = gpu_net.to(DEV)
    xc = feats.double().requires_grad_()
    xg = feats.double().to(DEV).requires_grad_()
    # Indices stay on the CPU for the GPU run: the plans follow the features' device.
    yc = cpu_net(spconv.SparseConvTensor(xc, coords, [16, 16, 16], 2))
    yg = gpu_net(spconv.SparseConvTensor(xg, coords, [16, 16, 16], 2))
    assert yg.features.device.type == "cuda"
    _close(yg.features, yc.features, torch.float64)
    yc.features.square().sum().backward()
    yg.features.square().sum().backward()
    _close(xg.grad, xc.grad, torch.float64, scale=10)
    for (n, pc), pg in zip(cpu_net.named_parameters(), gpu_net.parameters()):
        _close(pg.grad, pc.grad, torch.float64, scale=10)


@pytest.mark.parametrize("shape,kernel,dilation", [([9, 7], 3, 2), ([5, 6, 7, 3], 3, 1),
                                                    ([12, 12, 12], 1, 1), ([12, 12, 12], 5, 2)])
def test_submanifold_map_on_gpu_matches_cpu(shape, kernel, dilation):
    """The GPU-built submanifold map (sorted keys, NVRTC search, compaction) word for word."""
    for n in (0, 1, 60, 400):
        coords = random_sites(n, shape, seed=n)
        coords = coords[torch.randperm(coords.shape[0])]
        plan, oc = point_conv_plan(coords, shape, 2, "subm", kernel, 1, 0, dilation)
        dplan, doc = point_conv_plan(coords.to(DEV), shape, 2, "subm", kernel, 1, 0, dilation)
        assert torch.equal(dplan.cpu(), plan) and torch.equal(doc.cpu(), oc)


def test_bad_coordinates_on_gpu_get_the_cpu_errors():
    dup = torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2], [0, 1, 1, 1]], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="rows 0 and 2 are the same site"):
        point_conv_plan(dup, [4, 4, 4], 1, "subm", 3)
    outside = torch.tensor([[0, 1, 1, 4]], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="coords"):
        point_conv_plan(outside, [4, 4, 4], 1, "subm", 3)
    with pytest.raises(TypeError, match="integers"):
        point_conv_plan(torch.zeros(2, 4, device=DEV), [4, 4, 4], 1, "subm", 3)
