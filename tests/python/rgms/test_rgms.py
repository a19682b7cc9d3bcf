"""RGMS (sparsejit.rgms, TypedSparseMatrix), segment_matmul and nn.RGCNConv against plain
float64 per-relation references on fresh random typed graphs."""

import zlib

import pytest
import torch

import sparsejit as sj
from sparsejit import _core
from sparsejit.families.rgms.ops import plan_arrays
from sparsejit.nn import RGCNConv
from conftest import raises_type_error  # noqa: E402

# ---- inputs and references ---------------------------------------------------------------


def typed_graph(kind, seed=0):
    """(edge_index, edge_type, num_src, num_dst, R) for a named shape of typed graph."""
    g = torch.Generator().manual_seed(seed)
    n_src = n_dst = 40
    if kind == "uniform":
        e, r = 300, 5
        et = torch.randint(0, r, (e,), generator=g)
    elif kind == "skewed":  # geometric relation sizes, relations 1, 4 and 6 empty
        e, r = 300, 8
        p = torch.tensor([0.5, 0.0, 0.25, 0.12, 0.0, 0.08, 0.0, 0.05])
        et = torch.multinomial(p, e, replacement=True, generator=g)
    elif kind == "r1":
        e, r = 200, 1
        et = torch.zeros(e, dtype=torch.long)
    elif kind == "r200":  # many relations, a few entries each, some empty
        e, r, n_src, n_dst = 400, 200, 60, 60
        et = torch.randint(0, 180, (e,), generator=g)
    elif kind == "empty":
        e, r = 0, 4
        et = torch.zeros(0, dtype=torch.long)
    elif kind == "hub":  # very skewed degrees: half the edges into node 3
        e, r = 300, 6
        et = torch.randint(0, r, (e,), generator=g)
    elif kind == "rect":
        e, r, n_src, n_dst = 250, 4, 30, 17
        et = torch.randint(0, r, (e,), generator=g)
    else:
        raise ValueError(kind)
    src = torch.randint(0, n_src, (e,), generator=g)
    dst = torch.randint(0, n_dst, (e,), generator=g)
    if kind == "hub":
        dst[: e // 2] = 3
    return torch.stack([src, dst]), et, n_src, n_dst, r


def reference(edge_index, edge_type, n_dst, X, W, reduce, values=None):
    """float64, one relation at a time: Y = sum_r norm_r(A_r) X W_r."""
    Xd, Wd = X.double(), W.double()
    Y = torch.zeros(n_dst, W.shape[2], dtype=torch.float64)
    for r in range(W.shape[0]):
        m = edge_type == r
        s, d = edge_index[0][m], edge_index[1][m]
        v = (values[m].double() if values is not None
             else torch.ones(int(m.sum()), dtype=torch.float64))
        agg = torch.zeros(n_dst, X.shape[1], dtype=torch.float64)
        agg.index_add_(0, d, Xd[s] * v[:, None])
        if reduce == "mean":
            agg = agg / torch.bincount(d, minlength=n_dst).clamp(min=1).double()[:, None]
        Y += agg @ Wd[r]
    return Y


TOL = {torch.float32: 1e-4, torch.float64: 1e-10, torch.bfloat16: 5e-2}


def _check_bf16_mean(outputs, ei, et, n_dst, X, W, values, root, bias, x_root):
    """Each bfloat16 output of a mean RGMS (with the root term and bias where `root` is
    given) against the float64 reference, within bfloat16's tolerance."""
    ref = reference(ei, et, n_dst, X, W, "mean", values)
    if root is not None:
        ref = ref + x_root.double() @ root.double() + bias.double()
    for y in outputs:
        assert y.dtype == torch.bfloat16 and y.shape == (n_dst, W.shape[2])
        tol = TOL[torch.bfloat16] * max(1.0, ref.abs().max().item())
        torch.testing.assert_close(y.double(), ref, atol=tol, rtol=TOL[torch.bfloat16])


KINDS = ["uniform", "skewed", "r1", "r200", "empty", "hub", "rect"]

# ---- forward -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("weighted", [False, True])
def test_rgms_matches_reference(kind, reduce, dtype, weighted, poison_empty):
    seed = zlib.crc32(f"{kind}/{reduce}".encode()) % 1000  # fixed across processes
    ei, et, n_src, n_dst, r = typed_graph(kind, seed=seed)
    g = torch.Generator().manual_seed(1)
    X = torch.randn(n_src, 12, generator=g).to(dtype)
    W = torch.randn(r, 12, 7, generator=g).to(dtype)
    values = torch.rand(ei.shape[1], generator=g).to(dtype) if weighted else None
    A = sj.TypedSparseMatrix.from_edge_index(ei, (n_src, n_dst), edge_type=et, num_relations=r,
                                             values=values)
    Y = sj.rgms(A, X, W, reduce=reduce)
    assert Y.dtype == dtype and Y.shape == (n_dst, 7)
    ref = reference(ei, et, n_dst, X, W, reduce, values)
    tol = TOL[dtype] * max(1.0, ref.abs().max().item())
    torch.testing.assert_close(Y.double(), ref, atol=tol, rtol=TOL[dtype])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("strategy", [1, 2])  # aggregate first, transform first
@pytest.mark.parametrize("weighted,with_root", [(False, False), (True, True)])
def test_rgms_bfloat16_tiles_on_bf16_gemm(kind, strategy, weighted, with_root, monkeypatch,
                                          poison_empty):
    """bfloat16 X and W through the GEMM tiles (widths above the fused rows' 32): where
    oneDNN's bfloat16 GEMM runs natively the tiles are rounded to bfloat16 and multiplied
    there; the result matches the float64 reference to bfloat16 accuracy, and differs from
    the float32 tiles (SPARSEJIT_RGMS_BF16_GEMM=0) only by that rounding. Aggregating first,
    the tiles also gather X in bfloat16 (never converted)."""
    seed = zlib.crc32(f"bf16/{kind}".encode()) % 1000
    ei, et, n_src, n_dst, r = typed_graph(kind, seed=seed)
    g = torch.Generator().manual_seed(3)
    X = torch.randn(n_src, 40, generator=g).bfloat16()
    W = torch.randn(r, 40, 36, generator=g).bfloat16()
    values = torch.rand(ei.shape[1], generator=g).bfloat16() if weighted else None
    A = sj.TypedSparseMatrix.from_edge_index(ei, (n_src, n_dst), edge_type=et, num_relations=r,
                                             values=values)
    root = torch.randn(40, 36, generator=g).bfloat16() if with_root else None
    bias = torch.randn(36, generator=g).bfloat16() if with_root else None
    x_root = torch.randn(n_dst, 40, generator=g).bfloat16() if with_root else None

    def run():
        return torch.ops.sparsejit.rgms(A.plan, X, W, A.values, "mean", n_dst, 1, 0, strategy,
                                        root, bias, x_root)

    got = run()
    if strategy == 1:
        # The tiles gather the bfloat16 rows as they are (kind 7, widened exactly): the JIT's
        # width-specialized loop and the generic one give the same bits.
        from conftest import generic_only
        assert torch.equal(generic_only(run), got)
    monkeypatch.setenv("SPARSEJIT_RGMS_BF16_GEMM", "0")
    f32_tiles = run()
    _check_bf16_mean((got, f32_tiles), ei, et, n_dst, X, W, values, root, bias, x_root)
    if _core.gemm_bf16_native() and ei.shape[1] > 0 and strategy == 1:
        # aggregate first rounds each mean to bfloat16 before the product: not the same bits
        assert not torch.equal(got, f32_tiles)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("strategy", [0, 1, 2])
def test_rgms_bfloat16_tiles_exact_on_exact_inputs(kind, strategy, poison_empty):
    """Halves in X, small integers in W, sums: every gathered sum, its bfloat16 rounding and
    every product are exact, so the bfloat16 forward (tiles gathered in bfloat16, oneDNN's
    bfloat16 GEMM where native, float32 elsewhere) must equal the float64 reference rounded
    once to bfloat16, bit for bit: a wrong bit anywhere in the pipeline shows."""
    seed = zlib.crc32(f"bf16x/{kind}".encode()) % 1000
    ei, et, n_src, n_dst, r = typed_graph(kind, seed=seed)
    g = torch.Generator().manual_seed(4)
    X = (torch.randint(-2, 3, (n_src, 40), generator=g) / 2).bfloat16()
    W = torch.randint(-2, 3, (r, 40, 36), generator=g).bfloat16()
    A = sj.TypedSparseMatrix.from_edge_index(ei, (n_src, n_dst), edge_type=et, num_relations=r)
    got = torch.ops.sparsejit.rgms(A.plan, X, W, None, "sum", n_dst, 1, 0, strategy, None,
                                   None, None)
    want = reference(ei, et, n_dst, X, W, "sum").to(torch.bfloat16)
    assert torch.equal(got, want)


def big_typed_graph(kind, seed=0):
    """Typed graphs with enough entries (10000) for the fused rows' JIT instantiation from 7
    columns up (RGMS's loops are JIT-compiled from 2^16 gathered elements): (edge_index,
    edge_type, n_src, n_dst, R)."""
    g = torch.Generator().manual_seed(seed)
    e, r, n_src, n_dst = 10000, 6, 400, 400
    if kind == "r200":  # many relations, a few entries each, some empty
        r = 200
        et = torch.randint(0, 180, (e,), generator=g)
    else:
        et = torch.randint(0, r, (e,), generator=g)
    if kind == "rect":
        n_src, n_dst = 300, 170
    src = torch.randint(0, n_src, (e,), generator=g)
    dst = torch.randint(0, n_dst, (e,), generator=g)
    if kind == "hub":  # very skewed degrees: half the entries into target 3
        dst[: e // 2] = 3
    if kind == "one":  # a single entry repeated: one group
        src[:], dst[:], et[:] = 5, 7, 2
    return torch.stack([src, dst]), et, n_src, n_dst, r


def _fused_bf16_runs(entries, f_in):
    """Whether a bfloat16 forward on the fused rows runs kind 8 (bfloat16 products) here."""
    return (_core.gemm_bf16_native() and _core.isa_state()["avx512_bf16"] and
            _core.jit_enabled() and entries * f_in >= 1 << 16)


@pytest.mark.parametrize("kind", ["uniform", "hub", "r200", "rect", "one"])
@pytest.mark.parametrize("f_in,f_out", [(16, 16), (7, 5), (32, 20), (24, 32)])
@pytest.mark.parametrize("weighted,with_root", [(False, False), (True, True)])
def test_rgms_bfloat16_fused_rows(kind, f_in, f_out, weighted, with_root, monkeypatch,
                                  poison_empty):
    """bfloat16 X and W through the fused rows (widths up to 32): on a CPU with AVX512-BF16 the
    JIT's rows round each reduced row to bfloat16 and multiply on vdpbf16ps (kind 8), reading
    X in bfloat16; the result matches the float64 reference to bfloat16 accuracy. Without
    those products (SPARSEJIT_RGMS_BF16_GEMM=0) the rows run in float32: the same accuracy,
    and where kind 8 ran, other bits (the reduced rows were rounded)."""
    seed = zlib.crc32(f"bf16rows/{kind}/{f_in}".encode()) % 1000
    ei, et, n_src, n_dst, r = big_typed_graph(kind, seed=seed)
    g = torch.Generator().manual_seed(5)
    X = torch.randn(n_src, f_in, generator=g).bfloat16()
    W = torch.randn(r, f_in, f_out, generator=g).bfloat16()
    values = torch.rand(ei.shape[1], generator=g).bfloat16() if weighted else None
    A = sj.TypedSparseMatrix.from_edge_index(ei, (n_src, n_dst), edge_type=et, num_relations=r,
                                             values=values)
    root = torch.randn(f_in, f_out, generator=g).bfloat16() if with_root else None
    bias = torch.randn(f_out, generator=g).bfloat16() if with_root else None
    x_root = torch.randn(n_dst, f_in, generator=g).bfloat16() if with_root else None

    def run():
        return torch.ops.sparsejit.rgms(A.plan, X, W, A.values, "mean", n_dst, 0, 0, 1, root,
                                        bias, x_root)

    got = run()
    monkeypatch.setenv("SPARSEJIT_RGMS_BF16_GEMM", "0")
    f32_rows = run()
    _check_bf16_mean((got, f32_rows), ei, et, n_dst, X, W, values, root, bias, x_root)
    # "one": the mean of one repeated row is that row, exact either way
    if _fused_bf16_runs(ei.shape[1], f_in) and kind != "one":
        assert not torch.equal(got, f32_rows)


@pytest.mark.parametrize("kind", ["uniform", "r200", "rect", "one"])
@pytest.mark.parametrize("f_in,f_out", [(16, 16), (7, 5), (32, 20), (24, 32)])
def test_rgms_bfloat16_fused_rows_exact_on_exact_inputs(kind, f_in, f_out, poison_empty):
    """Halves in X, small integers in W, sums over few entries: every reduced row, its
    bfloat16 rounding and every product are exact, so the fused rows' bfloat16 forward
    (kind 8 where it runs) must equal the float64 reference rounded once to bfloat16."""
    seed = zlib.crc32(f"bf16rowsx/{kind}/{f_in}".encode()) % 1000
    ei, et, n_src, n_dst, r = big_typed_graph(kind, seed=seed)
    if kind == "one":
        ei, et = ei[:, :40], et[:40]  # 40 entries: a sum of halves up to 20, exact
    g = torch.Generator().manual_seed(6)
    X = (torch.randint(-2, 3, (n_src, f_in), generator=g) / 2).bfloat16()
    W = torch.randint(-2, 3, (r, f_in, f_out), generator=g).bfloat16()
    A = sj.TypedSparseMatrix.from_edge_index(ei, (n_src, n_dst), edge_type=et, num_relations=r)
    got = torch.ops.sparsejit.rgms(A.plan, X, W, None, "sum", n_dst, 0, 0, 1, None, None, None)
    want = reference(ei, et, n_dst, X, W, "sum").to(torch.bfloat16)
    assert torch.equal(got, want)


@pytest.mark.parametrize("f_in,f_out", [(0, 5), (6, 0), (0, 0)])
def test_rgms_zero_width(f_in, f_out, poison_empty):
    ei, et, n_src, n_dst, r = typed_graph("uniform")
    X = torch.randn(n_src, f_in)
    W = torch.randn(r, f_in, f_out)
    Y = sj.rgms(ei, X, W, edge_type=et, reduce="mean")
    assert Y.shape == (n_dst, f_out)
    assert torch.equal(Y, torch.zeros(n_dst, f_out))


def test_rgms_edge_index_form_and_int32():
    ei, et, n, _, r = typed_graph("skewed", seed=5)
    X, W = torch.randn(n, 8, dtype=torch.float64), torch.randn(r, 8, 3, dtype=torch.float64)
    Y = sj.rgms(ei.int(), X, W, edge_type=et.int(), reduce="mean")
    torch.testing.assert_close(Y, reference(ei, et, n, X, W, "mean"))


def test_plan_groups_by_relation_then_target():
    ei, et, n, _, r = typed_graph("skewed", seed=2)
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    stats = A.relation_stats()
    assert stats["entries"] == torch.bincount(et, minlength=r).tolist()
    assert stats["entries"][1] == stats["entries"][4] == stats["entries"][6] == 0
    for rel in range(r):
        m = et == rel
        assert stats["targets"][rel] == ei[1][m].unique().numel()


@pytest.mark.parametrize("kind", KINDS)
def test_plan_is_one_tensor_with_the_common_header(kind):
    """The plan is one int64 tensor: the common plan header (magic, version, op = rgms,
    R in the param word, the stamp: targets, entries, sources, a fingerprint), then the arrays
    at the positions _core.rgms_plan_view gives; the arrays hold the grouping the ops rely on,
    checked here against the edges themselves."""
    from sparsejit import _core
    ei, et, n_src, n_dst, r = typed_graph(kind, seed=7)
    e = ei.shape[1]
    A = sj.TypedSparseMatrix.from_edge_index(ei, (n_src, n_dst), edge_type=et, num_relations=r)
    layout = _core.plan_layout()
    w = layout["words"]
    plan = A.plan
    assert plan.dtype == torch.int64 and plan.dim() == 1
    assert plan.numel() == _core.rgms_plan_view(r, e)["total_words"]
    assert plan[w["magic"]] == layout["magic"] and plan[w["version"]] == layout["version"]
    assert plan[w["op"]] == layout["ops"]["rgms"] == _core.enums()["op"]["rgms"]
    assert (plan[w["param"]], plan[w["rows"]], plan[w["nnz"]], plan[w["cols"]]) == \
        (r, n_dst, e, n_src)
    assert A.num_relations == r and A.nnz == e
    arrays = plan_arrays(plan)  # R read from the header
    assert list(arrays) == layout["rgms"]["arrays"]
    rel_ptr, grp_ptr, grp_dst, src, perm = (arrays[k] for k in layout["rgms"]["arrays"])
    groups = int(rel_ptr[-1])
    # perm is a permutation of the edges, sorted by (relation, target), stable within a group.
    assert sorted(perm.tolist()) == list(range(e))
    key = [(int(et[i]), int(ei[1, i]), int(i)) for i in perm]
    assert key == sorted(key)
    assert torch.equal(src, ei[0][perm])
    for g in range(groups):  # one group per distinct (relation, target)
        members = perm[grp_ptr[g]:grp_ptr[g + 1]]
        assert members.numel() > 0
        assert (ei[1][members] == grp_dst[g]).all() and (et[members] == et[members[0]]).all()
    assert groups == len({(int(et[i]), int(ei[1, i])) for i in range(e)})
    for rel in range(r):
        assert all(int(et[perm[grp_ptr[g]]]) == rel
                   for g in range(int(rel_ptr[rel]), int(rel_ptr[rel + 1])))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_device_generic_plan_builder_equals_the_counting_sorts(monkeypatch, kind, dtype):
    """rgms_plan's tensor-op builder (what CUDA runs; SPARSEJIT_STRUCTURE_ATEN=1 routes the
    CPU op through it) gives the counting sorts' plan word for word, header included."""
    ei, et, n_src, n_dst, r = typed_graph(kind, seed=11)
    cases = [(ei, et, n_src, n_dst, r), (ei[:, :0], et[:0], n_src, n_dst, r),
             (ei[:, :1], et[:1], n_src, n_dst, r), (ei, et, n_src, n_dst, r + 3)]
    for e_i, e_t, ns, nd, rr in cases:
        args = (e_i.to(dtype), e_t.to(dtype), ns, nd, rr)
        monkeypatch.delenv("SPARSEJIT_STRUCTURE_ATEN", raising=False)
        want = torch.ops.sparsejit.rgms_plan(*args)
        monkeypatch.setenv("SPARSEJIT_STRUCTURE_ATEN", "1")
        got = torch.ops.sparsejit.rgms_plan(*args)
        monkeypatch.delenv("SPARSEJIT_STRUCTURE_ATEN")
        assert got.dtype == want.dtype and torch.equal(got, want), (kind, e_i.shape, rr)


@pytest.mark.parametrize("edit,match", [
    (lambda ei, et: et.__setitem__(3, 99), r"edge_type\[3\] = 99 is out of range"),
    (lambda ei, et: ei.__setitem__((0, 2), -1), r"edge_index\[0, 2\] = -1"),
    (lambda ei, et: ei.__setitem__((1, 5), 10 ** 6), r"edge_index\[1, 5\] = 1000000"),
])
def test_device_generic_plan_builder_names_bad_edges(monkeypatch, edit, match):
    ei, et, n_src, n_dst, r = typed_graph("uniform", seed=12)
    ei, et = ei.clone(), et.clone()
    edit(ei, et)
    monkeypatch.setenv("SPARSEJIT_STRUCTURE_ATEN", "1")
    with pytest.raises(ValueError, match=match):
        torch.ops.sparsejit.rgms_plan(ei, et, n_src, n_dst, r)


def test_plan_header_rejects_foreign_or_changed_plans():
    ei, et, n, _, r = typed_graph("uniform", seed=3)
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    X, W = torch.randn(n, 4), torch.randn(r, 4, 3)
    ref = torch.ops.sparsejit.rgms(A.plan, X, W, None, "sum", n)
    w = sj._core.plan_layout()["words"]
    # Another family's plan: named in the error.
    other = A.plan.clone()
    other[w["op"]] = sj._core.plan_layout()["ops"]["spmm"]
    with pytest.raises(ValueError, match="not an RGMS plan.*'spmm'"):
        torch.ops.sparsejit.rgms(other, X, W, None, "sum", n)
    # A still-valid edit of the arrays (two sources swapped within a group's range of
    # sources) no longer matches the stamp rgms_plan wrote.
    changed = A.plan.clone()
    src = plan_arrays(changed, r)["src"]
    i = int((src != src[0]).nonzero()[0])
    src[0], src[i] = int(src[i]), int(src[0])
    with pytest.raises(ValueError, match="plan built for another structure"):
        torch.ops.sparsejit.rgms(changed, X, W, None, "sum", n)
    # More target rows, or more rows of X, than the structure was built for.
    with pytest.raises(ValueError, match="plan built for another structure"):
        torch.ops.sparsejit.rgms(A.plan, X, W, None, "sum", n + 1)
    with pytest.raises(ValueError, match="plan built for another structure"):
        torch.ops.sparsejit.rgms(A.plan, torch.randn(n + 2, 4), W, None, "sum", n)
    # A plan cut short, or too short to hold a header.
    with pytest.raises(ValueError, match="words but its header describes"):
        torch.ops.sparsejit.rgms(A.plan[:-4].clone(), X, W, None, "sum", n)
    with pytest.raises(ValueError, match="fewer than the plan header"):
        torch.ops.sparsejit.rgms(A.plan[:3].clone(), X, W, None, "sum", n)
    with pytest.raises(TypeError, match="plan must be the int64 tensor"):
        sj.TypedSparseMatrix((A.plan,), (n, n))
    # The untouched plan still runs, with the same result.
    torch.testing.assert_close(torch.ops.sparsejit.rgms(A.plan, X, W, None, "sum", n), ref)


def test_typed_fingerprint_is_the_header_stamp():
    """Stored schedules are keyed by the stamp: equal structures share it, another differs."""
    from sparsejit.families.rgms import schedules
    ei, et, n, _, r = typed_graph("uniform", seed=3)
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    B = sj.TypedSparseMatrix.from_edge_index(ei.clone(), n, edge_type=et.clone(),
                                             num_relations=r)
    et2 = et.clone()
    et2[0] = (et2[0] + 1) % r
    C = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et2, num_relations=r)
    assert schedules.typed_fingerprint(A) == schedules.typed_fingerprint(B)
    assert schedules.typed_fingerprint(A) != schedules.typed_fingerprint(C)


# ---- segment_matmul ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("sizes", [[3, 0, 5, 1], [0], [0, 0, 4], [7], [2] * 30])
def test_segment_matmul_matches_loop(dtype, sizes, poison_empty):
    g = torch.Generator().manual_seed(len(sizes))
    n = sum(sizes)
    ptr = torch.tensor([0] + sizes).cumsum(0)
    x = torch.randn(n, 6, generator=g).to(dtype)
    w = torch.randn(len(sizes), 6, 4, generator=g).to(dtype)
    y = sj.segment_matmul(x, ptr, w)
    ref = torch.cat([x[ptr[k]:ptr[k + 1]].double() @ w[k].double() for k in range(len(sizes))]
                    + [torch.zeros(0, 4, dtype=torch.float64)])
    torch.testing.assert_close(y.double(), ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("n,k", [(50, 4), (0, 3), (20, 1)])
def test_gather_matmul(n, k):
    g = torch.Generator().manual_seed(n + k)
    x = torch.randn(n, 5, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(k, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, max(k - 1, 1), (n,), generator=g)  # the last type unused
    ref = torch.einsum("ni,nio->no", x, w[index])
    torch.testing.assert_close(sj.gather_matmul(x, index, w), ref)
    assert torch.autograd.gradcheck(lambda x, w: sj.gather_matmul(x, index, w), (x, w))
    if n:
        bad = index.clone()
        bad[n // 2] = k
        with pytest.raises(ValueError, match=rf"index\[{n // 2}\] = {k} is out of range"):
            sj.gather_matmul(x, bad, w)


# ---- bad input -------------------------------------------------------------------------------


def test_bad_relation_ids():
    ei, et, n, _, r = typed_graph("uniform")
    bad = et.clone()
    bad[17] = r
    with pytest.raises(ValueError, match=rf"edge_type\[17\] = {r} is out of range"):
        sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=bad, num_relations=r)
    bad[17] = -1
    with pytest.raises(ValueError, match=r"edge_type\[17\] = -1"):
        sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=bad, num_relations=r)
    with pytest.raises(ValueError, match="edge_type must have shape"):
        sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et[:-1], num_relations=r)
    with pytest.raises(TypeError, match="edge_type must hold integers"):
        sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et.float(), num_relations=r)
    with raises_type_error(match="edge_type must hold integers"):
        torch.ops.sparsejit.rgms_plan(ei, et.float(), n, n, r)
    with pytest.raises(ValueError, match=r"edge_index\[1, 0\] = 99"):
        e2 = ei.clone()
        e2[1, 0] = 99
        sj.TypedSparseMatrix.from_edge_index(e2, n, edge_type=et, num_relations=r)


