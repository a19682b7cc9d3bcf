"""Fuzz case kinds for RGMS and segment_matmul: the raw ops (``rgms_plan``, ``rgms``,
``rgms_backward``, ``segment_matmul``, ``linear``, ``linear_add_``) with corrupted plans,
relation ids, dense operands, root terms and schedule arguments, and valid draws checked
against float64 references."""

from __future__ import annotations

import dataclasses

import torch

from sparsejit import _core
from sparsejit.families.rgms.ops import plan_arrays

from .refs import Case, Rand, under_env

RGMS_FLOATS = [torch.float32, torch.float64, torch.bfloat16]


def _typed(r: Rand, e=None):
    n_src, n_dst = r.randint(1, 12), r.randint(1, 12)
    rel = r.randint(1, 6)
    e = r.randint(0, 30) if e is None else e
    src = torch.randint(0, n_src, (e,), generator=r.g)
    dst = torch.randint(0, n_dst, (e,), generator=r.g)
    et = torch.randint(0, rel, (e,), generator=r.g)
    return torch.stack([src, dst]), et, n_src, n_dst, rel


def _ref_rgms(ei, et, n_dst, x, w, reduce, values=None, root=None, bias=None, x_root=None):
    xd, wd = x.double(), w.double()
    y = torch.zeros(n_dst, w.shape[2], dtype=torch.float64)
    for k in range(w.shape[0]):
        m = et == k
        s, d = ei[0][m], ei[1][m]
        v = values[m].double() if values is not None else torch.ones(int(m.sum()),
                                                                      dtype=torch.float64)
        agg = torch.zeros(n_dst, x.shape[1], dtype=torch.float64).index_add_(
            0, d, xd[s] * v[:, None])
        if reduce == "mean":
            agg = agg / torch.bincount(d, minlength=n_dst).clamp(min=1).double()[:, None]
        y += agg @ wd[k]
    if root is not None:
        y += (x if x_root is None else x_root).double() @ root.double()
    if bias is not None:
        y += bias.double()
    return y


def _check_close(ref, dtype):
    tol = {torch.float32: 1e-4, torch.float64: 1e-10, torch.bfloat16: 6e-2}[dtype]

    def check(out):
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(ref.shape):
            return f"got {type(out).__name__} {getattr(out, 'shape', '')}, expected {tuple(ref.shape)}"
        if out.dtype != dtype:
            return f"dtype {out.dtype}, expected {dtype}"
        err = (out.double() - ref).abs()
        bound = tol * (1 + ref.abs()) * 8
        if not bool((err <= bound).all()):
            return f"max error {float(err.max()):.3g} (nan {int(out.double().isnan().sum())})"
        return None
    return check


def rgms_valid(r: Rand) -> Case:
    """Random typed graph (some relations empty, E may be 0), every dtype, reduce, values,
    forced strategy / tile / GEMM backend, optional fused root and bias."""
    ei, et, n_src, n_dst, rel = _typed(r)
    dtype = r.choice(RGMS_FLOATS)
    f_in, f_out = r.randint(0, 9), r.randint(0, 9)
    x = r.data((n_src, f_in), dtype)
    w = r.data((rel, f_in, f_out), dtype)
    values = r.data((ei.shape[1],), dtype) if r.coin() else None
    reduce = r.choice(["sum", "mean"])
    root = bias = x_root = None
    if r.coin():
        x_root = r.data((n_dst, r.randint(0, 5)), dtype)
        root = r.data((x_root.shape[1], f_out), dtype)
    if r.coin():
        bias = r.data((f_out,), dtype)
    gemm, tile, strategy = r.randint(0, 3), r.choice([0, 1, 3, 64]), r.randint(0, 2)
    plan = torch.ops.sparsejit.rgms_plan(ei, et, n_src, n_dst, rel)
    ref = _ref_rgms(ei, et, n_dst, x, w, reduce, values, root, bias, x_root)
    return Case("valid", lambda: torch.ops.sparsejit.rgms(
        plan, x, w, values, reduce, n_dst, gemm, tile, strategy, root, bias, x_root),
        _check_close(ref, dtype), "valid rgms",
        dict(e=ei.shape[1], rel=rel, f=(f_in, f_out), dtype=str(dtype), strategy=strategy,
             root=root is not None, bias=bias is not None))


