"""Fuzz case kinds for fused sparse attention: the raw ops ``sparse_attention`` and
``sparse_attention_backward`` in the three score modes (0 dot product, 1 GAT additive,
2 GATv2) with valid random draws (checked against a float64 masked-softmax reference),
corrupted CSR arrays and cached transposes, q / k / v / bias / att of the wrong dtype, rank,
rows, heads or width, bad scalar arguments, NaN / Inf inputs and meta tensors."""

from __future__ import annotations

import math

import torch

import sparsejit  # noqa: F401  (registers the ops)

from .cases_spmm_raw import STRUCTURE_BREAKS, _nonempty_csr, break_structure
from .refs import FLOATS, VIEWS, Case, Rand, close, entry_rows, expect_meta, view_as

ATT = torch.ops.sparsejit.sparse_attention
ATT_BWD = torch.ops.sparsejit.sparse_attention_backward


def _leaky(z, slope):
    return torch.where(z > 0, z, z * slope)


def ref_attention(ip, col, q, k, v, bias, mode, scale, slope, att, absolute=False):
    """float64 out [rows, H, Dv]: softmax over each row's entries of the mode's score, times
    V (rows without entries give 0); differentiable. absolute: the same with |V| (the scale
    of the accumulated terms)."""
    row, c = entry_rows(ip), col.long()
    qd, kd, vd = q.double(), k.double(), v.double()
    if mode == 0:
        s = (qd[row] * kd[c]).sum(-1) * scale
    elif mode == 1:
        s = qd[row, :, 0] + kd[c, :, 0]
    else:
        s = (_leaky(qd[row] + kd[c], slope) * att.double()).sum(-1)
    if bias is not None:
        s = s + bias.double()
    masked = s.detach() == -math.inf  # a -inf pre-activation score: not in the softmax
    if mode == 1:
        s = _leaky(s, slope)
    rows, heads = ip.numel() - 1, q.shape[1]
    idx = row[:, None].expand_as(s)
    mx = torch.full((rows, heads), -math.inf, dtype=torch.float64).scatter_reduce(
        0, idx, s.detach().masked_fill(masked, -math.inf), "amax", include_self=True)
    e = torch.where(masked, 0.0, torch.exp(s - mx[row]))
    den = torch.zeros(rows, heads, dtype=torch.float64).index_add(0, row, e)
    # rows whose entries are all masked give 0, like rows without entries
    p = torch.where(masked, 0.0, e / den[row])
    vv = vd.abs() if absolute else vd
    return torch.zeros(rows, heads, v.shape[2], dtype=torch.float64).index_add(
        0, row, p[..., None] * vv[c])


def _problem(r: Rand, dtype=None, mode=None, nonempty=False, big=False):
    if big:  # past the kernels' threading threshold (rows * H > 256), below the JIT's
        s = r.csr(rows=r.randint(150, 250), cols=r.randint(50, 200), max_deg=6)
    else:
        s = _nonempty_csr(r) if nonempty else r.csr(rows=r.randint(0, 16), cols=r.randint(1, 12))
    dtype = dtype or r.choice(FLOATS)
    mode = r.randint(0, 2) if mode is None else mode
    heads, d, dv = (r.randint(2, 3) if big else r.randint(1, 3)), \
        (1 if mode == 1 else r.randint(0, 6)), r.randint(0, 5)
    q = r.data((s.rows, heads, d), dtype)
    k = r.data((s.cols, heads, d), dtype)
    v = r.data((s.cols, heads, dv), dtype)
    bias = r.data((s.nnz, heads), dtype) if r.coin() else None
    att = r.data((heads, d), dtype) if mode == 2 else None
    scale = r.choice([1.0, 0.5, 1 / math.sqrt(max(d, 1)), -2.0]) if mode == 0 else 1.0
    slope = r.choice([0.2, 0.0, 1.5])
    return dict(csr=s, dtype=dtype, mode=mode, q=q, k=k, v=v, bias=bias, att=att, scale=scale,
                slope=slope)


def _kw(p):
    s = p["csr"]
    return dict(rowptr=s.indptr, col=s.indices, q=p["q"], k=p["k"], v=p["v"], bias=p["bias"],
                mode=p["mode"], scale=p["scale"], negative_slope=p["slope"], dropout=0.0,
                seed=0, att=p["att"])