def test_bad_dense_operands():
    ei, et, n, _, r = typed_graph("uniform")
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    X = torch.randn(n, 8)
    with pytest.raises(ValueError, match=f"W has {r + 1} relations"):
        sj.rgms(A, X, torch.randn(r + 1, 8, 4))
    with pytest.raises(ValueError, match="W has F_in = 9"):
        sj.rgms(A, X, torch.randn(r, 9, 4))
    with pytest.raises(ValueError, match=f"X has {n + 1} rows"):
        sj.rgms(A, torch.randn(n + 1, 8), torch.randn(r, 8, 4))
    with pytest.raises(TypeError, match="dtype"):
        sj.rgms(A, X, torch.randn(r, 8, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="reduce"):
        sj.rgms(A, X, torch.randn(r, 8, 4), reduce="max")
    # The raw op checks the same things itself.
    with pytest.raises(ValueError, match=f"W has {r + 1} relations"):
        torch.ops.sparsejit.rgms(A.plan, X, torch.randn(r + 1, 8, 4), None, "sum", n)
    with pytest.raises(ValueError, match="W has F_in = 9"):
        torch.ops.sparsejit.rgms(A.plan, X, torch.randn(r, 9, 4), None, "sum", n)
    with pytest.raises(ValueError, match="out of range for 5 rows of x"):
        torch.ops.sparsejit.rgms(A.plan, torch.randn(5, 8), torch.randn(r, 8, 4), None,
                                 "sum", n)
    bad = A.plan.clone()
    plan_arrays(bad, r)["src"][0] = 10**6
    with pytest.raises(ValueError, match="invalid typed structure"):
        torch.ops.sparsejit.rgms(bad, X, torch.randn(r, 8, 4), None, "sum", n)


@pytest.mark.parametrize("ptr,match", [
    ([0, 5, 3, 10], "must not decrease"),
    ([0, 3, 5, 9], r"ptr\[-1\] = 9 must equal the number of rows of x \(10\)"),
    ([1, 3, 5, 10], r"ptr\[0\] must be 0"),
    ([0, 5, 10], "ptr must have w.size\\(0\\) \\+ 1 = 4 entries"),
])
def test_segment_matmul_bad_ptr(ptr, match):
    with pytest.raises(ValueError, match=match):
        sj.segment_matmul(torch.randn(10, 4), torch.tensor(ptr), torch.randn(3, 4, 2))


def test_segment_matmul_bad_types():
    x, w = torch.randn(10, 4), torch.randn(3, 4, 2)
    with pytest.raises(TypeError, match="ptr must be int32 or int64"):
        sj.segment_matmul(x, torch.tensor([0.0, 3, 5, 10]), w)
    with pytest.raises(ValueError, match="ptr must be 1-D"):
        sj.segment_matmul(x, torch.tensor([[0, 3, 5, 10]]), w)
    with pytest.raises(ValueError, match="w has F_in = 4 but x has 5"):
        sj.segment_matmul(torch.randn(10, 5), torch.tensor([0, 3, 5, 10]), w)


# ---- autograd, opcheck, compile ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["uniform", "skewed", "rect", "empty"])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_rgms_gradcheck(kind, reduce):
    ei, et, n_src, n_dst, r = typed_graph(kind, seed=3)
    keep = torch.arange(ei.shape[1]) < 60  # small enough for finite differences
    ei, et = ei[:, keep], et[keep]
    g = torch.Generator().manual_seed(4)
    X = torch.randn(n_src, 3, generator=g, dtype=torch.float64, requires_grad=True)
    W = torch.randn(r, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.rand(ei.shape[1], generator=g, dtype=torch.float64, requires_grad=True)
    A = sj.TypedSparseMatrix.from_edge_index(ei, (n_src, n_dst), edge_type=et, num_relations=r)
    assert torch.autograd.gradcheck(lambda X, W: sj.rgms(A, X, W, reduce=reduce), (X, W))
    assert torch.autograd.gradcheck(lambda X, W, v: sj.rgms(A, X, W, reduce=reduce, values=v),
                                    (X, W, v))


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("f_in", [24, 5])
def test_rgms_backward_matches_reference_autograd(reduce, f_in):
    """Large enough for the parallel paths (kernels/cpu/row_tile_kernel.h parallelizes when
    groups x F > 32768; the column-split scatter into dX also needs F >= 16)."""
    g = torch.Generator().manual_seed(11)
    n, e, r = 2500, 24000, 6
    ei = torch.randint(0, n, (2, e), generator=g)
    et = torch.randint(0, r, (e,), generator=g)
    et[et == 5] = 2  # an empty relation
    X = torch.randn(n, f_in, generator=g, dtype=torch.float64, requires_grad=True)
    W = torch.randn(r, f_in, 20, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.rand(e, generator=g, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(n, 20, generator=g, dtype=torch.float64)
    Y = sj.rgms(ei, X, W, edge_type=et, reduce=reduce, values=v)
    ours = torch.autograd.grad(Y, (X, W, v), dy)
    ref = torch.autograd.grad(reference(ei, et, n, X, W, reduce, v), (X, W, v), dy)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b)


def test_typed_cache_hits_and_sees_in_place_changes():
    from sparsejit.families.rgms.ops import cached_from_edge_index
    ei, et, n, _, r = typed_graph("uniform", seed=12)
    A1 = cached_from_edge_index(ei, n, et, r)
    assert cached_from_edge_index(ei, n, et, r) is A1
    # Keyed by content (runtime.caches.content_key): an equal tensor finds the same structure.
    assert cached_from_edge_index(ei.clone(), n, et, r) is A1
    assert cached_from_edge_index(ei, n + 1, et, r) is not A1
    X, W = torch.randn(n, 4, dtype=torch.float64), torch.randn(r, 4, 2, dtype=torch.float64)
    et[:10] = (et[:10] + 1) % r  # in place: the cached plan must not be reused
    assert cached_from_edge_index(ei, n, et, r) is not A1
    torch.testing.assert_close(sj.rgms(ei, X, W, edge_type=et), reference(ei, et, n, X, W, "sum"))


def test_segment_matmul_gradcheck():
    ptr = torch.tensor([0, 2, 2, 7])
    x = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: sj.segment_matmul(x, ptr, w), (x, w))


def _opcheck_inputs():
    ei, et, n, _, r = typed_graph("skewed", seed=6)
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    X = torch.randn(n, 5, dtype=torch.float64, requires_grad=True)
    W = torch.randn(r, 5, 3, dtype=torch.float64, requires_grad=True)
    v = torch.rand(ei.shape[1], dtype=torch.float64, requires_grad=True)
    return ei, et, n, r, A, X, W, v


def test_opcheck_rgms_ops():
    ei, et, n, r, A, X, W, v = _opcheck_inputs()
    ops = torch.ops.sparsejit
    torch.library.opcheck(ops.rgms_plan, (ei, et, n, n, r))
    for reduce in ("sum", "mean"):
        torch.library.opcheck(ops.rgms, (A.plan, X, W, None, reduce, n))
        torch.library.opcheck(ops.rgms, (A.plan, X, W, v, reduce, n))
        dy = torch.randn(n, 3, dtype=torch.float64)
        torch.library.opcheck(ops.rgms_backward,
                              (A.plan, X.detach(), W.detach(), v.detach(), dy, reduce, True,
                               True, True))


def test_opcheck_segment_matmul():
    ptr = torch.tensor([0, 2, 2, 7])
    x = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 3, 4, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(torch.ops.sparsejit.segment_matmul, (x, ptr, w))
    torch.library.opcheck(torch.ops.sparsejit.segment_matmul_backward_w,
                          (x.detach(), ptr, torch.randn(7, 4, dtype=torch.float64)))


class RGCN(torch.nn.Module):
    def __init__(self, f_in, hidden, classes, r, num_bases=None):
        super().__init__()
        self.conv1 = RGCNConv(f_in, hidden, r, num_bases=num_bases)
        self.conv2 = RGCNConv(hidden, classes, r, num_bases=num_bases)

    def forward(self, x, edge_index, edge_type):
        return self.conv2(torch.relu(self.conv1(x, edge_index, edge_type)), edge_index, edge_type)


def test_compile_two_layer_rgcn_fullgraph():
    torch._dynamo.reset()
    ei, et, n, _, r = typed_graph("skewed", seed=7)
    model = RGCN(6, 8, 3, r, num_bases=2)
    x = torch.randn(n, 6)
    eager = model(x, ei, et)
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x, ei, et)
    torch.testing.assert_close(out, eager)
    out.sum().backward()
    g_compiled = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    eager.sum().backward()
    for gc, p in zip(g_compiled, model.parameters()):
        torch.testing.assert_close(gc, p.grad)


def test_compile_featureless_rgcn_fullgraph():
    torch._dynamo.reset()
    ei, et, n, _, r = typed_graph("uniform", seed=13)
    model = RGCN(n, 8, 3, r, num_bases=2)
    eager = model(None, ei, et)
    torch.testing.assert_close(torch.compile(model, fullgraph=True)(None, ei, et), eager)


# ---- the layer -------------------------------------------------------------------------------


def layer_reference(layer, x, ei, et, n):
    """RGCNConv by hand, one relation at a time (float64)."""
    w = layer.relation_weights().double()
    reduce = "mean" if layer.aggr == "mean" else "sum"
    if x is None or x.dtype == torch.long:
        ids = torch.arange(layer.in_channels_l) if x is None else x
        xd = torch.eye(layer.in_channels_l, dtype=torch.float64)[ids]
    else:
        xd = x.double()
    out = reference(ei, et, n, xd, w, reduce)
    if layer.root is not None:
        out = out + xd @ layer.root.double()
    if layer.bias is not None:
        out = out + layer.bias.double()
    return out


@pytest.mark.parametrize("cfg", [
    dict(), dict(num_bases=3), dict(num_blocks=2), dict(aggr="add"),
    dict(root_weight=False, bias=False), dict(aggr="sum", num_bases=2),
])
def test_rgcnconv_matches_reference(cfg):
    ei, et, n, _, r = typed_graph("skewed", seed=8)
    layer = RGCNConv(6, 4, r, **cfg)
    if layer.bias is not None:
        torch.nn.init.uniform_(layer.bias)
    x = torch.randn(n, 6)
    torch.testing.assert_close(layer(x, ei, et).double(), layer_reference(layer, x, ei, et, n),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("ids", [False, True])
def test_rgcnconv_featureless(ids):
    ei, et, n, _, r = typed_graph("uniform", seed=9)
    layer = RGCNConv(n, 4, r, num_bases=2)
    x = torch.randperm(n) if ids else None
    torch.testing.assert_close(layer(x, ei, et).double(), layer_reference(layer, x, ei, et, n),
                               atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="Block-diagonal"):
        RGCNConv(n, 4, r, num_blocks=2)(None, ei, et)


def test_rgcnconv_parameter_names():
    assert set(dict(RGCNConv(4, 6, 3).named_parameters())) == {"weight", "root", "bias"}
    layer = RGCNConv(4, 6, 3, num_bases=2)
    assert layer.weight.shape == (2, 4, 6) and layer.comp.shape == (3, 2)
    assert RGCNConv(4, 6, 3, num_blocks=2).weight.shape == (3, 2, 2, 3)
    with pytest.raises(ValueError, match="both"):
        RGCNConv(4, 6, 3, num_bases=2, num_blocks=2)
    # PyG's positional order: (..., aggr, root_weight, is_sorted, bias)
    assert RGCNConv(4, 6, 3, None, None, "mean", True, True, False).bias is None
    assert sj.nn.FastRGCNConv is RGCNConv


@pytest.mark.parametrize("cfg", [
    dict(), dict(num_bases=3), dict(num_blocks=2), dict(aggr="add"),
    dict(root_weight=False), dict(bias=False), dict(is_sorted=True),
])
@pytest.mark.parametrize("featureless", [False, True])
def test_rgcnconv_matches_pyg(cfg, featureless):
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    if featureless and "num_blocks" in cfg:
        pytest.skip("PyG has no block decomposition for featureless nodes")
    ei, et, n, _, r = typed_graph("skewed", seed=10)
    torch.manual_seed(0)
    f_in = n if featureless else 6
    pyg = pyg_nn.RGCNConv(f_in, 4, r, **cfg)
    if pyg.bias is not None:
        torch.nn.init.uniform_(pyg.bias)
    ours = RGCNConv(f_in, 4, r, **cfg)
    ours.load_state_dict(pyg.state_dict())
    x = None if featureless else torch.randn(n, f_in)
    torch.testing.assert_close(ours(x, ei, et), pyg(x, ei, et), atol=1e-5, rtol=1e-5)


def test_rgcnconv_bipartite_matches_pyg():
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    ei, et, n_src, n_dst, r = typed_graph("rect", seed=14)
    torch.manual_seed(1)
    pyg = pyg_nn.RGCNConv((5, 3), 4, r, num_bases=2)
    torch.nn.init.uniform_(pyg.bias)
    ours = RGCNConv((5, 3), 4, r, num_bases=2)
    ours.load_state_dict(pyg.state_dict())
    x = (torch.randn(n_src, 5), torch.randn(n_dst, 3))
    torch.testing.assert_close(ours(x, ei, et), pyg(x, ei, et), atol=1e-5, rtol=1e-5)


# ---- tiles, threads and GEMM kernels (csrc/rgms/rgms_forward.cpp, rgms_backward.cpp) ---------


def _grads_reference(ei, et, n_dst, X, W, values, reduce, dY):
    Xr = X.detach().double().requires_grad_()
    Wr = W.detach().double().requires_grad_()
    vr = values.detach().double().requires_grad_()
    Y = reference(ei, et, n_dst, Xr, Wr, reduce, vr)
    Y.backward(dY.double())
    return Y.detach(), Xr.grad, Wr.grad, vr.grad


@pytest.mark.parametrize("tile", [0, 1, 3, 4096])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("strategy", [0, 1, 2])
def test_rgms_tiles_and_threads(tile, threads, reduce, strategy, poison_empty):
    """Large enough for every pass to go parallel; odd widths (not multiples of 8 or 16);
    forward and all three gradients against the float64 reference."""
    g = torch.Generator().manual_seed(7 + tile)
    n, e, r, f_in, f_out = 700, 6000, 9, 37, 21
    et = torch.multinomial(torch.tensor([8.0, 4, 2, 1, 0, 1, 0.5, 0.25, 3]), e, True, generator=g)
    ei = torch.stack([torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)])
    ei[1, : e // 4] = 5  # a hub target
    X = torch.randn(n, f_in, generator=g, dtype=torch.float64)
    W = torch.randn(r, f_in, f_out, generator=g, dtype=torch.float64)
    values = torch.rand(e, generator=g, dtype=torch.float64)
    dY = torch.randn(n, f_out, generator=g, dtype=torch.float64)
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-4)):
            x, w, v, dy = X.to(dtype), W.to(dtype), values.to(dtype), dY.to(dtype)
            Y = torch.ops.sparsejit.rgms(A.plan, x, w, v, reduce, n, 0, tile, strategy)
            dx, dw, dv = torch.ops.sparsejit.rgms_backward(A.plan, x, w, v, dy, reduce,
                                                           True, True, True, 0, tile, strategy)
            ref = _grads_reference(ei, et, n, X, W, values, reduce, dY)
            for got, want in zip((Y, dx, dw, dv), ref):
                scale = max(1.0, want.abs().max().item())
                torch.testing.assert_close(got.double(), want, atol=tol * scale, rtol=tol)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("f_out", [8, 16, 32, 64])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_rgms_transform_first_row_widths(f_out, reduce, weighted, poison_empty):
    """Transform first (strategy 2) at the output widths whose row loops (the reduction of
    transformed rows into Y, the spread of dY rows for dW) have compile-time copies; forward
    and gradients against float64, with a hub target, an empty relation and 2 threads."""
    g = torch.Generator().manual_seed(f_out * 3 + weighted)
    n, e, r, f_in = 300, 2500, 6, 12
    et = torch.multinomial(torch.tensor([6.0, 3, 1, 0, 2, 0.5]), e, True, generator=g)
    ei = torch.stack([torch.randint(0, n, (e,), generator=g),
                      torch.randint(0, n, (e,), generator=g)])
    ei[1, : e // 5] = 7
    X = torch.randn(n, f_in, generator=g, dtype=torch.float64)
    W = torch.randn(r, f_in, f_out, generator=g, dtype=torch.float64)
    values = torch.rand(e, generator=g, dtype=torch.float64)
    if not weighted:
        values = torch.ones_like(values)
    dY = torch.randn(n, f_out, generator=g, dtype=torch.float64)
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    ref = _grads_reference(ei, et, n, X, W, values, reduce, dY)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-4)):
            x, w, dy = X.to(dtype), W.to(dtype), dY.to(dtype)
            v = values.to(dtype) if weighted else None
            Y = torch.ops.sparsejit.rgms(A.plan, x, w, v, reduce, n, 0, 0, 2)
            dx, dw, _ = torch.ops.sparsejit.rgms_backward(A.plan, x, w, v, dy, reduce, True,
                                                          True, False, 0, 0, 2)
            for got, want in zip((Y, dx, dw), ref[:3]):
                scale = max(1.0, want.abs().max().item())
                torch.testing.assert_close(got.double(), want, atol=tol * scale, rtol=tol)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("gemm_name", ["onednn", "builtin", "fused"])
