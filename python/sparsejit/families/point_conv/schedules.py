"""Stored dataflow choices for point-cloud sparse convolution: what ``sj.tune`` measured, read by
``point_conv`` when its dataflow is "auto". Below the ops: imports no op and no tuner.

Keyed by the kernel map's fingerprint (its header, K and pairs per offset: O(K)), C_in, C_out,
dtype, direction (swap), CPU model and thread count. With nothing tuned the per-call lookup
costs one set-membership test; a hit is cached per plan tensor (~1 us)."""

from __future__ import annotations

import functools
import weakref
from typing import Callable, Dict, List, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from sparsejit import _core
from sparsejit.families.point_conv.plan import is_point_conv_plan, plan_head
from sparsejit.runtime import caches
from sparsejit.runtime.cpu import cpu_model
from sparsejit.runtime.store import JsonStore, fingerprint

# Stored choices by id (csrc/point_conv/point_conv_run.h through _core.enums(); "auto" is the
# cost model's, never stored).
DATAFLOW_NAMES = {i: n for n, i in _core.enums()["point_conv_dataflow"].items() if n != "auto"}
WGRAD_NAMES = {i: n for n, i in _core.enums()["point_conv_wgrad"].items() if n != "auto"}

STORE = JsonStore("point_conv-", what="the point_conv schedule")
_MEMORY: Dict[Tuple[str, str], Tuple[int, int, int]] = {}  # (fp, key) -> (fwd, bwd, wgrad)
_FP = WeakIdKeyDictionary()  # plan tensor -> fingerprint, by identity
# id(plan) -> (weakref to plan, {(c_in, c_out, dtype, swap, threads): choices}): the per-call
# lookup (WeakIdKeyDictionary.get costs ~10 us, this ~1 us); entries leave with their plan.
_HITS: Dict[int, tuple] = {}
_TUNED_IN_PROCESS = [False]
# Called with (features, weight, plan, swap) by every eager point_conv call while a tuner
# records a model's layers (tuner.recording()).
recorders: List[Callable] = []

is_conv_plan = is_point_conv_plan


def _plan_hits(plan: torch.Tensor) -> dict:
    key = id(plan)
    entry = _HITS.get(key)
    if entry is None or entry[0]() is not plan:
        entry = (weakref.ref(plan, lambda _, k=key: _HITS.pop(k, None)), {})
        _HITS[key] = entry
    return entry[1]


def plan_fingerprint(plan: torch.Tensor) -> str:
    """Fingerprint of a conv plan's header (sizes, kind, the input keys' fingerprint) and its
    pairs per kernel offset: O(K), so it can be computed on every call."""
    fp = _FP.get(plan)
    if fp is None:
        fp = fingerprint(plan_head(plan).cpu())
        _FP[plan] = fp
    return fp


@functools.lru_cache(maxsize=1)
def _cpu() -> str:  # read once: schedule_key runs on every tuned-store lookup
    return cpu_model()


def schedule_key(c_in: int, c_out: int, dtype: torch.dtype, swap: bool) -> str:
    dt = str(dtype).replace("torch.", "")
    return (f"conv|ci{c_in}|co{c_out}|{dt}|{'swap' if swap else 'fwd'}|{_cpu()}|"
            f"t{torch.get_num_threads()}")


def clear_schedule_cache() -> None:
    _MEMORY.clear()
    _HITS.clear()
    STORE.forget()
    _TUNED_IN_PROCESS[0] = False


caches.register_cache("point_conv.schedules", clear_schedule_cache)


def remember(fp: str, key: str, choices: Tuple[int, int, int]) -> None:
    """Records a tuned result for this process (the tuner stores it on disk itself)."""
    _MEMORY[(fp, key)] = choices
    _HITS.clear()  # lookups cached before this tune are stale
    _TUNED_IN_PROCESS[0] = True


def tuned_choices(plan: torch.Tensor, c_in: int, c_out: int, dtype: torch.dtype,
                  swap: bool) -> Tuple[int, int, int]:
    """(forward dataflow, feature-gradient dataflow, weight-gradient path) stored for this
    call; (0, 0, 0) (the cost model's) when nothing was tuned for it."""
    if not (_TUNED_IN_PROCESS[0] or STORE.any()) or torch.compiler.is_compiling() or \
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
        entry = STORE.get(fp, key)
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
