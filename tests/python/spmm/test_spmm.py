import pytest
import torch

import sparsejit as sj
from conftest import dense_reference_spmm, random_graph

TOL = {torch.float32: 1e-4, torch.float64: 1e-10, torch.bfloat16: 3e-2}


def _close(got, ref, dtype):
    scale = max(1.0, float(ref.abs().max())) if ref.numel() else 1.0
    torch.testing.assert_close(got.double(), ref, atol=TOL[dtype] * scale, rtol=TOL[dtype])


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("with_values", [False, True])
def test_spmm_matches_reference(graph, reduce, dtype, index_dtype, with_values):
    A = graph.to(index_dtype=index_dtype)
    if with_values:
        A = A.with_values(torch.randn(A.nnz).to(dtype))
    X = torch.randn(A.shape[1], 16).to(dtype)
    Y = sj.spmm(A, X, reduce)
    assert Y.shape == (A.shape[0], 16) and Y.dtype == dtype
    Aref = A if A.values is None else A.with_values(A.values.double())
    _close(Y, dense_reference_spmm(Aref, X, reduce), dtype)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("value_heads", [0, 1, 4])
def test_spmm_multihead(reduce, value_heads):
    A = random_graph(200, 150, 5, power_law=True, seed=11)
    H, F = 4, 8
    if value_heads == 1:
        A = A.with_values(torch.rand(A.nnz))
    elif value_heads == 4:
        A = A.with_values(torch.rand(A.nnz, H))
    X = torch.randn(A.shape[1], H, F)
    Y = sj.spmm(A, X, reduce)
    assert Y.shape == (A.shape[0], H, F)
    _close(Y, dense_reference_spmm(A, X, reduce), torch.float32)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_spmm_empty_rows_give_zero(reduce):
    A = random_graph(60, 30, 3, seed=2, empty_frac=0.5)
    X = torch.randn(30, 5) + 10.0  # all-positive: a missing zero-fill would show
    Y = sj.spmm(A, X, reduce)
    empty = A.degree() == 0
    assert empty.any()
    assert (Y[empty] == 0).all()


@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_spmm_zero_features_and_empty_matrix(reduce):
    A = random_graph(10, 8, 3, seed=1)
    assert sj.spmm(A, torch.randn(8, 0), reduce).shape == (10, 0)
    E = random_graph(0, 0, 0)
    assert sj.spmm(E, torch.randn(0, 4), reduce).shape == (0, 4)
    Z = random_graph(5, 0, 0)
    assert torch.equal(sj.spmm(Z, torch.randn(0, 3), reduce), torch.zeros(5, 3))


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("heads", [None, 2])
def test_spmm_backward_with_values_on_a_graph_without_edges(reduce, heads):
    """No stored entry: zero outputs, zero gradients for X, empty ones for the values (max /
    min once indexed the empty column array here)."""
    A = sj.SparseMatrix.from_edge_index(torch.empty(2, 0, dtype=torch.long), 7)
    shape = (7, 4) if heads is None else (7, heads, 4)
    x = torch.randn(shape, requires_grad=True)
    v = torch.randn((0,) if heads is None else (0, heads), requires_grad=True)
    y = sj.spmm(A.with_values(v), x, reduce)
    assert torch.equal(y, torch.zeros(shape))
    y.sum().backward()
    assert torch.equal(x.grad, torch.zeros(shape)) and v.grad.shape == v.shape


def test_spmm_skewed_graph_many_threads():
    """One row with most entries: the merge-path pieces must combine it exactly."""
    n = 5000
    src = torch.cat([torch.arange(n), torch.randint(0, n, (200,))])
    dst = torch.cat([torch.zeros(n, dtype=torch.long), torch.randint(0, n, (200,))])
    A = sj.SparseMatrix.from_edge_index(torch.stack([src, dst]), n)
    X = torch.randn(n, 32, dtype=torch.float64)
    old = torch.get_num_threads()
    try:
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            for reduce in ("sum", "mean", "max", "min"):
                _close(sj.spmm(A, X, reduce), dense_reference_spmm(A, X, reduce), torch.float64)
    finally:
        torch.set_num_threads(old)


def test_from_edge_index_matches_pyg_aggregation():
    ei = torch.randint(0, 50, (2, 400))
    X = torch.randn(50, 6)
    A = sj.SparseMatrix.from_edge_index(ei, 50)
    ref = torch.zeros(50, 6).index_add_(0, ei[1], X[ei[0]])
    torch.testing.assert_close(sj.spmm(A, X), ref)
    w = torch.rand(400)
    Aw = sj.SparseMatrix.from_edge_index(ei, 50, values=w)
    refw = torch.zeros(50, 6).index_add_(0, ei[1], X[ei[0]] * w[:, None])
    torch.testing.assert_close(sj.spmm(Aw, X), refw)


