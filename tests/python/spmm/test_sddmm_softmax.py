import pytest
import torch

import sparsejit as sj
from conftest import random_graph

TOL = {torch.float32: 1e-4, torch.float64: 1e-10, torch.bfloat16: 3e-2}


def _rows_cols(A):
    return A.row_indices(), A.indices.long()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("heads", [None, 3])
def test_sddmm_matches_reference(graph, dtype, index_dtype, heads):
    A = graph.to(index_dtype=index_dtype)
    shape = (16,) if heads is None else (heads, 16)
    Q = torch.randn((A.shape[0],) + shape).to(dtype)
    K = torch.randn((A.shape[1],) + shape).to(dtype)
    S = sj.sddmm(A, Q, K)
    r, c = _rows_cols(A)
    ref = (Q.double()[r] * K.double()[c]).sum(-1)
    assert S.shape == ref.shape and S.dtype == dtype
    torch.testing.assert_close(S.double(), ref, atol=TOL[dtype] * 16, rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("heads", [None, 4])
def test_edge_softmax_matches_reference(graph, dtype, heads):
    A = graph
    shape = (A.nnz,) if heads is None else (A.nnz, heads)
    S = (torch.randn(shape) * 3).to(dtype)
    P = sj.edge_softmax(A, S)
    ref = torch.empty(shape, dtype=torch.float64)
    indptr = A.indptr.tolist()
    for i in range(A.shape[0]):
        lo, hi = indptr[i], indptr[i + 1]
        if hi > lo:
            ref[lo:hi] = torch.softmax(S[lo:hi].double(), dim=0)
    torch.testing.assert_close(P.double(), ref, atol=TOL[dtype], rtol=TOL[dtype])


def test_edge_softmax_large_scores_are_stable():
    A = random_graph(20, 20, 4, seed=3)
    S = torch.full((A.nnz,), 1e4)
    P = sj.edge_softmax(A, S)
    assert torch.isfinite(P).all()
    sums = sj.spmm(A.with_values(P), torch.ones(20, 1))[:, 0]
    nonempty = A.degree() > 0
    torch.testing.assert_close(sums[nonempty], torch.ones(int(nonempty.sum())))


def test_attention_pipeline_matches_dense():
    """spmm(A, edge_softmax(A, sddmm(A, Q, K)), V) equals masked dense attention."""
    mask = torch.rand(40, 30) < 0.2  # no duplicate entries, some empty rows
    mask[3] = False
    _, c = mask.nonzero(as_tuple=True)
    indptr = torch.zeros(41, dtype=torch.long)
    indptr[1:] = mask.sum(1).cumsum(0)
    A = sj.SparseMatrix.from_csr(indptr, c, shape=(40, 30))
    Q, K, V = torch.randn(40, 8), torch.randn(30, 8), torch.randn(30, 5)
    P = sj.edge_softmax(A, sj.sddmm(A, Q, K))
    out = sj.spmm(A.with_values(P), V)
    logits = (Q @ K.T).masked_fill(~mask, float("-inf"))
    attn = torch.softmax(logits, dim=1).nan_to_num(0.0)
    torch.testing.assert_close(out, attn @ V, atol=1e-5, rtol=1e-5)