def _params(p, **more):
    s = p["csr"]
    return dict(rows=s.rows, cols=s.cols, nnz=s.nnz, mode=p["mode"], dtype=str(p["dtype"]),
                q=tuple(p["q"].shape), v=tuple(p["v"].shape), bias=p["bias"] is not None, **more)


def _ref(p, absolute=False, **over):
    a = {**p, **over}
    s = a["csr"]
    return ref_attention(s.indptr, s.indices, a["q"], a["k"], a["v"], a["bias"], a["mode"],
                         a["scale"], a["slope"], a["att"], absolute)


def attention_valid(r: Rand) -> Case:
    """Every mode and dtype, empty rows and patterns, D or Dv = 0, non-contiguous q / k / v;
    some draws big enough to run on several threads."""
    p = _problem(r, big=r.coin(0.25))
    views = {}
    for name in ("q", "k", "v"):
        views[name] = r.choice(VIEWS)
        p[name] = view_as(p[name], views[name])
    ref, mag = _ref(p), _ref(p, absolute=True)
    dtype = p["dtype"]

    def check(result):
        out, lse = result
        return close(out, ref, mag, dtype, "out")
    return Case("valid", lambda: ATT(**_kw(p)), check, "valid sparse_attention",
                _params(p, views=views), f16=dtype == torch.float16)


def attention_backward_valid(r: Rand) -> Case:
    """float64 gradients of q, k, v, bias and att against autograd of the reference."""
    p = _problem(r, dtype=torch.float64, big=r.coin(0.25))
    s = p["csr"]
    leaves = {n: p[n].clone().requires_grad_() for n in ("q", "k", "v", "bias", "att")
              if p[n] is not None}
    out = _ref(p, **leaves)
    g = r.data(tuple(out.shape), torch.float64)
    want = dict(zip(leaves, torch.autograd.grad(out, list(leaves.values()), g,
                                                allow_unused=True)))
    fwd_out, lse = ATT(**_kw(p))
    trp, tcol, tperm = torch.ops.sparsejit.csr_transpose(s.indptr, s.indices, s.cols)
    need = {n: r.coin(0.8) for n in ("q", "k", "v", "bias", "att")}

    def call():
        return ATT_BWD(s.indptr, s.indices, trp, tcol, tperm, p["q"], p["k"], p["v"], p["bias"],
                       fwd_out, lse, g, p["mode"], p["scale"], p["slope"], 0.0, 0, need["q"],
                       need["k"], need["v"], need["bias"], p["att"], need["att"])

    def check(result):
        for got, name in zip(result, ("q", "k", "v", "bias", "att")):
            if name not in leaves or not need[name]:
                continue
            w = want[name] if want[name] is not None else torch.zeros_like(leaves[name])
            err = close(got, w, w.abs() + 1, torch.float64, f"d{name}")
            if err:
                return err
        return None
    return Case("valid", call, check, "valid sparse_attention_backward", _params(p, need=need))


