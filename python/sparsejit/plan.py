"""Plans: which kernel and schedule an op uses on a given structure, and how they are found.

A plan is a small int64 tensor (magic, version, kernel, prefetch distance; see
csrc/plan/spmm_plan.h) passed to the op, so it flows through torch.compile, torch.save and
``.to()``. Without a plan the op's cost model chooses. :func:`tune` measures the candidates on
the real data and stores the winner on disk, keyed by structure fingerprint, op, row width,
dtype, reduce, CPU model and thread count, so the next process starts tuned.

Caches: per structure (``SparseMatrix``), a process-wide LRU of tuned plans keyed by
fingerprint, and the on-disk store under the JIT cache directory. :func:`clear_caches` drops
the in-memory ones.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Dict, List, Optional

import torch

from . import _core
from ._ops import ops
from .matrix import SparseMatrix

_DTYPE_KIND = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2}
_REDUCES = ("sum", "mean", "max", "min")
_LRU_SIZE = 256
_BUCKETED = 3  # kernel id of a bucketed plan (csrc/plan/spmm_plan.h)
_tuned_lru: "OrderedDict[str, Dict[str, List[int]]]" = OrderedDict()


# ---- keys -----------------------------------------------------------------------------


def fingerprint(A: SparseMatrix) -> str:
    """64-bit hash of A's index arrays and shape, as 16 hex digits (cached on A)."""
    fp = A._s.extra.get("fingerprint")
    if fp is None:
        fp = "%016x" % _core.fingerprint(
            A.indptr.cpu().numpy(), A.indices.cpu().numpy(), A.shape[1]
        )
        A._s.extra["fingerprint"] = fp
    return fp


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown-cpu"


def _plan_key(op: str, width: int, dtype: torch.dtype, reduce: str) -> str:
    dt = str(dtype).replace("torch.", "")
    return f"{op}|w{width}|{dt}|{reduce}|{_cpu_model()}|t{torch.get_num_threads()}"


def _store_path(fp: str) -> Path:
    return Path(_core.cache_dir()) / "tuned" / f"{fp}.json"


def _load_store(fp: str) -> Dict[str, List[int]]:
    if fp in _tuned_lru:
        _tuned_lru.move_to_end(fp)
        return _tuned_lru[fp]
    path = _store_path(fp)
    entries: Dict[str, List[int]] = {}
    if path.exists():
        try:
            entries = {k: list(v["header"]) for k, v in json.loads(path.read_text()).items()}
        except (OSError, ValueError, KeyError, TypeError):
            entries = {}  # a damaged store is ignored and rewritten by the next tune()
    _remember(fp, entries)
    return entries


def _remember(fp: str, entries: Dict[str, List[int]]) -> None:
    _tuned_lru[fp] = entries
    _tuned_lru.move_to_end(fp)
    while len(_tuned_lru) > _LRU_SIZE:
        _tuned_lru.popitem(last=False)


