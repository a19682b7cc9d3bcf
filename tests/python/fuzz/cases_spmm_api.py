"""Case kinds of the fuzz test (test_fuzz.py). Each takes a seeded Rand and returns a Case:
the call to make and what must come of it. worker.ROSTER lists the kinds; each runs for every
seed.
"""

from __future__ import annotations

import torch

import sparsejit as sj
from .refs import (FLOATS, GRAD_EPS, NON_FLOATS, OTHER_DEVICES, VIEWS, Case, Csr, Rand, close,
                   expect_meta, ref_edge_softmax, ref_sddmm, ref_spmm, view_as)

REDUCES = ("sum", "mean", "max", "min")
ACTS = (None, "relu", "leaky_relu", "elu", "gelu")
PLAN_MAGIC = 0x534A504C


# ---- spmm problems and their checks -----------------------------------------------------------


def spmm_problem(r: Rand, dtype, csr=None, three_d=None, F=None, epilogue=True):
    s = csr or r.csr()
    three_d = r.coin(0.3) if three_d is None else three_d
    H, F = r.randint(1, 3), (r.randint(1, 9) if F is None else F)
    xshape = (s.cols, H, F) if three_d else (s.cols, F)
    vmode = r.choice([None, "1d", "2d" if three_d else "1d"])
    p = dict(csr=s, X=r.data(xshape, dtype), reduce=r.choice(REDUCES),
             values={None: None, "1d": r.data((s.nnz,), dtype),
                     "2d": r.data((s.nnz, H), dtype)}[vmode],
             bias=None, act=None, p=0.01, scale=1.0)
    if epilogue:
        p.update(bias=r.data(xshape[1:], dtype) if r.coin(0.4) else None, act=r.choice(ACTS),
                 p=r.choice([0.01, 0.2, 1.0, 1.5]), scale=r.choice([1.0, 0.5, -2.0]))
    return p


def describe(p, **extra):
    s = p["csr"]
    d = dict(rows=s.rows, cols=s.cols, nnz=s.nnz, index=str(s.indptr.dtype)[6:],
             X=list(p["X"].shape), dtype=str(p["X"].dtype)[6:], reduce=p["reduce"],
             values=None if p["values"] is None else list(p["values"].shape),
             bias=p["bias"] is not None, act=p["act"], scale=p["scale"])
    d.update(extra)
    return d


def spmm_check(p, indptr=None, indices=None, raw=False):
    """Checks spmm's output (raw: the (out, arg) pair) against ref_spmm on p's arrays."""
    s, X = p["csr"], p["X"]
    args = (s.indptr if indptr is None else indptr, s.indices if indices is None else indices,
            p["values"], X, p["reduce"])
    ref, pre = ref_spmm(*args, p["bias"], p["act"], p["p"], p["scale"])
    mag = ref_spmm(*args, p["bias"], scale=p["scale"], absolute=True)
    lip = max(1.2, abs(p["p"])) if p["act"] in ("elu", "leaky_relu") else 1.2

    def check(result):
        if raw:
            if not isinstance(result, (tuple, list)) or len(result) != 2:
                return f"raw spmm returned {type(result).__name__}, expected (out, arg)"
            result = result[0]
        return close(result, ref, mag, X.dtype, lip=lip, pre=pre)

    return check


def call_spmm(A, p):
    return lambda: sj.spmm(A, p["X"], p["reduce"], bias=p["bias"], activation=p["act"],
                           negative_slope=p["p"], alpha=p["p"], scale=p["scale"])


def raw_spmm_kwargs(p, **over):
    s = p["csr"]
    kw = dict(rowptr=s.indptr, col=s.indices, values=p["values"], x=p["X"], reduce=p["reduce"],
              bias=p["bias"], activation=p["act"] or "none", act_param=float(p["p"]),
              scale=float(p["scale"]), num_cols=s.cols)
    kw.update(over)
    return kw


# ---- public wrappers: spmm ---------------------------------------------------------------------


def spmm_dtypes(r: Rand) -> Case:
    dtype = r.choice(FLOATS + NON_FLOATS)
    p = spmm_problem(r, dtype)
    A = p["csr"].matrix(p["values"] if dtype in FLOATS else None)
    if dtype not in FLOATS:
        return Case("invalid", call_spmm(A, p), why=f"X of dtype {dtype}", params=describe(p))
    return Case("valid", call_spmm(A, p), spmm_check(p), f"spmm with X {dtype}", describe(p),
                f16=dtype == torch.float16)


