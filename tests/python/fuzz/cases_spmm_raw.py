"""Fuzz case kinds for the raw ops ``torch.ops.sparsejit.*``: malformed structures (indptr
non-monotone or past the entries, indices out of range), dense operands smaller than the
structure, garbage / foreign / truncated / tampered plans, meta tensors and mixed dtypes.

Raw ops are called by keyword (fuzz.refs.call_raw), so the cases hold before and after
`num_cols` joins the spmm / sddmm schemas. Each invalid case says which invariant it breaks
and what checking it costs (O(1), O(rows), O(nnz)): the raw ops promise the O(1) / O(rows) ones.
"""

from __future__ import annotations

import torch

from .cases_spmm_api import PLAN_MAGIC, describe, raw_spmm_kwargs, spmm_check, spmm_problem
from .refs import (FLOATS, OTHER_DEVICES, VIEWS, Case, Csr, Rand, call_raw, close, entry_rows,
                   expect_meta, has_arg, plan_layout, ref_edge_softmax, ref_edge_softmax_backward,
                   ref_sddmm, view_as)

# Structure corruptions: name -> (what it breaks, whether a literal reading is still defined).
STRUCTURE_BREAKS = {
    "decreasing": "indptr not monotone (O(rows))",
    "negative_indptr": "indptr[1] < 0 (O(rows))",
    "end_beyond_nnz": "indptr[-1] > len(indices) (O(1))",
    "negative_index": "an index < 0 (O(nnz))",
    "index_beyond_cols": "an index >= num_cols = X rows (O(nnz))",
}


def break_structure(r: Rand, s: Csr, kind: str) -> Csr:
    """A copy of s with the corruption `kind` (s needs rows >= 2 and nnz >= 1)."""
    ip, ix = s.indptr.clone(), s.indices.clone()
    nnz = s.nnz
    if kind == "decreasing":
        ip[1:3] = torch.tensor([nnz, 0]) if s.rows >= 3 else torch.tensor([nnz + 1, nnz])
    elif kind == "negative_indptr":
        ip[1] = -r.randint(1, 4)
    elif kind == "end_beyond_nnz":
        ip[-1] = nnz + r.choice([1, 7, 1000])
    elif kind == "negative_index":
        ix[r.randint(0, nnz - 1)] = -r.choice([1, 2, 1000])
    elif kind == "index_beyond_cols":
        ix[r.randint(0, nnz - 1)] = s.cols + r.choice([0, 1, 1000])
    return Csr(ip, ix, s.rows, s.cols)


def _nonempty_csr(r: Rand, **kw) -> Csr:
    s = r.csr(rows=r.randint(2, 20), empty_frac=0.1, **kw)
    if s.nnz == 0:  # one entry in row 0
        s = Csr(torch.cat([s.indptr[:1], s.indptr[1:] + 1]), s.indices.new_zeros(1), s.rows, s.cols)
    return s


# ---- spmm ----------------------------------------------------------------------------------


def raw_spmm_valid(r: Rand) -> Case:
    dtype = r.choice(FLOATS)
    p = spmm_problem(r, dtype)
    p["X"] = view_as(p["X"], r.choice(VIEWS))
    kw = raw_spmm_kwargs(p, need_arg=r.coin())
    return Case("valid", lambda: call_raw("spmm", **kw), spmm_check(p, raw=True), "raw spmm",
                describe(p, need_arg=kw["need_arg"]), f16=dtype == torch.float16)


def raw_spmm_argmax(r: Rand) -> Case:
    """max / min with need_arg: each arg is a CSR position in the row whose message equals
    the output (or the row is empty)."""
    dtype = r.choice(FLOATS)
    p = spmm_problem(r, dtype, epilogue=False)
    p["reduce"] = r.choice(["max", "min"])
    s, X, V = p["csr"], p["X"], p["values"]
    kw = raw_spmm_kwargs(p, need_arg=True)
    out_check = spmm_check(p, raw=True)

    def check(result):
        err = out_check(result)
        if err:
            return err
        out, arg = result
        if tuple(arg.shape) != tuple(out.shape) or arg.dtype != torch.long:
            return (f"arg has shape {tuple(arg.shape)} {arg.dtype}, "
                    f"expected {tuple(out.shape)} int64")
        deg = (s.indptr[1:] - s.indptr[:-1]).long().reshape((-1,) + (1,) * (out.dim() - 1))
        live = (deg > 0).expand_as(arg)
        a = arg[live]
        if ((a < 0) | (a >= s.nnz)).any():
            return f"arg holds {a[(a < 0) | (a >= s.nnz)][:3].tolist()}: outside 0..{s.nnz - 1}"
        rows = torch.arange(s.rows).reshape(deg.shape).expand_as(arg)
        if (entry_rows(s.indptr)[a] != rows[live]).any():
            return "arg points at an entry of another row"
        msg = X.double()[s.indices.long()]
        if V is not None:
            msg = msg * V.double().reshape(V.shape + (1,) * (msg.dim() - V.dim()))
        picked = msg.gather(0, arg.clamp(0, max(s.nnz - 1, 0))) if s.nnz else out.double()
        return close(out[live], picked[live], picked[live].abs(), dtype, "message at arg")

    return Case("valid", lambda: call_raw("spmm", **kw), check, "raw spmm max/min arg",
                describe(p), f16=dtype == torch.float16)


