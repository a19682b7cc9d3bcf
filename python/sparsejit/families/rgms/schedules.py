"""Stored RGMS schedules: what ``sj.tune`` measured for a typed structure (strategy, tile,
kernel), read by ``sj.rgms`` / ``RGCNConv`` when their strategy is "auto". Below the ops:
imports no op and no tuner. Keyed by the typed structure's fingerprint, widths, dtype, reduce,
CPU model and thread count."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from sparsejit import _core
from sparsejit.runtime import caches
from sparsejit.runtime.cpu import cpu_model
from sparsejit.runtime.store import JsonStore

STORE = JsonStore("rgms-", what="the RGMS schedule")
# The ops' `strategy` and `gemm` arguments by name (csrc/rgms/rgms_run.h through _core.enums()).
STRATEGIES: Dict[str, int] = dict(_core.enums()["rgms_strategy"])
GEMMS: Dict[str, int] = dict(_core.enums()["rgms_gemm"])
# The kernels tune measures: "tiles" = the planner's GEMM tiles (gemm "auto"), "fused" = the
# fused rows for every pass.
KERNELS: Dict[str, int] = {"tiles": GEMMS["auto"], "fused": GEMMS["fused"]}
_MEMORY: Dict[Tuple[str, str], Optional[Tuple[int, int, int]]] = {}  # None: nothing stored
_UNSEEN = object()


def typed_fingerprint(A) -> str:
    """Fingerprint of a typed structure (relation groups, targets, sources) and its shape: the
    stamp rgms_plan wrote in the plan's header (a fingerprint of every array word; the ops
    check it against the arrays when they first validate a plan), so O(1) here."""
    fp = getattr(A, "_fingerprint", None)
    if fp is None:
        layout = _core.plan_layout()
        w = layout["words"]
        header = A.plan[: layout["header_words"]].tolist()
        fp = "rgms-{:016x}-{}x{}-{}-r{}".format(header[w["stamp"]], header[w["rows"]],
                                               header[w["cols"]], header[w["nnz"]],
                                               header[w["param"]])
        A._fingerprint = fp
    return fp


def schedule_key(f_in: int, f_out: int, dtype: torch.dtype, reduce: str) -> str:
    dt = str(dtype).replace("torch.", "")
    return f"rgms|fi{f_in}|fo{f_out}|{dt}|{reduce}|{cpu_model()}|t{torch.get_num_threads()}"


def schedule_for(A, f_in: int, f_out: int, dtype: torch.dtype,
                 reduce: str) -> Optional[Tuple[int, int, int]]:
    """(strategy id, tile, gemm) stored by tune for this call, or None (the cost model's)."""
    if torch.compiler.is_compiling():
        return None
    fp = getattr(A, "_fingerprint", None)
    if fp is None:  # only structures someone tuned carry a store; skip the O(E) hash
        if not getattr(A, "_maybe_tuned", False) and not STORE.any():
            return None
        fp = typed_fingerprint(A)
    key = schedule_key(f_in, f_out, dtype, reduce)
    hit = _MEMORY.get((fp, key), _UNSEEN)
    if hit is _UNSEEN:  # read the store once per (structure, call); a miss is kept as None
        entry = STORE.get(fp, key)
        hit = None
        if isinstance(entry, dict) and "strategy" in entry and "tile" in entry:
            # stores from before the kernel choice: tiles
            gemm = int(entry.get("gemm", KERNELS["tiles"]))
            hit = (int(entry["strategy"]), int(entry["tile"]),
                   gemm if gemm in KERNELS.values() else KERNELS["tiles"])
        _MEMORY[(fp, key)] = hit
    return hit


def remember(fp: str, key: str, schedule: Tuple[int, int, int]) -> None:
    _MEMORY[(fp, key)] = schedule


def clear_schedule_cache() -> None:
    _MEMORY.clear()
    STORE.forget()


caches.register_cache("rgms.schedules", clear_schedule_cache)
