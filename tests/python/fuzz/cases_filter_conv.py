"""Fuzz case kinds for filter-sparse convolution (pruned Conv2d inference): the raw ops
``filter_conv_plan`` and ``filter_conv`` with valid random layers (against float64 conv2d of
the pruned weight), a corrupted plan / rowptr / taps / values, bad x, bias, geometry
(kernel_size, stride, padding, dilation: 0, negative, huge), groups and variant.

The JIT variants (0 = auto, which is "jit" with the JIT on; 6 jit; 7 jit_baked) compile a
kernel per layer, seconds each: the valid draws force the precompiled variants (1-5, 8)."""

from __future__ import annotations

import torch

import sparsejit  # noqa: F401  (registers the ops)

from .refs import FLOATS, Case, Rand, close, expect_meta

PLAN = torch.ops.sparsejit.filter_conv_plan
CONV = torch.ops.sparsejit.filter_conv
PRECOMPILED = (1, 2, 3, 4, 5, 8)


def _layer(r: Rand):
    groups = r.choice([1, 1, 2, 3])
    cin_g, cout_g = r.randint(1, 3), r.randint(0, 3)
    rr, ss = r.randint(1, 3), r.randint(1, 3)
    w = r.data((cout_g * groups, cin_g, rr, ss), torch.float32)
    w = w * (torch.rand(w.shape, generator=r.g) > r.choice([0.0, 0.5, 0.9, 1.0]))
    stride = [r.randint(1, 3), r.randint(1, 3)]
    dilation = [r.randint(1, 2), r.randint(1, 2)]
    padding = [r.randint(0, 2), r.randint(0, 2)]
    h = r.randint(max(1, dilation[0] * (rr - 1) + 1 - 2 * padding[0]), 9)
    wd = r.randint(max(1, dilation[1] * (ss - 1) + 1 - 2 * padding[1]), 9)
    x = r.data((r.randint(0, 2), cin_g * groups, h, wd), torch.float32)
    return dict(w=w, x=x, groups=groups, kernel=[rr, ss], stride=stride, padding=padding,
                dilation=dilation, threshold=r.choice([0.0, 0.0, 0.5]))


def _kept(w, threshold):
    w32 = w.float()
    keep = (w32 != 0) & ~(w32.abs() <= threshold)
    return torch.where(keep, w32, torch.zeros_like(w32)).double()


def _ref(L, x, bias, relu, absolute=False):
    w = _kept(L["w"], L["threshold"])
    xd = x.float().double()
    b = None if bias is None else bias.float().double()
    if absolute:
        w, xd, b = w.abs(), xd.abs(), None if b is None else b.abs()
    if w.shape[0] == 0:  # conv2d refuses C_out = 0: the same shape through one output channel
        y = torch.nn.functional.conv2d(xd, w.new_zeros((L["groups"],) + tuple(w.shape[1:])),
                                       None, L["stride"], L["padding"], L["dilation"],
                                       L["groups"])
        return y[:, :0]
    y = torch.nn.functional.conv2d(xd, w, b, L["stride"], L["padding"], L["dilation"],
                                   L["groups"])
    return y.clamp(min=0) if relu and not absolute else y


def _call(plan, L, x=None, bias=None, relu=False, variant=-1, residual=None, **over):
    a = dict(plan=plan[0], rowptr=plan[1], taps=plan[2], values=plan[3],
             x=L["x"] if x is None else x, bias=bias, kernel_size=L["kernel"],
             stride=L["stride"], padding=L["padding"], dilation=L["dilation"],
             groups=L["groups"], relu=relu, variant=variant, residual=residual)
    a.update(over)
    return CONV(**a)


