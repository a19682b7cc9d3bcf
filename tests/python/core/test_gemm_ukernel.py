"""The dense layer's small products on oneDNN's brgemm micro-kernel, as the PyTorch in the
process exports it (``at::native::cpublas::brgemm``, found at run time; csrc/dense/gemm.cpp):
the detection agrees with what libtorch_cpu exports, the switch turns it on and off, and the
products that take it (inside a parallel region or on one thread; no transposes; N <= 128,
K <= 64; beta 0 or 1) agree with float64 with it on and off, on row counts that exercise the
256-row blocks and every halving tail, and on widths on both sides of its limits."""

import ctypes
import os

import pytest
import torch

import sparsejit  # noqa: F401  (loads the op library)
from sparsejit import _core
from conftest import poison_heap, random_sites

LINEAR = torch.ops.sparsejit.linear
ADD = torch.ops.sparsejit.linear_add_
SEGMENT = torch.ops.sparsejit.segment_matmul
SYMBOL = "_ZN2at6native7cpublas6brgemmEllllllbPKfS3_Pfb"


def torch_exports_brgemm() -> bool:
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    return hasattr(lib, SYMBOL)


@pytest.fixture
def ukernel():
    """Yields a setter for the micro-kernel switch and the thread count; both restored."""
    was, threads = _core.gemm_ukernel(), torch.get_num_threads()

    def set_state(on: bool, num_threads: int):
        _core.set_gemm_ukernel(on)
        torch.set_num_threads(num_threads)

    yield set_state
    _core.set_gemm_ukernel(was)
    torch.set_num_threads(threads)


def test_detection_follows_torch_and_the_switch(ukernel):
    if os.environ.get("SPARSEJIT_GEMM_UKERNEL") == "0":
        pytest.skip("SPARSEJIT_GEMM_UKERNEL=0 in the environment")
    assert _core.gemm_ukernel() == torch_exports_brgemm()
    ukernel(False, 2)
    assert _core.gemm_ukernel() is False
    assert _core.set_gemm_ukernel(True) is False
    assert _core.gemm_ukernel() == torch_exports_brgemm()


ROWS = [1, 3, 127, 255, 256, 257, 511, 1000]
WIDTHS = [(1, 1), (5, 7), (16, 16), (64, 64), (64, 128), (3, 100),  # take the micro-kernel
          (65, 8), (128, 64), (8, 129)]                              # above its limits


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("f_in,f_out", WIDTHS)
def test_linear_and_linear_add_against_float64(ukernel, on, threads, f_in, f_out):
    ukernel(on, threads)
    for n in ROWS:
        g = torch.Generator().manual_seed(n * 1009 + f_in * 31 + f_out)
        x = torch.randn(n, f_in, generator=g)
        w = torch.randn(f_out, f_in, generator=g)
        b = torch.randn(f_out, generator=g)
        want = x.double() @ w.double().t()
        poison_heap((n, f_out))
        y = LINEAR(x, w, b)
        torch.testing.assert_close(y.double(), want + b.double(), rtol=1e-5, atol=1e-4)
        out = torch.randn(n, f_out, generator=g)  # beta = 1: added onto, not overwritten
        start = out.double()
        ADD(out, x, w)
        torch.testing.assert_close(out.double(), start + want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("f_in,f_out", [(16, 16), (64, 32), (7, 128), (96, 16)])
def test_segment_matmul_skewed_segments_against_float64(ukernel, on, f_in, f_out):
    """Many segments (one parallel region over (segment, row block) items): empty ones, one
    row, a 256-row block plus tails, one large one holding most rows."""
    ukernel(on, 2)
    sizes = [0, 1, 300, 0, 5, 2600, 256, 129, 1]
    g = torch.Generator().manual_seed(f_in * 17 + f_out)
    ptr = torch.tensor([0] + sizes).cumsum(0)
    n = int(ptr[-1])
    x = torch.randn(n, f_in, generator=g)
    w = torch.randn(len(sizes), f_in, f_out, generator=g)
    poison_heap((n, f_out))
    y = SEGMENT(x, ptr, w)
    want = torch.cat([x[ptr[k]:ptr[k + 1]].double() @ w[k].double() for k in range(len(sizes))])
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-4)