@pytest.mark.parametrize("strategy_name", ["aggregate_first", "transform_first"])
def test_rgms_each_gemm_kernel(gemm_name, strategy_name):
    """oneDNN, the built-in kernel and the fused row kernels (at widths that are not whole
    vectors) forced by the names _core.enums() exports, after torch has run its own oneDNN
    matmul (the case that once made libdnnl's sgemm return 'unimplemented')."""
    gemm = _core.enums()["rgms_gemm"][gemm_name]
    strategy = _core.enums()["rgms_strategy"][strategy_name]
    torch.randn(64, 64) @ torch.randn(64, 64)
    g = torch.Generator().manual_seed(5)
    ei, et, n, _, r = typed_graph("hub", seed=3)
    X = torch.randn(n, 33, generator=g)
    W = torch.randn(r, 33, 17, generator=g)
    dY = torch.randn(n, 17, generator=g)
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    Y = torch.ops.sparsejit.rgms(A.plan, X, W, None, "mean", n, gemm, 0, strategy)
    dx, dw, _ = torch.ops.sparsejit.rgms_backward(A.plan, X, W, None, dY, "mean", True, True,
                                                  False, gemm, 0, strategy)
    ref = _grads_reference(ei, et, n, X.double(), W.double(), torch.ones(ei.shape[1]), "mean",
                           dY.double())
    for got, want in zip((Y, dx, dw), ref[:3]):
        torch.testing.assert_close(got.double(), want, atol=2e-4 * max(1, want.abs().max()),
                                   rtol=2e-4)