def rgms_bad_plan_or_operands(r: Rand) -> Case:
    """One corruption of the plan tensors, the dense operands or the scalar arguments."""
    ei, et, n_src, n_dst, rel = _typed(r, e=r.randint(1, 30))
    x = r.data((n_src, 4), torch.float32)
    w = r.data((rel, 4, 3), torch.float32)
    plan = torch.ops.sparsejit.rgms_plan(ei, et, n_src, n_dst, rel)
    arrays = plan_arrays(plan, rel)  # views: writes change the plan
    kw = dict(values=None, reduce="sum", num_rows=n_dst, gemm=0, tile=0, strategy=0, root=None,
              bias=None, x_root=None)
    kind = r.choice(["rel_ptr_decreasing", "grp_ptr_past_end", "src_out_of_range",
                     "perm_out_of_range", "grp_dst_out_of_range", "plan_truncated",
                     "plan_float", "plan_2d", "plan_header_only", "header_op", "header_magic",
                     "header_relations", "src_swapped", "x_fewer_rows", "w_wrong_r", "w_wrong_f", "values_short",
                     "values_dtype", "reduce", "num_rows_negative", "gemm", "tile", "strategy",
                     "root_shape", "bias_shape", "x_root_rows", "x_root_alone", "w_meta"])
    words = _core.plan_layout()["words"]
    if kind == "rel_ptr_decreasing":
        arrays["rel_ptr"][-1] = -1
    elif kind == "grp_ptr_past_end":
        # the end of the last group (entries past it are padding)
        arrays["grp_ptr"][int(arrays["rel_ptr"][-1])] += r.choice([1, 1000])
    elif kind == "src_out_of_range":
        src = arrays["src"]
        src[r.randint(0, src.numel() - 1)] = r.choice([-1, n_src, 10**9])
    elif kind == "perm_out_of_range":
        arrays["perm"][0] = r.choice([-5, arrays["perm"].numel()])
    elif kind == "grp_dst_out_of_range":
        arrays["grp_dst"][0] = r.choice([-1, n_dst + 3])
    elif kind == "plan_truncated":
        plan = plan[:-r.randint(1, 4)]
    elif kind == "plan_float":
        plan = plan.double()
    elif kind == "plan_2d":
        plan = plan.view(1, -1)
    elif kind == "plan_header_only":
        plan = plan[: r.randint(0, words["param"] + 1)]
    elif kind == "header_op":
        plan[words["op"]] = r.choice([-1, 1, 4, 99])
    elif kind == "header_magic":
        plan[words["magic"]] = r.choice([0, -1])
    elif kind == "header_relations":
        plan[words["param"]] = r.choice([0, rel + 1, 10**9])
    elif kind == "src_swapped":  # still in range: only the stamp tells
        src = arrays["src"]
        src[0] = (int(src[0]) + 1) % n_src if n_src > 1 else 10**9
    elif kind == "x_fewer_rows":
        x = x[: n_src - 1]
    elif kind == "w_wrong_r":
        w = r.data((rel + r.choice([-1, 1]) if rel > 1 else rel + 1, 4, 3), torch.float32)
    elif kind == "w_wrong_f":
        w = r.data((rel, 5, 3), torch.float32)
    elif kind == "values_short":
        kw["values"] = r.data((ei.shape[1] - 1,), torch.float32)
    elif kind == "values_dtype":
        kw["values"] = r.data((ei.shape[1],), r.choice([torch.float64, torch.int64]))
    elif kind == "reduce":
        kw["reduce"] = r.choice(["max", "", "MEAN"])
    elif kind == "num_rows_negative":
        kw["num_rows"] = -r.randint(1, 5)
    elif kind == "gemm":
        kw["gemm"] = r.choice([-1, 4])
    elif kind == "tile":
        kw["tile"] = r.choice([-1, 2**40])
    elif kind == "strategy":
        kw["strategy"] = r.choice([-1, 3])
    elif kind == "root_shape":
        kw["root"] = r.data((4, r.choice([2, 4])), torch.float32)
        kw["x_root"] = r.data((n_dst, 4), torch.float32)
    elif kind == "bias_shape":
        kw["bias"] = r.data((r.choice([2, 4]),), torch.float32)
    elif kind == "x_root_rows":
        kw["root"] = r.data((2, 3), torch.float32)
        kw["x_root"] = r.data((n_dst + 1, 2), torch.float32)
    elif kind == "x_root_alone":
        kw["x_root"] = r.data((n_dst, 2), torch.float32)
    elif kind == "w_meta":
        w = w.to("meta")
    call = lambda: torch.ops.sparsejit.rgms(plan, x, w, **kw)  # noqa: E731
    if kind == "x_fewer_rows" and not bool((ei[0] >= n_src - 1).any()):
        # the dropped row is nobody's source: a result is fine, and must be right
        ref = _ref_rgms(ei, et, n_dst, x, w, "sum")
        return Case("either", call, _check_close(ref, torch.float32), "rgms X without an "
                    "unreferenced last row", dict(kind=kind, e=ei.shape[1], rel=rel))
    return Case("invalid", call, None, f"rgms {kind}", dict(kind=kind, e=ei.shape[1], rel=rel))


