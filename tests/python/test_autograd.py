"""Autograd (gradcheck in float64), opcheck of every op, and torch.compile of GNN layers."""

import pytest
import torch

import sparsejit as sj
from conftest import random_graph


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
    ]


@pytest.mark.parametrize("case", range(15))
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
