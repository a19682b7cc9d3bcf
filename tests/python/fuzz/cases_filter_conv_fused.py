"""Fuzz case kinds for the fused bottleneck of filter-sparse layers (``filter_conv_bottleneck``):
valid random blocks (every sparsity, odd conv2 kernels, tiny and one-row images, empty batch,
forced bands, any float dtype and layout) against float64 conv2d, and bad arguments (a plan,
rowptr, taps or values that is wrong, channels that do not chain, an even or strided conv2,
x of the wrong rank / dtype / channels, a negative band). Every valid draw forces one
precompiled variant in all three plans (a JIT compile costs seconds)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import sparsejit  # noqa: F401  (registers the ops)

from .refs import FLOATS, Case, Rand, close

PLAN = torch.ops.sparsejit.filter_conv_plan
BLOCK = torch.ops.sparsejit.filter_conv_bottleneck
PRECOMPILED = (1, 2, 3, 4, 5, 8)


def _block(r: Rand):
    c, m1, m2 = r.randint(1, 6), r.randint(1, 5), r.randint(1, 5)
    k = r.choice([(3, 3), (3, 3), (1, 1), (5, 5), (3, 5), (1, 3)])
    sp = r.choice([0.0, 0.5, 0.9, 1.0])

    def w(shape):
        t = r.data(shape, torch.float32)
        return t * (torch.rand(shape, generator=r.g) >= sp)
    ws = [w((m1, c, 1, 1)), w((m2, m1) + k), w((c, m2, 1, 1))]
    if r.coin(0.1):  # one output channel dense, the others empty (very skewed)
        ws[1] = torch.zeros_like(ws[1])
        ws[1][0] = r.data(tuple(ws[1].shape[1:]), torch.float32)
    bs = [r.data((n,), torch.float32) if r.coin(0.7) else None for n in (m1, m2, c)]
    h, wd = r.randint(1, 9), r.randint(1, 9)
    x = r.data((r.randint(0, 3), c, h, wd), torch.float32)
    return ws, bs, x, k


def _ref(ws, bs, x, k):
    d = [t.double() if t is not None else None for t in bs]
    xd = x.float().double()
    a = F.relu(F.conv2d(xd, ws[0].double(), d[0]))
    a = F.relu(F.conv2d(a, ws[1].double(), d[1], padding=(k[0] // 2, k[1] // 2)))
    y = F.relu(F.conv2d(a, ws[2].double(), d[2]) + xd)
    # magnitudes: the same network on |.| without ReLUs (the error scale of each output)
    m = F.conv2d(xd.abs(), ws[0].double().abs(), None if d[0] is None else d[0].abs())
    m = F.conv2d(m, ws[1].double().abs(), None if d[1] is None else d[1].abs(),
                 padding=(k[0] // 2, k[1] // 2))
    m = F.conv2d(m, ws[2].double().abs(), None if d[2] is None else d[2].abs()) + xd.abs()
    return y, m


def _args(plans, bs):
    out = []
    for p, b in zip(plans, bs):
        out += [*p, b]
    return out


def bottleneck_valid(r: Rand) -> Case:
    """A fused block on a random input, any dtype and layout, a forced band or the planner's."""
    ws, bs, x, k = _block(r)
    dtype = r.choice(FLOATS)
    x = x.to(dtype)
    layout = r.choice(["contiguous", "channels_last"])
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    variant = r.choice(PRECOMPILED)
    band = r.choice([0, 0, 1, 2, 3, 100])
    ref, mag = _ref(ws, bs, x, k)

    def call():
        plans = [PLAN(w, 0.0, variant) for w in ws]
        return BLOCK(x, *_args(plans, bs), band=band)

    def check(y):
        if not isinstance(y, torch.Tensor) or y.dtype != dtype or y.shape != x.shape:
            return f"got {getattr(y, 'dtype', type(y))} {getattr(y, 'shape', '')}, " \
                   f"expected {dtype} {tuple(x.shape)}"
        cmp = dtype if dtype != torch.float64 else torch.float32
        return close(y.to(cmp), ref, mag, cmp, "y")
    return Case("valid", call, check, "valid filter_conv_bottleneck",
                dict(w=[tuple(w.shape) for w in ws], x=tuple(x.shape), dtype=str(dtype),
                     layout=layout, variant=variant, band=band),
                f16=dtype == torch.float16)