def raw_spmm_x_fewer_rows(r: Rand) -> Case:
    """X with fewer rows than the structure has columns. Without num_cols (the default) and
    with it: both must raise (today the first reads out of bounds and returns NaN)."""
    s = _nonempty_csr(r)
    top = int(s.indices.max())
    p = spmm_problem(r, torch.float32, csr=s, three_d=False, epilogue=False)
    p["X"] = p["X"][: r.randint(0, top)]  # row `top` is missing
    give = r.coin() and has_arg("spmm", "num_cols")
    kw = raw_spmm_kwargs(p)
    if not give:
        kw.pop("num_cols")
    return Case("invalid", lambda: call_raw("spmm", **kw),
                why=f"X has {p['X'].shape[0]} rows, indices reach {top}"
                    f"{', num_cols given' if give else ', no num_cols'} (O(1) with num_cols)",
                params=describe(p, num_cols_given=give))


def raw_spmm_bad_structure(r: Rand) -> Case:
    kind = r.choice(list(STRUCTURE_BREAKS) + ["start_nonzero", "trailing_indices", "index_mix",
                                              "indptr_float", "indptr_2d", "indptr_empty",
                                              "noncontiguous"])
    s = _nonempty_csr(r)
    p = spmm_problem(r, r.choice([torch.float32, torch.float64]), csr=s)
    if kind in STRUCTURE_BREAKS:
        b = break_structure(r, s, kind)
        kw = raw_spmm_kwargs(p, rowptr=b.indptr, col=b.indices)
        return Case("invalid", lambda: call_raw("spmm", **kw), why=STRUCTURE_BREAKS[kind],
                    params=describe(p, kind=kind))
    ip, ix = s.indptr, s.indices
    expect = "either"
    if kind == "start_nonzero":  # row 0 made empty, its entries unused
        ip = ip.clone()
        ip[0] = ip[1]
    elif kind == "trailing_indices":  # entries past indptr[-1], unused
        ix = torch.cat([ix, ix[:2]])
        if p["values"] is not None:
            p["values"] = torch.cat([p["values"], p["values"][:2]])
    elif kind == "index_mix":
        ix = ix.long() if ip.dtype == torch.int32 else ix.int()
    elif kind == "indptr_float":
        ip, expect = ip.double(), "invalid"
    elif kind == "indptr_2d":
        ip, expect = ip.reshape(1, -1), "invalid"
    elif kind == "indptr_empty":
        ip, expect = ip[:0], "invalid"
    else:
        ip, ix, expect = view_as(ip, "strided_last"), view_as(ix, "offset"), "valid"
    kw = raw_spmm_kwargs(p, rowptr=ip, col=ix, values=p["values"])
    check = None if expect == "invalid" else spmm_check(p, ip, ix, raw=True)
    return Case(expect, lambda: call_raw("spmm", **kw), check, f"structure {kind} (read literally)",
                describe(p, kind=kind))


def raw_spmm_num_cols(r: Rand) -> Case:
    s = _nonempty_csr(r)
    p = spmm_problem(r, torch.float32, csr=s)
    cols = s.cols
    kind = r.choice(["x_fewer_than_num_cols", "x_more_than_num_cols", "negative", "exact_wider"])
    if not has_arg("spmm", "num_cols"):
        kind = "no_num_cols_in_schema"
    kw = raw_spmm_kwargs(p)
    if kind == "x_fewer_than_num_cols":  # every index < X rows, but num_cols says more
        kw["num_cols"] = cols + 2
        return Case("invalid", lambda: call_raw("spmm", **kw),
                    why="num_cols > X rows (O(1))", params=describe(p, kind=kind))
    if kind == "x_more_than_num_cols":
        kw["num_cols"] = max(int(s.indices.max()) + 1, cols - 1) if cols > 1 else cols
        kw["x"] = p["X"] = torch.cat([p["X"], p["X"][:2]])
    elif kind == "negative":
        kw["num_cols"] = -r.choice([2, 5, 2**40])
    elif kind == "exact_wider":
        kw["x"] = p["X"] = torch.cat([p["X"], p["X"][:3]])
        kw["num_cols"] = p["X"].shape[0]
    expect = "valid" if kind in ("exact_wider", "no_num_cols_in_schema") else "either"
    return Case(expect, lambda: call_raw("spmm", **kw), spmm_check(p, raw=True),
                f"num_cols {kind}", describe(p, kind=kind, num_cols=kw.get("num_cols")))


