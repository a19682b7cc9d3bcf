"""The raw ops (torch.ops.sparsejit.*) check every invariant that costs O(1) or O(rows), and
float16 works on every op (computed in float32, checked against float64 references)."""

import pytest
import torch

import sparsejit as sj
from conftest import dense_reference_spmm, random_graph
from sparsejit import _core
from sparsejit.families.spmm import plans
from conftest import raises_type_error  # noqa: E402

ops = torch.ops.sparsejit


@pytest.fixture
def A():
    return random_graph(40, 30, 4, power_law=True, seed=11)


def _poisoned(shape):
    return torch.full(shape, float("nan"))


# ---- float16 ----------------------------------------------------------------------------


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("with_values", [False, True])
def test_spmm_float16_matches_float64(A, reduce, with_values):
    X = torch.randn(A.shape[1], 16).half()
    B = A.with_values(torch.rand(A.nnz).half()) if with_values else A
    out = sj.spmm(B, X, reduce)
    assert out.dtype == torch.float16
    Bref = B if B.values is None else B.with_values(B.values.double())
    ref = dense_reference_spmm(Bref, X.double(), reduce)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


def test_spmm_float16_large_problem_runs_the_jit_path():
    """Big enough for the cost model to pick the specialized kernel (float32 inside)."""
    A = random_graph(3000, 2000, 10, seed=3)
    X = torch.randn(2000, 64).half()
    bias = torch.randn(64).half()
    out = sj.spmm(A, X, "sum", bias=bias, activation="relu")
    ref = torch.relu(dense_reference_spmm(A, X.double(), "sum") + bias.double())
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, atol=0.1, rtol=2e-2)


def test_sddmm_and_edge_softmax_float16(A):
    Q = torch.randn(A.shape[0], 2, 8).half()
    K = torch.randn(A.shape[1], 2, 8).half()
    S = sj.sddmm(A, Q, K)
    assert S.dtype == torch.float16
    r = A.row_indices()
    ref = (Q.double()[r] * K.double()[A.indices.long()]).sum(-1)
    torch.testing.assert_close(S.double(), ref, atol=3e-2, rtol=2e-2)
    P = sj.edge_softmax(A, S)
    Pref = sj.edge_softmax(A, S.double())
    assert P.dtype == torch.float16
    torch.testing.assert_close(P.double(), Pref, atol=2e-3, rtol=2e-2)


def test_float16_gradients(A):
    X = torch.randn(A.shape[1], 8).half().requires_grad_()
    sj.spmm(A, X, "mean").sum().backward()
    Xd = X.detach().double().requires_grad_()
    sj.spmm(A, Xd, "mean").sum().backward()
    assert X.grad.dtype == torch.float16
    torch.testing.assert_close(X.grad.double(), Xd.grad, atol=1e-2, rtol=1e-2)


def test_unsupported_dtypes_name_the_argument(A):
    for dt in (torch.int32, torch.complex64, torch.bool):
        X = torch.zeros(A.shape[1], 4, dtype=dt)
        with raises_type_error(match="X must be"):
            ops.spmm(A.indptr, A.indices, None, X, "sum", A.shape[1])
        with pytest.raises(TypeError, match="X must be"):
            sj.spmm(A, X)


# ---- dense operand rows against the structure ---------------------------------------------


def test_raw_spmm_rejects_x_with_too_few_rows():
    """The call from the issue: X has fewer rows than the structure has columns."""
    indptr = torch.tensor([0, 2, 3])
    indices = torch.tensor([0, 7, 3])
    X = torch.randn(4, 5)
    with pytest.raises(ValueError, match=r"indices\[1\] = 7 is out of range for 4 columns"):
        ops.spmm(indptr, indices, None, X, "sum")
    with pytest.raises(ValueError, match="X has 4 rows but the sparse matrix has 8 columns"):
        ops.spmm(indptr, indices, None, X, "sum", 8)
    with pytest.raises(ValueError, match=r"K has 4 rows but the sparse matrix has 8"):
        ops.sddmm(indptr, indices, torch.randn(2, 5), X, 8)
    with pytest.raises(ValueError, match=r"indices\[1\] = 7 is out of range for 4 columns"):
        ops.sddmm(indptr, indices, torch.randn(2, 5), X)


