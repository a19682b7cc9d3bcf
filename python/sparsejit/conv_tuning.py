"""Measured dataflows for point-cloud sparse convolution (``sj.tune(model, x)`` or
``sj.tune(plan, F=C_in, F_out=C_out)``).

The two dataflows of ``sparse_conv`` (gather-GEMM-scatter and output-stationary, see
docs/SPARSE_CONV.md) compute the same sums; which is faster depends on the kernel map (pairs
per offset, pairs per output row), the channel counts and the machine. ``tune`` runs both on
the real kernel map with random features, for the forward and for the backward's feature
gradient (the same core over the swapped map, C_out -> C_in), and both weight-gradient paths
(register rank-1 updates, gathered tiles through the dense GEMM), keeps the faster of each for
this process and on disk, keyed by the kernel map's fingerprint, C_in, C_out, dtype, direction
(swap), CPU model and thread count. ``sparse_conv`` (and so every ``sparsejit.spconv`` layer)
consults that store when its dataflow is "auto"; with nothing tuned the lookup costs one set
membership test.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import threading
import weakref
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import _core
from .plans import _cpu_model
from .tuning import _median_ms, _Progress

_WORD_OP, _WORD_K, _HEADER = 2, 10, 11
_POINT_CONV = 4  # plan::OpFamily::PointConv
DATAFLOW_NAMES = {1: "gather_gemm_scatter", 2: "output_stationary"}
WGRAD_NAMES = {1: "registers", 2: "gemm"}  # point_conv::WgradPath

_MEMORY: Dict[Tuple[str, str], Tuple[int, int, int]] = {}  # (fp, key) -> (fwd, bwd, wgrad)
_FP = WeakIdKeyDictionary()  # plan tensor -> fingerprint, by identity
# id(plan) -> (weakref to plan, {(c_in, c_out, dtype, swap, threads): choices}): the per-call
# lookup (WeakIdKeyDictionary.get costs ~10 us, this ~1 us); entries leave with their plan.
_HITS: Dict[int, tuple] = {}


def _plan_hits(plan: torch.Tensor) -> dict:
    key = id(plan)
    entry = _HITS.get(key)
    if entry is None or entry[0]() is not plan:
        entry = (weakref.ref(plan, lambda _, k=key: _HITS.pop(k, None)), {})
        _HITS[key] = entry
    return entry[1]
_ANY_STORE: Dict[str, bool] = {}  # cache dir -> holds any conv schedule (looked up once)
_TUNED_IN_PROCESS = False


def is_conv_plan(t) -> bool:
    return (isinstance(t, torch.Tensor) and t.dtype == torch.int64 and t.dim() == 1 and
            t.numel() > _HEADER and not t.is_meta and int(t[_WORD_OP]) == _POINT_CONV)


def plan_fingerprint(plan: torch.Tensor) -> str:
    """64-bit hash of a conv plan's header (sizes, kind, the input keys' fingerprint) and its
    pairs per kernel offset: O(K), so it can be computed on every call."""
    fp = _FP.get(plan)
    if fp is None:
        k = int(plan[_WORD_K])
        head = plan[:_HEADER + k + 1].cpu().numpy().tobytes()
        fp = hashlib.blake2b(head, digest_size=8).hexdigest()
        _FP[plan] = fp
    return fp


@functools.lru_cache(maxsize=1)
def _cpu() -> str:  # read once: schedule_key runs on every tuned-store lookup
    return _cpu_model()


def schedule_key(c_in: int, c_out: int, dtype: torch.dtype, swap: bool) -> str:
    dt = str(dtype).replace("torch.", "")
    return (f"conv|ci{c_in}|co{c_out}|{dt}|{'swap' if swap else 'fwd'}|{_cpu()}|"
            f"t{torch.get_num_threads()}")


def _store_path(fp: str) -> Path:
    return Path(_core.cache_dir()) / "tuned" / f"conv-{fp}.json"


def _load(fp: str) -> dict:
    try:
        return json.loads(_store_path(fp).read_text())
    except (OSError, ValueError):
        return {}


def _any_conv_store() -> bool:
    key = _core.cache_dir()
    hit = _ANY_STORE.get(key)
    if hit is None:
        try:
            hit = any(p.name.startswith("conv-") for p in (Path(key) / "tuned").iterdir())
        except OSError:
            hit = False
        _ANY_STORE[key] = hit
    return hit


def clear_schedule_cache() -> None:
    global _TUNED_IN_PROCESS
    _MEMORY.clear()
    _HITS.clear()
    _ANY_STORE.clear()
    _TUNED_IN_PROCESS = False


def tuned_choices(plan: torch.Tensor, c_in: int, c_out: int, dtype: torch.dtype,
                  swap: bool) -> Tuple[int, int, int]:
    """(forward dataflow, feature-gradient dataflow, weight-gradient path) stored for this
    call; (0, 0, 0) (the cost model's) when nothing was tuned for it."""
    if not (_TUNED_IN_PROCESS or _any_conv_store()) or torch.compiler.is_compiling() or \
            plan.device.type != "cpu":
        return (0, 0, 0)
    per_plan = _plan_hits(plan)
    fast = (c_in, c_out, dtype, swap, torch.get_num_threads())
    hit = per_plan.get(fast)
    if hit is not None:
        return hit
    fp = plan_fingerprint(plan)
    key = schedule_key(c_in, c_out, dtype, swap)
    hit = _MEMORY.get((fp, key))
    if hit is None:
        entry = _load(fp).get(key)
        ok = isinstance(entry, dict) and entry.get("forward") in DATAFLOW_NAMES and \
            entry.get("backward") in DATAFLOW_NAMES and entry.get("wgrad") in WGRAD_NAMES
        hit = (int(entry["forward"]), int(entry["backward"]), int(entry["wgrad"])) if ok \
            else (0, 0, 0)
        _MEMORY[(fp, key)] = hit
    per_plan[fast] = hit
    return hit


def tuned_dataflow(plan: torch.Tensor, c_in: int, c_out: int, dtype: torch.dtype, swap: bool,
                   backward: bool = False) -> int:
    """The stored dataflow id for this call (forward, or the backward's feature gradient),
    or 0 (auto: the cost model) when nothing was tuned for it."""
    return tuned_choices(plan, c_in, c_out, dtype, swap)[1 if backward else 0]


def tune_conv_plan(plan: torch.Tensor, F: int = 16, F_out: Optional[int] = None,
                   dtype: torch.dtype = torch.float32, swap: bool = False, repeat: int = 5,
                   progress: Optional[bool] = None, store: bool = True) -> dict:
    """Measures both dataflows of one conv layer (C_in = F -> C_out = F_out) on `plan` for the
    forward and the feature gradient, and both weight-gradient paths; returns ``{"best":
    {"forward": name, "backward": name, "wgrad": name}, "times_ms": {...}, "key": ...,
    "fingerprint": ...}``."""
    global _TUNED_IN_PROCESS
    if not is_conv_plan(plan):
        raise TypeError("sparsejit.tune: expected a conv plan from sparsejit.ops.conv_plan")
    if dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        raise TypeError(f"sparsejit.tune: dtype must be a floating type; got {dtype}")
    f_out = F if F_out is None else F_out
    if F < 1 or f_out < 1:
        raise ValueError(f"sparsejit.tune: channel counts must be >= 1; got F={F}, "
                         f"F_out={f_out}")
    from .ops.sparse_conv import plan_info

    info = plan_info(plan)
    n_in, n_out = info["num_in"], info["num_out"]
    if swap:
        n_in, n_out = n_out, n_in
    k = info["kernel_volume"]
    x = torch.randn(n_in, F).to(dtype)
    w = torch.randn(k, F, f_out).to(dtype)
    dy = torch.randn(n_out, f_out).to(dtype)
    ops = torch.ops.sparsejit
    bar = _Progress(6, f"sparsejit.tune conv C={F}->{f_out}",
                    sys.stderr.isatty() if progress is None else progress)
    times: Dict[str, float] = {}
    refs = {}
    parts = {"forward": DATAFLOW_NAMES, "backward": DATAFLOW_NAMES, "wgrad": WGRAD_NAMES}
    for part, choices in parts.items():
        for d, name in choices.items():
            if part == "forward":
                fn = lambda: ops.sparse_conv(x, w, None, plan, n_out, swap, d)  # noqa: E731
            elif part == "backward":
                fn = lambda: ops.sparse_conv_backward(  # noqa: E731
                    x, w, dy, plan, swap, d, True, False)[0]
            else:  # the weight gradient's path goes in the backward's bits 2-3
                fn = lambda: ops.sparse_conv_backward(  # noqa: E731
                    x, w, dy, plan, swap, d << 2, False, True)[1]
            out = fn()
            if part in refs:  # both dataflows compute the same function
                torch.testing.assert_close(out.float(), refs[part].float(), atol=1e-2,
                                           rtol=1e-2)
            refs[part] = out
            times[f"{part}/{name}"] = _median_ms(fn, repeat)
            bar.step(f"{part}/{name}")
    best = {part: min(choices, key=lambda d: times[f"{part}/{choices[d]}"])
            for part, choices in parts.items()}
    fp = plan_fingerprint(plan)
    key = schedule_key(F, f_out, dtype, swap)
    _MEMORY[(fp, key)] = (best["forward"], best["backward"], best["wgrad"])
    _HITS.clear()  # lookups cached before this tune are stale
    _TUNED_IN_PROCESS = True
    if store:
        path = _store_path(fp)
        data = _load(fp)
        data[key] = dict(best, times_ms=times)
        tmp = path.with_suffix(f".tmp.{os.getpid()}.{threading.get_ident()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data, indent=1))
            os.replace(tmp, path)
            _ANY_STORE.clear()
        except OSError as e:
            import warnings

            warnings.warn(f"sparsejit.tune: could not store the conv schedule in {path}: {e}")
    return {"best": {p: parts[p][d] for p, d in best.items()}, "times_ms": times,
            "key": key, "fingerprint": fp}


def tune_conv_model(model: torch.nn.Module, example, dtype: Optional[torch.dtype] = None,
                    repeat: int = 5, progress: Optional[bool] = None,
                    store: bool = True) -> dict:
    """Runs `model` once on `example` (a ``sparsejit.spconv.SparseConvTensor``), records every
    sparse conv call's (plan, C_in, C_out, direction) and tunes each distinct one. Returns
    ``{"layers": [{"module": name, "best": ..., "times_ms": ...}, ...]}``."""
    import importlib

    sc = importlib.import_module(__package__ + ".ops.sparse_conv")  # the module, not the op

    seen: Dict[Tuple, Tuple[torch.Tensor, str]] = {}
    names = {id(m): n for n, m in model.named_modules()}
    current = []
    hooks = [m.register_forward_pre_hook(lambda m, a: current.append(names.get(id(m), "?")))
             for m in model.modules()]
    original = sc._record

    def record(features, weight, plan, swap):
        key = (plan_fingerprint(plan), weight.shape[1], weight.shape[2], features.dtype, swap)
        seen.setdefault(key, (plan, current[-1] if current else "?"))

    sc._record = record
    try:
        with torch.no_grad():
            model(example)
    finally:
        sc._record = original
        for h in hooks:
            h.remove()
    layers = []
    for (fp, ci, co, dt, swap), (plan, module) in seen.items():
        res = tune_conv_plan(plan, ci, co, dtype or dt, swap, repeat, progress, store)
        layers.append(dict(res, module=module, c_in=ci, c_out=co, swap=swap))
    return {"layers": layers}
