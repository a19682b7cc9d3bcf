"""Fused sparse attention (sparsejit.sparse_attention / gat_attention) against a float64
per-edge reference: fresh random inputs, empty rows, empty pattern, one entry, a very skewed
row, int32/int64 indices, compile-time and run-time head widths, bf16, dropout; opcheck and
gradcheck of the op."""

import math

import pytest
import torch
import torch.nn.functional as F

import sparsejit as sj
from conftest import poison_heap, random_graph
from conftest import raises_type_error  # noqa: E402


def reference(A, q, k, v, bias, mode, scale=1.0, slope=0.2, att=None):
    """float64 per-edge softmax attention: (out [rows, H, Dv], weights [nnz, H])."""
    row, col = A.row_indices(), A.indices.long()
    q, k, v = q.double(), k.double(), v.double()
    if mode == "dot":
        s = (q[row] * k[col]).sum(-1) * scale
    elif mode == "gatv2":
        s = (F.leaky_relu(q[row] + k[col], slope) * att.double()).sum(-1)
    else:
        s = q[row] + k[col]
    if bias is not None:
        s = s + bias.double()
    if mode == "additive":
        s = F.leaky_relu(s, slope)
    rows, heads = A.shape[0], s.shape[1]
    m = torch.full((rows, heads), -math.inf, dtype=torch.float64).scatter_reduce(
        0, row.view(-1, 1).expand_as(s), s, "amax")
    e = torch.exp(s - m[row])
    e = torch.where(torch.isnan(e), torch.zeros_like(e), e)
    den = torch.zeros(rows, heads, dtype=torch.float64).index_add_(0, row, e)
    p = e / den[row]
    out = torch.zeros(rows, heads, v.shape[-1], dtype=torch.float64).index_add_(
        0, row, p.unsqueeze(-1) * v[col])
    return out, p


GRAPHS = {
    "uniform_empty_rows": lambda: random_graph(50, 40, 4, seed=1, empty_frac=0.2),
    "power_law": lambda: random_graph(60, 60, 5, power_law=True, seed=2),
    "one_entry": lambda: sj.SparseMatrix.from_csr(torch.tensor([0, 0, 1, 1]),
                                                  torch.tensor([2]), shape=(3, 4)),
    "empty_pattern": lambda: sj.SparseMatrix.from_csr(torch.zeros(6, dtype=torch.long),
                                                      torch.zeros(0, dtype=torch.long),
                                                      shape=(5, 3)),
    "one_huge_row": lambda: sj.SparseMatrix.from_csr(
        torch.tensor([0, 0, 3000, 3001]), torch.randint(0, 20, (3001,)), shape=(3, 20)),
}


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("heads,width", [(1, 8), (2, 16), (4, 32), (1, 64), (3, 5)])
@pytest.mark.parametrize("with_values", [False, True])
def test_dot_attention_matches_reference(graph, heads, width, with_values):
    A = GRAPHS[graph]()
    rows, cols = A.shape
    g = torch.Generator().manual_seed(heads * 100 + width)
    q = torch.randn(rows, heads, width, generator=g)
    k = torch.randn(cols, heads, width, generator=g)
    v = torch.randn(cols, heads, 7, generator=g)
    vals = torch.randn(A.nnz, heads, generator=g) if with_values else None
    poison_heap((rows, heads, 7), (rows, heads))
    out, w = sj.sparse_attention(A, q, k, v, values=vals, return_attention_weights=True)
    ref, ref_w = reference(A, q, k, v, vals, "dot", 1 / math.sqrt(width))
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w.double(), ref_w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_gat_attention_matches_reference(graph, index_dtype):
    A = GRAPHS[graph]().to(index_dtype=index_dtype)
    rows, cols = A.shape
    g = torch.Generator().manual_seed(3)
    a_dst, a_src = torch.randn(rows, 3, generator=g), torch.randn(cols, 3, generator=g)
    v = torch.randn(cols, 3, 6, generator=g)
    logits = torch.randn(A.nnz, generator=g)  # one term shared by the heads
    poison_heap((rows, 3, 6))
    out = sj.gat_attention(A, a_dst, a_src, v, 0.15, edge_logits=logits)
    ref, _ = reference(A, a_dst, a_src, v, logits.view(-1, 1).expand(-1, 3), "additive",
                       slope=0.15)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("width", [16, 5])