def test_rgms_results_do_not_depend_on_threads():
    """Every pass owns its output rows / columns: with the built-in GEMM (fixed summation
    order) the same bits with 1 and 2 threads; with oneDNN (auto) the same bits on every
    run at a fixed thread count (its kernels may sum in another order for another tile
    shape, so across thread counts only to rounding)."""
    ei, et, n, _, r = typed_graph("hub", seed=11)
    g = torch.Generator().manual_seed(3)
    X, W = torch.randn(n, 64, generator=g), torch.randn(r, 64, 48, generator=g)
    dY = torch.randn(n, 48, generator=g)
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)

    def run(gemm):
        return (torch.ops.sparsejit.rgms(A.plan, X, W, None, "mean", n, gemm, 0, 0),
                *torch.ops.sparsejit.rgms_backward(A.plan, X, W, None, dY, "mean", True, True,
                                                   False, gemm, 0))

    old, outs = torch.get_num_threads(), {}
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            outs[t] = run(2)
            first, again = run(0), run(0)
            for a, b in zip(first, again):
                assert torch.equal(a, b)
    finally:
        torch.set_num_threads(old)
    for a, b in zip(outs[1], outs[2]):
        assert torch.equal(a, b)


def _f64_operands(g, n, r, f_in, f_out, e):
    """Random float64 X [n, f_in], W [r, f_in, f_out], values [e] and dY [n, f_out]."""
    return (torch.randn(n, f_in, generator=g, dtype=torch.float64),
            torch.randn(r, f_in, f_out, generator=g, dtype=torch.float64),
            torch.rand(e, generator=g, dtype=torch.float64),
            torch.randn(n, f_out, generator=g, dtype=torch.float64))


