"""The point-cloud convolution's fused ReLU (point_conv(..., relu=True)) and SparseSequential's
fusion of ``conv, ReLU`` / ``conv, BatchNorm1d (eval), ReLU``: against the unfused ops, every
dataflow, forward and gradients, outputs poisoned."""

import pytest
import torch
from torch import nn

import sparsejit.spconv as spconv
from sparsejit.families.point_conv.ops import point_conv_plan, plan_info, point_conv


def sites(n, side, seed):
    g = torch.Generator().manual_seed(seed)
    flat = torch.randperm(2 * side ** 3, generator=g)[:n]
    return torch.stack([flat // side ** 3, flat // side // side % side, flat // side % side,
                        flat % side], 1).int()


@pytest.mark.parametrize("dataflow", ["gather_gemm_scatter", "output_stationary", "auto"])
@pytest.mark.parametrize("kind", ["subm", "spconv"])
@pytest.mark.parametrize("c_out", [16, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [0, 1, 400])
def test_fused_relu_matches_relu_of_conv(dataflow, kind, c_out, dtype, n, poison_empty):
    coords = sites(n, 9, seed=n + c_out)
    plan, _ = point_conv_plan(coords, [9, 9, 9], 2, kind, 3, 2 if kind == "spconv" else 1)
    n_out = plan_info(plan)["num_out"]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(coords.shape[0], 5, generator=g, dtype=dtype)
    w = torch.randn(27, 5, c_out, generator=g, dtype=dtype)
    b = torch.randn(c_out, generator=g, dtype=dtype)
    gy = torch.randn(n_out, c_out, generator=g, dtype=dtype)

    def run(fused):
        xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
        if fused:
            y = point_conv(xs, ws, bs, plan, n_out, dataflow=dataflow, relu=True)
        else:
            y = torch.relu(point_conv(xs, ws, bs, plan, n_out, dataflow=dataflow))
        y.backward(gy)
        return y.detach(), xs.grad, ws.grad, bs.grad

    got, want = run(True), run(False)
    assert (got[0] >= 0).all()
    for name, a, e in zip(("y", "dX", "dW", "db"), got, want):
        torch.testing.assert_close(a, e, msg=name)


def test_fused_relu_opcheck_and_gradcheck():
    coords = sites(60, 5, seed=3)
    plan, _ = point_conv_plan(coords, [5, 5, 5], 2, "subm", 3)
    n_out = plan_info(plan)["num_out"]
    g = torch.Generator().manual_seed(2)
    x = torch.randn(coords.shape[0], 3, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(27, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(torch.ops.sparsejit.point_conv.default,
                          (x, w, b, plan, n_out, False, 0, True))
    assert torch.autograd.gradcheck(
        lambda x, w, b: point_conv(x, w, b, plan, n_out, relu=True), (x, w, b))


def make_block(bn_mode):
    layers = [spconv.SubMConv3d(4, 16, 3, bias=bn_mode is None, indice_key="s")]
    if bn_mode is not None:
        layers.append(nn.BatchNorm1d(16))
    layers.append(nn.ReLU())
    layers.append(spconv.SparseConv3d(16, 8, 3, 2, 1, indice_key="d"))
    layers.append(nn.ReLU())
    return spconv.SparseSequential(*layers)


@pytest.mark.parametrize("bn_mode", [None, "train", "eval"])
def test_sparse_sequential_fuses_conv_relu(bn_mode, poison_empty, monkeypatch):
    """Fused run of the container against the children applied one by one (same weights); the
    container's convolution calls carry relu=True where a ReLU follows (through an eval-mode
    BatchNorm1d, not a training one)."""
    from sparsejit.spconv import conv as conv_mod

    calls = []
    real = conv_mod.point_conv

    def spy(*args, **kwargs):
        calls.append(kwargs.get("relu", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(conv_mod, "point_conv", spy)
    torch.manual_seed(0)
    block = make_block(bn_mode)
    if bn_mode is not None:
        bn = block[1]
        with torch.no_grad():
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.2)
        if bn_mode == "eval":
            block.eval()
    coords = sites(500, 12, seed=9)
    feats = torch.randn(coords.shape[0], 4)

    def run(fused):
        x = spconv.SparseConvTensor(feats.clone().requires_grad_(), coords, [12, 12, 12], 2)
        if fused:
            out = block(x)
        else:  # the children one by one: no fusion
            out = x
            for m in block._modules.values():
                out = m(out) if isinstance(m, spconv.SparseModule) else \
                    out.replace_feature(m(out.features))
        out.features.square().sum().backward()
        return out.features.detach(), x.features.grad, block[0].weight.grad.clone()

    state = {k: v.clone() for k, v in block.state_dict().items()}
    got = run(True)
    assert calls == [bn_mode != "train", True]  # the SubM (+BN) + ReLU, then the strided + ReLU
    calls.clear()
    block.load_state_dict(state)  # train-mode BN updated its statistics: start again
    block.zero_grad()
    want = run(False)
    assert calls == [False, False]
    for name, a, e in zip(("out", "dX", "dW"), got, want):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4, msg=name)