def test_raw_spmm_without_num_cols_takes_x_rows(A):
    X = torch.randn(A.shape[1] + 3, 6)  # trailing columns with no entries are fine
    out, _ = ops.spmm(A.indptr, A.indices, None, X, "sum")
    torch.testing.assert_close(out, sj.spmm(A, X[: A.shape[1]]))


@pytest.mark.parametrize("indptr, full, rows_only", [
    ([1, 2, 3], r"indptr\[0\] must be 0; got 1", r"indptr\[0\] = 1"),
    ([0, 3, 1, 3], r"indptr\[2\] = 1 < indptr\[1\] = 3", "decreases at position 2"),
    ([0, 1, 5], r"indptr\[2\] = 5 must equal the number of stored",
     r"indptr\[2\] = 5 but indices has 3 entries"),
])
def test_raw_ops_check_indptr(indptr, full, rows_only):
    """spmm / sddmm validate the whole structure (first call per tensor); edge_softmax, which
    gathers nothing by column, checks indptr only."""
    indptr = torch.tensor(indptr)
    indices = torch.tensor([0, 1, 2])
    X = torch.randn(3, 4)
    with pytest.raises(ValueError, match=full):
        ops.spmm(indptr, indices, None, X, "sum", 3)
    with pytest.raises(ValueError, match=full):
        ops.sddmm(indptr, indices, torch.randn(indptr.numel() - 1, 4), X, 3)
    with pytest.raises(ValueError, match=rows_only):
        ops.edge_softmax(indptr, torch.randn(3))


def test_negative_and_large_columns_are_caught_with_num_cols_given():
    indptr = torch.tensor([0, 2, 3])
    X = torch.randn(4, 2)
    for bad, match in ((-1, r"indices\[1\] = -1"), (4, r"indices\[1\] = 4 is out of range")):
        indices = torch.tensor([0, bad, 3])
        with pytest.raises(ValueError, match=match):
            ops.spmm(indptr, indices, None, X, "sum", 4)
        with pytest.raises(ValueError, match=match):
            ops.sddmm(indptr, indices, torch.randn(2, 2), X, 4)
        with pytest.raises(ValueError, match=match):
            ops.spmm_bucketed_plan(indptr, indices, 4, 3, 0)


def test_validation_is_redone_after_in_place_change(A):
    X = torch.randn(A.shape[1], 4)
    col = A.indices.clone()
    ops.spmm(A.indptr, col, None, X, "sum", A.shape[1])  # validated and remembered
    col[0] = -3  # bumps the version counter
    with pytest.raises(ValueError, match=r"indices\[0\] = -3"):
        ops.spmm(A.indptr, col, None, X, "sum", A.shape[1])


