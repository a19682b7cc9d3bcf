"""Autograd (gradcheck in float64), opcheck of every op, and torch.compile of GNN layers."""

import pytest
import torch

import sparsejit as sj
from conftest import random_graph
from conftest import raises_type_error  # noqa: E402


def _graph():
    # Modest size with empty rows and a skewed degree distribution.
    return random_graph(25, 20, 3, power_law=True, seed=5, empty_frac=0.2)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("heads", [None, 2])
def test_spmm_gradcheck(reduce, heads):
    A = _graph()
    if heads is None:
        vals = torch.rand(A.nnz, dtype=torch.float64, requires_grad=True)
        X = torch.randn(20, 4, dtype=torch.float64, requires_grad=True)
    else:
        vals = torch.rand(A.nnz, heads, dtype=torch.float64, requires_grad=True)
        X = torch.randn(20, heads, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v, x: sj.spmm(A.with_values(v), x, reduce), (vals, X))


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_spmm_gradcheck_shared_values_multihead_and_no_values(reduce):
    A = _graph()
    vals = torch.rand(A.nnz, dtype=torch.float64, requires_grad=True)
    X = torch.randn(20, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v, x: sj.spmm(A.with_values(v), x, reduce), (vals, X))
    assert torch.autograd.gradcheck(lambda x: sj.spmm(A, x, reduce), (X,))


def test_spmm_grad_without_cached_transpose():
    """The raw op computes the transpose itself when none is passed."""
    A = _graph()
    X = torch.randn(20, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x: sj.ops.spmm(A.indptr, A.indices, None, x, "sum")[0], (X,)
    )


@pytest.mark.parametrize("heads", [None, 3])
def test_sddmm_gradcheck(heads):
    A = _graph()
    shape = (4,) if heads is None else (heads, 4)
    Q = torch.randn((25,) + shape, dtype=torch.float64, requires_grad=True)
    K = torch.randn((20,) + shape, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k: sj.sddmm(A, q, k), (Q, K))


@pytest.mark.parametrize("heads", [None, 2])
def test_edge_softmax_gradcheck(heads):
    A = _graph()
    shape = (A.nnz,) if heads is None else (A.nnz, heads)
    S = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: sj.edge_softmax(A, s), (S,))


def test_max_gradient_goes_to_first_of_ties():
    # Row 0 holds columns 0 and 1 with equal features: the first stored entry wins.
    A = sj.SparseMatrix.from_csr(torch.tensor([0, 2]), torch.tensor([0, 1]), shape=(1, 2))
    X = torch.ones(2, 3, requires_grad=True)
    sj.spmm(A, X, "max").sum().backward()
    assert torch.equal(X.grad, torch.tensor([[1.0, 1, 1], [0, 0, 0]]))


def _arg_backward_reference(col, arg, g, values, cols):
    """float64 loop: each output element's gradient to its winner's column."""
    out = torch.zeros(cols, g.shape[1], dtype=torch.float64)
    for i in range(arg.shape[0]):
        for f in range(arg.shape[1]):
            p = int(arg[i, f])
            if p >= 0:
                out[int(col[p]), f] += (1.0 if values is None else float(values[p])) * \
                    float(g[i, f])
    return out