def _plan_problem(r: Rand, csr=None):
    """A fixed spec (F = 8, sum, no values or epilogue): plans that run the JIT compile it
    once per dtype, not once per draw."""
    dtype = r.choice([torch.float32, torch.float16])
    s = csr or r.csr(rows=r.randint(2, 24), empty_frac=0.2, index_dtype=torch.int64)
    p = spmm_problem(r, dtype, csr=s, three_d=False, F=8, epilogue=False)
    p.update(reduce="sum", values=None)
    return p


def _other_structure(r: Rand, s: Csr) -> Csr:
    """Same rows, columns and nnz, other entries (row lengths shuffled, indices redrawn)."""
    deg = (s.indptr[1:] - s.indptr[:-1])[torch.randperm(s.rows, generator=r.g)]
    ip = torch.cat([s.indptr[:1], deg.cumsum(0)]).to(s.indptr.dtype)
    ix = torch.randint(0, s.cols, (s.nnz,), generator=r.g, dtype=s.indices.dtype)
    return Csr(ip, ix, s.rows, s.cols)


PLAN_KINDS = ["garbage", "garbage_after_magic", "empty", "float", "int32", "bool", "complex", "2d",
              "meta", "strided", "bad_version", "bad_op", "bad_kernel", "bad_prefetch",
              "forged_jit", "header_only_bucketed", "bucketed_other_structure",
              "bucketed_one_index_changed", "bucketed_other_size", "bucketed_truncated",
              "bucketed_tampered_rows_field", "bucketed_tampered_row_map",
              "bucketed_tampered_rowptr", "bucketed_tampered_col", "bucketed_tampered_pos",
              "plan_of_other_structure", "valid_bucketed", "valid_cost_model"]


def cost_model_plan(c: Csr, dtype, width=8):
    return call_raw("spmm_plan", rowptr=c.indptr, col=c.indices, num_cols=c.cols,
                    row_width=width, dtype=dtype)


def bucketed_plan(c: Csr, **kw):
    return call_raw("spmm_bucketed_plan", rowptr=c.indptr, col=c.indices, num_cols=c.cols, **kw)