def test_plan_for_structure_differing_in_one_index_is_rejected():
    A = random_graph(400, 300, 5, seed=5)
    col = A.indices.clone()
    col[A.nnz // 2 + 1] = (col[A.nnz // 2 + 1] + 1) % 300
    X = torch.randn(300, 8)
    plan = ops.spmm_plan(A.indptr, A.indices, 300, 8, torch.float32)
    with pytest.raises(ValueError, match="another structure"):
        ops.spmm(A.indptr, col, None, X, "sum", 300, plan=plan)


def test_bucketed_plan_with_overwritten_column_is_rejected(A):
    X = torch.randn(A.shape[1], 4)
    plan = ops.spmm_bucketed_plan(A.indptr, A.indices, A.shape[1], 3, 0).clone()
    rows = A.shape[0]
    col_start = plans.layout()["header_words"] + rows + rows + 1
    plan[col_start] = 10**6
    with pytest.raises(ValueError, match="damaged at entry 0"):
        ops.spmm(A.indptr, A.indices, None, X, "sum", A.shape[1], plan=plan)


def test_meta_inputs_mixed_with_cpu_are_rejected(A):
    X = torch.randn(A.shape[1], 4)
    with pytest.raises(ValueError, match="one device"):
        ops.spmm(A.indptr.to("meta"), A.indices, None, X, "sum", A.shape[1])


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_drop_in_edge_index_must_hold_integers(dtype):
    with pytest.raises(TypeError, match="edge_index must hold integers"):
        sj.spmm(torch.zeros(2, 5, dtype=dtype), torch.randn(3, 2))


def test_edge_softmax_checks_score_count(A):
    with pytest.raises(ValueError, match="indices has"):
        ops.edge_softmax(A.indptr, torch.randn(A.nnz + 1))


def test_transpose_arguments_are_checked(A):
    X = torch.randn(A.shape[1], 4)
    trp, tcol, tperm = A.transpose_arrays()
    with pytest.raises(ValueError, match="t_rowptr has"):
        ops.spmm(A.indptr, A.indices, None, X, "sum", A.shape[1], trp[:-1], tcol, tperm)
    with pytest.raises(ValueError, match="given together"):
        ops.spmm(A.indptr, A.indices, None, X, "sum", A.shape[1], trp, None, None)


def test_csr_transpose_validates_columns():
    with pytest.raises(ValueError, match=r"indices\[1\] = 9 is out of range"):
        ops.csr_transpose(torch.tensor([0, 2]), torch.tensor([0, 9]), 3)


# ---- plans: stamped with their op and structure ----------------------------------------------


def test_plan_from_another_structure_of_the_same_size_is_rejected():
    A = random_graph(50, 50, 4, seed=1)
    B = random_graph(50, 50, 4, seed=2)
    B = sj.SparseMatrix.from_csr(A.indptr, B.indices[: A.nnz] if B.nnz >= A.nnz else
                                 torch.randint(0, 50, (A.nnz,)), shape=A.shape)
    assert B.nnz == A.nnz and B.shape == A.shape and not torch.equal(A.indices, B.indices)
    X = torch.randn(50, 8)
    for plan in (ops.spmm_plan(A.indptr, A.indices, 50, 8, torch.float32),
                 ops.spmm_bucketed_plan(A.indptr, A.indices, 50, 3, 0)):
        ops.spmm(A.indptr, A.indices, None, X, "sum", 50, plan=plan)  # its own structure: fine
        with pytest.raises(ValueError, match="plan built for another structure"):
            ops.spmm(B.indptr, B.indices, None, X, "sum", 50, plan=plan)


def test_plan_for_another_op_is_rejected(A):
    X = torch.randn(A.shape[1], 4)
    plan = ops.spmm_plan(A.indptr, A.indices, A.shape[1], 4, torch.float32).clone()
    layout = plans.layout()
    plan[layout["words"]["op"]] = layout["ops"]["sddmm"]
    with pytest.raises(ValueError, match="plan built for sddmm, not spmm"):
        ops.spmm(A.indptr, A.indices, None, X, "sum", A.shape[1], plan=plan)


@pytest.mark.parametrize("plan", [
    torch.zeros(10, dtype=torch.long),
    torch.tensor([1, 2, 3]),
    torch.zeros(0, dtype=torch.long),
])
def test_garbage_plans_are_rejected(A, plan):
    X = torch.randn(A.shape[1], 4)
    with pytest.raises(ValueError, match="not a sparsejit plan"):
        ops.spmm(A.indptr, A.indices, None, X, "sum", A.shape[1], plan=plan)
    with raises_type_error(match="plan must be a 1-D int64 tensor"):
        ops.spmm(A.indptr, A.indices, None, X, "sum", A.shape[1], plan=plan.float())


def test_damaged_bucketed_plan_is_rejected(A):
    X = torch.randn(A.shape[1], 4)
    plan = ops.spmm_bucketed_plan(A.indptr, A.indices, A.shape[1], 3, 0).clone()
    plan[plans.layout()["header_words"]] = 10**9  # row_map[0] far outside the output
    with pytest.raises(ValueError, match="damaged"):
        ops.spmm(A.indptr, A.indices, None, X, "sum", A.shape[1], plan=plan)


def test_in_memory_plan_cache_is_keyed_like_the_disk_store(A):
    X = torch.randn(A.shape[1], 8)
    for reduce in ("sum", "max"):
        sj.spmm(A, X, reduce)
    keys = set(A._s.extra["plans"])
    t = torch.get_num_threads()
    assert ("spmm", 8, torch.float32, "sum", t) in keys
    assert ("spmm", 8, torch.float32, "max", t) in keys


def test_plan_layout_is_exported():
    layout = _core.plan_layout()
    assert layout["header_words"] == 10 and layout["ops"]["spmm"] == 1
    assert set(layout["words"]) >= {"magic", "version", "op", "kernel", "rows", "stamp"}


# ---- csr_from_edge_index: counting sort on the target, rows sorted by source --------------


def _csr_reference(ei, n):
    src, dst = ei[0].tolist(), ei[1].tolist()
    order = sorted(range(len(src)), key=lambda k: (dst[k], src[k], k))  # stable
    rowptr = [0] * (n + 1)
    for d in dst:
        rowptr[d + 1] += 1
    for v in range(n):
        rowptr[v + 1] += rowptr[v]
    return (torch.tensor(rowptr, dtype=torch.long),
            torch.tensor([src[k] for k in order], dtype=torch.long),
            torch.tensor(order, dtype=torch.long))


def _skewed_edges(n, e, seed):
    g = torch.Generator().manual_seed(seed)
    dst = torch.randint(0, n, (e,), generator=g)
    dst[: e // 2] = 3  # one row holds half of the entries (sorted by a full sort, not insertion)
    src = torch.randint(0, max(n // 10, 1), (e,), generator=g)  # many duplicate edges
    return torch.stack([src, dst])


@pytest.mark.parametrize("n,e,kind", [(0, 0, "random"), (1, 0, "random"), (1, 1, "random"),
                                      (5, 40, "random"), (300, 2000, "random"),
                                      (50, 3000, "skewed"), (3000, 250_000, "skewed"),
                                      (40_000, 250_000, "random")])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_csr_from_edge_index_matches_a_stable_sort(n, e, kind, dtype):
    seed = n * 7 + e
    ei = (_skewed_edges(n, e, seed) if kind == "skewed"
          else torch.randint(0, max(n, 1), (2, e), generator=torch.Generator().manual_seed(seed)))
    rowptr, col, perm = ops.csr_from_edge_index(ei.to(dtype), n)
    if e > 5000:  # the Python reference is slow: check the invariants it implies instead
        ref_rp = torch.zeros(n + 1, dtype=torch.long)
        ref_rp[1:] = torch.cumsum(torch.bincount(ei[1], minlength=n), 0)
        assert torch.equal(rowptr, ref_rp)
        assert torch.equal(torch.sort(perm).values, torch.arange(e))
        assert torch.equal(col, ei[0][perm])
        row = torch.repeat_interleave(torch.arange(n), rowptr.diff())
        assert torch.equal(row, ei[1][perm])
        key = row * (e + 1) * (n + 1) + col * (e + 1) + perm  # (target, source, edge) ascending
        assert bool((key.diff() > 0).all())
    else:
        ref = _csr_reference(ei, n)
        for got, want in zip((rowptr, col, perm), ref):
            assert torch.equal(got, want)


def test_csr_from_edge_index_names_the_first_bad_edge():
    ei = torch.tensor([[0, 1, 7, 9], [1, 2, 0, 0]])
    with pytest.raises(ValueError, match=r"edge_index\[:, 2\] = \[7, 0\] is out of range for "
                                         r"num_nodes = 5"):
        ops.csr_from_edge_index(ei, 5)
    with pytest.raises(ValueError, match=r"edge_index\[:, 0\] = \[0, -1\]"):
        ops.csr_from_edge_index(torch.tensor([[0], [-1]]), 5)


# ---- The device-generic (ATen) structure builders: what the CUDA ops run --------------------
# SPARSEJIT_STRUCTURE_ATEN=1 routes the CPU ops through them; every output must equal the
# counting sorts' bit for bit, and bad input must raise the same errors.

_ATEN_CASES = [(0, 0, "random"), (1, 0, "random"), (1, 1, "loops"), (7, 60, "loops"),
               (300, 2000, "random"), (50, 3000, "skewed"), (3000, 40_000, "skewed")]


def _edges(n, e, kind, seed):
    if kind == "skewed":
        return _skewed_edges(n, e, seed)
    ei = torch.randint(0, max(n, 1), (2, e), generator=torch.Generator().manual_seed(seed))
    if kind == "loops" and e:
        ei[1, : e // 2] = ei[0, : e // 2]
    return ei


def _both_paths(monkeypatch, fn):
    monkeypatch.delenv("SPARSEJIT_STRUCTURE_ATEN", raising=False)
    want = fn()
    monkeypatch.setenv("SPARSEJIT_STRUCTURE_ATEN", "1")
    got = fn()
    monkeypatch.delenv("SPARSEJIT_STRUCTURE_ATEN")
    return got, want


@pytest.mark.parametrize("n,e,kind", _ATEN_CASES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_aten_structure_builders_equal_the_counting_sorts(monkeypatch, n, e, kind, dtype):
    ei = _edges(n, e, kind, n + 3 * e).to(dtype)
    got, want = _both_paths(monkeypatch, lambda: ops.csr_from_edge_index(ei, n))
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)
    got, want = _both_paths(monkeypatch, lambda: ops.gcn_adjacency(ei, n, torch.float64))
    for a, b in zip(got[:3], want[:3]):
        assert a.dtype == b.dtype and torch.equal(a, b)
    # d^-1/2 is 1 / sqrt(d) on both paths; CUDA's sqrt is correctly rounded like std::sqrt,
    # the CPU's vectorised one may be 1 ulp off (a product of two: a few ulp).
    assert got[3].dtype == want[3].dtype
    torch.testing.assert_close(got[3], want[3], rtol=1e-15, atol=0)
    rowptr, col, _ = want[:3]
    for idx in (torch.int64, torch.int32):
        rp, cl = rowptr.to(idx), col.to(idx)
        got, want = _both_paths(monkeypatch, lambda: ops.csr_transpose(rp, cl, n))
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("call,match", [
    (lambda: ops.csr_from_edge_index(torch.tensor([[0, 1, 7, 9], [1, 2, 0, 0]]), 5),
     r"edge_index\[:, 2\] = \[7, 0\] is out of range for num_nodes = 5"),
    (lambda: ops.csr_from_edge_index(torch.tensor([[0], [-1]]), 5), r"edge_index\[:, 0\] = \[0, -1\]"),
    (lambda: ops.gcn_adjacency(torch.tensor([[0, 2], [1, 9]]), 4, torch.float32),
     r"gcn_adjacency: edge_index\[:, 1\] = \[2, 9\] is out of range"),
    (lambda: ops.csr_transpose(torch.tensor([0, 2, 1]), torch.tensor([0, 1]), 3),
     "indptr must be non-decreasing"),
    (lambda: ops.csr_transpose(torch.tensor([1, 2]), torch.tensor([0]), 3), r"indptr\[0\] must be 0"),
    (lambda: ops.csr_transpose(torch.tensor([0, 2]), torch.tensor([0, 3]), 3), "col"),
    (lambda: ops.validate_csr(torch.tensor([0, 1, 3]), torch.tensor([0, 1]), 3), "indptr"),
    (lambda: ops.validate_csr(torch.tensor([0, 1]), torch.tensor([-1]), 3), "col"),
])
def test_aten_structure_builders_raise_the_same_errors(monkeypatch, call, match):
    monkeypatch.setenv("SPARSEJIT_STRUCTURE_ATEN", "1")
    with pytest.raises(ValueError, match=match) as got:
        call()
    monkeypatch.delenv("SPARSEJIT_STRUCTURE_ATEN")
    with pytest.raises(ValueError) as want:
        call()
    assert str(got.value).splitlines()[0] == str(want.value).splitlines()[0]


# ---- gcn_adjacency: GCN's D^-1/2 (A + I) D^-1/2 in one pass -------------------------------


def _gcn_reference(ei, n):
    """PyG's gcn_norm for an unweighted edge_index, entry by entry (float64): the edges then
    one loop per node; an existing self-loop gets weight 0, every added loop weight 1."""
    src, dst = ei[0].tolist(), ei[1].tolist()
    e = len(src)
    s_all, d_all = src + list(range(n)), dst + list(range(n))
    w = [0.0 if k < e and src[k] == dst[k] else 1.0 for k in range(e + n)]
    deg = [0.0] * n
    for k in range(e + n):
        deg[d_all[k]] += w[k]
    order = sorted(range(e + n), key=lambda k: (d_all[k], s_all[k], k))
    vals = [w[k] * deg[d_all[k]] ** -0.5 * deg[s_all[k]] ** -0.5 for k in order]
    return ([s_all[k] for k in order], order, torch.tensor(vals, dtype=torch.float64))


@pytest.mark.parametrize("n,e,loops", [(0, 0, False), (1, 0, False), (1, 1, True), (3, 5, True),
                                       (60, 400, True), (200, 3000, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gcn_adjacency_matches_pyg_formula(n, e, loops, dtype):
    g = torch.Generator().manual_seed(n + e)
    ei = torch.randint(0, max(n, 1), (2, e), generator=g)
    if loops and e:
        ei[1, : e // 3] = ei[0, : e // 3]  # existing self-loops, some repeated
    rowptr, col, perm, vals = ops.gcn_adjacency(ei, n, dtype)
    ref_col, ref_perm, ref_vals = _gcn_reference(ei, n)
    want_rp, _, _ = ops.csr_from_edge_index(
        torch.cat([ei, torch.arange(n).expand(2, n)], 1), n)
    assert torch.equal(rowptr, want_rp)
    assert col.tolist() == ref_col and perm.tolist() == ref_perm
    assert vals.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(vals.double(), ref_vals, atol=tol, rtol=tol)


@pytest.mark.parametrize("n,e", [(300, 40000), (50000, 70000)])
def test_gcn_adjacency_dtypes_round_the_float64_values_once(n, e):
    """float32 is written directly and bfloat16 converted from float64: both equal the
    float64 result rounded once, bit for bit; large enough for the parallel row sort (a hub
    row holding a third of the edges, like a sampled subgraph's seeds) and values pass."""
    g = torch.Generator().manual_seed(e)
    ei = torch.randint(0, n, (2, e), generator=g)
    ei[1, : e // 3] = 7
    ei[1, e // 3: e // 2] = ei[0, e // 3: e // 2]
    rp64, col64, perm64, v64 = ops.gcn_adjacency(ei, n, torch.float64)
    for dtype in (torch.float32, torch.bfloat16):
        rp, col, perm, v = ops.gcn_adjacency(ei, n, dtype)
        assert torch.equal(rp, rp64) and torch.equal(col, col64) and torch.equal(perm, perm64)
        assert v.dtype == dtype and torch.equal(v, v64.to(dtype))
    ref = torch.argsort(ei[1] * n + ei[0], stable=True)
    assert torch.equal(perm64[perm64 < e], ref)


def test_gcn_adjacency_matches_the_layer_path_with_unit_weights():
    """The layer's general path (weights given, all 1) builds the same matrix."""
    from sparsejit.families.spmm import graph as G
    from sparsejit.families.spmm.layers import gcn_matrix
    ei = torch.randint(0, 500, (2, 6000), generator=torch.Generator().manual_seed(2))
    ei[1, :100] = ei[0, :100]
    fast = gcn_matrix(G.edges_of(ei, (500, 500)), False, True, torch.float32)
    slow = gcn_matrix(G.edges_of(ei, (500, 500), torch.ones(6000)), False, True, torch.float32)
    assert torch.equal(fast.indptr, slow.indptr) and torch.equal(fast.indices, slow.indices)
    torch.testing.assert_close(fast.values, slow.values, atol=1e-6, rtol=1e-6)


def test_gcn_adjacency_rejects_bad_input():
    with pytest.raises(ValueError, match=r"gcn_adjacency: edge_index\[:, 1\] = \[2, 9\] is out "
                                         r"of range for num_nodes = 4"):
        ops.gcn_adjacency(torch.tensor([[0, 2], [1, 9]]), 4, torch.float32)
    with raises_type_error(match="dtype must be a floating type"):
        ops.gcn_adjacency(torch.tensor([[0], [1]]), 4, torch.int64)
    with pytest.raises(ValueError, match=r"edge_index must have shape \[2, E\]"):
        ops.gcn_adjacency(torch.zeros(3, 4, dtype=torch.long), 4, torch.float32)
    with pytest.raises(ValueError, match="num_nodes must be >= 0"):
        ops.gcn_adjacency(torch.zeros(2, 0, dtype=torch.long), -1, torch.float32)
