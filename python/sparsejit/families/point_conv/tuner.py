"""Measured dataflows for point-cloud sparse convolution (``sj.tune(model, x)`` or
``sj.tune(plan, F=C_in, F_out=C_out)``).

The two dataflows of ``point_conv`` (gather-GEMM-scatter and output-stationary, see
docs/SPARSE_CONV.md) compute the same sums; which is faster depends on the kernel map (pairs
per offset, pairs per output row), the channel counts and the machine. ``tune`` runs both on
the real kernel map with random features, for the forward and for the backward's feature
gradient (the same core over the swapped map, C_out -> C_in), and both weight-gradient paths
(register rank-1 updates, gathered tiles through the dense GEMM), keeps the faster of each for
this process and on disk, keyed by the kernel map's fingerprint, C_in, C_out, dtype, direction
(swap), CPU model and thread count. ``point_conv`` (and so every ``sparsejit.spconv`` layer)
consults that store when its dataflow is "auto"; with nothing tuned the lookup costs one set
membership test.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from sparsejit.families.point_conv.plan import plan_info
from sparsejit.families.point_conv.schedules import (  # noqa: F401  (re-exported: the tuner's API)
    DATAFLOW_NAMES, STORE, WGRAD_NAMES, clear_schedule_cache, is_conv_plan, plan_fingerprint,
    recorders, remember, schedule_key, tuned_choices, tuned_dataflow)
from sparsejit.runtime import tuners
from sparsejit.runtime.timing import Progress, median_ms


def tune_conv_plan(plan: torch.Tensor, F: int = 16, F_out: Optional[int] = None,
                   dtype: torch.dtype = torch.float32, swap: bool = False, repeat: int = 5,
                   progress: Optional[bool] = None, store: bool = True) -> dict:
    """Measures both dataflows of one conv layer (C_in = F -> C_out = F_out) on `plan` for the
    forward and the feature gradient, and both weight-gradient paths; returns ``{"best":
    {"forward": name, "backward": name, "wgrad": name}, "times_ms": {...}, "key": ...,
    "fingerprint": ...}``."""
    if not is_conv_plan(plan):
        raise TypeError("sparsejit.tune: expected a conv plan from "
                        "sparsejit.families.point_conv.point_conv_plan")
    if dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        raise TypeError(f"sparsejit.tune: dtype must be a floating type; got {dtype}")
    f_out = F if F_out is None else F_out
    if F < 1 or f_out < 1:
        raise ValueError(f"sparsejit.tune: channel counts must be >= 1; got F={F}, "
                         f"F_out={f_out}")
    info = plan_info(plan)
    n_in, n_out = info["num_in"], info["num_out"]
    if swap:
        n_in, n_out = n_out, n_in
    k = info["kernel_volume"]
    x = torch.randn(n_in, F).to(dtype)
    w = torch.randn(k, F, f_out).to(dtype)
    dy = torch.randn(n_out, f_out).to(dtype)
    ops = torch.ops.sparsejit
    bar = Progress(6, f"sparsejit.tune conv C={F}->{f_out}", progress)
    times: Dict[str, float] = {}
    refs = {}
    parts = {"forward": DATAFLOW_NAMES, "backward": DATAFLOW_NAMES, "wgrad": WGRAD_NAMES}
    for part, choices in parts.items():
        for d, name in choices.items():
            if part == "forward":
                fn = lambda: ops.point_conv(x, w, None, plan, n_out, swap, d)  # noqa: E731
            elif part == "backward":
                fn = lambda: ops.point_conv_backward(  # noqa: E731
                    x, w, dy, plan, swap, d, True, False)[0]
            else:  # the weight gradient's path goes in the backward's bits 2-3
                fn = lambda: ops.point_conv_backward(  # noqa: E731
                    x, w, dy, plan, swap, d << 2, False, True)[1]
            out = fn()
            if part in refs:  # both dataflows compute the same function
                torch.testing.assert_close(out.float(), refs[part].float(), atol=1e-2,
                                           rtol=1e-2)
            refs[part] = out
            times[f"{part}/{name}"] = median_ms(fn, repeat)
            bar.step(f"{part}/{name}")
    best = {part: min(choices, key=lambda d: times[f"{part}/{choices[d]}"])
            for part, choices in parts.items()}
    fp = plan_fingerprint(plan)
    key = schedule_key(F, f_out, dtype, swap)
    remember(fp, key, (best["forward"], best["backward"], best["wgrad"]))
    if store:
        STORE.put(fp, key, dict(best, times_ms=times))
    return {"best": {p: parts[p][d] for p, d in best.items()}, "times_ms": times,
            "key": key, "fingerprint": fp}


def tune_conv_model(model: torch.nn.Module, example, dtype: Optional[torch.dtype] = None,
                    repeat: int = 5, progress: Optional[bool] = None,
                    store: bool = True) -> dict:
    """Runs `model` once on `example` (a ``sparsejit.spconv.SparseConvTensor``), records every
    sparse conv call's (plan, C_in, C_out, direction) and tunes each distinct one. Returns
    ``{"layers": [{"module": name, "best": ..., "times_ms": ...}, ...]}``."""
    seen: Dict[Tuple, Tuple[torch.Tensor, str]] = {}
    names = {id(m): n for n, m in model.named_modules()}
    current = []
    hooks = [m.register_forward_pre_hook(lambda m, a: current.append(names.get(id(m), "?")))
             for m in model.modules()]

    def record(features, weight, plan, swap):
        key = (plan_fingerprint(plan), weight.shape[1], weight.shape[2], features.dtype, swap)
        seen.setdefault(key, (plan, current[-1] if current else "?"))

    recorders.append(record)  # point_conv calls every recorder (schedules.recorders)
    try:
        with torch.no_grad():
            model(example)
    finally:
        recorders.remove(record)
        for h in hooks:
            h.remove()
    layers = []
    for (fp, ci, co, dt, swap), (plan, module) in seen.items():
        res = tune_conv_plan(plan, ci, co, dtype or dt, swap, repeat, progress, store)
        layers.append(dict(res, module=module, c_in=ci, c_out=co, swap=swap))
    return {"layers": layers}


def _accepts(obj, args, kwargs) -> bool:
    """A conv plan, or a model whose example input is not a dense tensor (a tuple of them):
    those are filter_conv's (sparsify's) models."""
    if isinstance(obj, torch.nn.Module):
        return not (args and isinstance(args[0], (torch.Tensor, tuple)))
    return is_conv_plan(obj)


def tune(A, op="spmm", F: int = 64, reduce: str = "sum", dtype: torch.dtype = torch.float32,
         heads: int = 1, repeat: int = 7, progress: Optional[bool] = None, store: bool = True,
         F_out: Optional[int] = None) -> dict:
    """``sj.tune(model, x)``: every sparse conv layer `model` runs on the SparseConvTensor `x`
    (passed as the second argument); ``sj.tune(plan, F=C_in, F_out=C_out)``: one conv plan
    (``op="conv_inverse"``: read backwards). The signature is ``sj.tune``'s."""
    if isinstance(A, torch.nn.Module):
        return tune_conv_model(A, op, dtype=None, repeat=repeat, progress=progress, store=store)
    return tune_conv_plan(A, F=F, F_out=F_out, dtype=dtype, swap=op == "conv_inverse",
                          repeat=repeat, progress=progress, store=store)


tuners.register_tuner("point_conv", _accepts, tune)
