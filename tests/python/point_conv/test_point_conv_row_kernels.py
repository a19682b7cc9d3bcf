"""The row loops RGMS and the point-cloud convolution share (csrc/rgms/row_tiles.h,
kernels/cpu/row_tile_kernel.h kinds 5-6): the convolution's gather-GEMM-scatter dataflow and its
weight gradient load the JIT-compiled loops for their channel widths, give the same bits as
the generic loops, and match a plain per-pair reference."""

import pytest
import torch

from sparsejit import _core
from sparsejit.families.point_conv.ops import point_conv_plan, plan_info, plan_pairs, point_conv


def sites(n, side, seed):
    g = torch.Generator().manual_seed(seed)
    flat = torch.randperm(side ** 3, generator=g)[:n]
    return torch.stack([torch.zeros_like(flat), flat // side // side, flat // side % side,
                        flat % side], 1).int()


def reference(x, w, plan, n_out):
    ptr, i_idx, o_idx = plan_pairs(plan)
    y = torch.zeros(n_out, w.shape[2], dtype=torch.float64)
    for k in range(w.shape[0]):
        a, b = int(ptr[k]), int(ptr[k + 1])
        y.index_add_(0, o_idx[a:b], x.double()[i_idx[a:b]] @ w[k].double())
    return y


@pytest.mark.parametrize("c_in,c_out", [(16, 16), (32, 8), (12, 20)])
@pytest.mark.parametrize("kind", ["subm", "spconv"])
@pytest.mark.parametrize("threads", [1, 2])
def test_conv_gather_gemm_scatter_row_kernels(c_in, c_out, kind, threads, poison_empty):
    from conftest import generic_only

    coords = sites(3000, 20, seed=c_in + c_out)
    plan, out_coords = point_conv_plan(coords, [20, 20, 20], 1, kind, 3, 2 if kind == "spconv" else 1)
    n_out = plan_info(plan)["num_out"]
    g = torch.Generator().manual_seed(5)
    x = torch.randn(coords.shape[0], c_in, generator=g)
    w = torch.randn(27, c_in, c_out, generator=g)
    gy = torch.randn(n_out, c_out, generator=g)

    def run():
        xg = x.clone().requires_grad_()
        wg = w.clone().requires_grad_()
        y = point_conv(xg, wg, None, plan, n_out, dataflow="gather_gemm_scatter")
        y.backward(gy)
        return y.detach(), xg.grad, wg.grad

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _core.jit_clear_memory_cache()
        jitted = run()
        if c_in % 4 == 0 and plan_info(plan)["pairs"] * c_in >= 1 << 16:
            info = _core.jit_row_tile(_core.enums()["scalar"]["f32"], c_in)
            assert info["ok"] and info["memory_hit"], info["error"]  # the gather loaded it
        generic = generic_only(run)
    finally:
        torch.set_num_threads(old)
    for name, a, b in zip(("y", "dX", "dW"), jitted, generic):
        assert torch.equal(a, b), name
    want = reference(x, w, plan, n_out)
    torch.testing.assert_close(jitted[0].double(), want, atol=1e-4 * want.abs().max(), rtol=1e-4)