def _threads_and_dtypes(*tensors):
    """(threads, dtype, tolerance, the tensors in that dtype) for 1 and 2 threads, float64 and
    float32; the caller's thread count is restored afterwards."""
    old = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-4)):
                yield threads, dtype, tol, [t.to(dtype) for t in tensors]
    finally:
        torch.set_num_threads(old)


def _many_relations_graph(seed, dominant):
    """30 relations of similar sizes (relation 7 empty, relation 3 fanning out of 2 sources, so
    the forward computes it transform-first and grad W takes it on its sources); with
    `dominant`, relation 0 holds ~40% of the entries."""
    g = torch.Generator().manual_seed(seed)
    n, e, r = 500, 8000, 30
    weights = torch.ones(r)
    weights[7] = 0.0
    if dominant:
        weights[0] = 20.0
    et = torch.multinomial(weights, e, True, generator=g)
    src = torch.randint(0, n, (e,), generator=g)
    src[et == 3] = torch.randint(0, 2, (int((et == 3).sum()),), generator=g)
    dst = torch.randint(0, n, (e,), generator=g)
    return torch.stack([src, dst]), et, n, r


@pytest.mark.parametrize("dominant", [False, True])
@pytest.mark.parametrize("gemm", [0, 2, 3])
@pytest.mark.parametrize("strategy", [0, 1])
def test_rgms_grad_w_whole_relations_or_row_split(dominant, gemm, strategy, poison_empty):
    """grad W with 2 threads gives whole relations to threads when no relation dominates
    (largest <= a quarter of a thread's share of the entries), else splits each dW[r]'s rows:
    both against float64, with values and the mean, widths off the vector lengths; with the
    built-in GEMM and the fused rows the same bits as one thread (each dW[r] element is summed
    in the relation's group order on any thread)."""
    ei, et, n, r = _many_relations_graph(5 + int(dominant), dominant)
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    X, W, values, dY = _f64_operands(torch.Generator().manual_seed(9), n, r, 24, 19,
                                     ei.shape[1])
    ref_w = _grads_reference(ei, et, n, X, W, values, "mean", dY)[2]
    assert ref_w[7].abs().max() == 0 and ref_w[3].abs().max() > 0
    got = {}
    for threads, dtype, tol, (x, w, v, dy) in _threads_and_dtypes(X, W, values, dY):
        dw = torch.ops.sparsejit.rgms_backward(A.plan, x, w, v, dy, "mean", False, True, False,
                                               gemm, 0, strategy)[1]
        torch.testing.assert_close(dw.double(), ref_w,
                                   atol=tol * max(1.0, ref_w.abs().max().item()), rtol=tol)
        got[threads, dtype] = dw
    if gemm in (2, 3):
        for dtype in (torch.float64, torch.float32):
            assert torch.equal(got[1, dtype], got[2, dtype])