def filter_valid(r: Rand) -> Case:
    """A pruned layer (every sparsity, groups, stride, padding, dilation, empty batch,
    C_out = 0), any input dtype (computed in float32), channels_last or strided input,
    fused bias, residual and ReLU, a precompiled variant."""
    L = _layer(r)
    dtype = r.choice(FLOATS)
    x = L["x"].to(dtype)
    layout = r.choice(["contiguous", "channels_last", "strided"])
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "strided":
        big = torch.full(x.shape[:3] + (2 * x.shape[3],), float("nan"), dtype=dtype)
        big[..., ::2] = x
        x = big[..., ::2]
    c_out = L["w"].shape[0]
    bias = r.data((c_out,), r.choice([torch.float32, dtype])) if r.coin() else None
    relu = r.coin()
    plan_variant = r.choice((0,) + PRECOMPILED)
    variant = r.choice(PRECOMPILED) if r.coin(0.8) or plan_variant == 0 else -1
    ref, mag = _ref(L, x, bias, relu), _ref(L, x, bias, relu, absolute=True)
    residual = None
    if r.coin(0.3):  # added after the bias, before the ReLU
        residual = r.data(tuple(ref.shape), r.choice([dtype, torch.float32]))
        ref = _ref(L, x, bias, False) + residual.float().double()
        ref = ref.clamp(min=0) if relu else ref
        mag = mag + residual.float().double().abs()

    strided_arrays = r.coin(0.2)

    def call():
        plan = PLAN(L["w"], L["threshold"], plan_variant)
        if strided_arrays:  # the same rowptr / taps / values as non-contiguous views
            plan = tuple(plan[:1]) + tuple(
                torch.stack([t, torch.full_like(t, -7)], 1)[:, 0] for t in plan[1:])
        return _call(plan, L, x=x, bias=bias, relu=relu, variant=variant, residual=residual)

    def check(y):
        if not isinstance(y, torch.Tensor) or y.dtype != dtype:
            return f"got {getattr(y, 'dtype', type(y))}, expected {dtype}"
        # float64 inputs are computed in float32 (documented): float32 tolerances
        cmp = dtype if dtype != torch.float64 else torch.float32
        return close(y.to(cmp), ref, mag, cmp, "y")
    return Case("valid", call, check, "valid filter_conv",
                dict(w=tuple(L["w"].shape), x=tuple(x.shape), groups=L["groups"],
                     stride=L["stride"], padding=L["padding"], dilation=L["dilation"],
                     dtype=str(dtype), layout=layout, variant=variant, relu=relu,
                     residual=residual is not None),
                f16=dtype == torch.float16)


HUGE = (2**31, 2**40, 2**62, 2**63 - 1)