def test_gatv2_attention_matches_reference(graph, width):
    A = GRAPHS[graph]()
    rows, cols = A.shape
    g = torch.Generator().manual_seed(width)
    xd, xs = torch.randn(rows, 2, width, generator=g), torch.randn(cols, 2, width, generator=g)
    att = torch.randn(1, 2, width, generator=g)
    poison_heap((rows, 2, width))
    out, w = sj.gatv2_attention(A, xd, xs, att, negative_slope=0.3,
                                return_attention_weights=True)
    ref, ref_w = reference(A, xd, xs, xs, None, "gatv2", slope=0.3, att=att[0])
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w.double(), ref_w, atol=1e-5, rtol=1e-5)


def test_masked_entries_and_rows():
    """-inf scores drop entries (how the layers remove old self-loops), even as the first
    entry of a row; a row with only masked entries gives 0, never NaN."""
    A = sj.SparseMatrix.from_csr(torch.tensor([0, 3, 5]), torch.tensor([0, 1, 2, 0, 1]),
                                 shape=(2, 3))
    bias = torch.tensor([[-math.inf], [0.0], [0.0], [-math.inf], [-math.inf]])
    q, k, v = torch.randn(2, 1, 4), torch.randn(3, 1, 4), torch.randn(3, 1, 2)
    out = sj.sparse_attention(A, q, k, v, values=bias)
    keep = sj.SparseMatrix.from_csr(torch.tensor([0, 2, 2]), torch.tensor([1, 2]), shape=(2, 3))
    ref, _ = reference(keep, q, k, v, None, "dot", 0.5)
    torch.testing.assert_close(out.double(), ref, atol=1e-6, rtol=1e-6)
    assert torch.isfinite(out).all()


def test_gradcheck_gatv2():
    A = random_graph(12, 9, 3, seed=6, empty_frac=0.2)
    g = torch.Generator().manual_seed(8)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()  # noqa
    xd, xs, att, v, bias = mk(12, 2, 3), mk(9, 2, 3), mk(2, 3), mk(9, 2, 4), mk(A.nnz, 2)
    fn = lambda xd, xs, att, v, b: sj.gatv2_attention(A, xd, xs, att, v, 0.25, b)  # noqa
    assert torch.autograd.gradcheck(fn, (xd, xs, att, v, bias))
    # V defaults to x_src: the gradient of x_src then sums both roles.
    assert torch.autograd.gradcheck(lambda xd, xs, att: sj.gatv2_attention(A, xd, xs, att),
                                    (xd, xs, att))


@pytest.mark.parametrize("mode", ["dot", "additive"])
def test_gradcheck(mode):
    A = random_graph(12, 9, 3, seed=5, empty_frac=0.2)
    g = torch.Generator().manual_seed(7)
    d = 3 if mode == "dot" else None
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()  # noqa
    v = mk(9, 2, 4)
    bias = mk(A.nnz, 2)
    if mode == "dot":
        q, k = mk(12, 2, d), mk(9, 2, d)
        fn = lambda q, k, v, b: sj.sparse_attention(A, q, k, v, values=b)  # noqa: E731
    else:
        q, k = mk(12, 2), mk(9, 2)
        fn = lambda q, k, v, b: sj.gat_attention(A, q, k, v, 0.3, b)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v, bias))


def test_gradients_match_reference_float32_power_law():
    A = random_graph(80, 70, 6, power_law=True, seed=9)
    q = torch.randn(80, 4, 16, requires_grad=True)
    k = torch.randn(70, 4, 16, requires_grad=True)
    v = torch.randn(70, 4, 8, requires_grad=True)
    out = sj.sparse_attention(A, q, k, v)
    go = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), go)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, _ = reference(A, qd, kd, vd, None, "dot", 0.25)
    want = torch.autograd.grad(ref, (qd, kd, vd), go.double())
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-4)


def test_opcheck():
    A = random_graph(10, 8, 3, seed=11)
    trp, tcol, tperm = A.transpose_arrays()
    q, k, v = torch.randn(10, 2, 4), torch.randn(8, 2, 4), torch.randn(8, 2, 3)
    bias = torch.randn(A.nnz, 2)
    att = torch.randn(2, 4)
    for mode, (qq, kk), a in ((0, (q, k), None),
                              (1, (q[..., :1].contiguous(), k[..., :1].contiguous()), None),
                              (2, (q, k), att)):
        qq, kk = qq.detach().clone(), kk.detach().clone()
        a = None if a is None else a.clone().requires_grad_()
        args = (A.indptr, A.indices, qq.requires_grad_(), kk.requires_grad_(),
                v.requires_grad_(), bias.requires_grad_(), mode, 0.5, 0.2, 0.0, 0, trp, tcol,
                tperm, a)
        torch.library.opcheck(torch.ops.sparsejit.sparse_attention.default, args)
        out, lse = torch.ops.sparsejit.sparse_attention(*args)
        bargs = (A.indptr, A.indices, trp, tcol, tperm, qq.detach(), kk.detach(), v.detach(),
                 bias.detach(), out.detach(), lse.detach(), torch.randn_like(out), mode, 0.5, 0.2,
                 0.0, 0, True, True, True, True, None if a is None else a.detach(), a is not None)
        torch.library.opcheck(torch.ops.sparsejit.sparse_attention_backward.default, bargs)