def spmm_views(r: Rand) -> Case:
    dtype = r.choice(FLOATS)
    p = spmm_problem(r, dtype)
    views = {k: r.choice(VIEWS) for k in ("X", "values", "bias")}
    for k, v in views.items():
        if p[k] is not None:
            p[k] = view_as(p[k], v)
    A = p["csr"].matrix(p["values"])
    return Case("valid", call_spmm(A, p), spmm_check(p), f"non-contiguous {views}",
                describe(p, views=views), f16=dtype == torch.float16)


def spmm_zero_size(r: Rand) -> Case:
    dtype = r.choice(FLOATS)
    kind = r.choice(["no_rows", "no_entries", "no_features", "no_heads", "no_cols"])
    rows = 0 if kind == "no_rows" else None
    cols = 0 if kind == "no_cols" else None
    s = r.csr(rows=rows, cols=cols, max_deg=0 if kind == "no_entries" else 4)
    p = spmm_problem(r, dtype, csr=s, three_d=kind == "no_heads",
                     F=0 if kind == "no_features" else None)
    if kind == "no_heads":
        p["X"], p["values"], p["bias"] = p["X"][:, :0], None, None
    A = s.matrix(p["values"])
    return Case("valid", call_spmm(A, p), spmm_check(p), f"zero-size: {kind}",
                describe(p, kind=kind), f16=dtype == torch.float16)


def spmm_bad_shapes(r: Rand) -> Case:
    p = spmm_problem(r, torch.float32, three_d=False)
    s, X = p["csr"], p["X"]
    kind = r.choice(["x_1d", "x_4d", "x_fewer_rows", "x_more_rows", "values_heads", "bias_size",
                     "values_dtype", "bias_device", "x_device"])
    A = s.matrix(p["values"])
    if kind == "x_1d":
        p["X"] = X[:, 0]
    elif kind == "x_4d":
        p["X"] = X.reshape(s.cols, 1, 1, -1)
    elif kind == "x_fewer_rows":
        p["X"] = X[: max(s.cols - r.randint(1, 3), 0)]
    elif kind == "x_more_rows":
        p["X"] = torch.cat([X, X[:1].expand(2, -1)]) if s.cols else X.new_ones(2, X.shape[1])
    elif kind == "values_heads":
        A = s.matrix(r.data((s.nnz, 2), torch.float32))
    elif kind == "bias_size":
        n = X.shape[1]
        p["bias"] = r.data((r.choice([m for m in (0, n - 1, n + 1, 2 * n) if m >= 0 and m != n]),),
                           torch.float32)
    elif kind == "values_dtype":
        A = s.matrix(r.data((s.nnz,), r.choice([torch.float64, torch.float16, torch.int64])))
    elif kind == "bias_device":
        p["bias"] = torch.zeros(X.shape[1:], device=r.choice(OTHER_DEVICES))
    else:
        p["X"] = X.to(r.choice(OTHER_DEVICES))
    return Case("invalid", call_spmm(A, p), why=kind, params=describe(p, kind=kind))


def spmm_bad_strings(r: Rand) -> Case:
    p = spmm_problem(r, torch.float32)
    A = p["csr"].matrix(p["values"])
    if r.coin():
        p["reduce"] = r.choice(["prod", "", "SUM", "mean ", "sum\0", "max_", None, 3])
        why = f"reduce={p['reduce']!r}"
    else:
        p["act"] = r.choice(["tanh", "RELU", "", "relu ", "gelu_tanh", 1])
        why = f"activation={p['act']!r}"
    return Case("invalid", call_spmm(A, p), why=why, params=describe(p))


def spmm_meta(r: Rand) -> Case:
    dtype = r.choice(FLOATS)
    p = spmm_problem(r, dtype, epilogue=False)
    s = p["csr"]
    A = s.matrix(p["values"]).to("meta")
    X = p["X"].to("meta")
    both = r.coin()
    if not both:  # meta structure, CPU X: must be refused
        return Case("invalid", lambda: sj.spmm(A, p["X"], p["reduce"]),
                    why="meta structure with a CPU X", params=describe(p))
    return Case("either", lambda: sj.spmm(A, X, p["reduce"]),
                expect_meta((s.rows,) + tuple(X.shape[1:]), dtype), "all on meta",
                describe(p))


