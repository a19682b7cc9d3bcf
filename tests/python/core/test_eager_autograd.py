"""Every family's eager calls take the one autograd path (sparsejit.runtime.autograd): with a
gradient to compute, the Function call_op builds around the op's registered formula; without,
no autograd node at all. The gradients equal those of the registered formula itself (the raw
op called through the dispatcher, the path torch.compile traces), for every differentiable
input, on fresh random inputs including empty ones."""

from __future__ import annotations

import pytest
import torch

import sparsejit as sj
from sparsejit.families.dense import ops as dense_ops
from sparsejit.families.point_conv.ops import point_conv_plan, point_conv
from sparsejit.runtime import autograd as ag

from conftest import random_sites

RAW = torch.ops.sparsejit


def _leaves(*ts):
    return [None if t is None else t.detach().clone().requires_grad_() for t in ts]


def _grads_of(fn, inputs, seed):
    """fn(*inputs)'s output and the gradients of every input given a fixed upstream gradient;
    the grad_fn's name."""
    leaves = _leaves(*inputs)
    y = fn(*leaves)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=y.dtype)
    (y * g).sum().backward()
    return y.detach(), [None if t is None else t.grad for t in leaves], type(y.grad_fn).__name__


def _same_as_registered(public, raw, inputs, seed=0):
    y1, g1, name = _grads_of(public, inputs, seed)
    y2, g2, raw_name = _grads_of(raw, inputs, seed)
    assert name.startswith("Eager_sparsejit_"), name
    assert not raw_name.startswith("Eager_"), raw_name
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)
    for i, (a, b) in enumerate(zip(g1, g2)):
        assert (a is None) == (b is None), i
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=f"input {i}")
    with torch.no_grad():
        y3 = public(*inputs)
    assert y3.grad_fn is None
    torch.testing.assert_close(y3, y1, rtol=0, atol=0)


def _typed(n, e, r, seed):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, max(n, 1), (2, e), generator=g)
    et = torch.randint(0, r, (e,), generator=g)
    return sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r), g


@pytest.mark.parametrize("n,e", [(0, 0), (1, 1), (37, 300), (50, 0)])
@pytest.mark.parametrize("root", ["none", "x", "x_root"])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_rgms_eager_path_matches_registered_formula(n, e, root, reduce):
    A, g = _typed(n, e, 3, seed=n + e)
    X = torch.randn(n, 5, generator=g, dtype=torch.float64)
    W = torch.randn(3, 5, 4, generator=g, dtype=torch.float64)
    vals = torch.randn(e, generator=g, dtype=torch.float64)
    xr = torch.randn(n, 6, generator=g, dtype=torch.float64) if root == "x_root" else None
    rt = None if root == "none" else torch.randn(6 if xr is not None else 5, 4, generator=g,
                                                  dtype=torch.float64)
    bias = torch.randn(4, generator=g, dtype=torch.float64)

    def public(X, W, vals, rt, bias, xr):
        return sj.rgms(A, X, W, reduce=reduce, values=vals, root=rt, bias=bias, x_root=xr)

    def raw(X, W, vals, rt, bias, xr):
        return RAW.rgms(A.plan, X, W, vals, reduce, n, 0, 0, 0, rt, bias, xr)

    _same_as_registered(public, raw, (X, W, vals, rt, bias, xr))


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("n", [1, 60])
def test_sparse_conv_eager_path_matches_registered_formula(relu, n):
    shape = [6, 6, 6]
    idx = random_sites(n, shape, batch_size=1, seed=n)
    plan, _ = point_conv_plan(idx, shape, 1, "subm", 3)
    g = torch.Generator().manual_seed(n)
    m = idx.shape[0]
    feats = torch.randn(m, 4, generator=g, dtype=torch.float64)
    w = torch.randn(27, 4, 3, generator=g, dtype=torch.float64)
    bias = torch.randn(3, generator=g, dtype=torch.float64)
    _same_as_registered(
        lambda f, w, b: point_conv(f, w, b, plan, m, relu=relu),
        lambda f, w, b: RAW.point_conv(f, w, b, plan, m, False, 0, relu), (feats, w, bias))


@pytest.mark.parametrize("sizes", [[0, 0], [3, 0, 5], [17, 1, 30]])
def test_segment_matmul_eager_path_matches_registered_formula(sizes):
    g = torch.Generator().manual_seed(len(sizes))
    ptr = torch.tensor([0] + sizes).cumsum(0)
    x = torch.randn(int(ptr[-1]), 6, generator=g)
    w = torch.randn(len(sizes), 6, 5, generator=g)
    _same_as_registered(lambda x, w: sj.segment_matmul(x, ptr, w),
                        lambda x, w: RAW.segment_matmul(x, ptr, w), (x, w))


@pytest.mark.parametrize("bias", [False, True])
def test_linear_eager_path_matches_registered_formula(bias, monkeypatch):
    monkeypatch.setenv("SPARSEJIT_LINEAR", "1")  # sparsejit's GEMM layer, not torch's
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1100, 8, generator=g)
    w = torch.randn(5, 8, generator=g)
    b = torch.randn(5, generator=g) if bias else None
    _same_as_registered(dense_ops.linear, RAW.linear, (x, w, b))


def test_spmm_eager_path_matches_registered_formula():
    g = torch.Generator().manual_seed(2)
    ei = torch.randint(0, 40, (2, 200), generator=g)
    A = sj.SparseMatrix.from_edge_index(ei, 40)
    x = torch.randn(40, 7, generator=g, dtype=torch.float64)
    y, _, name = _grads_of(lambda x: sj.spmm(A, x), (x,), 0)
    assert name.startswith("Eager_sparsejit_spmm"), name


def test_composite_double_backward_and_no_grad():
    """A composite's backward is recorded under create_graph (a second derivative exists) and
    runs below the Autograd key otherwise."""
    seen = []

    def fwd(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    def bwd(ctx, grad):
        (x,) = ctx.saved_tensors
        seen.append(torch.is_grad_enabled())
        return 3 * x * x * grad

    cube = ag.composite("Cube", fwd, bwd)
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(cube(x).sum(), x, create_graph=True)
    torch.testing.assert_close(gx, 3 * x.detach() ** 2)
    (ggx,) = torch.autograd.grad(gx.sum(), x)
    torch.testing.assert_close(ggx, 6 * x.detach())
    (g1,) = torch.autograd.grad(cube(x).sum(), x)
    assert g1.grad_fn is None and seen == [True, False]
    assert type(cube(x).grad_fn).__name__ == "CubeBackward"
    torch.autograd.gradcheck(cube, (x,))


def test_call_op_under_compile_traces_the_registered_formula():
    g = torch.Generator().manual_seed(4)
    ptr = torch.tensor([0, 4, 9])
    x = torch.randn(9, 3, generator=g, requires_grad=True)
    w = torch.randn(2, 3, 2, generator=g, requires_grad=True)
    want = torch.autograd.grad(sj.segment_matmul(x, ptr, w).sum(), (x, w))
    torch._dynamo.reset()
    f = torch.compile(lambda x, w: sj.segment_matmul(x, ptr, w), backend="aot_eager",
                      fullgraph=True)
    got = torch.autograd.grad(f(x, w).sum(), (x, w))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