def attention_bad_args(r: Rand) -> Case:
    p = _problem(r, dtype=torch.float32, nonempty=True)
    s = p["csr"]
    kw = _kw(p)
    heads, d = p["q"].shape[1], p["q"].shape[2]
    what = r.choice(["structure", "col_dtype", "rowptr_2d", "q_dtype", "k_dtype", "v_dtype",
                     "qkv_mixed", "q_rows", "v_rows", "q_rank", "k_heads", "v_heads",
                     "k_width", "additive_width", "mode", "att_missing", "att_extra",
                     "att_shape", "att_dtype", "att_2d_q", "bias_shape", "bias_dtype", "dropout",
                     "scale", "negative_slope", "meta"])
    names = (what.split("_")[0],)
    if what == "structure":
        kind = r.choice(list(STRUCTURE_BREAKS))
        b = break_structure(r, s, kind)
        kw.update(rowptr=b.indptr, col=b.indices)
        names = ("indptr", "indices", "rowptr", "col", "structure")
        what = kind
    elif what == "col_dtype":
        kw["col"] = s.indices.to(r.choice([torch.float32, torch.int16, torch.bool]))
        names = ("indices", "col", "dtype")
    elif what == "rowptr_2d":
        kw["rowptr"] = s.indptr[None]
        names = ("indptr", "rowptr")
    elif what in ("q_dtype", "k_dtype", "v_dtype"):
        n = what[0]
        kw[n] = kw[n].to(r.choice([torch.int32, torch.int64, torch.bool, torch.complex64]))
    elif what == "qkv_mixed":
        n = r.choice(["q", "k", "v"])
        kw[n] = kw[n].to(r.choice([torch.float64, torch.bfloat16]))
        names = ("q", "k", "v", "dtype")
    elif what == "q_rows":
        kw["q"] = r.data((s.rows + r.choice([-1, 1]), heads, d), torch.float32)
    elif what == "v_rows":
        kw["v"] = r.data((s.cols + r.choice([-1, 1]),) + tuple(p["v"].shape[1:]), torch.float32)
    elif what == "q_rank":
        n = r.choice(["q", "k", "v"])
        kw[n] = r.choice([kw[n][:, 0], kw[n][None]])
        names = (n,)
    elif what in ("k_heads", "v_heads"):
        n = what[0]
        kw[n] = r.data((kw[n].shape[0], heads + 1, kw[n].shape[2]), torch.float32)
        names = ("heads",)
    elif what == "k_width":
        kw["k"] = r.data((s.cols, heads, d + 1), torch.float32)
        if p["mode"] == 2:
            kw["q"] = kw["q"]
        names = ("width", "k")
    elif what == "additive_width":
        kw.update(mode=1, att=None, q=r.data((s.rows, heads, 2), torch.float32),
                  k=r.data((s.cols, heads, 2), torch.float32))
        names = ("additive", "q")
    elif what == "mode":
        kw["mode"] = r.choice([-1, 3, 2**40])
    elif what == "att_missing":
        kw.update(mode=2, att=None)
        names = ("att",)
    elif what == "att_extra":
        kw.update(mode=r.choice([0, 1]), att=r.data((heads, d), torch.float32))
        if kw["mode"] == 1:
            kw.update(q=r.data((s.rows, heads, 1), torch.float32),
                      k=r.data((s.cols, heads, 1), torch.float32))
            kw["att"] = r.data((heads, 1), torch.float32)
        names = ("att",)
    elif what == "att_shape":
        kw.update(mode=2, att=r.choice([r.data((heads + 1, d), torch.float32),
                                        r.data((heads, d + 1), torch.float32),
                                        r.data((heads * d,), torch.float32)]))
    elif what == "att_dtype":
        kw.update(mode=2, att=r.data((heads, d), r.choice([torch.int64, torch.complex64])))
    elif what == "att_2d_q":  # GATv2 with [N, D] q (the op wants [N, H, D])
        kw.update(mode=2, att=r.data((heads, d), torch.float32), q=kw["q"][:, 0])
        names = ("q", "att")
    elif what == "bias_shape":
        kw["bias"] = r.choice([r.data((s.nnz + 1, heads), torch.float32),
                               r.data((s.nnz, heads + 1), torch.float32),
                               r.data((s.nnz,), torch.float32)])
    elif what == "bias_dtype":
        kw["bias"] = r.data((s.nnz, heads), r.choice([torch.int64, torch.bool, torch.complex64]))
    elif what == "dropout":
        kw["dropout"] = r.choice([1.0, -0.1, float("nan"), 2.0])
    elif what == "scale":
        kw["scale"] = r.choice([float("nan"), float("inf")])
    elif what == "negative_slope":
        kw["negative_slope"] = r.choice([float("nan"), -float("inf")])
        kw["mode"] = r.choice([1, 2]) if kw["mode"] == 0 else kw["mode"]
        if kw["mode"] == 1:
            kw.update(q=r.data((s.rows, heads, 1), torch.float32),
                      k=r.data((s.cols, heads, 1), torch.float32), att=None)
        elif kw["att"] is None:
            kw["att"] = r.data((heads, d), torch.float32)
    elif what == "meta":  # one argument on meta, the rest on the CPU: refused, or meta
        n = r.choice(["rowptr", "col", "q", "k", "v"] + (["bias"] if kw["bias"] is not None
                                                         else []))
        kw[n] = kw[n].to("meta")
        return Case("either", lambda: ATT(**kw),
                    expect_meta((s.rows, heads, p["v"].shape[2])), f"{n} on meta",
                    _params(p, what=what, which=n), names=(n, "device", "meta"))
    return Case("invalid", lambda: ATT(**kw), None, f"sparse_attention with a bad {what}",
                _params(p, what=what), names=names)