def spmm_edge_index(r: Rand) -> Case:
    """The drop-in form sj.spmm(edge_index, X), with a malformed edge_index or X half the time."""
    n, e = r.randint(1, 15), r.randint(0, 30)
    dtype = r.choice([torch.float32, torch.float16])
    ei = r.edge_index(n, e)
    X = r.data((n, r.randint(1, 6)), dtype)
    kind = r.choice(["valid", "valid_int32", "valid_transposed_view", "float", "bool", "shape3",
                     "negative", "x_fewer_rows"])
    bad = not kind.startswith("valid")
    if kind == "valid_int32":
        ei = ei.int()
    elif kind == "valid_transposed_view":
        ei = ei.t().contiguous().t()
    elif kind == "float":
        ei = ei.float()
    elif kind == "bool":
        ei = ei > 0
    elif kind == "shape3":
        ei = torch.cat([ei, ei[:1]])
    elif kind == "negative" and e:
        ei[0, r.randint(0, e - 1)] = -1
    elif kind == "x_fewer_rows" and e:
        ei[0, 0] = n + 2  # a source beyond X's rows
    elif not kind.startswith("valid"):
        bad = False  # no edges: nothing to break
    params = dict(kind=kind, n=n, edges=e, dtype=str(dtype))
    call = lambda: sj.spmm(ei, X)  # noqa: E731
    if bad:
        return Case("invalid", call, why=f"edge_index {kind}", params=params)
    src, dst = ei[0].long(), ei[1].long()
    ref = torch.zeros(n, X.shape[1], dtype=torch.float64).index_add(0, dst, X.double()[src])
    mag = torch.zeros_like(ref).index_add(0, dst, X.double().abs()[src])
    return Case("valid", call, lambda out: close(out, ref, mag, dtype), f"edge_index {kind}",
                params, f16=dtype == torch.float16)


def spmm_index_dtype(r: Rand) -> Case:
    p = spmm_problem(r, r.choice([torch.float32, torch.float64]), epilogue=False)
    s = p["csr"]
    target = r.choice([torch.int32, torch.int64, torch.int16, torch.float32, torch.uint8])
    A = s.matrix(p["values"])
    call = lambda: sj.spmm(A.to(index_dtype=target), p["X"], p["reduce"])  # noqa: E731
    if target in (torch.int32, torch.int64):
        return Case("valid", call, spmm_check(p), f"A.to(index_dtype={target})", describe(p))
    return Case("invalid", call, why=f"A.to(index_dtype={target})", params=describe(p))


def spmm_f16_long_row(r: Rand) -> Case:
    """A row of 3000 ones: a float16 accumulator stops at 2048; float32 gives 3000 exactly."""
    n = 3000
    reduce = r.choice(["sum", "mean"])
    F = r.choice([4, 64])  # 64: work above the JIT threshold, so the JIT kernel runs
    s = Csr(torch.tensor([0, n, n]), torch.arange(n), 2, n)
    X = torch.ones(n, F, dtype=torch.float16)
    p = dict(csr=s, X=X, reduce=reduce, values=None, bias=None, act=None, p=0.01, scale=1.0)
    return Case("valid", call_spmm(s.matrix(), p), spmm_check(p),
                "float16 sum of 3000 ones (float32 accumulation)", describe(p), f16=True)


def spmm_jit_sized(r: Rand) -> Case:
    """Large enough ((rows + nnz) * F >= 2^17) that the cost model picks the JIT kernel; one
    spec per dtype, so a cold cache compiles each once."""
    dtype = r.choice([torch.float32, torch.float16])
    s = r.csr(rows=1500, cols=1500, max_deg=8, index_dtype=torch.int64, empty_frac=0.0)
    p = dict(csr=s, X=r.data((s.cols, 32), dtype), reduce="sum", values=None, bias=None,
             act=None, p=0.01, scale=1.0)
    return Case("valid", call_spmm(s.matrix(), p), spmm_check(p), "JIT-sized spmm",
                describe(p), f16=dtype == torch.float16)


def spmm_grad(r: Rand) -> Case:
    dtype = r.choice([torch.float32, torch.float64, torch.float16])
    p = spmm_problem(r, dtype, epilogue=False)
    p["reduce"] = r.choice(["sum", "mean"])
    s = p["csr"]
    X = p["X"].clone().requires_grad_()
    V = None if p["values"] is None else p["values"].clone().requires_grad_()
    G = r.data((s.rows,) + tuple(X.shape[1:]), dtype)

    def call():
        out = sj.spmm(s.matrix(V), X, p["reduce"])
        return torch.autograd.grad(out, [t for t in (X, V) if t is not None], G)

    Xd = p["X"].double().requires_grad_()
    Vd = None if V is None else p["values"].double().requires_grad_()
    want = [t for t in (Xd, Vd) if t is not None]
    ref = torch.autograd.grad(ref_spmm(s.indptr, s.indices, Vd, Xd, p["reduce"])[0], want,
                              G.double())
    Xa = p["X"].double().abs().requires_grad_()
    Va = None if V is None else p["values"].double().abs().requires_grad_()
    mag = torch.autograd.grad(ref_spmm(s.indptr, s.indices, Va, Xa, p["reduce"])[0],
                              [t for t in (Xa, Va) if t is not None], G.double().abs())

    def check(grads):
        for name, g, rf, m in zip(("grad X", "grad values"), grads, ref, mag):
            err = close(g, rf, m, dtype, name, eps=GRAD_EPS[dtype])
            if err:
                return err
        return None

    return Case("valid", call, check, "backward of spmm", describe(p), f16=dtype == torch.float16)