def test_bfloat16_runs_in_float32():
    A = random_graph(30, 30, 4, seed=12)
    q, k, v = (torch.randn(30, 2, 8) for _ in range(3))
    out = sj.sparse_attention(A, q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert out.dtype == torch.bfloat16
    ref, _ = reference(A, q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(),
                       None, "dot", 1 / math.sqrt(8))
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


def test_dropout_mask_is_consistent_between_forward_and_backward():
    """With dropout the kernel's output and gradients must agree with a reference that
    applies the same mask: recover the mask from V = identity rows."""
    torch.manual_seed(0)
    mask = torch.rand(20, 16) < 0.3  # no duplicate entries: one weight per (row, column)
    csr = mask.double().to_sparse_csr()
    A = sj.SparseMatrix.from_csr(csr.crow_indices(), csr.col_indices(), shape=(20, 16))
    q, k = torch.randn(20, 1, 4, dtype=torch.float64), torch.randn(16, 1, 4, dtype=torch.float64)
    eye = torch.eye(16, dtype=torch.float64).view(16, 1, 16)
    torch.manual_seed(42)
    out_eye = sj.sparse_attention(A, q, k, eye, dropout=0.4)  # [rows, 1, 16]: kept weights
    _, p = reference(A, q, k, eye, None, "dot", 0.5)
    kept = out_eye[A.row_indices(), 0, A.indices.long()]
    scaled = p[:, 0] / 0.6
    dropped = kept == 0
    assert 0 < dropped.float().mean() < 0.8
    torch.testing.assert_close(kept[~dropped], scaled[~dropped])
    # Same seed, same mask: gradient through V (which entries were kept) is consistent.
    v = torch.randn(16, 1, 3, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(42)
    out = sj.sparse_attention(A, q, k, v, dropout=0.4)
    out.sum().backward()
    mask_w = torch.zeros(20, 16, dtype=torch.float64)
    mask_w[A.row_indices(), A.indices.long()] = kept
    torch.testing.assert_close(out[:, 0], mask_w @ v[:, 0].detach())
    torch.testing.assert_close(v.grad[:, 0], mask_w.sum(0).view(-1, 1).expand(-1, 3))


def test_errors_name_the_argument():
    A = random_graph(5, 4, 2, seed=14)
    q, k, v = torch.randn(5, 2, 3), torch.randn(4, 2, 3), torch.randn(4, 2, 3)
    with pytest.raises(ValueError, match="dropout"):
        sj.sparse_attention(A, q, k, v, dropout=1.0)
    with pytest.raises(ValueError, match="values"):
        sj.sparse_attention(A, q, k, v, values=torch.randn(A.nnz + 1))
    with pytest.raises(ValueError, match="q has"):
        sj.sparse_attention(A, torch.randn(6, 2, 3), k, v)
    with pytest.raises(ValueError, match="head width"):
        sj.sparse_attention(A, q, torch.randn(4, 2, 5), v)
    with pytest.raises(ValueError, match="heads"):
        sj.sparse_attention(A, q, k, torch.randn(4, 3, 3))
    with pytest.raises(TypeError):
        sj.sparse_attention(A, q.long(), k, v)
    with pytest.raises(ValueError, match="a_dst"):
        sj.gat_attention(A, torch.randn(5), torch.randn(4, 1), v)
    bad_col = torch.tensor([0, 9])
    with pytest.raises(ValueError, match="sparse_attention"):
        torch.ops.sparsejit.sparse_attention(torch.tensor([0, 1, 2]), bad_col, q[:2], k, v,
                                             None, 0, 1.0, 0.2, 0.0, 0)


def test_backward_rejects_a_bad_transpose_permutation():
    A = random_graph(10, 8, 3, seed=16)
    trp, tcol, tperm = A.transpose_arrays()
    q, k, v = torch.randn(10, 1, 4), torch.randn(8, 1, 4), torch.randn(8, 1, 2)
    out, lse = torch.ops.sparsejit.sparse_attention(A.indptr, A.indices, q, k, v, None, 0, 1.0,
                                                    0.2, 0.0, 0)
    bad = tperm.clone()
    bad[0] = A.nnz + 7
    with pytest.raises(ValueError, match="t_perm"):
        torch.ops.sparsejit.sparse_attention_backward(
            A.indptr, A.indices, trp, tcol, bad, q, k, v, None, out, lse, torch.ones_like(out),
            0, 1.0, 0.2, 0.0, 0, True, True, True, False)


def test_compile_fullgraph():
    A = random_graph(30, 30, 4, seed=15)
    A.transpose_arrays()
    q = torch.randn(30, 2, 8, requires_grad=True)

    def f(q):
        return sj.sparse_attention(A, q, q, q).relu()

    torch._dynamo.reset()
    out = torch.compile(f, fullgraph=True)(q)
    torch.testing.assert_close(out, f(q))


# ---- regressions found by the fuzz test (fuzz/cases_attention.py) ---------------------------

def _one_row(d=2):
    rp, col = torch.tensor([0, 2]), torch.tensor([0, 1])
    return rp, col, torch.randn(1, 1, d), torch.randn(2, 1, d), torch.randn(2, 1, 3)


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_nan_score_propagates(mode):
    # A NaN score was dropped: LeakyReLU's max/min selects turned NaN into 0 (modes 1, 2) and
    # a NaN running sum failed `l > 0`, giving the empty row's 0 (mode 0).
    rp, col, q, k, v = _one_row(1 if mode == 1 else 2)
    q[0, 0, 0] = float("nan")
    att = torch.randn(1, 2) if mode == 2 else None
    out, lse = torch.ops.sparsejit.sparse_attention(rp, col, q, k, v, None, mode, 1.0, 0.2,
                                                    0.0, 0, att=att)
    assert out.isnan().all() and lse.isnan().all()
    # masked entries (-inf bias) still give 0 for a row with nothing left
    q[0, 0, 0] = 1.0
    bias = torch.full((2, 1), -float("inf"))
    out, lse = torch.ops.sparsejit.sparse_attention(rp, col, q, k, v, bias, mode, 1.0, 0.2,
                                                    0.0, 0, att=att)
    assert (out == 0).all() and (lse == -float("inf")).all()


def test_gatv2_att_with_2d_q_names_q():
    # att's shape check read q.size(2) before q's rank was checked: IndexError naming nothing
    rp, col, q, k, v = _one_row()
    with pytest.raises(ValueError, match="q must be"):
        torch.ops.sparsejit.sparse_attention(rp, col, q[:, 0], k, v, None, 2, 1.0, 0.2, 0.0, 0,
                                             att=torch.randn(1, 2))


def _backward_args():
    rp, col, q, k, v = _one_row()
    out, lse = torch.ops.sparsejit.sparse_attention(rp, col, q, k, v, None, 0, 1.0, 0.2, 0.0, 0)
    trp, tcol, tperm = torch.ops.sparsejit.csr_transpose(rp, col, 2)
    return dict(rowptr=rp, col=col, t_rowptr=trp, t_col=tcol, t_perm=tperm, q=q, k=k, v=v,
                bias=None, out=out, lse=lse, grad_out=torch.ones_like(out), mode=0, scale=1.0,
                negative_slope=0.2, dropout=0.0, seed=0, need_q=True, need_k=True,
                need_v=True, need_bias=False)


@pytest.mark.parametrize("name", ["out", "lse", "grad_out"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.complex64])
def test_backward_saved_tensors_must_be_floating(name, dtype):
    a = _backward_args()
    a[name] = a[name].to(dtype)  # was converted silently (complex: imaginary part dropped)
    with raises_type_error(match=name):
        torch.ops.sparsejit.sparse_attention_backward(**a)


@pytest.mark.parametrize("name", ["lse", "grad_out", "t_perm", "t_col"])
def test_backward_argument_on_meta_is_refused(name):
    a = _backward_args()
    a[name] = a[name].to("meta")  # the fake returned uninitialized CPU tensors
    with pytest.raises(ValueError, match=f"{name} on meta"):
        torch.ops.sparsejit.sparse_attention_backward(**a)


def test_backward_float_transpose_names_it():
    a = _backward_args()
    a["t_col"] = a["t_col"].float()  # the message said "indptr"
    with raises_type_error(match="t_col"):
        torch.ops.sparsejit.sparse_attention_backward(**a)