def make_plan(r: Rand, s: Csr, dtype, kind: str) -> torch.Tensor:
    """A plan tensor of the given kind for spmm on s (words named by refs.plan_layout)."""
    L = plan_layout()
    rows, nnz, H = s.rows, s.nnz, L["header"]
    header = lambda word, value: _with(cost_model_plan(s, dtype), L[word], value)  # noqa: E731
    if kind == "garbage":
        return torch.randint(-2**40, 2**40, (r.randint(0, 20),), generator=r.g)
    if kind == "garbage_after_magic":
        g = torch.randint(-2**40, 2**40, (r.randint(2, H + 2 * rows + 4),), generator=r.g)
        g[L["magic"]], g[L["version"]] = PLAN_MAGIC, L["version_value"]
        return g
    if kind == "empty":
        return torch.zeros(0, dtype=torch.long)
    if kind in ("float", "int32", "bool", "complex"):
        return cost_model_plan(s, dtype).to({"float": torch.float64, "int32": torch.int32,
                                             "bool": torch.bool, "complex": torch.complex64}[kind])
    if kind == "2d":
        return cost_model_plan(s, dtype).reshape(1, -1)
    if kind == "meta":
        return cost_model_plan(s, dtype).to("meta")
    if kind == "strided":
        return view_as(bucketed_plan(s), "strided_last")
    if kind == "bad_version":
        return header("version", r.choice([0, 99, -1]))
    if kind == "bad_op":  # a plan for another op family (sddmm), if plans name their op
        return header("op", 2) if "op" in L else header("kernel", 77)
    if kind == "bad_kernel":
        return header("kernel", r.choice([0, 4, -1, 2**40]))
    if kind == "bad_prefetch":
        return header("prefetch", r.choice([-5, 10**6]))
    if kind == "forged_jit":  # the JIT kernel on a problem the cost model keeps generic
        return header("kernel", 2)
    if kind == "header_only_bucketed":
        return bucketed_plan(s)[:H]
    if kind == "bucketed_other_structure":
        return bucketed_plan(_other_structure(r, s))
    if kind == "bucketed_one_index_changed":  # same sizes, one entry in another column
        o = Csr(s.indptr, s.indices.clone(), s.rows, s.cols)
        k = r.randint(0, nnz - 1)
        o.indices[k] = (o.indices[k] + r.randint(1, max(s.cols - 1, 1))) % s.cols
        return bucketed_plan(o)
    if kind == "bucketed_other_size":
        return bucketed_plan(r.csr(rows=rows + 1, cols=s.cols, index_dtype=s.indptr.dtype))
    if kind == "bucketed_truncated":
        return bucketed_plan(s)[: -r.randint(1, 3)]
    if kind == "plan_of_other_structure":
        return cost_model_plan(_other_structure(r, s), dtype)
    if kind == "valid_cost_model":
        return cost_model_plan(s, dtype)
    # valid_bucketed, or one word of a bucketed plan overwritten:
    # [header, row_map[rows], rowptr[rows + 1], col[nnz], pos[nnz]]  (csrc/spmm/spmm_plan.h)
    region = {"bucketed_tampered_rows_field": (L["rows"], 1, rows + 1),
              "bucketed_tampered_row_map": (H, rows, r.choice([rows + 7, -1, 2**40])),
              "bucketed_tampered_rowptr": (H + rows + 1, rows, nnz + r.choice([1, 1000])),
              "bucketed_tampered_col": (H + 2 * rows + 1, nnz, s.cols + r.choice([0, 10**6])),
              "bucketed_tampered_pos": (H + 2 * rows + 1 + nnz, nnz, nnz + 3)}.get(kind)
    plan = bucketed_plan(s)
    if region:
        start, length, value = region
        plan[start + r.randint(0, length - 1)] = value
    return plan


def _with(t: torch.Tensor, i: int, value: int) -> torch.Tensor:
    t = t.clone()
    t[i] = value
    return t


def raw_spmm_plans(r: Rand) -> Case:
    kind = r.choice(PLAN_KINDS)
    # One changed index among hundreds: a stamp that samples the structure misses it.
    big = kind == "bucketed_one_index_changed"
    p = _plan_problem(r, r.csr(rows=120, cols=30, max_deg=8, index_dtype=torch.int64) if big
                      else None)
    plan = make_plan(r, p["csr"], p["X"].dtype, kind)
    expect = "valid" if kind in ("valid_bucketed", "valid_cost_model", "strided") else "either"
    kw = raw_spmm_kwargs(p, plan=plan)
    return Case(expect, lambda: call_raw("spmm", **kw), spmm_check(p, raw=True), f"plan {kind}",
                describe(p, plan=kind, plan_words=int(plan.numel())),
                f16=p["X"].dtype == torch.float16)


def raw_spmm_strings_and_bias(r: Rand) -> Case:
    p = spmm_problem(r, torch.float32, three_d=False)
    width = p["X"].shape[1]
    kind = r.choice(["reduce", "activation", "empty_activation", "bias_int", "bias_f64",
                     "bias_numel", "bias_2d", "bias_meta", "values_dtype", "x_int", "x_complex"])
    kw = raw_spmm_kwargs(p)
    expect, why = "either", kind
    if kind == "reduce":
        kw["reduce"], expect = r.choice(["prod", "", "SUM", "sum ", "max\0"]), "invalid"
    elif kind == "activation":
        kw["activation"], expect = r.choice(["tanh", "RELU", "relu ", "gelu_tanh"]), "invalid"
    elif kind == "empty_activation":  # read as "none" or refused
        kw["activation"], p["act"] = "", None
    elif kind == "bias_int":
        p["bias"] = kw["bias"] = torch.randint(-3, 4, (width,), generator=r.g)
    elif kind == "bias_f64":
        p["bias"] = kw["bias"] = r.data((width,), torch.float64)
    elif kind == "bias_numel":
        kw["bias"], expect = torch.ones(width + r.choice([1, 5])), "invalid"
    elif kind == "bias_2d":
        p["bias"] = kw["bias"] = r.data((1, width), torch.float32)
    elif kind == "bias_meta":
        kw["bias"] = torch.ones(width, device="meta")
    elif kind == "values_dtype":
        kw["values"], expect = r.data((p["csr"].nnz,), torch.float64), "invalid"
    else:
        bad_dtype = torch.int64 if kind == "x_int" else torch.complex64
        kw["x"], expect = r.data(p["X"].shape, bad_dtype), "invalid"
    return Case(expect, lambda: call_raw("spmm", **kw), spmm_check(p, raw=True), why,
                describe(p, kind=kind))