@pytest.mark.parametrize("c_in,c_out", [(16, 16), (4, 16), (24, 40), (64, 64), (12, 8)])
@pytest.mark.parametrize("kind", ["subm", "spconv"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_conv_output_stationary_jit(c_in, c_out, kind, dtype, poison_empty):
    """The output-stationary dataflow loads rows JIT-compiled for (c_in, c_out) (kernels/cpu/
    point_conv_kernel.h), forward and feature gradient; bit-identical to the ahead-of-time rows
    where those exist (c_out 16, 32, 64, 128), and equal to a per-pair reference."""
    from conftest import generic_only

    if not _core.jit_enabled():
        pytest.skip("SPARSEJIT_JIT=0")
    coords = sites(6000, 24, seed=c_in * c_out)
    plan, _ = point_conv_plan(coords, [24, 24, 24], 1, kind, 3, 2 if kind == "spconv" else 1)
    info = plan_info(plan)
    n_out = info["num_out"]
    g = torch.Generator().manual_seed(7)
    x = torch.randn(coords.shape[0], c_in, generator=g, dtype=dtype)
    w = torch.randn(27, c_in, c_out, generator=g, dtype=dtype)
    b = torch.randn(c_out, generator=g, dtype=dtype)
    gy = torch.randn(n_out, c_out, generator=g, dtype=dtype)

    def run(relu):
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = point_conv(xg, wg, b, plan, n_out, dataflow="output_stationary", relu=relu)
        y.backward(gy)
        return y.detach(), xg.grad

    lanes = 32 // x.element_size()
    for relu in (False, True):
        _core.jit_clear_memory_cache()
        jitted = run(relu)
        scalar = _core.enums()["scalar"]["f32" if dtype == torch.float32 else "f64"]
        for ci, co in ((c_in, c_out), (c_out, c_in)):  # forward, then feature gradient
            if co % lanes == 0 and info["pairs"] * ci * co >= 1 << 20:
                rows = _core.point_conv_rows_together(27, ci, co, x.element_size())
                got = _core.jit_point_conv(scalar, ci, co, rows)
                assert got["ok"] and got["memory_hit"], (ci, co, got["error"])
        aot = generic_only(lambda: run(relu))
        for name, a, b_, co in (("y", jitted[0], aot[0], c_out), ("dX", jitted[1], aot[1], c_in)):
            if co in (16, 32, 64, 128):
                assert torch.equal(a, b_), name
            else:
                torch.testing.assert_close(a, b_, rtol=1e-5, atol=1e-4 * b_.abs().max().item())
        want = reference(x, w, plan, n_out) + b.double()
        if relu:
            want = want.clamp_min(0)
        torch.testing.assert_close(jitted[0].double(), want, rtol=1e-4,
                                   atol=1e-4 * want.abs().max().item())


@pytest.mark.parametrize("c_in,c_out", [(16, 16), (4, 16), (24, 40), (64, 64), (12, 8),
                                        (5, 16), (33, 24)])
@pytest.mark.parametrize("kind", ["subm", "spconv"])
@pytest.mark.parametrize("relu", [False, True])
def test_conv_output_stationary_bf16(c_in, c_out, kind, relu, poison_empty):
    """bfloat16 features run natively in the JIT-compiled output-stationary rows (bfloat16 in
    and out, float32 weights and accumulation): bit for bit the float32 rows on the widened
    features, rounded to nearest even as PyTorch rounds, forward and feature gradient. With
    bfloat16 weights on a CPU with AVX512-BF16 the rows multiply channel pairs with vdpbf16ps
    (an odd C_in leaves one channel alone): the same bits. The weight gradient is the float32
    one, rounded, except where oneDNN's bfloat16 GEMM takes it (AVX512-BF16 / AMX, the
    gathered-tile path): then the sums are in oneDNN's order, checked against float64."""
    if not _core.jit_enabled():
        pytest.skip("SPARSEJIT_JIT=0")
    coords = sites(6000, 24, seed=c_in + 3 * c_out)
    plan, _ = point_conv_plan(coords, [24, 24, 24], 1, kind, 3, 2 if kind == "spconv" else 1)
    info = plan_info(plan)
    n_out = info["num_out"]
    g = torch.Generator().manual_seed(9)
    x = torch.randn(coords.shape[0], c_in, generator=g).bfloat16()
    x[0, 0] = float("nan")  # NaNs stay NaN (their bits may differ: PyTorch's own float ->
    # bfloat16 casts give 0x7fc0 or 0xffff depending on the code path)
    w = torch.randn(27, c_in, c_out, generator=g).bfloat16()
    b = torch.randn(c_out, generator=g).bfloat16()
    gy = torch.randn(n_out, c_out, generator=g).bfloat16()

    def run(dtype):
        xg = x.to(dtype, copy=True).requires_grad_()
        wg = w.to(dtype, copy=True).requires_grad_()
        y = point_conv(xg, wg, b.to(dtype), plan, n_out, dataflow="output_stationary",
                        relu=relu)
        y.backward(gy.to(dtype))
        return y.detach(), xg.grad, wg.grad

    _core.jit_clear_memory_cache()
    native = run(torch.bfloat16)
    wide = run(torch.float32)
    bf16 = _core.enums()["scalar"]["bf16"]
    for ci, co in ((c_in, c_out), (c_out, c_in)):
        if co % 8 == 0 and info["pairs"] * ci * co >= 1 << 20:
            got = _core.jit_point_conv(bf16, ci, co,
                                       _core.point_conv_rows_together(27, ci, co, 4))
            assert got["ok"] and got["memory_hit"], (ci, co, got["error"])
    # The weight gradient's path: registers (float32) up to 16 x 16 channels, else the
    # gathered tiles, on oneDNN's bfloat16 GEMM where it runs natively.
    dw_gemm_bf16 = _core.gemm_bf16_native() and not (c_in <= 16 and c_out <= 16)
    if dw_gemm_bf16:
        ptr, i_idx, o_idx = plan_pairs(plan)
        gyr = gy.double()
        if relu:  # the gradient reaches W through the ReLU's mask (the output > 0)
            gyr = gyr * (native[0].double() > 0)
        want = torch.stack([x.double()[i_idx[int(ptr[k]):int(ptr[k + 1])]].T
                            @ gyr[o_idx[int(ptr[k]):int(ptr[k + 1])]] for k in range(27)])
        assert native[2].dtype == torch.bfloat16
        scale = want.nan_to_num(0).abs().max().item()  # (x[0, 0] is NaN: its row of dW too)
        torch.testing.assert_close(native[2].double(), want, rtol=2e-2, atol=2e-2 * scale,
                                   equal_nan=True)
        torch.testing.assert_close(native[2].float(), wide[2].float(), rtol=2e-2,
                                   atol=1e-2 * scale, equal_nan=True)
    for name, a, b_ in zip(("y", "dX", "dW"), native, wide):
        if name == "dW" and dw_gemm_bf16:
            continue
        assert a.dtype == torch.bfloat16, name
        want = b_.bfloat16()
        assert torch.equal(a.isnan(), want.isnan()), name
        assert torch.equal(a.nan_to_num(0).view(torch.int16), want.nan_to_num(0).view(torch.int16)), name