def test_layers_agree_with_the_micro_kernel_on_and_off(ukernel):
    """One R-GCN layer forward + backward (its tiles and its Linear-like products) gives the
    same values either way."""
    import sparsejit.nn as sjnn

    g = torch.Generator().manual_seed(5)
    n, r, f = 700, 6, 32
    ei = torch.randint(0, n, (2, 5000), generator=g)
    et = torch.randint(0, r, (5000,), generator=g)
    x0 = torch.randn(n, f, generator=g)
    gy = torch.randn(n, f, generator=g)
    torch.manual_seed(0)
    layer = sjnn.RGCNConv(f, f, r, aggr="mean")
    results = []
    for on in (True, False):
        ukernel(on, 2)
        layer.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        y = layer(x, ei, et)
        y.backward(gy)
        results.append((y.detach(), x.grad, [p.grad.clone() for p in layer.parameters()]))
    (y1, dx1, dp1), (y0, dx0, dp0) = results
    torch.testing.assert_close(y1, y0, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(dx1, dx0, rtol=1e-5, atol=1e-4)
    for a, b in zip(dp1, dp0):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("kind", ["subm", "spconv"])
@pytest.mark.parametrize("c_in,c_out", [(16, 16), (32, 64), (64, 32), (48, 128), (8, 130)])
def test_point_conv_feature_gradient_against_float64(ukernel, on, kind, c_in, c_out):
    """The gather-GEMM-scatter feature gradient multiplies by W^T: with the micro-kernel it
    copies W^T out once and multiplies untransposed. Against the pairs in float64, for a
    submanifold map (unique out rows per offset) and a strided one (several pairs per out row
    in one offset), with the forward and weight gradient alongside."""
    from sparsejit.families.point_conv.ops import point_conv_plan, plan_pairs

    ukernel(on, 2)
    coords = random_sites(3000, (24, 24, 24), batch_size=2, seed=c_in + c_out)
    if kind == "subm":
        plan, out = point_conv_plan(coords, [24] * 3, 2, "subm", 3)
    else:
        plan, out = point_conv_plan(coords, [24] * 3, 2, "spconv", 3, 2, 1)
    n_in, n_out = coords.shape[0], out.shape[0]
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n_in, c_in, generator=g)
    w = torch.randn(27, c_in, c_out, generator=g)
    gy = torch.randn(n_out, c_out, generator=g)
    gather_gemm_scatter = 1
    poison_heap((n_in, c_in))
    dx, dw = torch.ops.sparsejit.point_conv_backward(x, w, gy, plan, False,
                                                      gather_gemm_scatter, True, True)
    want_dx = torch.zeros(n_in, c_in, dtype=torch.float64)
    want_dw = torch.zeros(27, c_in, c_out, dtype=torch.float64)
    ptr, ins, outs = plan_pairs(plan)
    for k in range(27):
        i, o = ins[ptr[k]:ptr[k + 1]], outs[ptr[k]:ptr[k + 1]]
        want_dx.index_add_(0, i, gy[o].double() @ w[k].double().t())
        want_dw[k] = x[i].double().t() @ gy[o].double()
    torch.testing.assert_close(dx.double(), want_dx, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(dw.double(), want_dw, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("f_in,f_out", [(7, 16), (64, 64), (33, 48), (1, 5), (16, 65)])
@pytest.mark.parametrize("strategy", [1, 2])
def test_rgms_bfloat16_tiles_exact_on_exact_inputs(ukernel, on, f_in, f_out, strategy):
    """bfloat16 R-GCN tiles: with the micro-kernel the weights are packed per relation into
    oneDNN's VNNI layout (pairs of rows interleaved, odd f_in padded, N up to 64; 65 keeps
    oneDNN's bfloat16 GEMM). Halves in X and small integers in W make every sum and product
    exact, so the output must equal the float64 reference rounded once, bit for bit."""
    ukernel(on, 2)
    g = torch.Generator().manual_seed(f_in * 100 + f_out)
    n_src, n_dst, r, e = 900, 700, 5, 6000
    src = torch.randint(0, n_src, (e,), generator=g)
    dst = torch.cat([torch.zeros(e // 2, dtype=torch.long),  # one very skewed target
                     torch.randint(0, n_dst, (e - e // 2,), generator=g)])
    et = torch.randint(0, r, (e,), generator=g)
    x = (torch.randint(-2, 3, (n_src, f_in), generator=g) / 2).bfloat16()
    w = torch.randint(-2, 3, (r, f_in, f_out), generator=g).bfloat16()
    a = sparsejit.TypedSparseMatrix.from_edge_index(torch.stack([src, dst]), (n_src, n_dst),
                                                    edge_type=et, num_relations=r)
    got = torch.ops.sparsejit.rgms(a.plan, x, w, None, "sum", n_dst, 1, 0, strategy, None,
                                   None, None)
    want = torch.zeros(n_dst, f_out, dtype=torch.float64)
    want.index_add_(0, dst, torch.bmm(x[src].double().unsqueeze(1), w[et].double()).squeeze(1))
    assert torch.equal(got, want.to(torch.bfloat16))


def test_bfloat16_micro_kernel_refused_falls_back():
    """With torch.backends.mkldnn disabled, torch's bfloat16 entry throws instead of
    multiplying VNNI-packed data: the tiles fall back to oneDNN's bfloat16 GEMM (same values
    as with the micro-kernel off) instead of failing. A subprocess: the refusal is remembered
    for the rest of the process."""
    import subprocess
    import sys

    code = """
import torch, sparsejit as sj
from sparsejit import _core
g = torch.Generator().manual_seed(0)
n, e, r, f = 1000, 10000, 5, 64
ei = torch.randint(0, n, (2, e), generator=g)
et = torch.randint(0, r, (e,), generator=g)
x = torch.randn(n, f, generator=g).bfloat16()
w = torch.randn(r, f, f, generator=g).bfloat16()
torch.backends.mkldnn.enabled = False
y = sj.rgms(ei, x, w, edge_type=et, reduce="mean")
torch.backends.mkldnn.enabled = True
_core.set_gemm_ukernel(False)
y0 = sj.rgms(ei, x, w, edge_type=et, reduce="mean")
assert torch.equal(y, y0), (y.float() - y0.float()).abs().max()
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


@pytest.mark.parametrize("on", [True, False])
def test_rgms_bfloat16_tiles_round_to_nearest_even(ukernel, on):
    """Aggregate first: each group's sum is rounded to bfloat16 before its product. Integer
    features make every float32 sum exact (any order) and most of them need rounding (sums
    past 256 have more bits than bfloat16 keeps), ties included: the output must equal the
    float64 sums rounded by torch (to nearest even), multiplied exactly, rounded once. Where
    the CPU has no bfloat16 products (an AVX2 CPU, or SPARSEJIT_MAX_ISA=avx2) the forward
    multiplies in float32 on widened inputs instead: the sums are then not rounded."""
    ukernel(on, 2)
    rounds_sums = _core.gemm_bf16_native()
    g = torch.Generator().manual_seed(11)
    n_src, n_dst, r, e, f_in, f_out = 400, 60, 3, 6000, 40, 36
    src = torch.randint(0, n_src, (e,), generator=g)
    dst = torch.randint(0, n_dst, (e,), generator=g)
    et = torch.randint(0, r, (e,), generator=g)
    x = torch.randint(0, 64, (n_src, f_in), generator=g).bfloat16()
    w = torch.randint(-1, 2, (r, f_in, f_out), generator=g).bfloat16()
    a = sparsejit.TypedSparseMatrix.from_edge_index(torch.stack([src, dst]), (n_src, n_dst),
                                                    edge_type=et, num_relations=r)
    got = torch.ops.sparsejit.rgms(a.plan, x, w, None, "sum", n_dst, 1, 0, 1, None, None,
                                   None)
    want = torch.zeros(n_dst, f_out, dtype=torch.float64)
    for k in range(r):
        sums = torch.zeros(n_dst, f_in, dtype=torch.float64)
        sel = et == k
        sums.index_add_(0, dst[sel], x[src[sel]].double())
        want += (sums.to(torch.bfloat16).double() if rounds_sums else sums) @ w[k].double()
    rounded = sums.to(torch.bfloat16).double()
    assert (rounded != sums).any()  # the rounding is exercised
    assert torch.equal(got, want.to(torch.bfloat16))
