"""Plans: which kernel and schedule an op uses on a given structure, and where they are kept.

A plan is an int64 tensor (the header of csrc/plan/plan_header.h, read here through
``_core.plan_layout()``, then arrays for decomposed plans) passed to the op, so it flows
through torch.compile, torch.save and ``.to()``. It names its op family and is stamped with
the structure it was built for; ops reject a plan from another op or structure. Without a
plan the op's cost model chooses. :mod:`sparsejit.families.spmm.tuner` measures candidates
and stores the winner's recipe on disk, keyed by structure fingerprint, op, row width, dtype,
reduce, CPU model and thread count, so the next process starts tuned.

Caches: per structure (``SparseMatrix``), keyed by (op, width, dtype, reduce, threads) like
the disk store; a process-wide LRU of tuned recipes keyed by fingerprint; the on-disk store under the
JIT cache directory. :func:`clear_caches` drops the in-memory ones.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List, Optional

import torch

from sparsejit import _core
from sparsejit.runtime import caches
from sparsejit.runtime.cpu import cpu_model as _cpu_model
from sparsejit.runtime.store import JsonStore
from sparsejit.runtime.store import fingerprint as _fingerprint
from sparsejit._library import ops
from sparsejit.families.spmm.matrix import SparseMatrix

_LAYOUT = _core.plan_layout()
_WORDS = _LAYOUT["words"]
_SPMM = _LAYOUT["ops"]["spmm"]
_BUCKETED = _LAYOUT["spmm_kernels"]["bucketed"]
_LRU_SIZE = 256
_tuned_lru: "OrderedDict[str, Dict[str, List[int]]]" = OrderedDict()
STORE = JsonStore("spmm-", what="the tuned plan")
caches.register_cache("spmm.tuned_recipes", _tuned_lru.clear)


def layout() -> dict:
    """The plan header's layout: magic, version, header size, word positions, op ids."""
    return _LAYOUT


# ---- keys -----------------------------------------------------------------------------


def fingerprint(A: SparseMatrix) -> str:
    """64-bit hash of A's index arrays and shape, as 16 hex digits (cached on A)."""
    fp = A._s.extra.get("fingerprint")
    if fp is None:
        fp = _fingerprint(A.indptr, A.indices, A.shape[1])
        A._s.extra["fingerprint"] = fp
    return fp


def _plan_key(op: str, width: int, dtype: torch.dtype, reduce: str) -> str:
    dt = str(dtype).replace("torch.", "")
    return f"{op}|w{width}|{dt}|{reduce}|{_cpu_model()}|t{torch.get_num_threads()}"


def _load_store(fp: str) -> Dict[str, List[int]]:
    if fp in _tuned_lru:
        _tuned_lru.move_to_end(fp)
        return _tuned_lru[fp]
    entries: Dict[str, List[int]] = {}
    try:
        entries = {k: list(v["header"]) for k, v in STORE.load(fp).items()}
    except (KeyError, TypeError):
        entries = {}  # a damaged store is ignored and rewritten by the next tune()
    if entries:
        # Recipes of another plan version (an older sparsejit) are ignored, not misread.
        entries = {k: h for k, h in entries.items() if _is_recipe(h)}
    _remember(fp, entries)
    return entries


def _remember(fp: str, entries: Dict[str, List[int]]) -> None:
    _tuned_lru[fp] = entries
    _tuned_lru.move_to_end(fp)
    while len(_tuned_lru) > _LRU_SIZE:
        _tuned_lru.popitem(last=False)


def _save_store(fp: str, key: str, header: List[int], report: dict) -> None:
    STORE.put(fp, key, {"header": header, **report})


# ---- lookup used by every op call -------------------------------------------------------


def _is_recipe(header) -> bool:
    try:
        return len(header) == _LAYOUT["header_words"] and \
            _core.describe_plan(list(header))["op"] == "spmm"
    except (ValueError, TypeError):
        return False


def spmm_plan_for(A: SparseMatrix, width: int, dtype: torch.dtype,
                  reduce: str = "sum") -> Optional[torch.Tensor]:
    """The plan tensor for spmm on A, or None to let the op's cost model choose.

    Looks in A's own cache, then (once per structure) in the tuned-plan store."""
    if torch.compiler.is_compiling():
        # The thread count cannot be read while tracing (a graph break): a plan made
        # eagerly for this structure and problem is used whatever its thread count.
        for k, plan in A._s.extra.get("plans", {}).items():
            if k[:4] == ("spmm", width, dtype, reduce):
                return plan
        return None
    key = memory_key("spmm", width, dtype, reduce)
    plans = A._s.extra.setdefault("plans", {})
    if key in plans:
        return plans[key]
    plan = None
    if A._s.extra.get("has_tuned", True):
        store = _load_store(fingerprint(A)) if _store_exists(A) else {}
        A._s.extra["has_tuned"] = bool(store)
        header = store.get(_plan_key("spmm", width, dtype, reduce))
        if header is not None:
            plan = materialize(A, header)
            A._s.extra.setdefault("tuned_keys", set()).add(key)
    if plan is None and dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        # The cost model's choice, made once per structure here rather than on every call.
        plan = ops.spmm_plan(A.indptr, A.indices, A.shape[1], width, dtype)
    plans[key] = plan
    caches.own(A._s, plan)
    return plan


def memory_key(op: str, width: int, dtype: torch.dtype, reduce: str) -> tuple:
    """The key of a plan cached on a structure: the disk key's fields (the CPU model is fixed
    for the life of a process; the thread count is not, so it is part of the key)."""
    return (op, width, dtype, reduce, torch.get_num_threads())


def is_tuned(A: SparseMatrix, width: int, dtype: torch.dtype, reduce: str = "sum") -> bool:
    return memory_key("spmm", width, dtype, reduce) in A._s.extra.get("tuned_keys", ())


def _store_exists(A: SparseMatrix) -> bool:
    # Fingerprinting costs a pass over the indices: only pay it when a store could exist.
    return STORE.any()


def is_bucketed(header) -> bool:
    return len(header) > _WORDS["kernel"] and int(header[_WORDS["kernel"]]) == _BUCKETED


def materialize(A: SparseMatrix, recipe) -> torch.Tensor:
    """The plan tensor of a recipe for A's structure: stamped, and for bucketed plans with
    the decomposed arrays (built once per structure: callers cache the result on A)."""
    recipe = [int(w) for w in recipe[:_LAYOUT["header_words"]]]
    indptr, indices = A.indptr.cpu(), A.indices.cpu()
    if is_bucketed(recipe):
        return ops.spmm_bucketed_plan(indptr, indices, A.shape[1], recipe[_WORDS["param"]],
                                      recipe[_WORDS["prefetch"]])
    words = _core.stamp_plan(recipe, indptr.numpy(), indices.numpy(), A.shape[1])
    return torch.tensor(words, dtype=torch.long)