def filter_bad_args(r: Rand) -> Case:
    L = _layer(r)
    if L["w"].shape[0] == 0 or not bool((L["w"] != 0).any()):
        L["w"] = L["w"].clone()
        L["w"] = torch.ones((max(L["w"].shape[0], L["groups"]),) + tuple(L["w"].shape[1:]))
    if L["x"].shape[0] == 0:
        L["x"] = r.data((1,) + tuple(L["x"].shape[1:]), torch.float32)
    L["threshold"] = 0.0
    plan = list(PLAN(L["w"], 0.0, r.choice(PRECOMPILED)))
    c_out, nnz = L["w"].shape[0], plan[2].numel()
    over, kw = {}, {}
    what = r.choice(["plan_dtype", "plan_len", "plan_header", "plan_other_weight",
                     "plan_geometry", "rowptr_len", "rowptr_break", "taps_range",
                     "taps_order", "values_len", "values_dtype", "x_dtype", "x_rank",
                     "x_channels", "x_small", "bias", "residual", "kernel_size", "stride",
                     "padding",
                     "dilation", "groups", "variant", "meta"])
    names = (what.split("_")[0],)
    if what == "plan_dtype":
        plan[0] = plan[0].to(r.choice([torch.int32, torch.float64]))
    elif what == "plan_len":
        plan[0] = r.choice([plan[0][:-1], torch.cat([plan[0], plan[0][:1]])])
    elif what == "plan_header":
        p = plan[0].clone()
        word = r.choice([0, 1, 2, 3, 6, 7, 8, 9])
        p[word] = r.choice([5, 99]) if word != 2 else r.choice([1, 4, 99])
        if word in (0, 1, 2, 6, 7, 8, 9) and int(p[word]) == int(plan[0][word]):
            p[word] += 1
        if word == 3:
            p[word] = r.choice([-1, 9, 2**40])
            names = ("plan", "variant")
        plan[0] = p
    elif what == "plan_other_weight":  # a plan of another pattern of the same shape
        w2 = L["w"].clone()
        w2.view(-1)[r.randint(0, w2.numel() - 1)] = 0.0 if r.coin() else 3.0
        if torch.equal((w2 != 0), (L["w"] != 0)):
            w2.view(-1)[0] = 0.0 if float(w2.view(-1)[0]) != 0 else 1.0
        plan[0] = PLAN(w2, 0.0, 1)[0]
    elif what == "plan_geometry":  # the geometry words after the header
        p = plan[0].clone()
        word = 10 + r.randint(0, 3)
        p[word] = r.choice([0, -1, 2**62 + 1, 2**62, 2**63 - 1, int(p[word]) + 1])
        plan[0] = p
        names = ("plan", "rowptr", "kernel_size", "channels", "x")
    elif what == "rowptr_len":
        plan[1] = r.choice([plan[1][:-1], torch.cat([plan[1], plan[1][-1:]])])
    elif what == "rowptr_break":
        rp = plan[1].clone()
        kind = r.choice(["first", "last", "decreasing"])
        if kind == "first":
            rp[0] = r.choice([1, -1])
        elif kind == "last":
            rp[-1] = nnz + r.choice([1, -1, 2**40])
        else:
            j = r.randint(1, c_out)
            rp[j] = int(rp[j - 1]) - 1
        plan[1] = rp
    elif what == "taps_range":
        t = plan[2].clone()
        t[r.randint(0, nnz - 1)] = r.choice([-1, L["w"][0].numel(), 2**40, -2**62])
        plan[2] = t
    elif what == "taps_order":
        t = plan[2].clone()
        rp = plan[1]
        rows = [i for i in range(c_out) if int(rp[i + 1]) - int(rp[i]) >= 2]
        if rows:
            i = int(rp[rows[0]])
            t[i], t[i + 1] = int(t[i + 1]), int(t[i])
        else:  # no row with two taps: a tap dtype change instead
            t = t.to(torch.int32)
        plan[2] = t
    elif what == "values_len":
        plan[3] = r.choice([plan[3][:-1], torch.cat([plan[3], plan[3][:1]]), plan[3][None]])
    elif what == "values_dtype":
        plan[3] = plan[3].to(r.choice([torch.float64, torch.float16, torch.int64]))
    elif what == "x_dtype":
        kw["x"] = L["x"].to(r.choice([torch.int64, torch.bool, torch.complex64]))
    elif what == "x_rank":
        kw["x"] = r.choice([L["x"][0], L["x"][None]])
    elif what == "x_channels":
        x = L["x"]
        kw["x"] = r.data((x.shape[0], x.shape[1] + 1) + tuple(x.shape[2:]), torch.float32)
        names = ("x", "channels")
    elif what == "x_small":
        x = L["x"]
        kw["x"] = x[:, :, :0] if r.coin() else x[:, :, :, :0]
        over["padding"] = [0, 0]
        names = ("x", "input")
    elif what == "bias":
        kw["bias"] = r.choice([r.data((c_out + 1,), torch.float32),
                               r.data((c_out,), torch.int64), r.data((c_out,), torch.complex64),
                               r.data((1, c_out), torch.float32)])
    elif what == "residual":
        shape = tuple(_ref(L, L["x"], None, False).shape)
        kw["residual"] = r.choice([
            r.data(shape[:-1] + (shape[-1] + 1,), torch.float32), r.data(shape[1:], torch.float32),
            r.data(shape, torch.float32).to(torch.int64), r.data(shape, torch.complex64),
            r.data((shape[0] + 1,) + shape[1:], torch.float32)])
    elif what in ("stride", "padding", "dilation"):
        v = list(L[what])
        v[r.randint(0, 1)] = r.choice(([0] if what != "padding" else []) + [-1, -2**62]
                                      + list(HUGE))
        over[what] = r.choice([v, v[:1] * 3, []]) if r.coin(0.2) else v
    elif what == "kernel_size":
        over["kernel_size"] = r.choice([[L["kernel"][0] + 1, L["kernel"][1]], [0, 0],
                                        [2**40, 1], [1, 2, 3]])
    elif what == "groups":
        over["groups"] = r.choice([0, -1, L["groups"] + 1, 2**62, 2**63 - 1])
    elif what == "variant":
        over["variant"] = r.choice([-2, 9, 2**40])
    elif what == "meta":
        n = r.choice(["x", "bias", "plan", "rowptr", "taps", "values"])
        names = (n, "device", "meta", "cpu")
        if n == "bias":
            kw["bias"] = r.data((c_out,), torch.float32).to("meta")
        elif n == "x":
            kw["x"] = L["x"].to("meta")
        else:
            plan[["plan", "rowptr", "taps", "values"].index(n)] = \
                plan[["plan", "rowptr", "taps", "values"].index(n)].to("meta")
        return Case("either", lambda: _call(plan, L, **kw, **over), expect_meta(
            _ref(L, L["x"], None, False).shape), f"filter_conv with {n} on meta",
            dict(what=what, which=n), names=names)
    return Case("invalid", lambda: _call(plan, L, **kw, **over), None,
                f"filter_conv with a bad {what}", dict(what=what, w=tuple(L["w"].shape)),
                names=names)


