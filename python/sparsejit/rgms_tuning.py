"""Measured schedules for RGMS (:func:`tune_rgms`, reached through ``sj.tune(A_typed, ...)``).

A schedule is (strategy, tile, kernel): the forward's strategy ("auto" = the per-relation
cost model, or one strategy for every relation), the groups per GEMM tile of every pass, and
where the products run ("tiles": small GEMMs on oneDNN per tile of groups, with the built-in
fused rows for narrow widths; "fused": every pass row by row in JIT-compiled registers, no
GEMM call). ``tune``
measures each candidate forward + backward on the typed structure with random features,
keeps the fastest on the structure for this process and on disk, keyed by the structure's
fingerprint, widths, dtype, reduce, CPU model and thread count, so the next process (and
``sj.rgms`` / ``RGCNConv`` calls on the same graph) start tuned.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

from . import _core
from .ops.rgms import _STRATEGIES, TypedSparseMatrix
from .plans import _cpu_model
from .tuning import _median_ms, _Progress

_TILES = (32, 64, 128, 256, 512, 1024)
_KERNELS = {"tiles": 0, "fused": 3}  # the raw ops' `gemm` argument
_MEMORY: Dict[Tuple[str, str], Tuple[int, int, int]] = {}


def typed_fingerprint(A: TypedSparseMatrix) -> str:
    """64-bit hash of the typed structure (relation groups, targets, sources) and its shape."""
    fp = getattr(A, "_fingerprint", None)
    if fp is None:
        rel_ptr, grp_ptr, grp_dst, src, _ = (t.cpu() for t in A.plan)
        key = torch.cat([rel_ptr, grp_ptr, grp_dst, torch.tensor([A.shape[0], A.shape[1]])])
        fp = "%016x" % _core.fingerprint(key.numpy(), src.numpy(), A.shape[1])
        A._fingerprint = fp
    return fp


def schedule_key(f_in: int, f_out: int, dtype: torch.dtype, reduce: str) -> str:
    dt = str(dtype).replace("torch.", "")
    return f"rgms|fi{f_in}|fo{f_out}|{dt}|{reduce}|{_cpu_model()}|t{torch.get_num_threads()}"


def _store_path(fp: str) -> Path:
    return Path(_core.cache_dir()) / "tuned" / f"rgms-{fp}.json"


def _load(fp: str) -> dict:
    try:
        return json.loads(_store_path(fp).read_text())
    except (OSError, ValueError):
        return {}


def schedule_for(A: TypedSparseMatrix, f_in: int, f_out: int, dtype: torch.dtype,
                 reduce: str) -> Optional[Tuple[int, int, int]]:
    """(strategy id, tile, gemm) stored by tune for this call, or None (the cost model's)."""
    if torch.compiler.is_compiling():
        return None
    fp = getattr(A, "_fingerprint", None)
    if fp is None:  # only structures someone tuned carry a store; skip the O(E) hash
        if not getattr(A, "_maybe_tuned", False) and not _any_rgms_store():
            return None
        fp = typed_fingerprint(A)
    key = schedule_key(f_in, f_out, dtype, reduce)
    hit = _MEMORY.get((fp, key))
    if hit is None:
        entry = _load(fp).get(key)
        if not isinstance(entry, dict) or "strategy" not in entry or "tile" not in entry:
            return None
        gemm = int(entry.get("gemm", 0))  # stores from before the kernel choice: tiles
        hit = (int(entry["strategy"]), int(entry["tile"]), gemm if gemm in (0, 3) else 0)
        _MEMORY[(fp, key)] = hit
    return hit


_ANY_STORE: Dict[str, bool] = {}  # cache dir -> holds any RGMS schedule (looked up once)


def _any_rgms_store() -> bool:
    key = _core.cache_dir()
    hit = _ANY_STORE.get(key)
    if hit is not None:
        return hit
    folder = Path(key) / "tuned"
    if key not in _ANY_STORE:
        try:
            _ANY_STORE[key] = any(p.name.startswith("rgms-") for p in folder.iterdir())
        except OSError:
            _ANY_STORE[key] = False
    return _ANY_STORE[key]


def clear_schedule_cache() -> None:
    _MEMORY.clear()
    _ANY_STORE.clear()


def tune_rgms(A: TypedSparseMatrix, F: int = 16, F_out: Optional[int] = None,
              reduce: str = "mean", dtype: torch.dtype = torch.float32, repeat: int = 5,
              progress: Optional[bool] = None, store: bool = True) -> dict:
    """Measures every (strategy, tile) with GEMM tiles, and every strategy with the fused row
    kernels, for one RGMS layer's forward + backward on A with random ``[num_src, F]``
    features and ``[R, F, F_out]`` weights; returns ``{"best": name, "times_ms": {...},
    "key": ..., "strategy": id, "tile": t, "gemm": 0 (tiles) or 3 (fused)}``."""
    if reduce not in ("sum", "mean"):
        raise ValueError(f"reduce must be 'sum' or 'mean'; got {reduce!r}")
    if dtype not in (torch.float32, torch.float64, torch.bfloat16):
        raise TypeError(f"dtype must be float32, float64 or bfloat16; got {dtype}")
    f_out = F if F_out is None else F_out
    if F < 0 or f_out < 0:
        raise ValueError(f"widths must be >= 0; got F={F}, F_out={f_out}")
    n_dst, n_src = A.shape
    X = torch.randn(n_src, F).to(dtype)
    W = torch.randn(A.num_relations, F, f_out).to(dtype)
    dY = torch.randn(n_dst, f_out).to(dtype)
    vals = A.values.to(dtype) if A.values is not None else None
    default_tile = _core.rgms_default_tile(F, f_out)
    cands = [(s, t, "tiles") for s in _STRATEGIES for t in sorted({default_tile, *_TILES})]
    if 0 < F <= 256 and 0 < f_out <= 256:  # the fused kernels' widths
        cands += [(s, default_tile, "fused") for s in _STRATEGIES]
    bar = _Progress(len(cands), f"sparsejit.tune rgms F={F}->{f_out}",
                    sys.stderr.isatty() if progress is None else progress)
    times: Dict[str, float] = {}
    ref = None
    for s, t, kernel in cands:
        sid, gemm = _STRATEGIES[s], _KERNELS[kernel]

        def step():
            y = torch.ops.sparsejit.rgms(*A.plan, X, W, vals, reduce, n_dst, gemm, t, sid)
            g = torch.ops.sparsejit.rgms_backward(*A.plan, X, W, vals, dY, reduce, True, True,
                                                  False, gemm, t, sid)
            return y, g

        y, _ = step()
        if ref is None:
            ref = y
        else:  # every candidate computes the same function
            torch.testing.assert_close(y.float(), ref.float(), atol=1e-2, rtol=1e-2)
        name = f"{s}/tile={t}" if kernel == "tiles" else f"{s}/fused"
        times[name] = _median_ms(step, repeat)
        bar.step(name)
    best = min(times, key=times.get)
    s_best, t_best, k_best = next(c for c in cands if (
        f"{c[0]}/tile={c[1]}" if c[2] == "tiles" else f"{c[0]}/fused") == best)
    result = {"best": best, "times_ms": times, "strategy": _STRATEGIES[s_best],
              "tile": int(t_best), "gemm": _KERNELS[k_best],
              "key": schedule_key(F, f_out, dtype, reduce)}
    fp = typed_fingerprint(A)
    _MEMORY[(fp, result["key"])] = (result["strategy"], result["tile"], result["gemm"])
    A._maybe_tuned = True
    _ANY_STORE.clear()
    if store:
        path = _store_path(fp)
        data = _load(fp)
        data[result["key"]] = {"strategy": result["strategy"], "tile": result["tile"],
                               "gemm": result["gemm"], "best": best, "times_ms": times}
        tmp = path.with_suffix(f".tmp.{os.getpid()}.{threading.get_ident()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data, indent=1))
            os.replace(tmp, path)
        except OSError as e:
            import warnings

            warnings.warn(f"sparsejit.tune: could not store the RGMS schedule in {path}: {e}")
    return result