def attention_backward_bad_args(r: Rand) -> Case:
    p = _problem(r, dtype=torch.float32, nonempty=True)
    s = p["csr"]
    out, lse = ATT(**_kw(p))
    trp, tcol, tperm = torch.ops.sparsejit.csr_transpose(s.indptr, s.indices, s.cols)
    g = r.data(tuple(out.shape), torch.float32)
    a = dict(rowptr=s.indptr, col=s.indices, t_rowptr=trp, t_col=tcol, t_perm=tperm, q=p["q"],
             k=p["k"], v=p["v"], bias=p["bias"], out=out, lse=lse, grad_out=g, mode=p["mode"],
             scale=p["scale"], negative_slope=p["slope"], dropout=0.0, seed=0, need_q=True,
             need_k=True, need_v=True, need_bias=True, att=p["att"], need_att=True)
    what = r.choice(["t_perm_range", "t_perm_short", "t_rowptr_len", "t_rowptr_break",
                     "t_col_range", "t_dtype", "grad_out_shape", "out_shape", "lse_shape",
                     "grad_out_dtype", "lse_dtype", "out_dtype", "grad_out_meta", "lse_meta",
                     "out_meta", "t_perm_meta"])
    names = (what.rsplit("_", 1)[0],)
    if what == "t_perm_range":
        tp = tperm.clone()
        tp[r.randint(0, tp.numel() - 1)] = r.choice(
            [-1, s.nnz, 2**40 if tp.dtype == torch.int64 else 2**31 - 1])
        a["t_perm"] = tp
        names = ("t_perm",)
    elif what == "t_perm_short":
        a["t_perm"] = tperm[:-1]
        names = ("t_perm",)
    elif what == "t_rowptr_len":
        a["t_rowptr"] = torch.cat([trp, trp[-1:]])
    elif what == "t_rowptr_break":
        tr = trp.clone()
        tr[-1] = s.nnz + r.choice([1, 100])
        a["t_rowptr"] = tr
        names = ("indptr", "t_rowptr", "structure")
    elif what == "t_col_range":
        tc = tcol.clone()
        tc[r.randint(0, tc.numel() - 1)] = r.choice(
            [-1, s.rows, 2**40 if tc.dtype == torch.int64 else 2**31 - 1])
        a["t_col"] = tc
        names = ("indices", "t_col", "structure", "column")
    elif what == "t_dtype":
        n = r.choice(["t_rowptr", "t_col", "t_perm"])
        other = torch.int32 if s.indptr.dtype == torch.int64 else torch.int64
        a[n] = a[n].to(r.choice([other, torch.float32]))
        names = (n, "transpose", "indices", "dtype")
    elif what in ("grad_out_shape", "out_shape"):
        n = what[:-6]
        a[n] = r.choice([a[n][:-1], a[n][:, :, :0] if a[n].shape[2] else a[n][:, :1],
                         a[n].reshape(a[n].shape[0], -1)])
    elif what == "lse_shape":
        a["lse"] = r.choice([lse[:-1], lse[:, None]])
    elif what.endswith("_dtype"):
        n = what[:-6]
        a[n] = a[n].to(r.choice([torch.int64, torch.bool, torch.complex64]))
    elif what.endswith("_meta"):
        n = what[:-5]
        a[n] = a[n].to("meta")
        return Case("either", lambda: ATT_BWD(**a), expect_meta(tuple(p["q"].shape)),
                    f"sparse_attention_backward with {n} on meta", _params(p, what=what),
                    names=(n, "device", "meta"))
    return Case("invalid", lambda: ATT_BWD(**a), None,
                f"sparse_attention_backward with a bad {what}", _params(p, what=what),
                names=names)