def filter_plan_bad_args(r: Rand) -> Case:
    w = r.data((r.randint(1, 3), r.randint(1, 3), r.randint(1, 3), r.randint(1, 3)),
               torch.float32)
    a = dict(weight=w, threshold=0.0, variant=r.choice(PRECOMPILED))
    what = r.choice(["weight_dtype", "weight_rank", "weight_zero", "threshold", "variant",
                     "nan_weight"])
    names = (what.split("_")[0],)
    if what == "weight_dtype":
        a["weight"] = w.to(r.choice([torch.int64, torch.bool, torch.complex64]))
    elif what == "weight_rank":
        a["weight"] = r.choice([w[0], w[None], w.reshape(-1)])
    elif what == "weight_zero":
        a["weight"] = w[:, :0] if r.coin() else w[:, :, :, :0]
    elif what == "threshold":
        a["threshold"] = r.choice([-1.0, float("nan"), -float("inf")])
    elif what == "variant":
        a["variant"] = r.choice([-1, 9, 2**40])
    elif what == "nan_weight":  # NaN is kept (it shows in the output), never dropped
        w = w.clone()
        w.view(-1)[r.randint(0, w.numel() - 1)] = float("nan")
        a["weight"] = w

        def check(res):
            plan, rowptr, taps, values = res
            if int(rowptr[-1]) != int((w != 0).sum()) or not bool(values.isnan().any()):
                return (f"the NaN tap was dropped: {int(rowptr[-1])} taps, "
                        f"{int((w != 0).sum())} nonzero")
            return None
        return Case("valid", lambda: PLAN(**a), check, "weight with a NaN", dict(what=what))
    return Case("invalid", lambda: PLAN(**a), None, f"filter_conv_plan with a bad {what}",
                dict(what=what), names=names)


def filter_modules(r: Rand) -> Case:
    """sparsejit.families.filter_conv.PrunedConv2d: from a pruned nn.Conv2d (forward against it in
    float64), or built / called with bad arguments."""
    from sparsejit.families.filter_conv.layers import PrunedConv2d

    L = _layer(r)
    c_out, cin_g = L["w"].shape[0], L["w"].shape[1]
    if c_out == 0:
        L["w"] = torch.ones((L["groups"], cin_g) + tuple(L["w"].shape[2:]))
        c_out = L["groups"]
    conv = torch.nn.Conv2d(cin_g * L["groups"], c_out, L["kernel"], L["stride"], L["padding"],
                           L["dilation"], L["groups"], bias=r.coin())
    with torch.no_grad():
        conv.weight.copy_(L["w"])
    what = r.choice(["valid", "valid", "x_channels", "stride", "groups", "padding_mode",
                     "kernel", "weight"])
    x = L["x"]
    if what == "valid":
        sc = PrunedConv2d.from_dense(conv)
        variant = r.choice(PRECOMPILED)
        ref = torch.nn.functional.conv2d(x.double(), conv.weight.double(), None if conv.bias
                                         is None else conv.bias.double(), L["stride"],
                                         L["padding"], L["dilation"], L["groups"])
        mag = torch.nn.functional.conv2d(x.double().abs(), conv.weight.double().abs(), None,
                                         L["stride"], L["padding"], L["dilation"], L["groups"])
        return Case("valid", lambda: sc(x, variant=variant),
                    lambda y: close(y, ref, mag + 1, torch.float32), "PrunedConv2d.from_dense",
                    dict(w=tuple(L["w"].shape), x=tuple(x.shape), variant=variant))
    names = (what,)
    if what == "x_channels":
        sc = PrunedConv2d.from_dense(conv)
        xb = r.data((1, x.shape[1] + 1) + tuple(x.shape[2:]), torch.float32)
        call, names = (lambda: sc(xb)), ("x", "channels")
    elif what == "stride":
        st = r.choice([0, -1, 2**40])
        call = lambda: PrunedConv2d(L["w"], stride=st, groups=L["groups"])(x)  # noqa: E731
    elif what == "groups":
        g = r.choice([0, -1, c_out + 1])
        call = lambda: PrunedConv2d(L["w"], groups=g)(x)  # noqa: E731
    elif what == "padding_mode":
        bad = torch.nn.Conv2d(conv.in_channels, c_out, L["kernel"], padding=1,
                              padding_mode=r.choice(["reflect", "circular", "replicate"]),
                              groups=L["groups"])
        call = lambda: PrunedConv2d.from_dense(bad)  # noqa: E731
    elif what == "kernel":
        kernel = r.choice(["fast", "", "vec16"])
        call = lambda: PrunedConv2d(L["w"], kernel=kernel)  # noqa: E731
    else:
        bad_w = r.choice([L["w"][0], L["w"].to(torch.int64), L["w"].to(torch.complex64)])
        call = lambda: PrunedConv2d(bad_w)(x)  # noqa: E731
    return Case("invalid", call, None, f"PrunedConv2d with a bad {what}", dict(what=what),
                names=names)


FILTER_CASES = [filter_valid, filter_valid, filter_bad_args, filter_bad_args, filter_bad_args,
                filter_plan_bad_args, filter_modules]