# ---- sddmm, edge softmax, transpose, validation, plan builders --------------------------------


def raw_sddmm(r: Rand) -> Case:
    s = _nonempty_csr(r)
    dtype = r.choice(FLOATS)
    H, F = r.randint(1, 3), r.randint(1, 8)
    feat = (H, F) if r.coin(0.3) else (F,)
    Q, K = r.data((s.rows,) + feat, dtype), r.data((s.cols,) + feat, dtype)
    kind = r.choice(["valid", "valid", "k_fewer_rows", "end_below_nnz", "t_garbage", "meta"]
                    + list(STRUCTURE_BREAKS))
    Q = view_as(Q, r.choice(VIEWS))
    kw = dict(rowptr=s.indptr, col=s.indices, q=Q, k=K, num_cols=s.cols)
    params = dict(kind=kind, rows=s.rows, cols=s.cols, nnz=s.nnz, Q=list(Q.shape), dtype=str(dtype))
    ref = ref_sddmm(s.indptr, s.indices, Q, K)
    mag = ref_sddmm(s.indptr, s.indices, Q, K, absolute=True)
    check = lambda out: close(out, ref, mag, dtype)  # noqa: E731
    call = lambda: call_raw("sddmm", **kw)  # noqa: E731
    f16 = dtype == torch.float16
    if kind == "valid":
        return Case("valid", call, check, "raw sddmm", params, f16)
    if kind == "t_garbage":  # forward never reads the transpose
        kw.update(t_rowptr=torch.ones(3), t_col=torch.zeros(2, 2), t_perm=None)
        return Case("either", call, check, "garbage t_* arguments", params, f16)
    if kind == "meta":
        kw.update(rowptr=s.indptr.to("meta"), col=s.indices.to("meta"), q=Q.to("meta"),
                  k=K.to("meta"))
        return Case("either", call, expect_meta(ref.shape, dtype), "all on meta", params)
    if kind == "k_fewer_rows":
        kw["k"] = K[: r.randint(0, int(s.indices.max()))]
        why = "K has fewer rows than indices reach (O(1) with num_cols)"
    elif kind == "end_below_nnz":  # the trailing outputs would never be written
        kw["col"] = torch.cat([s.indices, s.indices[:2]])
        why = "indptr[-1] < len(indices): outputs past indptr[-1] unwritten (O(1))"
    else:
        b = break_structure(r, s, kind)
        kw.update(rowptr=b.indptr, col=b.indices)
        why = STRUCTURE_BREAKS[kind]
    return Case("invalid", call, why=why, params=params)


def raw_edge_softmax(r: Rand) -> Case:
    s = _nonempty_csr(r)
    dtype = r.choice(FLOATS)
    shape = (s.nnz, r.randint(1, 3)) if r.coin(0.4) else (s.nnz,)
    S = r.data(shape, dtype) * 3
    kind = r.choice(["valid", "valid", "end_below_nnz", "end_beyond_nnz", "decreasing",
                     "negative_indptr", "indptr_float", "meta", "backward", "backward_grad_f64",
                     "backward_grad_shape", "backward_end_beyond"])
    params = dict(kind=kind, rows=s.rows, nnz=s.nnz, S=list(shape), dtype=str(dtype))
    ip = s.indptr
    f16 = dtype == torch.float16
    if kind.startswith("backward"):
        y = view_as(ref_edge_softmax(ip, S).to(dtype), r.choice(VIEWS[:-1]))
        g = r.data(shape, torch.float64 if kind == "backward_grad_f64" else dtype)
        ref, mag = ref_edge_softmax_backward(ip, y, g.to(dtype))
        if kind == "backward_grad_shape":
            g = g[:-1]
        if kind == "backward_end_beyond":
            ip = break_structure(r, s, "end_beyond_nnz").indptr
        call = lambda: call_raw("edge_softmax_backward", rowptr=ip, y=y, grad=g)  # noqa: E731
        expect = {"backward": "valid", "backward_grad_f64": "either"}.get(kind, "invalid")
        check = lambda out: close(out, ref, mag, dtype)  # noqa: E731
        if kind == "backward_grad_f64":
            # the op may round the float64 gradient to y's dtype first, or not: either result
            ref64, mag64 = ref_edge_softmax_backward(ip, y, g)
            check = lambda out: close(out, ref, mag, dtype) and \
                close(out, ref64, mag64, dtype)  # noqa: E731
        return Case(expect, call, check, kind, params, f16)
    ref = ref_edge_softmax(ip, S)
    check = lambda out: close(out, ref, torch.ones_like(ref), dtype)  # noqa: E731
    if kind == "valid":
        Sv = view_as(S, r.choice(VIEWS[:-1]))
        return Case("valid", lambda: call_raw("edge_softmax", rowptr=ip, s=Sv), check,
                    "raw edge_softmax", params, f16)
    if kind == "meta":
        ipm, Sm = ip.to("meta"), S.to("meta")
        return Case("either", lambda: call_raw("edge_softmax", rowptr=ipm, s=Sm),
                    expect_meta(shape, dtype), "all on meta", params)
    if kind == "end_below_nnz":
        S = torch.cat([S, S[:2]])
        why = "indptr[-1] < len(S): entries past it unwritten (O(1))"
    elif kind == "indptr_float":
        ip, why = ip.double(), "float indptr"
    else:
        ip, why = break_structure(r, s, kind).indptr, STRUCTURE_BREAKS[kind]
    return Case("invalid", lambda: call_raw("edge_softmax", rowptr=ip, s=S), why=why, params=params)


