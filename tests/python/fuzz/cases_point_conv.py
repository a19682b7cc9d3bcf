"""Fuzz case kinds for point-cloud sparse convolution: the raw ops ``point_conv_plan``,
``point_conv`` and ``point_conv_backward`` with valid random geometries (checked against a
float64 reference whose kernel map comes from the geometry formulas, not from the plan), bad
coordinates and geometry arguments, every plan array corrupted, bad operands, NaN / Inf
features, meta tensors. (The Python entry points: cases_point_conv_api.py.)

point_conv is called by keyword (``conv_call``): a trailing argument added to its schema
later (a fused activation) takes its default, or False for a bool without one."""

from __future__ import annotations

import dataclasses
import math

import torch

import sparsejit  # noqa: F401  (registers the ops)

from .point_conv_refs import (PLAN_ARRAYS, WORD_K, WORD_NNZ, WORD_OP, WORD_PARAM, check_map,
                        close_nan, cloud, conv_ref, get_plan_array, plan_arrays, reference_map,
                        rows_of, same_pairs, set_plan_entry)
from .refs import FLOATS, VIEWS, Case, Rand, close, expect_meta, under_env, view_as

KINDS = ("subm", "spconv", "coarse", "transposed", "generalized")


def conv_call(op: str, **kw):
    """torch.ops.sparsejit.<op> by keyword; bool arguments the schema added without a
    default are False (the plain convolution)."""
    fn = getattr(torch.ops.sparsejit, op)
    for a in fn.default._schema.arguments:
        if a.name not in kw and not a.has_default_value() and str(a.type) == "bool":
            kw[a.name] = False
    return fn(**kw)