def rgms_plan_bad_relations(r: Rand) -> Case:
    ei, et, n_src, n_dst, rel = _typed(r, e=r.randint(1, 30))
    kind = r.choice(["negative", "too_large", "float", "short", "edge_out_of_range",
                     "edge_index_shape", "num_relations_zero"])
    args = [ei, et, n_src, n_dst, rel]
    if kind == "negative":
        args[1] = et.clone()
        args[1][r.randint(0, et.numel() - 1)] = -1
    elif kind == "too_large":
        args[1] = et.clone()
        args[1][r.randint(0, et.numel() - 1)] = rel + r.choice([0, 7])
    elif kind == "float":
        args[1] = et.double()
    elif kind == "short":
        args[1] = et[:-1]
    elif kind == "edge_out_of_range":
        args[0] = ei.clone()
        args[0][r.randint(0, 1), 0] = r.choice([-1, max(n_src, n_dst) + 5])
    elif kind == "edge_index_shape":
        args[0] = ei[0]
    elif kind == "num_relations_zero":
        args[4] = 0
    return Case("invalid", lambda: torch.ops.sparsejit.rgms_plan(*args), None,
                f"rgms_plan {kind}", dict(kind=kind))


def rgms_backward_draws(r: Rand) -> Case:
    """Valid backward draws (gradients against autograd of the float64 reference), or a
    grad_y of the wrong shape / dtype."""
    ei, et, n_src, n_dst, rel = _typed(r)
    f_in, f_out = r.randint(1, 6), r.randint(1, 6)
    x = r.data((n_src, f_in), torch.float64)
    w = r.data((rel, f_in, f_out), torch.float64)
    reduce = r.choice(["sum", "mean"])
    plan = torch.ops.sparsejit.rgms_plan(ei, et, n_src, n_dst, rel)
    strategy = r.randint(0, 2)
    if r.coin(0.3) and ei.shape[1] > 0:
        # grad_y's rows are the output rows: fewer than the largest target + 1 is invalid
        dy = r.data(r.choice([(n_dst, f_out + 1), (int(ei[1].max()), f_out)]), torch.float64) \
            if r.coin() else r.data((n_dst, f_out), torch.float32)
        return Case("invalid", lambda: torch.ops.sparsejit.rgms_backward(
            plan, x, w, None, dy, reduce, True, True, False, 0, 0, strategy), None,
            "rgms_backward with a bad grad_y", dict(dy=tuple(dy.shape), dtype=str(dy.dtype)))
    dy = r.data((n_dst, f_out), torch.float64)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    ref = torch.autograd.grad(_ref_rgms(ei, et, n_dst, xr, wr, reduce), (xr, wr), dy,
                              allow_unused=True)

    def check(out):
        for got, want, name in zip(out[:2], ref, ("dX", "dW")):
            want = torch.zeros_like(got) if want is None else want
            if tuple(got.shape) != tuple(want.shape) or not torch.allclose(got, want, atol=1e-9):
                return f"{name} wrong: shape {tuple(got.shape)}"
        return None
    return Case("valid", lambda: torch.ops.sparsejit.rgms_backward(
        plan, x, w, None, dy, reduce, True, True, False, 0, 0, strategy), check,
        "valid rgms_backward", dict(e=ei.shape[1], strategy=strategy))