# ---- public wrappers: sddmm and edge_softmax --------------------------------------------------


def sddmm_problem(r: Rand, dtype, csr=None, F=None, three_d=None):
    s = csr or r.csr()
    H = r.randint(1, 3)
    F = r.randint(1, 9) if F is None else F
    feat = (H, F) if (r.coin(0.3) if three_d is None else three_d) else (F,)
    return s, r.data((s.rows,) + feat, dtype), r.data((s.cols,) + feat, dtype)


def sddmm_case(s, Q, K, why, f16=False, params=None):
    ref = ref_sddmm(s.indptr, s.indices, Q, K)
    mag = ref_sddmm(s.indptr, s.indices, Q, K, absolute=True)
    params = dict(rows=s.rows, cols=s.cols, nnz=s.nnz, Q=list(Q.shape), dtype=str(Q.dtype),
                  **(params or {}))
    return Case("valid", lambda: sj.sddmm(s.matrix(), Q, K),
                lambda out: close(out, ref, mag, Q.dtype), why, params, f16=f16)


def sddmm_dtypes(r: Rand) -> Case:
    dtype = r.choice(FLOATS + NON_FLOATS)
    s, Q, K = sddmm_problem(r, dtype)
    if dtype not in FLOATS:
        return Case("invalid", lambda: sj.sddmm(s.matrix(), Q, K), why=f"Q, K of dtype {dtype}",
                    params=dict(dtype=str(dtype)))
    return sddmm_case(s, Q, K, f"sddmm {dtype}", f16=dtype == torch.float16)


def sddmm_views(r: Rand) -> Case:
    dtype = r.choice(FLOATS)
    kind = r.choice(["no_rows", "no_entries", "no_features", None, None, None])
    s = r.csr(rows=0 if kind == "no_rows" else None, max_deg=0 if kind == "no_entries" else 5)
    s, Q, K = sddmm_problem(r, dtype, csr=s, F=0 if kind == "no_features" else None)
    vq, vk = r.choice(VIEWS), r.choice(VIEWS)
    return sddmm_case(s, view_as(Q, vq), view_as(K, vk), f"views Q {vq}, K {vk}, zero-size {kind}",
                      dtype == torch.float16, dict(views=[vq, vk], zero=kind))


def sddmm_bad_shapes(r: Rand) -> Case:
    s, Q, K = sddmm_problem(r, torch.float32)
    kind = r.choice(["q_rows", "k_fewer_rows", "features", "dtype_mix", "q_1d", "k_device"])
    if kind == "q_rows":
        Q = torch.cat([Q, Q[:1]]) if s.rows else Q.new_ones((1,) + Q.shape[1:])
    elif kind == "k_fewer_rows":
        K = K[: s.cols - r.randint(1, 3)]
    elif kind == "features":
        K = torch.cat([K, K[..., :1]], -1)
    elif kind == "dtype_mix":
        K = K.double()
    elif kind == "q_1d":
        Q = Q.reshape(-1)
    else:
        K = K.to(r.choice(OTHER_DEVICES))
    return Case("invalid", lambda: sj.sddmm(s.matrix(), Q, K), why=kind,
                params=dict(kind=kind, Q=list(Q.shape), K=list(K.shape), cols=s.cols))


def sddmm_f16_long_dot(r: Rand) -> Case:
    """Dot products of 4096 ones: a float16 accumulator stops at 2048."""
    s = r.csr(rows=r.randint(1, 4), cols=3, max_deg=3, empty_frac=0.0)
    F = 4096
    Q, K = torch.ones(s.rows, F, dtype=torch.float16), torch.ones(s.cols, F, dtype=torch.float16)
    return sddmm_case(s, Q, K, "float16 dot of 4096 ones (float32 accumulation)", True)


def sddmm_jit_sized(r: Rand) -> Case:
    dtype = r.choice([torch.float32, torch.float16])
    s = r.csr(rows=1500, cols=1500, max_deg=8, index_dtype=torch.int64, empty_frac=0.0)
    s, Q, K = sddmm_problem(r, dtype, csr=s, F=32, three_d=False)
    return sddmm_case(s, Q, K, "JIT-sized sddmm", dtype == torch.float16)