def _transpose_check(s: Csr, num_cols: int):
    def check(result):
        trp, tcol, tperm = result
        want = torch.zeros(num_cols + 1, dtype=torch.long)
        want[1:] = torch.bincount(s.indices.long(), minlength=num_cols).cumsum(0)
        if not torch.equal(trp.long(), want):
            return f"t_rowptr {trp.tolist()[:12]} != {want.tolist()[:12]}"
        if not torch.equal(torch.sort(tperm.long()).values, torch.arange(s.nnz)):
            return "t_perm is not a permutation of the entries"
        if not torch.equal(tcol.long(), entry_rows(s.indptr)[tperm.long()]):
            return "t_col does not hold the source rows of the permuted entries"
        if not torch.equal(s.indices.long()[tperm.long()], entry_rows(trp)):
            return "entries are not grouped by column in the transpose"
        return None

    return check


def raw_transpose_validate(r: Rand) -> Case:
    s = _nonempty_csr(r)
    op = r.choice(["csr_transpose", "validate_csr"])
    kind = r.choice(["valid", "num_cols_too_small", "negative_num_cols"] + list(STRUCTURE_BREAKS))
    ip, ix, cols = s.indptr, s.indices, s.cols
    params = dict(op=op, kind=kind, rows=s.rows, cols=cols, nnz=s.nnz)
    if kind == "valid":
        check = _transpose_check(s, cols) if op == "csr_transpose" else (
            lambda out: None if out is None else f"validate_csr returned {out!r}")
        ipv = view_as(ip, r.choice(VIEWS[:-1]))
        return Case("valid", lambda: call_raw(op, rowptr=ipv, col=ix, num_cols=cols), check, op,
                    params)
    if kind == "num_cols_too_small":
        cols, why = int(s.indices.max()), "num_cols <= max index (O(nnz))"
    elif kind == "negative_num_cols":
        cols, why = -r.choice([1, 3]), "num_cols < 0 (O(1))"
    else:
        b = break_structure(r, s, kind)
        ip, ix, why = b.indptr, b.indices, STRUCTURE_BREAKS[kind]
    return Case("invalid", lambda: call_raw(op, rowptr=ip, col=ix, num_cols=cols), why=why,
                params=params)