def segment_matmul_draws(r: Rand) -> Case:
    n, k = r.randint(0, 20), r.randint(1, 5)
    f_in, f_out = r.randint(0, 6), r.randint(0, 6)
    cuts = sorted(r.randint(0, n) for _ in range(k - 1))
    ptr = torch.tensor([0] + cuts + [n])
    x = r.data((n, f_in), torch.float32)
    w = r.data((k, f_in, f_out), torch.float32)
    kind = r.choice(["valid", "valid", "decreasing", "end", "length", "float_ptr", "w_shape",
                     "ptr_2d"])
    if kind == "valid":
        ref = torch.zeros(n, f_out, dtype=torch.float64)
        for s in range(k):
            ref[ptr[s]:ptr[s + 1]] = x[ptr[s]:ptr[s + 1]].double() @ w[s].double()
        return Case("valid", lambda: torch.ops.sparsejit.segment_matmul(x, ptr, w),
                    _check_close(ref, torch.float32), "valid segment_matmul",
                    dict(n=n, k=k, f=(f_in, f_out)))
    if kind == "decreasing":
        ptr = ptr.clone()
        ptr[1] = n + 1 if k > 1 else -1
    elif kind == "end":
        ptr = ptr.clone()
        ptr[-1] = n + r.choice([1, -1]) if n > 0 else 1
    elif kind == "length":
        ptr = torch.cat([ptr, ptr[-1:]])
    elif kind == "float_ptr":
        ptr = ptr.double()
    elif kind == "w_shape":
        w = r.data((k, f_in + 1, f_out), torch.float32)
    elif kind == "ptr_2d":
        ptr = ptr[None]
    return Case("invalid", lambda: torch.ops.sparsejit.segment_matmul(x, ptr, w), None,
                f"segment_matmul {kind}", dict(kind=kind, n=n, k=k))


def linear_draws(r: Rand) -> Case:
    """sparsejit::linear (x @ weight^T + bias on the dense GEMM layer): valid shapes from
    empty to a few row blocks against float64, and bad ranks, widths, bias shapes and dtypes,
    which must raise naming the argument."""
    n = r.choice([0, 1, r.randint(2, 300), r.randint(250, 700)])
    f_in, f_out = r.randint(0, 9), r.randint(0, 9)
    x = r.data((n, f_in), torch.float32)
    w = r.data((f_out, f_in), torch.float32)
    b = r.data((f_out,), torch.float32) if r.coin() else None
    kind = r.choice(["valid", "valid", "valid", "x_1d", "w_3d", "width", "bias_shape",
                     "x_dtype", "w_dtype", "bias_dtype"])
    if kind == "valid":
        ref = x.double() @ w.double().t()
        if b is not None:
            ref = ref + b.double()
        return Case("valid", lambda: torch.ops.sparsejit.linear(x, w, b),
                    _check_close(ref, torch.float32), "valid linear",
                    dict(n=n, f=(f_in, f_out), bias=b is not None))
    if kind == "x_1d":
        x = x.reshape(-1)
    elif kind == "w_3d":
        w = w[None]
    elif kind == "width":
        w = r.data((f_out, f_in + 1), torch.float32)
    elif kind == "bias_shape":
        b = r.data((f_out + 1,), torch.float32)
    elif kind == "x_dtype":
        x = x.double()
    elif kind == "w_dtype":
        w = w.half()
    elif kind == "bias_dtype":
        b = r.data((f_out,), torch.float64)
    return Case("invalid", lambda: torch.ops.sparsejit.linear(x, w, b), None, f"linear {kind}",
                dict(kind=kind, n=n, f=(f_in, f_out)))