def bottleneck_bad_args(r: Rand) -> Case:
    ws, bs, x, k = _block(r)
    if x.shape[0] == 0:
        x = r.data((1,) + tuple(x.shape[1:]), torch.float32)
    plans = [list(PLAN(w, 0.0, r.choice(PRECOMPILED))) for w in ws]
    band = 0
    what = r.choice(["plan_len", "plan_header", "rowptr_len", "rowptr_break", "taps_range",
                     "taps_order", "values_len", "values_dtype", "taps_dtype", "chain",
                     "residual", "even", "x_dtype", "x_rank", "x_channels", "bias", "band",
                     "swap"])
    i = r.randint(0, 2)
    names = (what.split("_")[0],)
    p = plans[i]
    if what == "plan_len":
        p[0] = p[0][:-1]
    elif what == "plan_header":
        p[0] = p[0].clone()
        p[0][0] += 1
    elif what == "rowptr_len":
        p[1] = p[1][:-1]
    elif what == "rowptr_break":
        p[1] = p[1].clone()
        p[1][-1] = p[1][-1] + 5
        names = ("rowptr", "taps")
    elif what == "taps_range" and p[2].numel():
        p[2] = p[2].clone()
        p[2][r.randint(0, p[2].numel() - 1)] = r.choice([-1, 2**40, 10**6])
        names = ("taps", "pattern", "plan")
    elif what == "taps_order" and p[1].numel() > 1 and int((p[1][1:] - p[1][:-1]).max()) >= 2:
        p[2] = p[2].flip(0).contiguous()
        names = ("taps", "pattern", "plan")
    elif what == "values_len":
        p[3] = torch.cat([p[3], torch.ones(1)])
    elif what == "values_dtype":
        p[3] = p[3].double()
    elif what == "taps_dtype":
        p[2] = p[2].int()
    elif what == "chain":  # conv2 taking another channel count than conv1 gives
        plans[1] = list(PLAN(torch.ones(ws[1].shape[0], ws[1].shape[1] + 1, *k), 0.0, 1))
        names = ("conv2", "channels")
    elif what == "residual":  # conv3 not giving x's channels
        plans[2] = list(PLAN(torch.ones(ws[2].shape[0] + 1, ws[2].shape[1], 1, 1), 0.0, 1))
        names = ("conv3", "residual", "bias")
        bs = [bs[0], bs[1], None]
    elif what == "even":
        plans[1] = list(PLAN(torch.ones(ws[1].shape[0], ws[1].shape[1], 2, 2), 0.0, 1))
        names = ("conv2", "odd")
    elif what == "x_dtype":
        x = x.to(r.choice([torch.int64, torch.complex64, torch.bool]))
        names = ("x",)
    elif what == "x_rank":
        x = x[0]
    elif what == "x_channels":
        x = r.data((1, x.shape[1] + 1) + tuple(x.shape[2:]), torch.float32)
        names = ("conv1", "channels", "x")
    elif what == "bias":
        bs = list(bs)
        n = ws[i].shape[0] + 1
        bs[i] = r.data((n,), torch.float32)
    elif what == "band":
        band = r.choice([-1, -2**40])
    elif what == "swap" and k != (1, 1):  # conv1 and conv2 swapped (a k x k where a 1x1 belongs)
        plans[0], plans[1] = plans[1], plans[0]
        bs = [bs[1], bs[0], bs[2]]
        names = ("1x1", "conv1", "conv2", "channels")
    else:
        return bottleneck_valid(r)
    return Case("invalid", lambda: BLOCK(x, *_args(plans, bs), band=band), None,
                f"filter_conv_bottleneck with a bad {what}", dict(what=what, layer=i + 1),
                names=names)


FUSED_CASES = [bottleneck_valid, bottleneck_valid, bottleneck_bad_args, bottleneck_bad_args]
