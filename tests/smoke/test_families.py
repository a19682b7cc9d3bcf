"""Every op family of the installed wheel, eager, forward and backward, against a plain
PyTorch reference on fresh random inputs (including an empty, a one-element and a skewed
structure): SpMM / SDDMM / edge softmax, fused attention, RGMS, point-cloud convolution, and
filter-sparse convolution (inference only, as the README says: forward). Only torch and
numpy are needed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import sparsejit as sj
from sparsejit import spconv

TOL = dict(rtol=1e-4, atol=1e-4)


def graph(kind: str, seed: int):
    """(edge_index, n): random, empty, one edge, or skewed (half the edges into node 0)."""
    g = torch.Generator().manual_seed(seed)
    n = {"one": 1}.get(kind, 40)
    e = {"empty": 0, "one": 1}.get(kind, 200)
    ei = torch.randint(0, n, (2, e), generator=g)
    if kind == "skewed":
        ei[1, : e // 2] = 0
    return ei, n


def csr(ei, n):
    """A built from edge_index, and its entries in CSR order as (rows, cols) int64."""
    A = sj.SparseMatrix.from_edge_index(ei, n)
    return A, A.row_indices().long(), A.indices.long()


def leaves(*shapes, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).requires_grad_() for s in shapes]


def check_grads(got, want, inputs):
    """Gradients of a random projection of `got` and `want` agree for every input."""
    w = torch.randn(got.shape, generator=torch.Generator().manual_seed(99))
    g1 = torch.autograd.grad((got * w).sum(), inputs, allow_unused=True)
    g2 = torch.autograd.grad((want * w).sum(), inputs, allow_unused=True)
    for a, b in zip(g1, g2):
        if b is None:
            continue
        assert a is not None
        torch.testing.assert_close(a, b, **TOL)


def row_softmax(s, rows, n):
    """Softmax of scores `s` ([nnz] or [nnz, H]) over entries sharing a row."""
    idx = rows.view(-1, *([1] * (s.dim() - 1))).expand_as(s)
    m = torch.full((n,) + s.shape[1:], -torch.inf).scatter_reduce(0, idx, s, "amax")
    e = (s - m.gather(0, idx)).exp()
    return e / torch.zeros((n,) + s.shape[1:]).index_add(0, rows, e)[rows]


KINDS = ["random", "empty", "one", "skewed"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_spmm(kind, reduce):
    ei, n = graph(kind, 1)
    A, r, c = csr(ei, n)
    x, v = leaves((n, 16), (A.nnz,), seed=2)
    got = sj.spmm(A.with_values(v), x, reduce=reduce)
    msg = v[:, None] * x[c]
    if reduce == "sum":
        want = torch.zeros(n, 16).index_add(0, r, msg)
    else:  # rows without entries keep the 0 they start with
        want = torch.zeros(n, 16).index_reduce(0, r, msg, {"mean": "mean", "max": "amax"}[reduce],
                                               include_self=False)
    torch.testing.assert_close(got, want, **TOL)
    check_grads(got, want, [x, v])


@pytest.mark.parametrize("kind", KINDS)
def test_sddmm_and_edge_softmax(kind):
    ei, n = graph(kind, 3)
    A, r, c = csr(ei, n)
    q, k = leaves((n, 2, 8), (n, 2, 8), seed=4)
    s = sj.sddmm(A, q, k)
    want_s = (q[r] * k[c]).sum(-1)
    torch.testing.assert_close(s, want_s, **TOL)
    p = sj.edge_softmax(A, s)
    want_p = row_softmax(want_s, r, n)
    torch.testing.assert_close(p, want_p, **TOL)
    check_grads(p, want_p, [q, k])


@pytest.mark.parametrize("kind", KINDS)
def test_fused_attention(kind):
    ei, n = graph(kind, 5)
    A, r, c = csr(ei, n)
    q, k, v = leaves((n, 2, 8), (n, 2, 8), (n, 2, 4), seed=6)
    got = sj.sparse_attention(A, q, k, v)
    p = row_softmax((q[r] * k[c]).sum(-1) / 8 ** 0.5, r, n)
    want = torch.zeros(n, 2, 4).index_add(0, r, p[..., None] * v[c])
    torch.testing.assert_close(got, want, **TOL)
    check_grads(got, want, [q, k, v])


@pytest.mark.parametrize("kind", KINDS)
def test_rgms(kind):
    ei, n = graph(kind, 7)
    et = torch.randint(0, 3, (ei.shape[1],), generator=torch.Generator().manual_seed(8))
    x, w = leaves((n, 8), (3, 8, 4), seed=9)
    got = sj.rgms(ei, x, w, edge_type=et, num_nodes=n)
    msg = torch.bmm(x[ei[0]][:, None, :], w[et])[:, 0]
    want = torch.zeros(n, 4).index_add(0, ei[1], msg)
    torch.testing.assert_close(got, want, **TOL)
    check_grads(got, want, [x, w])


def dense_subm_reference(feats, coords, weight, grid):
    """Submanifold conv = a dense conv3d (padding k // 2) read at the active sites, with
    inactive inputs zero. `weight` is spconv's ``[out, kd, kh, kw, in]``."""
    at = tuple(coords[:, 1:].long().t())
    dense = torch.zeros(*grid, feats.shape[1]).index_put(at, feats)
    out = F.conv3d(dense.permute(3, 0, 1, 2)[None], weight.permute(0, 4, 1, 2, 3),
                   padding=weight.shape[1] // 2)[0]
    return out.permute(1, 2, 3, 0)[at]


@pytest.mark.parametrize("n", [0, 1, 300, "skewed"])
def test_point_cloud_conv(n):
    g = torch.Generator().manual_seed(10)
    grid = [12, 12, 12]
    if n == "skewed":  # one dense 6^3 block and a few scattered sites
        block = torch.stack(torch.meshgrid(*[torch.arange(6)] * 3, indexing="ij"), -1)
        xyz = torch.unique(torch.cat([block.reshape(-1, 3),
                                      torch.randint(6, 12, (20, 3), generator=g)]), dim=0)
    else:
        xyz = torch.unique(torch.randint(0, 12, (n, 3), generator=g), dim=0)
    coords = torch.cat([torch.zeros(len(xyz), 1, dtype=torch.long), xyz], 1).int()
    feats, = leaves((len(xyz), 4), seed=11)
    conv = spconv.SubMConv3d(4, 8, 3, bias=False)
    got = conv(spconv.SparseConvTensor(feats, coords, grid, 1)).features
    want = dense_subm_reference(feats, coords, conv.weight, grid)
    torch.testing.assert_close(got, want, **TOL)
    if len(xyz):
        check_grads(got, want, [feats, conv.weight])


@pytest.mark.parametrize("shape", [(2, 8, 10, 9), (1, 8, 1, 1), (0, 8, 5, 5)])
def test_filter_sparse_conv(shape):
    torch.manual_seed(12)
    conv = torch.nn.Conv2d(8, 6, 3, padding=1)
    with torch.no_grad():
        conv.weight.mul_((torch.rand_like(conv.weight) > 0.8).float())  # 80 % pruned
        conv.weight[0] = 0  # one filter without any weight
    layer = sj.nn.PrunedConv2d.from_dense(conv)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(13))
    with torch.no_grad():  # inference only, as the README says: forward checked
        torch.testing.assert_close(layer(x), conv(x), **TOL)