def linear_add_draws(r: Rand) -> Case:
    """sparsejit::linear_add_ (out += x @ weight^T in place): valid shapes against float64 on a
    random out, and bad ranks, widths, out shapes, layouts and dtypes, which must raise
    naming the argument."""
    n = r.choice([0, 1, r.randint(2, 300), r.randint(250, 700)])
    f_in, f_out = r.randint(0, 9), r.randint(0, 9)
    x = r.data((n, f_in), torch.float32)
    w = r.data((f_out, f_in), torch.float32)
    out = r.data((n, f_out), torch.float32)
    kind = r.choice(["valid", "valid", "valid", "x_1d", "width", "out_shape", "out_strided",
                     "out_dtype", "x_dtype"])
    if kind == "valid":
        ref = out.double() + x.double() @ w.double().t()

        def run():
            torch.ops.sparsejit.linear_add_(out, x, w)
            return out
        return Case("valid", run, _check_close(ref, torch.float32), "valid linear_add_",
                    dict(n=n, f=(f_in, f_out)))
    if kind == "x_1d":
        x = x.reshape(-1)
    elif kind == "width":
        w = r.data((f_out, f_in + 1), torch.float32)
    elif kind == "out_shape":
        out = r.data((n + 1, f_out), torch.float32)
    elif kind == "out_strided":
        out = r.data((f_out + 1, n), torch.float32).t()[:, :f_out]
        if out.is_contiguous():
            out = r.data((n, f_out + 1), torch.float32)
    elif kind == "out_dtype":
        out = out.double()
    elif kind == "x_dtype":
        x = x.half()
    return Case("invalid", lambda: torch.ops.sparsejit.linear_add_(out, x, w), None,
                f"linear_add_ {kind}", dict(kind=kind, n=n, f=(f_in, f_out)))


def rgms_plan_device_generic(r: Rand) -> Case:
    """rgms_plan through the device-generic builder the CUDA op runs
    (SPARSEJIT_STRUCTURE_ATEN=1): equal to the counting sorts' plan on valid edges; the bad
    edges of rgms_plan_bad_relations still raise."""
    if r.coin():
        base = rgms_plan_bad_relations(r)
        return dataclasses.replace(base, call=under_env("SPARSEJIT_STRUCTURE_ATEN", "1", base.call),
                                   why=base.why + " (device-generic builder)")
    ei, et, n_src, n_dst, rel = _typed(r)
    if r.coin():
        ei, et = ei.int(), et.int()
    want = torch.ops.sparsejit.rgms_plan(ei, et, n_src, n_dst, rel)

    def check(got):
        return None if torch.equal(got, want) else "the device-generic plan differs"
    return Case("valid", under_env("SPARSEJIT_STRUCTURE_ATEN", "1",
                                   lambda: torch.ops.sparsejit.rgms_plan(ei, et, n_src, n_dst, rel)),
                check, "rgms_plan through the device-generic builder",
                dict(e=int(et.numel()), relations=rel))


RGMS_CASES = [rgms_valid, rgms_bad_plan_or_operands, rgms_bad_plan_or_operands,
              rgms_plan_bad_relations, rgms_backward_draws, segment_matmul_draws,
              rgms_plan_device_generic, linear_draws, linear_add_draws]
