"""RGMS family on CUDA (skipped without a device): segment_matmul and its weight gradient
(cuBLAS per segment), gather_matmul, and RGCNConv / sparsejit.rgms with CUDA tensors (the
composite of torch_ext/ops/rgms.cpp), all compared with the CPU op, forward and backward,
results, gradients and plans on the input's device."""
import pytest
import torch

import sparsejit as sj
from sparsejit.nn import RGCNConv

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-10),
       torch.float16: dict(atol=2e-2, rtol=2e-2), torch.bfloat16: dict(atol=5e-2, rtol=5e-2)}


def _ptr(sizes, dtype=torch.long):
    return torch.tensor([0] + list(torch.tensor(sizes).cumsum(0)), dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sizes", [[5, 0, 7, 1], [0, 0, 0], [1], [300, 1, 0, 2]])
@pytest.mark.parametrize("ptr_dtype", [torch.long, torch.int32])
def test_cuda_segment_matmul_forward_backward_match_cpu(dtype, sizes, ptr_dtype):
    g = torch.Generator().manual_seed(len(sizes) * 7 + sum(sizes))
    n, f_in, f_out = sum(sizes), 6, 5
    x = torch.randn(n, f_in, generator=g).to(dtype)
    w = torch.randn(len(sizes), f_in, f_out, generator=g).to(dtype)
    ptr = _ptr(sizes, ptr_dtype)
    xc, wc = x.cuda().requires_grad_(), w.cuda().requires_grad_()
    xh, wh = x.clone().requires_grad_(), w.clone().requires_grad_()
    yc = sj.segment_matmul(xc, ptr.cuda(), wc)
    yh = sj.segment_matmul(xh, ptr, wh)
    assert yc.device.type == "cuda" and yc.dtype == dtype
    torch.testing.assert_close(yc.cpu().float(), yh.float(), **TOL[dtype])
    gy = torch.randn(n, f_out, generator=g).to(dtype)
    yc.backward(gy.cuda())
    yh.backward(gy)
    torch.testing.assert_close(xc.grad.cpu().float(), xh.grad.float(), **TOL[dtype])
    torch.testing.assert_close(wc.grad.cpu().float(), wh.grad.float(), **TOL[dtype])


def test_cuda_segment_matmul_backward_w_empty_segments_are_zero():
    x = torch.randn(4, 3, device="cuda")
    dy = torch.randn(4, 2, device="cuda")
    dw = torch.ops.sparsejit.segment_matmul_backward_w(x, _ptr([0, 4, 0]).cuda(), dy)
    assert torch.equal(dw[0], torch.zeros(3, 2, device="cuda"))
    assert torch.equal(dw[2], torch.zeros(3, 2, device="cuda"))
    torch.testing.assert_close(dw[1], x.t() @ dy)


def test_cuda_segment_matmul_bad_ptr_names_argument():
    x, w = torch.randn(10, 4, device="cuda"), torch.randn(3, 4, 2, device="cuda")
    with pytest.raises(ValueError, match="ptr"):
        sj.segment_matmul(x, torch.tensor([0, 5, 3, 10], device="cuda"), w)


def test_cuda_gather_matmul_matches_cpu():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(50, 8, generator=g), torch.randn(4, 8, 3, generator=g)
    index = torch.randint(0, 4, (50,), generator=g)
    torch.testing.assert_close(sj.gather_matmul(x.cuda(), index.cuda(), w.cuda()).cpu(),
                               sj.gather_matmul(x, index, w), atol=1e-4, rtol=1e-4)


def _typed_graph(n=40, e=200, r=4, seed=0, skewed=False):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (e,), generator=g)
    dst = torch.zeros(e, dtype=torch.long) if skewed else torch.randint(0, n, (e,), generator=g)
    et = torch.randint(0, r - 1, (e,), generator=g)  # relation r - 1 stays empty
    return torch.stack([src, dst]), et, n, r


@pytest.mark.parametrize("cfg", [dict(), dict(num_bases=2), dict(aggr="add")])
@pytest.mark.parametrize("skewed", [False, True])
def test_cuda_rgcnconv_forward_backward_match_cpu(cfg, skewed):
    ei, et, n, r = _typed_graph(skewed=skewed, seed=5)
    torch.manual_seed(0)
    layer = RGCNConv(6, 4, r, **cfg)
    layer_c = RGCNConv(6, 4, r, **cfg)
    layer_c.load_state_dict(layer.state_dict())
    layer_c = layer_c.cuda()
    x = torch.randn(n, 6)
    xc = x.cuda().requires_grad_()
    xh = x.clone().requires_grad_()
    yc = layer_c(xc, ei.cuda(), et.cuda())
    yh = layer(xh, ei, et)
    assert yc.device.type == "cuda"
    torch.testing.assert_close(yc.cpu(), yh, atol=1e-4, rtol=1e-4)
    gy = torch.randn_like(yh)
    yc.backward(gy.cuda())
    yh.backward(gy)
    torch.testing.assert_close(xc.grad.cpu(), xh.grad, atol=1e-4, rtol=1e-4)
    for (name, pc), (_, ph) in zip(layer_c.named_parameters(), layer.named_parameters()):
        torch.testing.assert_close(pc.grad.cpu(), ph.grad, atol=1e-4, rtol=1e-4, msg=name)