def raw_plan_builders(r: Rand) -> Case:
    s = _nonempty_csr(r, index_dtype=torch.int64)
    if r.coin():
        kind = r.choice(["negative_num_cols", "negative_width", "huge_width", "complex_dtype",
                         "int_dtype", "indptr_float", "indptr_empty", "indptr_meta", "decreasing"])
        kw = dict(rowptr=s.indptr, col=s.indices, num_cols=s.cols, row_width=8, dtype=torch.float32)
        kw.update({"negative_num_cols": dict(num_cols=-4), "negative_width": dict(row_width=-1),
                   "huge_width": dict(row_width=2**40),
                   "complex_dtype": dict(dtype=torch.complex64),
                   "int_dtype": dict(dtype=torch.int32),
                   "indptr_float": dict(rowptr=s.indptr.double()),
                   "indptr_empty": dict(rowptr=s.indptr[:0]),
                   "indptr_meta": dict(rowptr=s.indptr.to("meta"), col=s.indices.to("meta")),
                   "decreasing": dict(rowptr=break_structure(r, s, "decreasing").indptr)}[kind])

        def is_plan(out):
            ok = isinstance(out, torch.Tensor) and out.dim() == 1 and out.dtype == torch.long \
                and out.numel() >= 4
            return None if ok else f"spmm_plan returned {out!r}"[:200]

        return Case("either", lambda: call_raw("spmm_plan", **kw), is_plan, f"spmm_plan {kind}",
                    dict(kind=kind))
    kind = r.choice(["valid", "max_log2", "prefetch", "index_beyond_cols", "decreasing",
                     "end_beyond_nnz", "negative_indptr"])
    p = _plan_problem(r, csr=s)
    ip, ix, extra = s.indptr, s.indices, {}
    if kind == "max_log2":
        extra = dict(max_log2=r.choice([-1, 21, 63]))
    elif kind == "prefetch":
        extra = dict(prefetch=r.choice([-1, 65, 2**40]))
    elif kind != "valid":
        b = break_structure(r, s, kind)
        ip, ix = b.indptr, b.indices

    def call():
        plan = call_raw("spmm_bucketed_plan", rowptr=ip, col=ix, num_cols=s.cols, **extra)
        return call_raw("spmm", **raw_spmm_kwargs(p, rowptr=ip, col=ix, plan=plan))

    expect = "valid" if kind == "valid" else "invalid"
    return Case(expect, call, spmm_check(p, raw=True), f"bucketed plan builder: {kind}",
                describe(p, kind=kind), f16=p["X"].dtype == torch.float16)


def raw_mixed_devices(r: Rand) -> Case:
    """One argument on another device (meta, or CUDA when present), the rest on the CPU."""
    p = spmm_problem(r, torch.float32, epilogue=False)
    s = p["csr"]
    dev = r.choice(OTHER_DEVICES)
    which = r.choice(["x", "rowptr", "col"] + (["values"] if p["values"] is not None else []))
    kw = raw_spmm_kwargs(p)
    kw[which] = kw[which].to(dev)
    shape = (s.rows,) + tuple(p["X"].shape[1:])
    # A meta result (the fake kernel) is acceptable; a real one from mixed devices is not.
    return Case("either" if dev == "meta" else "invalid", lambda: call_raw("spmm", **kw),
                expect_meta(shape, torch.float32), f"spmm with {which} on {dev}",
                describe(p, which=which, device=dev))