@pytest.mark.parametrize("kind", ["uniform", "hub", "empty_rows", "one", "empty"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("threads", [1, 2])
def test_spmm_arg_backward_matches_loop(kind, dtype, index_dtype, threads, poison_empty):
    """The native gradient of max / min (threads add into private copies of dX) against a
    float64 loop, on positions drawn at random inside each row (-1 for empty rows), with
    and without values; large enough for the threaded path on the uniform kind."""
    g = torch.Generator().manual_seed(len(kind) * 7 + threads)
    if kind == "uniform":
        A = random_graph(3000, 2000, 8, seed=3)
    elif kind == "hub":  # every row's entries point at a few columns: heavy collisions
        n = 1500
        src = torch.randint(0, 3, (n * 6,), generator=g)
        dst = torch.randint(0, n, (n * 6,), generator=g)
        A = sj.SparseMatrix.from_edge_index(torch.stack([src, dst]), n)
    elif kind == "empty_rows":
        A = random_graph(80, 40, 3, seed=2, empty_frac=0.5)
    elif kind == "one":
        A = sj.SparseMatrix.from_edge_index(torch.tensor([[0], [0]]), 1)
    else:
        A = random_graph(5, 4, 0, seed=1)
    A = A.to(index_dtype=index_dtype)
    rows, cols, f = A.shape[0], A.shape[1], 24
    deg = (A.indptr[1:] - A.indptr[:-1]).long()
    pick = (torch.rand(rows, f, generator=g) * deg.clamp(min=1)[:, None]).long()
    arg = torch.where(deg[:, None] > 0, A.indptr[:-1].long()[:, None] + pick,
                      torch.full_like(pick, -1))
    grad = torch.randn(rows, f, generator=g).to(dtype)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for values in (None, torch.rand(A.nnz, generator=g).to(dtype)):
            got = torch.ops.sparsejit.spmm_arg_backward(A.indptr, A.indices, arg, grad, values,
                                                        cols)
            assert got.shape == (cols, f) and got.dtype == dtype
            ref = _arg_backward_reference(A.indices, arg, grad, values, cols)
            tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 2e-2}[dtype]
            torch.testing.assert_close(got.double(), ref, atol=tol * max(1.0, ref.abs().max()),
                                       rtol=tol)
    finally:
        torch.set_num_threads(old)


def test_spmm_arg_backward_bad_arguments():
    A = random_graph(20, 10, 3, seed=4)
    arg = torch.zeros(20, 4, dtype=torch.long)
    g = torch.randn(20, 4)
    op = torch.ops.sparsejit.spmm_arg_backward
    with pytest.raises(ValueError,
                       match=rf"arg holds positions in .* outside \[-1, nnz = {A.nnz}\)"):
        op(A.indptr, A.indices, arg + A.nnz, g, None, 10)
    with pytest.raises(ValueError, match=r"outside \[-1"):
        op(A.indptr, A.indices, arg - 2, g, None, 10)
    with raises_type_error(match="arg must be int64"):
        op(A.indptr, A.indices, arg.int(), g, None, 10)
    with pytest.raises(ValueError, match="arg must have grad_out's shape"):
        op(A.indptr, A.indices, arg[:, :3], g, None, 10)
    with pytest.raises(ValueError, match="grad_out must be"):
        op(A.indptr, A.indices, arg[:5], g[:5], None, 10)
    with pytest.raises(ValueError, match="values must have shape"):
        op(A.indptr, A.indices, arg, g, torch.rand(A.nnz + 1), 10)
    with pytest.raises(ValueError):  # a column past num_cols: the structure check names it
        op(A.indptr, A.indices, arg, g, None, 3)


def test_max_gradient_through_the_native_op_matches_scatter():
    """sj.spmm max/min backward (2-D X: the native op) equals the ATen scatter it replaced,
    with values, on a graph with ties and empty rows."""
    A = random_graph(300, 200, 6, power_law=True, seed=9, empty_frac=0.1)
    A = A.with_values(torch.rand(A.nnz, dtype=torch.float64))
    X = torch.randint(-3, 4, (200, 16)).double().requires_grad_()  # many ties
    for reduce in ("max", "min"):
        out, arg = torch.ops.sparsejit.spmm(A.indptr, A.indices, A.values, X.detach(), reduce)
        dy = torch.randn_like(out)
        got, = torch.autograd.grad(sj.spmm(A, X, reduce), X, dy)
        valid = arg >= 0
        pos = arg.clamp(min=0)
        src = A.indices.long()[pos]
        ref = torch.zeros_like(X).scatter_add_(0, src, torch.where(valid, dy, 0.0) *
                                               A.values[pos])
        torch.testing.assert_close(got, ref)


def test_max_without_positions_refuses_backward():
    """need_arg=False skips the position pass; a backward through it must not guess."""
    A = _graph()
    X = torch.randn(20, 4, requires_grad=True)
    out, arg = sj.ops.spmm(A.indptr, A.indices, None, X, "max", need_arg=False)
    assert arg.numel() == 0
    with pytest.raises(RuntimeError, match="need_arg=False"):
        out.sum().backward()


def test_spmm_max_inference_skips_positions_same_values():
    A = _graph()
    X = torch.randn(20, 4, requires_grad=True)
    with torch.no_grad():
        inf = sj.spmm(A, X, "min")
    train = sj.spmm(A, X, "min")
    assert torch.equal(inf, train.detach())


def _opcheck_cases():
    A = _graph()
    v = torch.rand(A.nnz, requires_grad=True)
    X = torch.randn(20, 4, requires_grad=True)
    Q = torch.randn(25, 2, 4, requires_grad=True)
    K = torch.randn(20, 2, 4, requires_grad=True)
    S = torch.randn(A.nnz, 2, requires_grad=True)
    t = A.transpose_arrays()
    ip, ix = A.indptr, A.indices
    return [
        ("spmm", (ip, ix, v, X, "sum", 20, *t)),
        ("spmm", (ip, ix, None, X, "mean")),
        ("spmm", (ip, ix, v, X, "max")),
        ("spmm", (ip, ix, None, X, "min")),
        ("spmm", (ip, ix, v.detach(), X.detach(), "max", -1, *[None] * 5, "none", 0.01, 1.0,
                  False)),
        ("sddmm", (ip, ix, Q, K, 20, *t)),
        ("sddmm", (ip, ix, Q[:, 0], K[:, 0])),
        ("edge_softmax", (ip, S)),
        ("edge_softmax_backward", (ip, torch.rand(A.nnz, 2), torch.randn(A.nnz, 2))),
        ("csr_transpose", (ip, ix, 20)),
        ("spmm_bucketed_plan", (ip, ix, 20, 3, 0)),
        ("spmm", (ip, ix, v, X, "sum", 20, *t,
                  torch.ops.sparsejit.spmm_bucketed_plan(ip, ix, 20, 2, 0))),
        ("spmm_plan", (ip, ix, 20, 4, torch.float32)),
        ("csr_from_edge_index", (torch.randint(0, 20, (2, 50)), 20)),
        ("gcn_adjacency", (torch.randint(0, 20, (2, 50)), 20, torch.float32)),
        ("spmm_arg_backward", (ip, ix, torch.randint(-1, A.nnz, (25, 4)), torch.randn(25, 4),
                               v.detach(), 20)),
    ]


@pytest.mark.parametrize("case", range(16))
def test_opcheck(case):
    name, args = _opcheck_cases()[case]
    torch.library.opcheck(getattr(torch.ops.sparsejit, name).default, args)


class GCN(torch.nn.Module):
    def __init__(self, fin, hidden, fout):
        super().__init__()
        self.conv1 = sj.nn.GCNConv(fin, hidden, normalize=False)
        self.conv2 = sj.nn.GCNConv(hidden, fout, normalize=False)

    def forward(self, x, A):
        return self.conv2(torch.relu(self.conv1(x, A)), A)


def _compile_matches_eager(model, x, A):
    eager = model(x, A)
    eager.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x, A)
    out.sum().backward()
    torch.testing.assert_close(out, eager, atol=1e-5, rtol=1e-5)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g, atol=1e-5, rtol=1e-5)


def test_compile_gcn_fullgraph():
    A = sj.nn.gcn_norm(random_graph(60, 60, 4, power_law=True, seed=1))
    A.transpose_arrays()  # cached outside the compiled region, as in training
    _compile_matches_eager(GCN(8, 16, 3), torch.randn(60, 8), A)


def test_compile_gat_fullgraph():
    A = random_graph(50, 50, 5, seed=4)
    A.transpose_arrays()
    _compile_matches_eager(sj.nn.GATConv(8, 6, heads=2), torch.randn(50, 8), A)


def test_export_spmm():
    A = random_graph(30, 30, 3, seed=8)

    class M(torch.nn.Module):
        def forward(self, indptr, indices, x):
            return torch.ops.sparsejit.spmm(indptr, indices, None, x, "mean")[0]

    ep = torch.export.export(M(), (A.indptr, A.indices, torch.randn(30, 4)))
    x = torch.randn(30, 4)
    torch.testing.assert_close(ep.module()(A.indptr, A.indices, x), sj.spmm(A, x, "mean"))
