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

from typing import Dict, Optional

import torch

from sparsejit import _core
from sparsejit.families.rgms.ops import _STRATEGIES, TypedSparseMatrix
from sparsejit.families.rgms.schedules import (  # noqa: F401  (re-exported: the tuner's API)
    KERNELS, STORE, clear_schedule_cache, remember, schedule_for, schedule_key,
    typed_fingerprint)
from sparsejit.runtime import tuners
from sparsejit.runtime.timing import Progress, median_ms

_TILES = (32, 64, 128, 256, 512, 1024)


def tune_rgms(A: TypedSparseMatrix, F: int = 16, F_out: Optional[int] = None,
              reduce: str = "mean", dtype: torch.dtype = torch.float32, repeat: int = 5,
              progress: Optional[bool] = None, store: bool = True) -> dict:
    """Measures every (strategy, tile) with GEMM tiles, and every strategy with the fused row
    kernels, for one RGMS layer's forward + backward on A with random ``[num_src, F]``
    features and ``[R, F, F_out]`` weights; returns ``{"best": name, "times_ms": {...},
    "key": ..., "strategy": id, "tile": t, "gemm": KERNELS["tiles"] or KERNELS["fused"]}``."""
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
    bar = Progress(len(cands), f"sparsejit.tune rgms F={F}->{f_out}", progress)
    times: Dict[str, float] = {}
    ref = None
    for s, t, kernel in cands:
        sid, gemm = _STRATEGIES[s], KERNELS[kernel]

        def step():
            y = torch.ops.sparsejit.rgms(A.plan, X, W, vals, reduce, n_dst, gemm, t, sid)
            g = torch.ops.sparsejit.rgms_backward(A.plan, X, W, vals, dY, reduce, True, True,
                                                  False, gemm, t, sid)
            return y, g

        y, _ = step()
        if ref is None:
            ref = y
        else:  # every candidate computes the same function
            torch.testing.assert_close(y.float(), ref.float(), atol=1e-2, rtol=1e-2)
        name = f"{s}/tile={t}" if kernel == "tiles" else f"{s}/fused"
        times[name] = median_ms(step, repeat)
        bar.step(name)
    best = min(times, key=times.get)
    s_best, t_best, k_best = next(c for c in cands if (
        f"{c[0]}/tile={c[1]}" if c[2] == "tiles" else f"{c[0]}/fused") == best)
    result = {"best": best, "times_ms": times, "strategy": _STRATEGIES[s_best],
              "tile": int(t_best), "gemm": KERNELS[k_best],
              "key": schedule_key(F, f_out, dtype, reduce)}
    fp = typed_fingerprint(A)
    remember(fp, result["key"], (result["strategy"], result["tile"], result["gemm"]))
    A._maybe_tuned = True
    if store:
        STORE.put(fp, result["key"], {"strategy": result["strategy"], "tile": result["tile"],
                                      "gemm": result["gemm"], "best": best, "times_ms": times})
    return result


def tune(A, op: str = "spmm", F: int = 64, reduce: str = "sum",
         dtype: torch.dtype = torch.float32, heads: int = 1, repeat: int = 7,
         progress: Optional[bool] = None, store: bool = True, F_out: Optional[int] = None) -> dict:
    """``sj.tune(A_typed, F=..., reduce=...)`` (``sj.tune``'s signature): see tune_rgms."""
    return tune_rgms(A, F=F, F_out=F_out, reduce=reduce, dtype=dtype, repeat=repeat,
                     progress=progress, store=store)


def explain(A, op: str = "spmm", F: int = 64, reduce: str = "sum",
            dtype: torch.dtype = torch.float32, heads: int = 1, file=None,
            time_it: bool = True) -> dict:
    """Per-relation strategies (``A.explain``) and the tuned schedule, if any."""
    import sys

    text = A.explain(F, F)
    sched = schedule_for(A, F, F, dtype, reduce)
    if sched is not None:
        kernel = "fused rows" if sched[2] == 3 else f"GEMM tiles of {sched[1]} groups"
        text += f"\ntuned schedule (sparsejit.tune): strategy id {sched[0]}, {kernel}"
    print(text, file=file or sys.stdout)
    return {"text": text, "tuned": sched}


tuners.register_tuner("rgms", lambda obj, a, k: isinstance(obj, TypedSparseMatrix), tune, explain)