def raw_gcn_adjacency(r: Rand) -> Case:
    """GCN's normalised A + I from an unweighted edge_index: valid inputs against the
    per-entry formula, malformed ones must raise."""
    n, e = r.randint(1, 14), r.randint(0, 30)
    ei = r.edge_index(n, e)
    num_nodes, dtype = n, r.choice([torch.float32, torch.float64, torch.bfloat16])
    bad = ["float", "shape", "negative", "beyond", "negative_n", "int_dtype", "meta_n0"]
    kind = r.choice(bad + ["plain", "int32", "loops", "view", "larger_n"])
    if kind == "float":
        ei = ei.double()
    elif kind == "shape":
        ei = ei[:1]
    elif kind == "negative" and e:
        ei[r.randint(0, 1), r.randint(0, e - 1)] = -r.randint(1, 3)
    elif kind == "beyond" and e:
        ei[r.randint(0, 1), r.randint(0, e - 1)] = n + r.randint(0, 2)
    elif kind == "negative_n":
        num_nodes = -r.randint(1, 2)
    elif kind == "int_dtype":
        dtype = torch.int32
    elif kind == "meta_n0":
        ei, num_nodes = torch.zeros(2, 1, dtype=torch.long), 0
    elif kind == "int32":
        ei = ei.int()
    elif kind == "loops" and e:
        ei[1, : e // 2 + 1] = ei[0, : e // 2 + 1]
    elif kind == "view":
        ei = ei.t().contiguous().t()
    elif kind == "larger_n":
        num_nodes = n + 2
    params = dict(kind=kind, n=num_nodes, edges=e, dtype=str(dtype))
    call = lambda: call_raw("gcn_adjacency", edge_index=ei, num_nodes=num_nodes,  # noqa: E731
                            dtype=dtype)
    if kind in bad and (e or kind not in ("negative", "beyond")):
        return Case("invalid", call, why=f"gcn_adjacency: {kind}", params=params)

    def check(out):
        rowptr, col, perm, vals = out
        src = torch.cat([ei[0].long(), torch.arange(num_nodes)])
        dst = torch.cat([ei[1].long(), torch.arange(num_nodes)])
        w = torch.ones(src.numel(), dtype=torch.float64)
        w[: ei.shape[1]][ei[0] == ei[1]] = 0
        deg = torch.zeros(num_nodes, dtype=torch.float64).index_add_(0, dst, w)
        if not torch.equal(torch.sort(perm).values, torch.arange(src.numel())):
            return "perm is not a permutation of edges + loops"
        if not (torch.equal(col, src[perm]) and torch.equal(entry_rows(rowptr).long(), dst[perm])):
            return "col / rows do not match the permuted edge list"
        want = (w * deg[dst].rsqrt() * deg[src].rsqrt())[perm]
        err = (vals.double() - want).abs().max().item() if want.numel() else 0.0
        return None if err <= (1e-2 if dtype == torch.bfloat16 else 1e-5) else f"values off by {err}"

    return Case("valid", call, check, "gcn_adjacency", params)


def raw_spmm_arg_backward(r: Rand) -> Case:
    """max / min's gradient op: positions drawn inside their rows (valid, checked against a
    loop), or one argument broken (positions past nnz or below -1, int32 positions, shapes,
    values, a structure past num_cols)."""
    s = r.csr(max_deg=6, empty_frac=0.2)
    f = r.randint(0, 9)
    dtype = r.choice([torch.float32, torch.float64, torch.bfloat16])
    deg = (s.indptr[1:] - s.indptr[:-1]).long()
    pick = torch.randint(0, 1 << 30, (s.rows, f), generator=r.g) % deg.clamp(min=1)[:, None]
    arg = torch.where(deg[:, None] > 0, s.indptr[:-1].long()[:, None] + pick,
                      torch.full_like(pick, -1))
    grad = r.data((s.rows, f), dtype)
    values = r.data((s.nnz,), dtype) if r.coin() else None
    kw = dict(rowptr=s.indptr, col=s.indices, arg=arg, grad_out=grad, values=values,
              num_cols=s.cols)
    kind = r.choice(["valid", "valid", "past_nnz", "below", "int32", "shape", "values_len",
                     "values_dtype", "num_cols"])
    params = dict(kind=kind, rows=s.rows, nnz=s.nnz, f=f, dtype=str(dtype))
    if kind == "valid":
        def check(out):
            want = torch.zeros(s.cols, f, dtype=torch.float64)
            for i in range(s.rows):
                for k in range(f):
                    p = int(arg[i, k])
                    if p >= 0:
                        c = 1.0 if values is None else float(values[p])
                        want[int(s.indices[p]), k] += c * float(grad[i, k])
            if tuple(out.shape) != (s.cols, f) or out.dtype != dtype:
                return f"shape {tuple(out.shape)} / dtype {out.dtype}"
            tol = 3e-2 if dtype == torch.bfloat16 else 1e-5
            err = (out.double() - want).abs().max().item() if want.numel() else 0.0
            return None if err <= tol * max(1.0, want.abs().max().item() if want.numel() else 0.0) \
                else f"off by {err}"
        return Case("valid", lambda: call_raw("spmm_arg_backward", **kw), check,
                    "spmm_arg_backward", params)
    if kind == "past_nnz" and arg.numel():
        kw["arg"] = arg.clone().view(-1).index_fill_(0, torch.tensor([0]), s.nnz + r.randint(0, 3)).view(arg.shape)
    elif kind == "below" and arg.numel():
        kw["arg"] = arg.clone().view(-1).index_fill_(0, torch.tensor([0]), -2 - r.randint(0, 5)).view(arg.shape)
    elif kind == "int32":
        kw["arg"] = arg.int()
    elif kind == "shape":
        kw["arg"] = arg[:, : max(f - 1, 0)] if f else arg.new_zeros(s.rows, 1)
    elif kind == "values_len":
        kw["values"] = r.data((s.nnz + 1,), dtype)
    elif kind == "values_dtype":
        kw["values"] = r.data((s.nnz,), torch.float64 if dtype != torch.float64 else torch.float32)
    elif kind == "num_cols" and s.nnz:
        kw["num_cols"] = int(s.indices.max())  # one short of a stored column
    else:  # nothing to break on an empty draw: a valid call with no check
        return Case("either", lambda: call_raw("spmm_arg_backward", **kw), None,
                    "spmm_arg_backward (nothing to break)", params)
    return Case("invalid", lambda: call_raw("spmm_arg_backward", **kw), None,
                f"spmm_arg_backward {kind}", params)


RAW_CASES = [raw_gcn_adjacency, raw_spmm_valid, raw_spmm_argmax, raw_spmm_x_fewer_rows, raw_spmm_bad_structure,
             raw_spmm_num_cols, raw_spmm_plans, raw_spmm_plans, raw_spmm_strings_and_bias,
             raw_sddmm, raw_edge_softmax, raw_transpose_validate, raw_plan_builders,
             raw_mixed_devices, raw_spmm_arg_backward]