@pytest.mark.parametrize("gemm", [0, 1, 2])
@pytest.mark.parametrize("strategy", [0, 2])
def test_rgms_grad_w_inside_grad_x(gemm, strategy, poison_empty):
    """With dX and dW both wanted, GEMM tiles (widths above 32) and tiles of at least 32
    groups per (chunk, relation), dW is taken inside grad X's pass on the transposed structure
    (slab partials). Relations 0-2 random, 3 fanning out of 2 sources (the forward's
    transform-first: its dW is taken on its sources instead), 4 empty: dX and dW against
    float64, with values and the mean; the same bits with 1 and 2 threads on the built-in
    GEMM, and on every run with oneDNN; dW alone (its own pass) agrees to rounding."""
    g = torch.Generator().manual_seed(21)
    n, per, r, f_in, f_out = 3000, 4000, 5, 40, 36
    src = [torch.randint(0, n, (per,), generator=g) for _ in range(3)]
    src.append(torch.randint(0, 2, (1500,), generator=g))
    dst = [torch.randint(0, n, (len(s_),), generator=g) for s_ in src]
    et = torch.cat([torch.full((len(s_),), k) for k, s_ in enumerate(src)])
    ei = torch.stack([torch.cat(src), torch.cat(dst)])
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    X, W, values, dY = _f64_operands(g, n, r, f_in, f_out, ei.shape[1])
    _, ref_x, ref_w, _ = _grads_reference(ei, et, n, X, W, values, "mean", dY)
    assert ref_w[4].abs().max() == 0
    got = {}
    for threads, dtype, tol, (x, w, v, dy) in _threads_and_dtypes(X, W, values, dY):
        dx, dw, _ = torch.ops.sparsejit.rgms_backward(A.plan, x, w, v, dy, "mean",
                                                      True, True, False, gemm, 0,
                                                      strategy)
        for a, b in ((dx, ref_x), (dw, ref_w)):
            torch.testing.assert_close(a.double(), b,
                                       atol=tol * max(1.0, b.abs().max().item()),
                                       rtol=tol)
        again = torch.ops.sparsejit.rgms_backward(A.plan, x, w, v, dy, "mean", True,
                                                  True, False, gemm, 0, strategy)
        assert torch.equal(again[0], dx) and torch.equal(again[1], dw)
        dw_alone = torch.ops.sparsejit.rgms_backward(A.plan, x, w, v, dy, "mean",
                                                     False, True, False, gemm, 0,
                                                     strategy)[1]
        torch.testing.assert_close(dw_alone, dw, atol=tol * max(1.0, dw.abs().max()),
                                   rtol=tol)
        got[threads, dtype] = (dx, dw)
    if gemm == 2:
        for dtype in (torch.float64, torch.float32):
            for a, b in zip(got[1, dtype], got[2, dtype]):
                assert torch.equal(a, b)


def test_rgms_bad_gemm_and_tile_arguments():
    ei, et, n, _, r = typed_graph("uniform")
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    X, W = torch.randn(n, 4), torch.randn(r, 4, 3)
    with pytest.raises(ValueError, match="gemm must be"):
        torch.ops.sparsejit.rgms(A.plan, X, W, None, "sum", n, 7, 0)
    with pytest.raises(ValueError, match="tile must be"):
        torch.ops.sparsejit.rgms(A.plan, X, W, None, "sum", n, 0, -1)


def test_rgms_plan_validated_once_but_rechecked_after_in_place_change():
    ei, et, n, _, r = typed_graph("uniform")
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    plan = A.plan.clone()
    src = plan_arrays(plan, r)["src"]                       # a view: writes change the plan
    X, W = torch.randn(n, 4), torch.randn(r, 4, 3)
    torch.ops.sparsejit.rgms(plan, X, W, None, "sum", n)    # validated and remembered
    src[0] = 10 ** 6                                        # src out of range, version bumped
    with pytest.raises(ValueError, match=r"src\[0\] = 1000000 is out of range"):
        torch.ops.sparsejit.rgms(plan, X, W, None, "sum", n)
    src[0] = 0
    with pytest.raises(ValueError, match="grp_dst"):       # fewer rows than the plan's targets
        torch.ops.sparsejit.rgms(plan, X, W, None, "sum", 1)


def test_rgms_explain_and_cost_model():
    """A relation with many targets and few sources transforms first; its inverse (few
    targets, many sources) aggregates first; forcing either gives the same result."""
    g = torch.Generator().manual_seed(4)
    n, e = 500, 4000
    hubs = torch.randint(0, 5, (e,), generator=g)            # 5 distinct nodes
    spread = torch.randint(0, n, (e,), generator=g)
    ei = torch.cat([torch.stack([hubs, spread]), torch.stack([spread, hubs])], dim=1)
    et = torch.cat([torch.zeros(e, dtype=torch.long), torch.ones(e, dtype=torch.long)])
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=3)
    t = torch.ops.sparsejit.rgms_explain(A.plan, n, n, 16, 16)
    assert t[:, 0].tolist() == [e, e, 0]
    assert t[0, 2] == 5 and t[0, 3] == 2        # few sources: transform first
    assert t[1, 1] == 5 and t[1, 3] == 1        # few targets: aggregate first
    text = A.explain(16, 16)
    assert "transform-then-aggregate" in text and "1 of 3 relations transform first" in text
    X, W = torch.randn(n, 16, dtype=torch.float64), torch.randn(3, 16, 16, dtype=torch.float64)
    ref = reference(ei, et, n, X, W, "mean")
    for s in ("auto", "aggregate_first", "transform_first"):
        torch.testing.assert_close(sj.rgms(A, X, W, reduce="mean", strategy=s), ref)
    with pytest.raises(ValueError, match="strategy"):
        sj.rgms(A, X, W, strategy="fused")


def test_tune_rgms_stores_and_reuses_schedule(tmp_path, monkeypatch, capsys):
    from sparsejit.families.rgms import tuner as rgms_tuning
    monkeypatch.setenv("SPARSEJIT_CACHE_DIR", str(tmp_path))
    sj._core.jit_refresh_env()
    rgms_tuning.clear_schedule_cache()
    ei, et, n, _, r = typed_graph("skewed", seed=21)
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    res = sj.tune(A, F=8, reduce="mean", repeat=1, progress=True)
    assert res["best"] in res["times_ms"] and len(res["times_ms"]) >= 21
    assert any(k.endswith("/fused") for k in res["times_ms"])     # the fused row kernels
    assert "sparsejit.tune rgms" in capsys.readouterr().err       # the progress bar
    stored = list((tmp_path / "tuned").glob("rgms-*.json"))
    assert len(stored) == 1
    # A fresh structure object (same graph) in a "new process": memory cleared, disk read.
    sj.clear_caches()
    B = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    tuned = (res["strategy"], res["tile"], res["gemm"])
    assert rgms_tuning.schedule_for(B, 8, 8, torch.float32, "mean") == tuned
    assert rgms_tuning.schedule_for(B, 8, 8, torch.float64, "mean") is None
    X, W = torch.randn(n, 8, dtype=torch.float64), torch.randn(r, 8, 8, dtype=torch.float64)
    torch.testing.assert_close(sj.rgms(B, X, W, reduce="mean"), reference(ei, et, n, X, W, "mean"))
    info = sj.explain(B, F=8, reduce="mean", dtype=torch.float32)
    assert info["tuned"] == tuned
    sj.clear_caches()
    monkeypatch.delenv("SPARSEJIT_CACHE_DIR")
    sj._core.jit_refresh_env()


def test_untuned_structure_reads_the_store_once(tmp_path, monkeypatch):
    """With schedules stored for other graphs, a structure nobody tuned looks the store up
    once per call signature, not on every forward (a file read per step)."""
    from sparsejit.families.rgms import tuner as rgms_tuning
    monkeypatch.setenv("SPARSEJIT_CACHE_DIR", str(tmp_path))
    sj._core.jit_refresh_env()
    sj.clear_caches()
    ei, et, n, _, r = typed_graph("skewed", seed=22)
    tuned = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    sj.tune(tuned, F=8, reduce="mean", repeat=1, progress=False)  # a store exists on disk
    sj.clear_caches()
    other = sj.TypedSparseMatrix.from_edge_index(ei[:, 1:], n, edge_type=et[1:],
                                                 num_relations=r)
    other._maybe_tuned = True  # as if it might hold a schedule: fingerprinted, looked up
    reads = []
    get = rgms_tuning.STORE.get
    monkeypatch.setattr(rgms_tuning.STORE, "get", lambda fp, key: reads.append(key) or
                        get(fp, key))
    X, W = torch.randn(n, 8), torch.randn(r, 8, 8)
    for _ in range(3):
        assert rgms_tuning.schedule_for(other, 8, 8, torch.float32, "mean") is None
        sj.rgms(other, X, W, reduce="mean")
    assert len(reads) == 1
    assert rgms_tuning.schedule_for(other, 8, 8, torch.float64, "mean") is None  # another key
    assert len(reads) == 2
    sj.clear_caches()
    monkeypatch.delenv("SPARSEJIT_CACHE_DIR")
    sj._core.jit_refresh_env()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("f_in,f_out", [(24, 17), (0, 5), (6, 0)])
