"""The row loops RGMS and the point-cloud convolution share (csrc/core/row_tiles.h,
kernels/cpu/rgms_kernel.h kinds 5-6): the convolution's gather-GEMM-scatter dataflow and its
weight gradient load the JIT-compiled loops for their channel widths, give the same bits as
the generic loops, and match a plain per-pair reference."""

import pytest
import torch

from sparsejit import _core
from sparsejit.ops.sparse_conv import conv_plan, plan_info, plan_pairs, sparse_conv


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
    plan, out_coords = conv_plan(coords, [20, 20, 20], 1, kind, 3, 2 if kind == "spconv" else 1)
    n_out = plan_info(plan)["num_out"]
    g = torch.Generator().manual_seed(5)
    x = torch.randn(coords.shape[0], c_in, generator=g)
    w = torch.randn(27, c_in, c_out, generator=g)
    gy = torch.randn(n_out, c_out, generator=g)

    def run():
        xg = x.clone().requires_grad_()
        wg = w.clone().requires_grad_()
        y = sparse_conv(xg, wg, None, plan, n_out, dataflow="gather_gemm_scatter")
        y.backward(gy)
        return y.detach(), xg.grad, wg.grad

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _core.jit_clear_memory_cache()
        jitted = run()
        if c_in % 4 == 0 and plan_info(plan)["pairs"] * c_in >= 1 << 16:
            info = _core.jit_rgms_tile(_core.enums()["scalar"]["f32"], c_in)
            assert info["ok"] and info["memory_hit"], info["error"]  # the gather loaded it
        generic = generic_only(run)
    finally:
        torch.set_num_threads(old)
    for name, a, b in zip(("y", "dX", "dW"), jitted, generic):
        assert torch.equal(a, b), name
    want = reference(x, w, plan, n_out)
    torch.testing.assert_close(jitted[0].double(), want, atol=1e-4 * want.abs().max(), rtol=1e-4)