def attention_nonfinite(r: Rand) -> Case:
    """NaN in V or q / k, or -inf scores in bias (masked entries): the output must be the
    reference's, NaN exactly where it has NaN."""
    p = _problem(r, dtype=r.choice([torch.float32, torch.float64]), nonempty=True)
    s = p["csr"]
    what = r.choice(["v_nan", "v_inf", "q_nan", "bias_minus_inf"])
    if what == "bias_minus_inf":
        b = p["bias"] if p["bias"] is not None else r.data((s.nnz, p["q"].shape[1]), p["dtype"])
        b = b.clone()
        b.view(-1)[r.randint(0, b.numel() - 1)] = -float("inf")
        p["bias"] = b
    else:
        n = what[0]
        t = p[n].clone()
        if t.numel():
            t.view(-1)[r.randint(0, t.numel() - 1)] = float("nan") if what.endswith("nan") \
                else float("inf")
        p[n] = t
    ref, mag = _ref(p), _ref(p, absolute=True)
    from .point_conv_refs import close_nan
    return Case("valid", lambda: ATT(**_kw(p))[0],
                lambda out: close_nan(out, ref, mag, p["dtype"], "out"),
                f"sparse_attention with {what}", _params(p, what=what))


def attention_api(r: Rand) -> Case:
    """sj.sparse_attention / gat_attention / gatv2_attention: valid calls (edge_index or
    SparseMatrix, [N, D] or [N, H, D], shared [nnz] edge terms) against the reference, and
    bad arguments of the wrappers."""
    import sparsejit as sj

    p = _problem(r, dtype=torch.float32, nonempty=True)
    s = p["csr"]
    A = s.matrix()
    heads = p["q"].shape[1]
    mode = p["mode"]
    edge = r.data((s.nnz,), torch.float32) if r.coin() else None
    if mode == 0:
        args = (A, p["q"], p["k"], p["v"])
        kw = dict(scale=p["scale"], values=edge)
        fn = sj.sparse_attention
    elif mode == 1:
        args = (A, p["q"][..., 0], p["k"][..., 0], p["v"])
        kw = dict(negative_slope=p["slope"], edge_logits=edge)
        fn = sj.gat_attention
    else:
        args = (A, p["q"], p["k"], p["att"], p["v"])
        kw = dict(negative_slope=p["slope"], edge_logits=edge)
        fn = sj.gatv2_attention
    what = r.choice(["valid", "valid", "edge_shape", "q_rank", "dropout", "A_type"])
    if what == "valid":
        bias = None if edge is None else edge[:, None].expand(s.nnz, heads)
        ref, mag = _ref(p, bias=bias), _ref(p, absolute=True, bias=bias)
        return Case("valid", lambda: fn(*args, **kw), lambda out: close(out, ref, mag,
                                                                        torch.float32),
                    f"valid {fn.__name__}", _params(p, edge=edge is not None))
    args = list(args)
    names = ()
    if what == "edge_shape":
        key = "values" if mode == 0 else "edge_logits"
        kw[key] = r.choice([r.data((s.nnz + 1,), torch.float32),
                            r.data((s.nnz, heads + 1), torch.float32)])
        names = (key,)
    elif what == "q_rank":
        i = r.randint(1, 2)
        args[i] = args[i][None]
        names = ({1: ("Q", "a_dst", "x_dst"), 2: ("K", "a_src", "x_src")}[i])
    elif what == "dropout":
        kw["dropout"] = r.choice([1.0, -0.5, float("nan")])
        names = ("dropout",)
    elif what == "A_type":
        args[0] = r.choice([s.indptr.double(), "A", torch.zeros(3, 3)])
        names = ("edge_index", "SparseMatrix", "A")
    return Case("invalid", lambda: fn(*args, **kw), None, f"{fn.__name__} with a bad {what}",
                _params(p, what=what), names=names)


ATTENTION_CASES = [attention_valid, attention_valid, attention_backward_valid,
                   attention_bad_args, attention_bad_args, attention_bad_args,
                   attention_backward_bad_args, attention_backward_bad_args,
                   attention_nonfinite, attention_api]