def test_scipy_and_dense_round_trip():
    sp = pytest.importorskip("scipy.sparse")
    m = sp.random(30, 20, density=0.2, format="csr", dtype="float64", random_state=0)
    A = sj.SparseMatrix.from_scipy(m)
    assert A.shape == (30, 20) and A.nnz == m.nnz
    torch.testing.assert_close(A.to_dense(), torch.from_numpy(m.toarray()))
    assert (A.to_scipy() != m.astype("float32")).nnz == 0
    X = torch.randn(20, 4, dtype=torch.float64)
    torch.testing.assert_close(sj.spmm(A, X), torch.from_numpy(m @ X.numpy()))
    At = A.t()
    torch.testing.assert_close(At.to_dense(), A.to_dense().T)


def test_drop_in_edge_index_reuses_the_structure():
    sj.clear_caches()
    ei = torch.randint(0, 300, (2, 3000))
    X = torch.randn(300, 8, requires_grad=True)
    ref = torch.zeros(300, 8).index_add_(0, ei[1], X.detach()[ei[0]])
    torch.testing.assert_close(sj.spmm(ei, X), ref)
    from sparsejit.families.spmm.matrix import _GRAPH_CACHE

    (A,) = _GRAPH_CACHE.values()
    sj.spmm(ei.clone(), X).sum().backward()  # same content, new tensor: cache hit
    assert list(_GRAPH_CACHE.values()) == [A]
    assert A._s.transpose is not None  # the transpose was built once and kept
    sj.spmm(torch.randint(0, 300, (2, 3000)), X)
    assert len(_GRAPH_CACHE) == 2
    sj.clear_caches()
    assert len(_GRAPH_CACHE) == 0


def test_content_key_sees_in_place_changes_and_forgets_dead_tensors():
    import gc

    from sparsejit.runtime import caches
    ei = torch.randint(0, 50, (2, 400))
    k1 = caches.content_key(ei, extra=(50,))
    assert caches.content_key(ei.clone(), extra=(50,)) == k1  # same content, same key
    assert caches.content_key(ei, extra=(51,)) != k1
    assert caches.content_key(ei.to(torch.int32), extra=(50,)) != k1  # dtype is part of it
    ei[0, 0] = (ei[0, 0] + 1) % 50  # in place: the memoised hash must not be reused
    assert caches.content_key(ei, extra=(50,)) != k1
    ei[0, 0] = (ei[0, 0] - 1) % 50
    assert caches.content_key(ei, extra=(50,)) == k1
    assert caches.content_key(None, ei) == (None,) + k1[:1]
    tid = id(ei)
    assert tid in caches._HASHES
    del ei
    gc.collect()
    assert tid not in caches._HASHES
    with torch.inference_mode():  # no version counter: hashed each time, still a key
        t = torch.arange(10)
    assert caches.content_key(t) == caches.content_key(torch.arange(10))


def test_save_load_and_to_keep_structure_and_plans(tmp_path):
    A = random_graph(500, 400, 8, seed=3)
    A = A.with_values(torch.rand(A.nnz))
    X = torch.randn(400, 16)
    sj.tune(A, F=16, repeat=1, progress=False, store=False)
    A.transpose_arrays()
    torch.save(A, tmp_path / "A.pt")
    B = torch.load(tmp_path / "A.pt")  # weights_only=True by default
    assert torch.equal(sj.spmm(B, X), sj.spmm(A, X))
    assert B._s.transpose is not None and B._s.extra["plans"]
    C = A.to("cpu", index_dtype=torch.int32)
    assert C.index_dtype == torch.int32 and C._s.extra["plans"] == A._s.extra["plans"]
    torch.testing.assert_close(sj.spmm(C, X), sj.spmm(A, X))


def test_device_mismatch_is_named():
    A = random_graph(5, 4, 2, seed=1)
    with pytest.raises(ValueError, match="X is on meta but the sparse matrix is on cpu"):
        sj.spmm(A, torch.empty(4, 3, device="meta"))
    with pytest.raises(ValueError, match="values is on meta"):
        A.with_values(torch.empty(A.nnz, device="meta"))


def test_elu_epilogue_is_accurate_near_zero():
    # Found by the fuzz test: ELU computed exp(z) - 1, which in float32 cancels near 0
    # (z = -8e-6: 0.4% off, 30x the output's rounding); expm1 keeps float32's precision.
    z = torch.tensor([-7.8e-6, -1e-7, -3e-4, -1.0, 2e-6], dtype=torch.float32)
    A = sj.SparseMatrix.from_csr(torch.arange(6), torch.arange(5), None, (5, 5))
    got = sj.spmm(A, z[:, None], activation="elu", alpha=0.01)
    want = 0.01 * torch.expm1(z.double())[:, None]
    want[4] = z[4].double()
    torch.testing.assert_close(got.double(), want, rtol=2e-7, atol=0)