def _save_store(fp: str, key: str, header: List[int], report: dict) -> None:
    path = _store_path(fp)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        data = {}
    data[key] = {"header": header, **report}
    tmp = path.with_suffix(f".tmp.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError as e:
        import warnings

        warnings.warn(f"sparsejit.tune: could not store the tuned plan in {path}: {e}")


# ---- lookup used by every op call -------------------------------------------------------


def spmm_plan_for(A: SparseMatrix, width: int, dtype: torch.dtype,
                  reduce: str = "sum") -> Optional[torch.Tensor]:
    """The plan tensor for spmm on A, or None to let the op's cost model choose.

    Looks in A's own cache, then (once per structure) in the tuned-plan store."""
    key = ("spmm", width, dtype)
    if torch.compiler.is_compiling():
        return A._s.extra.get("plans", {}).get(key)
    plans = A._s.extra.setdefault("plans", {})
    if key in plans:
        return plans[key]
    plan = None
    if A._s.extra.get("has_tuned", True):
        store = _load_store(fingerprint(A)) if _store_exists(A) else {}
        A._s.extra["has_tuned"] = bool(store)
        header = store.get(_plan_key("spmm", width, dtype, reduce)) or store.get(
            _plan_key("spmm", width, dtype, "sum")
        )
        if header is not None:
            plan = _materialize(A, header)
            A._s.extra.setdefault("tuned_keys", set()).add(key)
    if plan is None and dtype in _DTYPE_KIND:
        # The cost model's choice, made once per structure here rather than on every call.
        plan = ops.spmm_plan(A.indptr, A.shape[1], width, dtype)
    plans[key] = plan
    return plan


def _is_tuned(A: SparseMatrix, width: int, dtype: torch.dtype) -> bool:
    return ("spmm", width, dtype) in A._s.extra.get("tuned_keys", ())


def _store_exists(A: SparseMatrix) -> bool:
    # Fingerprinting costs a pass over the indices: only pay it when a store could exist.
    tuned_dir = Path(_core.cache_dir()) / "tuned"
    return tuned_dir.is_dir() and any(tuned_dir.iterdir())


# ---- tuning -----------------------------------------------------------------------------


def _candidates() -> List[List[int]]:
    cands = [_core.encode_plan("generic", 0)]
    if _core.jit_enabled():
        cands += [_core.encode_plan("jit", pf) for pf in (0, 4, 8, 16, 32)]
    # Rows regrouped by length (csrc/plan/spmm_plan.h): up to 8 or 32 entries per bucket.
    cands += [_core.encode_plan("bucketed", pf, k) for k, pf in ((3, 0), (5, 0), (5, 16))]
    return cands


def _is_bucketed(header) -> bool:
    return len(header) >= 5 and int(header[2]) == _BUCKETED


def _materialize(A: SparseMatrix, header) -> torch.Tensor:
    """The plan tensor for a header or recipe: bucketed plans get their arrays, built from
    A's structure (once per structure: callers cache the result on A)."""
    if _is_bucketed(header):
        return ops.spmm_bucketed_plan(A.indptr.cpu(), A.indices.cpu(), int(header[4]),
                                      int(header[3]))
    return torch.tensor(list(header), dtype=torch.long)


def _describe(header: List[int]) -> str:
    d = _core.decode_plan(list(header[:8]))
    if d["kernel"] == "bucketed":
        return f"bucketed(max_log2={d['max_log2']}, prefetch={d['prefetch']})"
    return d["kernel"] if d["kernel"] == "generic" else f"jit(prefetch={d['prefetch']})"


def _median_ms(fn, repeat: int) -> float:
    fn()  # warm-up (also compiles)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


class _Progress:
    """A one-line progress bar on stderr (only when it is a terminal, or forced)."""

    def __init__(self, total: int, label: str, enabled: bool):
        self.total, self.label, self.done = total, label, 0
        self.enabled = enabled

    def step(self, what: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 24
        filled = int(width * self.done / self.total)
        bar = "#" * filled + "-" * (width - filled)
        end = "\n" if self.done == self.total else ""
        sys.stderr.write(f"\r{self.label} [{bar}] {self.done}/{self.total} {what:<28}{end}")
        sys.stderr.flush()


def tune(A: SparseMatrix, op: str = "spmm", F: int = 64, reduce: str = "sum",
         dtype: torch.dtype = torch.float32, heads: int = 1, repeat: int = 7,
         progress: Optional[bool] = None, store: bool = True) -> dict:
    """Measures every candidate plan for ``op`` on A with random ``[cols, heads, F]``
    features, keeps the fastest for this process (on A) and on disk (unless store=False).

    Returns ``{"best": name, "times_ms": {name: median_ms}, "key": ..., "header": [...]}``.
    """
    if op != "spmm":
        raise ValueError(f"tune supports op='spmm' (SDDMM has no tunable schedule yet); got {op!r}")
    if reduce not in _REDUCES:
        raise ValueError(f"reduce must be one of {_REDUCES}; got {reduce!r}")
    if dtype not in _DTYPE_KIND:
        raise TypeError(f"dtype must be float32, float64 or bfloat16; got {dtype}")
    shape = (A.shape[1], F) if heads == 1 else (A.shape[1], heads, F)
    X = torch.randn(shape).to(dtype)
    vals = A.values.to(dtype) if A.values is not None else None
    cands = _candidates()
    bar = _Progress(len(cands), f"sparsejit.tune spmm F={F}",
                    sys.stderr.isatty() if progress is None else progress)
    times: Dict[str, float] = {}
    ref = None
    for header in cands:
        plan = _materialize(A, header)
        fn = lambda: ops.spmm(A.indptr, A.indices, vals, X, reduce,  # noqa: E731
                              plan=plan, need_arg=False)
        out = fn()[0]
        if ref is None:
            ref = out
        else:  # every candidate must compute the same function
            torch.testing.assert_close(out.float(), ref.float(), atol=1e-2, rtol=1e-2)
        times[_describe(header)] = _median_ms(fn, repeat)
        bar.step(_describe(header))
    best_name = min(times, key=times.get)
    best = next(h for h in cands if _describe(h) == best_name)
    width = F * heads
    key = _plan_key("spmm", width, dtype, reduce)
    A._s.extra.setdefault("plans", {})[("spmm", width, dtype)] = _materialize(A, best)
    A._s.extra.setdefault("tuned_keys", set()).add(("spmm", width, dtype))
    report = {"best": best_name, "times_ms": times, "key": key, "header": best}
    if store:
        fp = fingerprint(A)
        _save_store(fp, key, best, {"best": best_name, "times_ms": times})
        entries = dict(_load_store(fp))
        entries[key] = best
        _remember(fp, entries)
        A._s.extra["has_tuned"] = True
    return report


# ---- introspection ----------------------------------------------------------------------


def explain(A: SparseMatrix, op: str = "spmm", F: int = 64, reduce: str = "sum",
            dtype: torch.dtype = torch.float32, heads: int = 1, file=None,
            time_it: bool = True) -> dict:
    """Prints (and returns) the plan sparsejit uses for ``op`` on A: structure statistics,
    chosen kernel and why, the KernelSpec name, the generated source path, compile / load
    time, and a measured run time."""
    if op != "spmm":
        raise ValueError(f"explain supports op='spmm'; got {op!r}")
    out = file or sys.stdout
    width = F * heads
    stats = A.row_stats()
    elem = torch.empty((), dtype=dtype).element_size()
    plan = spmm_plan_for(A, width, dtype, reduce)
    if plan is not None and _is_tuned(A, width, dtype):
        chosen = _core.decode_plan(plan[:8].tolist())
        chosen["reason"] = "tuned (measured by sparsejit.tune)"
    else:
        chosen = _core.choose_spmm(A.shape[0], A.shape[1], A.nnz, width, elem)
    info = {"stats": stats, "plan": chosen, "jit_enabled": _core.jit_enabled()}
    if chosen["kernel"] in ("jit", "bucketed") and _core.jit_enabled():
        vmode = 0 if A.values is None else (1 if A.values.dim() == 1 else 2)
        # Bucketed plans run on their own int64 arrays.
        index = 0 if (A.index_dtype == torch.int32 and chosen["kernel"] == "jit") else 1
        info["kernel"] = _core.jit_spmm(_DTYPE_KIND[dtype], index, reduce, vmode, heads, F, 0,
                                        int(chosen["prefetch"]))
    if time_it:
        shape = (A.shape[1], F) if heads == 1 else (A.shape[1], heads, F)
        X = torch.randn(shape).to(dtype)
        from .functional import spmm

        B = A if A.values is None else A.with_values(A.values.to(dtype))
        info["run_ms"] = _median_ms(lambda: spmm(B, X, reduce), 5)
    hist = stats["log2_histogram"]
    print(f"sparsejit plan for {op} on {A}", file=out)
    print(f"  structure: rows={stats['rows']} cols={stats['cols']} nnz={stats['nnz']} "
          f"mean row={stats['mean_row']:.2f} max row={stats['max_row']} "
          f"skew={stats['skew']:.1f} empty rows={stats['empty_rows']}", file=out)
    print("  row lengths (log2 buckets 0,1,2-3,4-7,...): " + " ".join(map(str, hist)), file=out)
    print(f"  problem: F={F} heads={heads} dtype={str(dtype).replace('torch.', '')} "
          f"reduce={reduce} threads={torch.get_num_threads()}", file=out)
    extra = f" max_log2={chosen['max_log2']}" if chosen['kernel'] == 'bucketed' else ''
    print(f"  kernel: {chosen['kernel']} prefetch={chosen['prefetch']}{extra} ({chosen.get('reason', '')})",
          file=out)
    k = info.get("kernel")
    if k:
        state = "memory hit" if k["memory_hit"] else ("disk hit" if k["disk_hit"] else "compiled")
        print(f"  spec: {k['name']} [{state}; compile {k['compile_ms']:.0f} ms, "
              f"load {k['load_ms']:.1f} ms]", file=out)
        print(f"  source: {k['source_path']}", file=out)
        if not k["ok"]:
            print(f"  JIT failed, generic kernel used: {k['error']}", file=out)
    print(f"  compiler: {_core.compiler_command()}  ({_core.compiler_version()})", file=out)
    if "run_ms" in info:
        print(f"  measured: {info['run_ms']:.3f} ms (median of 5)", file=out)
    return info


def clear_caches() -> None:
    """Drops in-memory caches: the edge_index -> structure LRU, the tuned-plan LRU and loaded
    JIT functions (shared objects stay mapped; their handles are dropped). Plans cached on
    live SparseMatrix objects go with those objects; the disk cache stays."""
    from .matrix import clear_graph_cache

    _tuned_lru.clear()
    clear_graph_cache()
    _core.jit_clear_memory_cache()