def _geometry(r: Rand, kind=None, dims=None):
    """A valid random geometry: kind, dims, shape, batch, kernel, stride, padding, dilation."""
    kind = kind or r.choice(KINDS)
    dims = dims or r.choice([1, 2, 2, 3, 3, 4])
    kernel = [r.choice([1, 3]) if kind == "subm" else r.randint(1, 3) for _ in range(dims)]
    stride = [1 if kind == "subm" else r.randint(1, 2) for _ in range(dims)]
    dilation = [r.randint(1, 2) for _ in range(dims)]
    padding = [r.randint(0, dilation[d] * (kernel[d] - 1) // 2) for d in range(dims)]
    shape = [r.randint(max(1, dilation[d] * (kernel[d] - 1) + 1), 7) for d in range(dims)]
    return dict(kind=kind, dims=dims, shape=shape, batch=r.randint(1, 2), kernel=kernel,
                stride=stride, padding=padding, dilation=dilation)


def _plan(coords, g, out_coords=None):
    return torch.ops.sparsejit.point_conv_plan(coords, g["shape"], g["batch"], g["kind"], g["kernel"],
                                         g["stride"], g["padding"], g["dilation"], out_coords)


def _problem(r: Rand, g, n=None):
    coords = cloud(r, g["dims"], g["shape"], g["batch"], r.randint(0, 25) if n is None else n)
    out_coords = None
    if g["kind"] == "generalized":
        out_coords = cloud(r, g["dims"], [r.randint(1, 6) for _ in g["shape"]], g["batch"],
                           r.randint(0, 12))
    return coords, out_coords


def conv_valid(r: Rand) -> Case:
    """point_conv_plan then point_conv on a random cloud: every kind, 1-4 axes, empty clouds,
    C = 0, every dtype, non-contiguous features, swap (inverse conv), forced dataflows."""
    g = _geometry(r)
    big = r.coin(0.25)  # enough pairs for the parallel tiles and output-row blocks
    if big:
        g["shape"] = [max(s, 10) for s in g["shape"]] if g["dims"] <= 3 else g["shape"]
    coords, out_coords = _problem(r, g, n=r.randint(200, 500) if big else None)
    dtype = r.choice(FLOATS)
    c_in, c_out = (r.choice([16, 32]), r.choice([16, 32, 5])) if big else \
        (r.randint(0, 5), r.randint(0, 5))
    outs, pairs = reference_map(coords, g["kind"], g["shape"], g["kernel"], g["stride"],
                                g["padding"], g["dilation"], out_coords)
    k = math.prod(g["kernel"])
    w = r.data((k, c_in, c_out), dtype)
    bias = r.data((c_out,), dtype) if r.coin() else None
    swap = r.coin(0.3)
    dataflow = r.randint(0, 2)
    relu = r.coin(0.3)  # the fused ReLU epilogue
    view = r.choice(VIEWS)
    n_in, n_out = coords.shape[0], len(outs)
    x = view_as(r.data((n_out if swap else n_in, c_in), dtype), view)

    def call():
        plan, oc = _plan(coords, g, out_coords)
        y = conv_call("point_conv", features=x, weight=w, bias=bias, plan=plan,
                      num_out=n_in if swap else oc.shape[0], swap=swap, dataflow=dataflow,
                      relu=relu)
        return oc, y

    def check(result):
        oc, y = result
        rows, err = rows_of(outs, oc)
        if err:
            return err
        p = [(i, rows[o], k) for i, o, k in pairs]
        if swap:
            p = [(o, i, k) for i, o, k in p]
        n = n_in if swap else n_out
        ref = conv_ref(x, w, bias, p, n)
        return close(y, torch.relu(ref) if relu else ref, conv_ref(x, w, bias, p, n, True),
                     dtype)

    return Case("valid", call, check, "valid point_conv_plan + point_conv",
                dict(g, n=n_in, c=(c_in, c_out), dtype=str(dtype), swap=swap, big=big,
                     dataflow=dataflow, relu=relu, view=view), f16=dtype == torch.float16)


def conv_backward_valid(r: Rand) -> Case:
    """point_conv_backward (float64) against autograd of the float64 reference."""
    g = _geometry(r)
    coords, out_coords = _problem(r, g)
    plan, oc = _plan(coords, g, out_coords)
    outs, pairs = reference_map(coords, g["kind"], g["shape"], g["kernel"], g["stride"],
                                g["padding"], g["dilation"], out_coords)
    rows, err = rows_of(outs, oc)
    assert err is None, err
    p = [(i, rows[o], k) for i, o, k in pairs]
    n_x, n_y = coords.shape[0], oc.shape[0]
    swap = r.coin(0.3)  # the inverse convolution: the plan read backwards
    if swap:
        p, n_x, n_y = [(o, i, k) for i, o, k in p], n_y, n_x
    k = int(plan[WORD_K])
    c_in, c_out = r.randint(1, 4), r.randint(1, 4)
    x = r.data((n_x, c_in), torch.float64).requires_grad_()
    w = r.data((k, c_in, c_out), torch.float64).requires_grad_()
    dy = r.data((n_y, c_out), torch.float64)
    need_x, need_w = r.coin(0.8), r.coin(0.8)
    dataflow = r.randint(0, 2) | (r.randint(0, 2) << 2)
    if p:
        dx_ref, dw_ref = torch.autograd.grad(conv_ref(x, w, None, p, n_y), (x, w), dy)
    else:  # no pairs: the output is the constant 0
        dx_ref, dw_ref = torch.zeros_like(x), torch.zeros_like(w)

    def check(out):
        for got, want, need, name in ((out[0], dx_ref, need_x, "d_features"),
                                      (out[1], dw_ref, need_w, "d_weight")):
            if not need:
                continue
            err = close(got, want, want.abs() + 1, torch.float64, name)
            if err:
                return err
        return None

    return Case("valid", lambda: conv_call(
        "point_conv_backward", features=x.detach(), weight=w.detach(), grad_out=dy, plan=plan,
        swap=swap, dataflow=dataflow, need_features=need_x, need_weight=need_w), check,
        "valid point_conv_backward", dict(g, n=coords.shape[0], need=(need_x, need_w),
                                           swap=swap))


# ---- point_conv_plan with bad arguments -----------------------------------------------------------

HUGE = (2**31, 2**40, 2**62, 2**63 - 1)


def conv_plan_bad_args(r: Rand) -> Case:
    g = _geometry(r, kind=r.choice(KINDS))
    coords, out_coords = _problem(r, g, n=r.randint(1, 20))
    if g["kind"] == "generalized" and out_coords.shape[0] == 0:
        out_coords = coords.clone()
    a = dict(coords=coords, spatial_shape=list(g["shape"]), batch_size=g["batch"],
             kind=g["kind"], kernel=list(g["kernel"]), stride=list(g["stride"]),
             padding=list(g["padding"]), dilation=list(g["dilation"]), out_coords=out_coords)
    what = r.choice(["coords_dtype", "coords_rank", "coords_width", "coord_negative",
                     "coord_outside", "coord_huge", "batch_negative", "batch_too_large",
                     "duplicate", "spatial_shape", "batch_size", "kind", "kernel", "stride",
                     "padding", "dilation", "axes_count", "subm_even", "out_coords",
                     "coords_meta", "large_valid", "large_valid", "large_shape"])
    names = (what,)
    d = r.randint(0, g["dims"] - 1)
    c = coords.clone()
    row = r.randint(0, c.shape[0] - 1)
    if what == "coords_dtype":
        a["coords"] = c.to(r.choice([torch.float32, torch.float64, torch.complex64, torch.bool]))
        names = ("coords",)
    elif what == "coords_rank":
        a["coords"] = r.choice([c.reshape(-1), c[None], c.reshape(-1)[:0]])
        names = ("coords",)
    elif what == "coords_width":
        a["coords"] = r.choice([c[:, :-1], torch.cat([c, c[:, :1]], 1)])
        names = ("coords", "columns")
    elif what == "coord_negative":
        c[row, 1 + d] = -r.choice([1, 2**31])
        a["coords"], names = c, ("coords",)
    elif what == "coord_outside":
        c[row, 1 + d] = g["shape"][d] + r.choice([0, 1, 1000])
        a["coords"], names = c, ("coords",)
    elif what == "coord_huge":  # int64 coordinates past int32
        c = c.long()
        c[row, r.randint(0, g["dims"])] = r.choice([2**31, 2**40, -2**40])
        a["coords"], names = c, ("coords",)
    elif what == "batch_negative":
        c[row, 0] = -r.choice([1, 7])
        a["coords"], names = c, ("coords", "batch")
    elif what == "batch_too_large":
        c[row, 0] = g["batch"] + r.choice([0, 3])
        a["coords"], names = c, ("batch",)
    elif what == "duplicate":
        if c.shape[0] < 2:
            c = torch.cat([c, c])
        else:
            c[1] = c[0]
        a["coords"], names = c, ("coords", "duplicate")
    elif what == "spatial_shape":
        s = list(g["shape"])
        s[d] = r.choice([0, -1, -2**40] + list(HUGE))
        a["spatial_shape"] = s
    elif what == "batch_size":
        a["batch_size"] = r.choice([0, -1] + list(HUGE))
        names = ("batch",)
        if a["batch_size"] > 0:  # ids are int32: a batch_size past them changes nothing
            base = _plan(coords, g, out_coords)
            return Case("either", lambda: torch.ops.sparsejit.point_conv_plan(**a),
                        lambda res: None if torch.equal(res[1], base[1]) and
                        same_pairs(res[0], base[0]) else "another kernel map",
                        f"point_conv_plan with batch_size {a['batch_size']}",
                        dict(what=what, kind=a["kind"]), names=names)
    elif what == "kind":
        a["kind"] = r.choice(["", "SUBM", "conv", "inverse"])
    elif what in ("kernel", "stride", "padding", "dilation"):
        v = list(a[what])
        v[d] = r.choice(([0] if what != "padding" else []) + [-1, -2**40] + list(HUGE))
        a[what] = v
    elif what == "large_shape":  # a grid the 64-bit keys may not hold: refused, or correct
        a["spatial_shape"] = [r.choice([2**16, 2**20, 2**30]) for _ in range(g["dims"])]
        a["batch_size"] = r.choice([g["batch"], 2**20])
        geo = {n: a[n] for n in ("kernel", "stride", "padding", "dilation")}
        return Case("either", lambda: torch.ops.sparsejit.point_conv_plan(**a),
                    lambda res: check_map(res, coords, a["kind"], a["spatial_shape"], geo,
                                          out_coords),
                    "point_conv_plan on a large grid", dict(what=what, kind=a["kind"],
                                                      shape=a["spatial_shape"]),
                    names=("spatial_shape",))
    elif what == "large_valid":  # large but representable: the reference's kernel map
        which = r.choice(["stride", "padding", "dilation"])
        a[which] = list(a[which])
        a[which][d] = r.choice([2**10, 2**20, 2**29])
        if a["kind"] == "subm" and which == "stride":
            a["kind"] = "coarse"
        names = (which, "packing range", "dilated kernel")
        geo = {n: a[n] for n in ("kernel", "stride", "padding", "dilation")}
        return Case("either", lambda: torch.ops.sparsejit.point_conv_plan(**a),
                    lambda res: check_map(res, coords, a["kind"], a["spatial_shape"], geo,
                                           out_coords),
                    f"point_conv_plan with {which} {a[which][d]}", dict(what=which, kind=a["kind"],
                                                                  value=a[which][d]),
                    names=names)
    elif what == "axes_count":
        which = r.choice(["kernel", "stride", "padding", "dilation", "spatial_shape"])
        a[which] = a[which] + [1] if r.coin() or g["dims"] == 1 else a[which][:-1]
        names = (which, "coords", "one per spatial axis")  # the op cannot tell which list
    elif what == "subm_even":
        a["kind"] = "subm"
        a["kernel"] = [2] * g["dims"]
        a["stride"] = [1] * g["dims"]
        names = ("kernel",)
    elif what == "out_coords":
        a["kind"] = "generalized"
        oc = coords.clone()
        bad = r.choice(["missing", "float", "width", "negative", "batch"])
        if bad == "missing":
            oc = None
        elif bad == "float":
            oc = oc.double()
        elif bad == "width":
            oc = oc[:, :-1]
        elif bad == "negative":
            oc[0, 1] = -3
        else:
            oc[0, 0] = g["batch"]
        a["out_coords"] = oc
        names = ("out_coords",)
    elif what == "coords_meta":
        a["coords"] = c.to("meta")
        names = ("coords", "meta", "device", "cpu")
    return Case("invalid", lambda: torch.ops.sparsejit.point_conv_plan(**a), None,
                f"point_conv_plan with a bad {what}", dict(what=what, kind=a["kind"], dims=g["dims"]),
                names=names)


# ---- point_conv with a corrupted plan or bad operands --------------------------------------

def _subm_problem(r: Rand, dtype=torch.float32):
    g = _geometry(r, kind=r.choice(["subm", "subm", "spconv", "generalized"]))
    coords, out_coords = _problem(r, g, n=r.randint(2, 20))
    if g["kind"] == "generalized" and out_coords.shape[0] == 0:
        out_coords = coords.clone()
    plan, oc = _plan(coords, g, out_coords)
    if int(plan[WORD_NNZ]) == 0:  # corruptions need pairs: take a submanifold plan
        g = dict(g, kind="subm", kernel=[3] * g["dims"], stride=[1] * g["dims"])
        plan, oc = _plan(coords, g)
    k = int(plan[WORD_K])
    c_in, c_out = r.randint(1, 4), r.randint(1, 4)
    x = r.data((coords.shape[0], c_in), dtype)
    w = r.data((k, c_in, c_out), dtype)
    return g, coords, plan, oc, x, w


def conv_corrupt_plan(r: Rand) -> Case:
    """One plan array (or header word) corrupted; the raw op must refuse it (O(K + M + N)
    checks), never read past an array or write past the output."""
    g, coords, plan, oc, x, w = _subm_problem(r)
    lay = plan_arrays(plan)
    k, m = int(plan[WORD_K]), int(plan[WORD_NNZ])
    n_in, n_out = x.shape[0], oc.shape[0]
    what = r.choice(["truncated", "extended", "dtype", "rank", "strided", "header"]
                    + list(PLAN_ARRAYS)
                    + ["group_ptr", "identity", "pairs_past_end"])
    p = plan.clone()
    detail = what
    if what == "truncated":
        p = plan[:r.choice([0, 5, WORD_K + 1, plan.numel() - 1])]
    elif what == "extended":
        p = torch.cat([plan, plan[-1:]])
    elif what == "dtype":
        p = plan.to(r.choice([torch.int32, torch.float64]))
    elif what == "rank":
        p = plan[None]
    elif what == "strided":  # the same words, not contiguous: refused, or the same result
        big = torch.zeros(2 * plan.numel(), dtype=plan.dtype)
        big[::2] = plan
        p = big[::2]
        ref = conv_call("point_conv", features=x, weight=w, bias=None, plan=plan,
                        num_out=n_out, swap=False, dataflow=0)
        return Case("either", lambda: conv_call("point_conv", features=x, weight=w, bias=None,
                                                plan=p, num_out=n_out, swap=False, dataflow=0),
                    lambda y: None if torch.equal(y, ref) else "another result",
                    "a non-contiguous copy of the plan", dict(what=what), names=("plan",))
    elif what == "header":
        word = r.choice([0, 1, WORD_OP, WORD_OP, WORD_K, WORD_NNZ, 6, 8])
        p[word] = r.choice([1, 3, 5, 99, -1, 2**40]) if word == WORD_OP else \
            int(plan[word]) + r.choice([1, -1, 2**40, -2**40])
        detail = f"word {word} = {int(p[word])}"
    elif what == "identity":
        sizes = get_plan_array(plan, "group_ptr").diff().tolist()
        wrong = [i for i in range(k) if sizes[i] != n_in]
        p[WORD_PARAM] = r.choice([k, k + 5, 2**40] + wrong[:1])
        detail = f"identity group {int(p[WORD_PARAM])}"
    elif what == "pairs_past_end":  # every pointer array agreeing on more pairs than stored
        extra = r.choice([1, 1000, 2**31])
        for arr in ("group_ptr", "out_row_ptr", "in_row_ptr"):
            p = set_plan_entry(p, arr, lay[arr][1] - 1, m + extra)
        detail = f"pointers end at {m + extra} of {m} pairs"
    else:
        at, n, bits = lay[what]
        if what.endswith("_ptr"):
            kind = r.choice(["first", "last_up", "last_down", "decreasing"])
            j = {"first": 0, "last_up": n - 1, "last_down": n - 1}.get(kind, r.randint(1, n - 1))
            val = get_plan_array(plan, what)
            v = {"first": r.choice([1, -1]), "last_up": int(val[-1]) + r.choice([1, 1000, 2**40]),
                 "last_down": int(val[-1]) - 1,
                 "decreasing": int(val[j - 1]) - 1 if j >= 1 else -1}[kind]
            if kind == "last_down" and int(val[-1]) == 0:
                v = -1
            p = set_plan_entry(plan, what, j, v)
            detail = f"{what}[{j}] = {v} ({kind})"
        else:
            j = r.randint(0, n - 1)
            limit = {"in_idx": n_in, "out_idx": n_out, "pair_group": k}.get(what, m)
            v = r.choice([-1, limit, limit + 7, 2**31 - 1, -2**31])
            p = set_plan_entry(plan, what, j, v)
            detail = f"{what}[{j}] = {v}"
    backward, swap, dataflow = r.coin(0.3), r.coin(), r.randint(0, 2)
    dy = r.data((n_in if swap else n_out, w.shape[2]), torch.float32)
    xs = r.data((n_out, x.shape[1]), torch.float32) if swap else x
    if backward:
        call = lambda: conv_call("point_conv_backward", features=xs, weight=w,  # noqa: E731
                                 grad_out=dy, plan=p, swap=swap, dataflow=dataflow,
                                 need_features=True, need_weight=True)
    else:
        call = lambda: conv_call("point_conv", features=x, weight=w, bias=None,  # noqa: E731
                                 plan=p, num_out=n_out, swap=False, dataflow=dataflow)
    return Case("invalid", call, None, f"corrupted conv plan: {detail}",
                dict(what=detail, kind=g["kind"], k=k, m=m, backward=backward),
                names=("plan",))


def conv_identity_tampered(r: Rand) -> Case:
    """A submanifold plan whose identity (centre) group is run as one GEMM without reading its
    pairs: pairs inside it changed (in range) must be refused, or honoured; and the identity
    word cleared (-1) must give the same result as the plan did."""
    g = _geometry(r, kind="subm")
    g["kernel"] = [3] * g["dims"]
    coords, _ = _problem(r, g, n=r.randint(2, 20))
    plan, oc = _plan(coords, g)
    ident = int(plan[WORD_PARAM])
    assert ident >= 0, "a submanifold plan has an identity group"
    x = r.data((coords.shape[0], 3), torch.float64)
    w = r.data((int(plan[WORD_K]), 3, 2), torch.float64)
    outs, pairs = reference_map(coords, "subm", g["shape"], g["kernel"], g["stride"],
                                g["padding"], g["dilation"])
    p = plan.clone()
    start = int(get_plan_array(plan, "group_ptr")[ident])
    n = coords.shape[0]
    if r.coin() or n < 2:
        p[WORD_PARAM] = -1
        ref_pairs = [(i, o, k) for i, o, k in pairs]
        ref_pairs = [(i, [tuple(s) for s in oc.tolist()].index(o), k) for i, o, k in ref_pairs]
        return Case("valid", lambda: conv_call("point_conv", features=x, weight=w, bias=None,
                                               plan=p, num_out=n, swap=False, dataflow=0),
                    lambda y: close(y, conv_ref(x, w, None, ref_pairs, n),
                                    conv_ref(x, w, None, ref_pairs, n, True), torch.float64),
                    "identity word cleared", dict(n=n))
    j = r.randint(0, n - 1)
    arr = r.choice(["in_idx", "out_idx"])
    p = set_plan_entry(plan, arr, start + j, (j + r.randint(1, n - 1)) % n)
    return Case("invalid", lambda: conv_call("point_conv", features=x, weight=w, bias=None,
                                             plan=p, num_out=n, swap=False, dataflow=0), None,
                f"{arr}[{start + j}] of the identity group changed", dict(n=n, arr=arr),
                names=("plan",))


def conv_bad_operands(r: Rand) -> Case:
    g, coords, plan, oc, x, w = _subm_problem(r)
    n_in, n_out = x.shape[0], oc.shape[0]
    k, c_in, c_out = w.shape
    kw = dict(features=x, weight=w, bias=None, plan=plan, num_out=n_out, swap=False, dataflow=0)
    op = "point_conv"
    what = r.choice(["features_rows", "features_dtype", "features_rank", "weight_k",
                     "weight_cin", "weight_dtype", "weight_rank", "bias_shape", "bias_dtype",
                     "num_out", "dataflow", "swap_rows", "grad_out_shape", "grad_out_dtype",
                     "backward_dataflow"])
    names = (what.split("_")[0],)
    if what == "features_rows":
        kw["features"] = r.data((n_in + r.choice([-1, 1]), c_in), torch.float32)
    elif what == "features_dtype":
        kw["features"] = r.data((n_in, c_in), r.choice([torch.int32, torch.int64, torch.bool,
                                                        torch.complex64]))
    elif what == "features_rank":
        kw["features"] = r.choice([x.reshape(-1), x[None]])
    elif what == "weight_k":
        kw["weight"] = r.data((k + r.choice([-1, 1]), c_in, c_out), torch.float32)
    elif what == "weight_cin":
        kw["weight"] = r.data((k, c_in + 1, c_out), torch.float32)
        names = ("weight", "C_in")
    elif what == "weight_dtype":
        kw["weight"] = w.to(r.choice([torch.float64, torch.int32, torch.complex64]))
    elif what == "weight_rank":
        kw["weight"] = r.choice([w[0], w[None]])
    elif what == "bias_shape":
        kw["bias"] = r.choice([r.data((c_out + 1,), torch.float32),
                               r.data((1, c_out), torch.float32), torch.zeros(())])
    elif what == "bias_dtype":
        kw["bias"] = r.data((c_out,), r.choice([torch.int64, torch.bool, torch.complex64]))
    elif what == "num_out":
        kw["num_out"] = r.choice([n_out + 1, n_out - 1, -1])
    elif what in ("dataflow", "backward_dataflow"):
        kw["dataflow"] = r.choice([-1, 3, 7, 15, 1 << 6, 2**40])
        names = ("dataflow",)
        if what == "backward_dataflow":
            op = "point_conv_backward"
            kw.update(grad_out=r.data((n_out, c_out), torch.float32), need_features=True,
                      need_weight=True, dataflow=r.choice([-1, 3, 12, 1 << 4, 2**40]))
    elif what == "swap_rows":  # swap: the features are the plan's output sites
        if n_in == n_out:
            kw["features"] = r.data((n_out + 1, c_in), torch.float32)
        kw.update(swap=True, num_out=n_in)
        names = ("features",)
    elif what.startswith("grad_out"):
        op = "point_conv_backward"
        dy = r.data((n_out, c_out), torch.float32)
        if what == "grad_out_shape":
            dy = r.choice([r.data((n_out + 1, c_out), torch.float32),
                           r.data((n_out, c_out + 1), torch.float32), dy.reshape(-1)])
        else:
            dy = dy.to(r.choice([torch.int64, torch.bool, torch.complex64]))
        kw.update(grad_out=dy, need_features=True, need_weight=r.coin())
        names = ("grad_out",)
    if op == "point_conv_backward":
        kw.pop("bias")
        kw.pop("num_out")
    return Case("invalid", lambda: conv_call(op, **kw), None, f"{op} with a bad {what}",
                dict(what=what, kind=g["kind"]), names=names)


def conv_nonfinite_and_meta(r: Rand) -> Case:
    """NaN / ±inf features or weights (the result has them exactly where the reference
    does), or one argument on the meta device (refused, or a meta result)."""
    g, coords, plan, oc, x, w = _subm_problem(r, torch.float64)
    n_in, n_out = x.shape[0], oc.shape[0]
    kw = dict(features=x.clone(), weight=w.clone(), bias=None, plan=plan, num_out=n_out,
              swap=False, dataflow=r.randint(0, 2))
    which = r.choice(["features", "weight", "bias", "plan", "grad_out"])
    if r.coin():
        t = kw[which] if which in ("features", "weight") else None
        if t is None:
            which, t = "features", kw["features"]
        flat = t.view(-1)
        for _ in range(r.randint(1, 3)):
            flat[r.randint(0, flat.numel() - 1)] = r.choice([float("nan"), float("inf"),
                                                             -float("inf")])
        outs, pairs = reference_map(coords, g["kind"], g["shape"], g["kernel"], g["stride"],
                                    g["padding"], g["dilation"],
                                    oc if g["kind"] == "generalized" else None)
        rows = {tuple(s): i for i, s in enumerate(oc.tolist())}
        p = [(i, rows[o], k) for i, o, k in pairs]
        xs, ws = kw["features"], kw["weight"]
        return Case("valid", lambda: conv_call("point_conv", **kw),
                    lambda y: close_nan(y, conv_ref(xs, ws, None, p, n_out),
                                        conv_ref(xs, ws, None, p, n_out, True), torch.float64),
                    f"non-finite {which}", dict(which=which, kind=g["kind"]))
    op = "point_conv"
    if which == "bias":
        kw["bias"] = r.data((w.shape[2],), torch.float64)
    if which == "grad_out":
        op = "point_conv_backward"
        kw.pop("bias")
        kw.pop("num_out")
        kw.update(grad_out=r.data((n_out, w.shape[2]), torch.float64), need_features=True,
                  need_weight=True)
    kw[which] = kw[which].to("meta")
    shape = (n_out, w.shape[2]) if op == "point_conv" else tuple(x.shape)
    return Case("either", lambda: conv_call(op, **kw), expect_meta(shape),
                f"{op} with {which} on meta", dict(which=which, op=op),
                names=(which, "device", "meta"))


def conv_plan_device_generic(r: Rand) -> Case:
    """point_conv_plan through the device-generic builders the CUDA op runs
    (SPARSEJIT_STRUCTURE_ATEN=1): on a valid random cloud the plan and output sites must equal
    the core's word for word; with the bad arguments of conv_plan_bad_args, an exception that
    names the argument, never a crash."""
    if r.coin():
        base = conv_plan_bad_args(r)
        return dataclasses.replace(base, call=under_env("SPARSEJIT_STRUCTURE_ATEN", "1", base.call),
                                   why=base.why + " (device-generic builders)")
    g = _geometry(r)
    coords, out_coords = _problem(r, g)
    want = _plan(coords, g, out_coords)

    def check(got):
        same = all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want))
        return None if same else "the device-generic builder's plan differs from the core's"
    return Case("valid", under_env("SPARSEJIT_STRUCTURE_ATEN", "1",
                                   lambda: _plan(coords, g, out_coords)), check,
                "point_conv_plan through the device-generic builders",
                dict(kind=g["kind"], dims=g["dims"], n=int(coords.shape[0])))


CONV_CASES = [conv_valid, conv_valid, conv_backward_valid, conv_plan_bad_args,
              conv_plan_bad_args, conv_corrupt_plan, conv_corrupt_plan, conv_corrupt_plan,
              conv_identity_tampered, conv_bad_operands, conv_bad_operands,
              conv_nonfinite_and_meta, conv_plan_device_generic]