def sddmm_grad(r: Rand) -> Case:
    dtype = r.choice([torch.float32, torch.float64, torch.float16])
    s, Q, K = sddmm_problem(r, dtype)
    G = r.data((s.nnz,) + tuple(Q.shape[1:-1]), dtype)
    q, k = Q.clone().requires_grad_(), K.clone().requires_grad_()
    call = lambda: torch.autograd.grad(sj.sddmm(s.matrix(), q, k), [q, k], G)  # noqa: E731
    qd, kd = Q.double().requires_grad_(), K.double().requires_grad_()
    ref = torch.autograd.grad(ref_sddmm(s.indptr, s.indices, qd, kd), [qd, kd], G.double())
    qa, ka = Q.double().abs().requires_grad_(), K.double().abs().requires_grad_()
    mag = torch.autograd.grad(ref_sddmm(s.indptr, s.indices, qa, ka), [qa, ka], G.double().abs())

    def check(grads):
        return (close(grads[0], ref[0], mag[0], dtype, "grad Q", eps=GRAD_EPS[dtype])
                or close(grads[1], ref[1], mag[1], dtype, "grad K", eps=GRAD_EPS[dtype]))

    return Case("valid", call, check, "backward of sddmm", dict(Q=list(Q.shape), dtype=str(dtype)),
                f16=dtype == torch.float16)


def softmax_case(s, S, why, params=None):
    ref = ref_edge_softmax(s.indptr, S)
    return Case("valid", lambda: sj.edge_softmax(s.matrix(), S),
                lambda out: close(out, ref, torch.ones_like(ref), S.dtype), why,
                dict(rows=s.rows, nnz=s.nnz, S=list(S.shape), dtype=str(S.dtype), **(params or {})),
                f16=S.dtype == torch.float16)


def softmax_dtypes_views(r: Rand) -> Case:
    dtype = r.choice(FLOATS + NON_FLOATS)
    kind = r.choice(["no_rows", "no_entries", None, None])
    s = r.csr(rows=0 if kind == "no_rows" else None, max_deg=0 if kind == "no_entries" else 6)
    shape = (s.nnz, r.randint(1, 3)) if r.coin(0.4) else (s.nnz,)
    view = r.choice(VIEWS[:-1])  # not "expanded": a softmax of equal rows is not interesting
    S = view_as(r.data(shape, dtype) * (3 if dtype in FLOATS else 1), view)
    if dtype not in FLOATS:
        return Case("invalid", lambda: sj.edge_softmax(s.matrix(), S), why=f"S of dtype {dtype}",
                    params=dict(dtype=str(dtype)))
    return softmax_case(s, S, f"edge_softmax {dtype}, {view}, zero-size {kind}",
                        dict(view=view, zero=kind))


def softmax_bad_shapes(r: Rand) -> Case:
    s = r.csr()
    kind = r.choice(["more_entries", "fewer_entries", "3d", "device", "scalar"])
    S = r.data((s.nnz,), torch.float32)
    if kind == "more_entries":
        S = torch.cat([S, S.new_ones(2)])
    elif kind == "fewer_entries":
        S = S[:-1] if s.nnz else S.new_ones(1)
    elif kind == "3d":
        S = S.reshape(s.nnz, 1, 1)
    elif kind == "device":
        S = S.to(r.choice(OTHER_DEVICES))
    else:
        S = S.sum()
    return Case("invalid", lambda: sj.edge_softmax(s.matrix(), S), why=kind,
                params=dict(kind=kind, nnz=s.nnz, S=list(S.shape)))


def softmax_f16_long_row(r: Rand) -> Case:
    """3000 equal scores in a row: each 1/3000; a float16 running sum of exp stops at 2048."""
    n = 3000
    s = Csr(torch.tensor([0, n]), torch.arange(n) % 7, 1, 7)
    S = torch.full((n,), r.choice([0.0, 1.5, -4.0]), dtype=torch.float16)
    return softmax_case(s, S, "float16 softmax over 3000 entries (float32 accumulation)")


API_CASES = [spmm_dtypes, spmm_views, spmm_zero_size, spmm_bad_shapes, spmm_bad_strings, spmm_meta,
             spmm_edge_index, spmm_index_dtype, spmm_f16_long_row, spmm_jit_sized, spmm_grad,
             sddmm_dtypes, sddmm_views, sddmm_bad_shapes, sddmm_f16_long_dot, sddmm_jit_sized,
             sddmm_grad, softmax_dtypes_views, softmax_bad_shapes, softmax_f16_long_row]