def test_segment_matmul_many_segments(threads, f_in, f_out, poison_empty):
    """50 segments (empty ones, one of 700 rows spanning several row blocks) through the one
    parallel region; forward and both gradients against a float64 loop."""
    g = torch.Generator().manual_seed(17)
    sizes = torch.randint(0, 12, (50,), generator=g)
    sizes[3] = sizes[10] = 0
    sizes[20] = 700
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
    x = torch.randn(int(ptr[-1]), f_in, generator=g, requires_grad=True)
    w = torch.randn(50, f_in, f_out, generator=g, requires_grad=True)
    dy = torch.randn(int(ptr[-1]), f_out, generator=g)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = sj.segment_matmul(x, ptr, w)
        y.backward(dy)
    finally:
        torch.set_num_threads(old)
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b = ptr.tolist()
    ref = torch.cat([xd[b[k]:b[k + 1]] @ wd[k] for k in range(50)])
    ref.backward(dy.double())
    torch.testing.assert_close(y.double(), ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(x.grad.double(), xd.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(w.grad.double(), wd.grad, atol=1e-4, rtol=1e-4)


# ---- source-side backward and the fused root term -------------------------------------------


def _fan_graph(seed=0):
    """Relations of both shapes: 0 and 1 fan out from 3 sources to many targets (the cost
    model computes them transform-first, so the backward differentiates them on their
    sources), 2 and 3 are uniform random (target side), 4 is empty."""
    g = torch.Generator().manual_seed(seed)
    n, per = 300, 900
    src, dst, et = [], [], []
    for r in range(4):
        s = torch.randint(0, 3, (per,), generator=g) if r < 2 else \
            torch.randint(0, n, (per,), generator=g)
        src.append(s)
        dst.append(torch.randint(0, n, (per,), generator=g))
        et.append(torch.full((per,), r))
    return torch.stack([torch.cat(src), torch.cat(dst)]), torch.cat(et), n, 5


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("strategy", [0, 1, 2])
def test_rgms_backward_sides_match_reference(threads, strategy, poison_empty):
    ei, et, n, r = _fan_graph()
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    plan = torch.ops.sparsejit.rgms_explain(A.plan, n, n, 24, 24)
    assert plan[:2, 3].tolist() == [2, 2] and plan[2:4, 3].tolist() == [1, 1]
    g = torch.Generator().manual_seed(2)
    X = torch.randn(n, 24, generator=g, dtype=torch.float64)
    W = torch.randn(r, 24, 24, generator=g, dtype=torch.float64)
    values = torch.rand(ei.shape[1], generator=g, dtype=torch.float64)
    dY = torch.randn(n, 24, generator=g, dtype=torch.float64)
    ref = _grads_reference(ei, et, n, X, W, values, "mean", dY)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-4)):
            x, w, v, dy = X.to(dtype), W.to(dtype), values.to(dtype), dY.to(dtype)
            got = torch.ops.sparsejit.rgms_backward(A.plan, x, w, v, dy, "mean", True, True,
                                                    True, 0, 0, strategy)
            for a, b in zip(got, ref[1:]):
                torch.testing.assert_close(a.double(), b, atol=tol * max(1, b.abs().max()),
                                           rtol=tol)
            # only dW, only dX: each pass alone writes all of its output
            dw_only = torch.ops.sparsejit.rgms_backward(A.plan, x, w, v, dy, "mean", False,
                                                        True, False, 0, 0, strategy)[1]
            dx_only = torch.ops.sparsejit.rgms_backward(A.plan, x, w, v, dy, "mean", True,
                                                        False, False, 0, 0, strategy)[0]
            assert torch.equal(dw_only, got[1]) and torch.equal(dx_only, got[0])
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("strategy", [0, 1, 2])
@pytest.mark.parametrize("threads", [1, 2])
def test_rgms_grad_x_on_the_transposed_structure(kind, reduce, strategy, threads,
                                                 poison_empty):
    """dX runs the forward on the transposed structure (csrc/rgms/rgms_run.h): against
    autograd of the float64 reference on every graph kind (rectangular, 200 relations, empty,
    a hub), with and without values, every strategy, 1 and 2 threads; widths 16 and 5 (the
    fused and the tiled rows), and a larger graph so the forward's parallel chunks run."""
    seed = zlib.crc32(f"tx/{kind}/{reduce}".encode()) % 1000
    cases = [typed_graph(kind, seed=seed)]
    if kind == "uniform":  # n * F large enough for the parallel row chunks
        g = torch.Generator().manual_seed(seed)
        n, e, r = 3000, 30000, 7
        cases.append((torch.randint(0, n, (2, e), generator=g),
                      torch.randint(0, r, (e,), generator=g), n, n, r))
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for ei, et, n_src, n_dst, r in cases:
            A = sj.TypedSparseMatrix.from_edge_index(ei, (n_src, n_dst), edge_type=et,
                                                     num_relations=r)
            g = torch.Generator().manual_seed(seed + 1)
            for f_in, f_out in ((16, 16), (5, 9)):
                X = torch.randn(n_src, f_in, generator=g, dtype=torch.float64,
                                requires_grad=True)
                W = torch.randn(r, f_in, f_out, generator=g, dtype=torch.float64)
                dY = torch.randn(n_dst, f_out, generator=g, dtype=torch.float64)
                for v in (None, torch.rand(ei.shape[1], generator=g, dtype=torch.float64)):
                    want = torch.autograd.grad(reference(ei, et, n_dst, X, W, reduce, v), X,
                                               dY, allow_unused=True)[0]
                    want = torch.zeros_like(X) if want is None else want
                    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
                        dx = torch.ops.sparsejit.rgms_backward(
                            A.plan, X.detach().to(dtype), W.to(dtype),
                            None if v is None else v.to(dtype), dY.to(dtype), reduce, True,
                            False, False, 0, 0, strategy)[0]
                        assert dx.shape == X.shape and dx.dtype == dtype
                        torch.testing.assert_close(dx.double(), want,
                                                   atol=tol * max(1.0, want.abs().max()),
                                                   rtol=tol)
    finally:
        torch.set_num_threads(old)


def _root_reference(ei, et, n_dst, X, W, reduce, root, bias, x_root):
    Y = reference(ei, et, n_dst, X, W, reduce)
    Y = Y + (X if x_root is None else x_root).double() @ root.double()
    return Y + bias.double() if bias is not None else Y


@pytest.mark.parametrize("kind", ["uniform", "skewed", "empty", "rect"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rgms_fused_root_and_bias(kind, with_bias, dtype, poison_empty):
    ei, et, n_src, n_dst, r = typed_graph(kind, seed=8)
    g = torch.Generator().manual_seed(9)
    X = torch.randn(n_src, 6, generator=g, dtype=dtype, requires_grad=True)
    W = torch.randn(r, 6, 5, generator=g, dtype=dtype, requires_grad=True)
    x_root = None if n_src == n_dst else \
        torch.randn(n_dst, 4, generator=g, dtype=dtype, requires_grad=True)
    root = torch.randn(6 if x_root is None else 4, 5, generator=g, dtype=dtype,
                       requires_grad=True)
    bias = torch.randn(5, generator=g, dtype=dtype, requires_grad=True) if with_bias else None
    A = sj.TypedSparseMatrix.from_edge_index(ei, (n_src, n_dst), edge_type=et, num_relations=r)
    Y = sj.rgms(A, X, W, reduce="mean", root=root, bias=bias, x_root=x_root)
    want = _root_reference(ei, et, n_dst, X, W, "mean", root, bias, x_root)
    tol = TOL[dtype]
    torch.testing.assert_close(Y.double(), want.detach(), atol=tol * 10, rtol=tol)
    leaves = [t for t in (X, W, root, bias, x_root) if t is not None]
    dY = torch.randn(n_dst, 5, generator=g, dtype=dtype)
    got = torch.autograd.grad(Y, leaves, dY)
    ref = torch.autograd.grad(want, leaves, dY.double())
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.double(), b.double(), atol=tol * 10 * max(1, b.abs().max()),
                                   rtol=tol)


def test_rgms_root_gradcheck_and_opcheck():
    ei, et, n, _, r = typed_graph("skewed", seed=5)
    keep = torch.arange(ei.shape[1]) < 50
    ei, et = ei[:, keep], et[keep]
    g = torch.Generator().manual_seed(6)
    X = torch.randn(n, 3, generator=g, dtype=torch.float64, requires_grad=True)
    W = torch.randn(r, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    root = torch.randn(3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(2, generator=g, dtype=torch.float64, requires_grad=True)
    xr = torch.randn(n, 4, generator=g, dtype=torch.float64, requires_grad=True)
    root4 = torch.randn(4, 2, generator=g, dtype=torch.float64, requires_grad=True)
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    assert torch.autograd.gradcheck(
        lambda X, W, root, bias: sj.rgms(A, X, W, reduce="mean", root=root, bias=bias),
        (X, W, root, bias))
    assert torch.autograd.gradcheck(
        lambda X, W, xr, root4: sj.rgms(A, X, W, root=root4, x_root=xr), (X, W, xr, root4))
    ops = torch.ops.sparsejit
    torch.library.opcheck(ops.rgms, (A.plan, X, W, None, "mean", n),
                          {"root": root, "bias": bias})
    torch.library.opcheck(ops.rgms, (A.plan, X, W, None, "sum", n),
                          {"root": root4, "x_root": xr})
    dy = torch.randn(n, 2, dtype=torch.float64)
    torch.library.opcheck(ops.rgms_backward, (A.plan, X.detach(), W.detach(), None, dy, "sum",
                                              True, True, False, 0, 0, 2, root.detach()))


def test_rgms_root_bad_arguments():
    ei, et, n, _, r = typed_graph("uniform", seed=4)
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    X, W = torch.randn(n, 6), torch.randn(r, 6, 5)
    with pytest.raises(ValueError, match="root must be"):
        sj.rgms(A, X, W, root=torch.randn(5, 5))
    with pytest.raises(ValueError, match="bias must be"):
        sj.rgms(A, X, W, bias=torch.randn(4))
    with pytest.raises(ValueError, match="x_root"):
        sj.rgms(A, X, W, root=torch.randn(3, 5), x_root=torch.randn(n + 1, 3))
    with pytest.raises(ValueError, match="x_root given without root"):
        sj.rgms(A, X, W, x_root=torch.randn(n, 3))
    with pytest.raises(TypeError, match="root"):
        sj.rgms(A, X, W, root=torch.randn(6, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="strategy"):
        torch.ops.sparsejit.rgms_backward(A.plan, X, W, None, torch.randn(n, 5), "sum", True,
                                          True, False, 0, 0, 3)
    B = sj.TypedSparseMatrix.from_edge_index(ei[:, ei[1] < 30], (n, 30),
                                             edge_type=et[ei[1] < 30], num_relations=r)
    with pytest.raises(ValueError, match="pass x_root"):
        sj.rgms(B, X, W, root=torch.randn(6, 5))


def _all_strategies(A, X, W, v, dY, n, gemm, need_values):
    """Forward and gradients through the raw ops for strategies 0, 1, 2 with one `gemm`
    kernel choice: [Y, dX, dW(, dv)] per strategy."""
    outs = []
    for strategy in (0, 1, 2):
        outs.append(torch.ops.sparsejit.rgms(A.plan, X, W, v, "mean", n, gemm, 0, strategy))
        grads = torch.ops.sparsejit.rgms_backward(A.plan, X, W, v, dY, "mean", True, True,
                                                  need_values, gemm, 0, strategy)
        outs.extend(grads if need_values else grads[:2])
    return outs


@pytest.mark.parametrize("width", [16, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_rgms_jit_tiles_match_generic_bitwise(width, dtype, threads, poison_empty):
    """The gather / scatter tile loops compiled by the JIT with the row width as a constant
    (codegen/cpu_row_tile_spec) against the generic loops (SPARSEJIT_JIT=0): the same bits, for
    the forward and every gradient, each strategy."""
    from sparsejit import _core

    from conftest import generic_only

    g = torch.Generator().manual_seed(21)
    n, e, r = 900, 8000, 7
    ei = torch.randint(0, n, (2, e), generator=g)
    et = torch.randint(0, r, (e,), generator=g)
    ei[0, et == 1] = ei[0, et == 1] % 4  # a fan-out relation: the source-side backward
    X = torch.randn(n, width, generator=g, dtype=dtype)
    W = torch.randn(r, width, 24, generator=g, dtype=dtype)
    v = torch.rand(e, generator=g, dtype=dtype)
    dY = torch.randn(n, 24, generator=g, dtype=dtype)
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)

    def run():
        return _all_strategies(A, X, W, v, dY, n, 2, True)

    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    f32 = _core.enums()["scalar"]["f32"] if dtype == torch.float32 else \
        _core.enums()["scalar"]["f64"]
    try:
        _core.jit_clear_memory_cache()
        jitted = run()
        # the ops loaded the width-specialized loops (a lookup now hits the memory cache)
        info = _core.jit_row_tile(f32, width)
        assert info["ok"] and info["memory_hit"], info["error"]
        generic = generic_only(run)
    finally:
        torch.set_num_threads(old_threads)
    names = [f"{what} strategy {s}" for s in (0, 1, 2) for what in ("Y", "dX", "dW", "dv")]
    for name, a, b in zip(names, jitted, generic):
        assert torch.equal(a, b), name
    ref = _grads_reference(ei, et, n, X, W, v, "mean", dY)
    for got, want in zip(jitted[:4], ref):
        torch.testing.assert_close(got.double(), want, atol=1e-4 * max(1, want.abs().max()),
                                   rtol=1e-4)


@pytest.mark.parametrize("f_in,f_out", [(16, 16), (8, 24), (64, 32), (16, 40), (5, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_rgms_fused_rows_jit_match_generic_and_reference(f_in, f_out, dtype, threads,
                                                         poison_empty):
    """The fused row kernels (gemm=3: kernels/cpu/row_tile_kernel.h kinds 2-4) compiled by the
    JIT with both widths constant against their generic instantiation (SPARSEJIT_JIT=0):
    the same bits for the forward and the X and W gradients, each strategy, with values and
    mean; and both against the float64 reference. Skewed relations (one empty, a fan-out
    one), a hub target, one-entry groups."""
    from sparsejit import _core

    from conftest import generic_only

    g = torch.Generator().manual_seed(33 + f_in)
    n, e, r = 700, 14000, 6  # E x F_in >= 2^16: the JIT compiles for these widths
    et = torch.multinomial(torch.tensor([6.0, 3, 0, 1, 0.5, 2]), e, True, generator=g)
    ei = torch.randint(0, n, (2, e), generator=g)
    ei[0, et == 1] = ei[0, et == 1] % 3  # fan-out: few distinct sources (transform first)
    ei[1, : e // 5] = 11                 # a hub target
    X = torch.randn(n, f_in, generator=g, dtype=dtype)
    W = torch.randn(r, f_in, f_out, generator=g, dtype=dtype)
    v = torch.rand(e, generator=g, dtype=dtype)
    dY = torch.randn(n, f_out, generator=g, dtype=dtype)
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)

    def run():
        return _all_strategies(A, X, W, v, dY, n, 3, False)

    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    scalar = _core.enums()["scalar"]["f32" if dtype == torch.float32 else "f64"]
    try:
        _core.jit_clear_memory_cache()
        jitted = run()
        # the forward loaded the kernel compiled for (F_in, F_out)
        info = _core.jit_row_tile(scalar, f_in, f_out)
        assert info["ok"] and info["memory_hit"], info["error"]
        generic = generic_only(run)
    finally:
        torch.set_num_threads(old_threads)
    names = [f"{what} strategy {s}" for s in (0, 1, 2) for what in ("Y", "dX", "dW")]
    for name, a, b in zip(names, jitted, generic):
        assert torch.equal(a, b), name
    ref = _grads_reference(ei, et, n, X, W, v, "mean", dY)[:3]
    tol = 2e-4 if dtype == torch.float32 else 1e-10
    for i, got in enumerate(jitted):
        want = ref[i % 3]
        torch.testing.assert_close(got.double(), want, atol=tol * max(1, want.abs().max()),
                                   rtol=tol)


@pytest.mark.parametrize("kind", ["empty", "r1", "r200", "skewed", "rect"])
def test_rgms_fused_rows_edge_cases(kind, poison_empty):
    """gemm=3 on the small named shapes (no edges, one relation, 200 relations with a few
    entries each, empty relations, a rectangular graph), forward and gradients."""
    ei, et, n_src, n_dst, r = typed_graph(kind, seed=4)
    g = torch.Generator().manual_seed(2)
    X = torch.randn(n_src, 16, generator=g, dtype=torch.float64)
    W = torch.randn(r, 16, 8, generator=g, dtype=torch.float64)
    dY = torch.randn(n_dst, 8, generator=g, dtype=torch.float64)
    v = torch.rand(ei.shape[1], generator=g, dtype=torch.float64)
    A = sj.TypedSparseMatrix.from_edge_index(ei, (n_src, n_dst), edge_type=et, num_relations=r)
    Y = torch.ops.sparsejit.rgms(A.plan, X, W, v, "sum", n_dst, 3, 0, 0)
    dx, dw, dv = torch.ops.sparsejit.rgms_backward(A.plan, X, W, v, dY, "sum", True, True,
                                                   True, 3, 0, 0)
    ref = _grads_reference(ei, et, n_dst, X, W, v, "sum", dY)
    for got, want in zip((Y, dx, dw, dv), ref):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


# ---- The device-generic composite (what CUDA tensors run) ----------------------------------
# SPARSEJIT_RGMS_COMPOSITE=1 runs it on CPU tensors: SpMM over the groups, per-relation GEMMs,
# SpMM over targets; backward with an SDDMM for the values. It must agree with the CPU kernels
# on every output and gradient.


@pytest.mark.parametrize("kind", ["uniform", "skewed", "r1", "r200", "empty", "hub", "rect"])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("with_values", [False, True])
def test_composite_matches_the_cpu_kernels(monkeypatch, kind, reduce, with_values):
    ei, et, n_src, n_dst, r = typed_graph(kind, seed=21)
    g = torch.Generator().manual_seed(5)
    X = torch.randn(n_src, 6, generator=g, dtype=torch.float64)
    W = torch.randn(r, 6, 3, generator=g, dtype=torch.float64)
    v = torch.rand(ei.shape[1], generator=g, dtype=torch.float64) + 0.5 if with_values else None
    root = torch.randn(6, 3, generator=g, dtype=torch.float64) if n_src == n_dst else None
    bias = torch.randn(3, generator=g, dtype=torch.float64)
    dY = torch.randn(n_dst, 3, generator=g, dtype=torch.float64)
    A = sj.TypedSparseMatrix.from_edge_index(ei, (n_src, n_dst), edge_type=et, num_relations=r)
    ops = torch.ops.sparsejit

    def run():
        y = ops.rgms(A.plan, X, W, v, reduce, n_dst, 0, 0, 0, root, bias)
        grads = ops.rgms_backward(A.plan, X, W, v, dY, reduce, True, True, v is not None, 0,
                                  0, 0, root)
        return [y, *grads]

    monkeypatch.delenv("SPARSEJIT_RGMS_COMPOSITE", raising=False)
    want = run()
    monkeypatch.setenv("SPARSEJIT_RGMS_COMPOSITE", "1")
    got = run()
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    # And the forward against the float64 reference, independently of the CPU kernels.
    ref = reference(ei, et, n_dst, X, W, reduce, v) + bias
    if root is not None:
        ref = ref + X @ root
    torch.testing.assert_close(got[0], ref, atol=1e-10, rtol=1e-10)


def test_composite_rejects_what_the_cpu_op_rejects(monkeypatch):
    monkeypatch.setenv("SPARSEJIT_RGMS_COMPOSITE", "1")
    ei, et, n, _, r = typed_graph("uniform", seed=3)
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)
    X, W = torch.randn(n, 4), torch.randn(r, 4, 2)
    with pytest.raises(ValueError, match="gemm must be"):
        torch.ops.sparsejit.rgms(A.plan, X, W, None, "sum", n, 7)
    with pytest.raises(ValueError, match="reduce must be 'sum' or 'mean'"):
        torch.ops.sparsejit.rgms(A.plan, X, W, None, "max", n)
