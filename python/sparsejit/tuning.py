"""Measured plan choice (:func:`tune`) and introspection (:func:`explain`) for SpMM.

:func:`tune` runs every candidate plan on the real structure with random features, keeps the
fastest on the structure and stores its recipe on disk (``sparsejit.plans``), so the next
process starts tuned. :func:`explain` prints the plan an op call would use and why.
"""

from __future__ import annotations

import sys
import time
from typing import Dict, List, Optional

import torch

from . import _core
from ._library import ops
from .matrix import SparseMatrix
from .ops.spmm import spmm
from .plans import (_LAYOUT, _load_store, _plan_key, _remember, _save_store, fingerprint,
                    is_tuned, materialize, memory_key, spmm_plan_for)

_DTYPE_KIND = {t: _core.enums()["scalar"][k] for t, k in
               ((torch.float32, "f32"), (torch.float64, "f64"), (torch.bfloat16, "bf16"))}
_REDUCES = ("sum", "mean", "max", "min")


# ---- tuning -----------------------------------------------------------------------------


def _candidates() -> List[List[int]]:
    cands = [_core.spmm_recipe("generic", 0)]
    if _core.jit_enabled():
        cands += [_core.spmm_recipe("jit", pf) for pf in (0, 4, 8, 16, 32)]
    # Rows regrouped by length (csrc/plan/spmm_plan.h): up to 8 or 32 entries per bucket.
    cands += [_core.spmm_recipe("bucketed", pf, k) for k, pf in ((3, 0), (5, 0), (5, 16))]
    return cands


def _describe(header: List[int]) -> str:
    d = _core.describe_plan(list(header[:_LAYOUT["header_words"]]))
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
         progress: Optional[bool] = None, store: bool = True, F_out: Optional[int] = None
         ) -> dict:
    """Measures every candidate plan for ``op`` on A with random ``[cols, heads, F]``
    features, keeps the fastest for this process (on A) and on disk (unless store=False).

    Returns ``{"best": name, "times_ms": {name: median_ms}, "key": ..., "header": [...]}``.
    Point-cloud convolution (conv_tuning.py): ``tune(model, x)`` tunes the dataflow of every
    sparse conv layer `model` runs on the SparseConvTensor `x`; ``tune(plan, F=C_in,
    F_out=C_out)`` one conv plan (``op="conv_inverse"``: read backwards).
    """
    from .conv_tuning import is_conv_plan, tune_conv_model, tune_conv_plan
    from .ops.rgms import TypedSparseMatrix

    if isinstance(A, torch.nn.Module):  # point-cloud conv layers run by A on the input `op`
        return tune_conv_model(A, op, dtype=None, repeat=repeat, progress=progress,
                               store=store)
    if is_conv_plan(A):
        return tune_conv_plan(A, F=F, F_out=F_out, dtype=dtype, swap=op == "conv_inverse",
                              repeat=repeat, progress=progress, store=store)

    if isinstance(A, TypedSparseMatrix):  # RGMS: strategies and tiles (rgms_tuning.py)
        from .rgms_tuning import tune_rgms

        return tune_rgms(A, F=F, reduce=reduce, dtype=dtype, repeat=repeat, progress=progress,
                         store=store)
    if op != "spmm":
        raise ValueError(f"tune supports op='spmm' (SDDMM has no tunable schedule yet); got {op!r}")
    if reduce not in _REDUCES:
        raise ValueError(f"reduce must be one of {_REDUCES}; got {reduce!r}")
    if dtype not in _DTYPE_KIND:
        raise TypeError(f"dtype must be float32, float64 or bfloat16; got {dtype}")
    if not isinstance(A, SparseMatrix):
        raise TypeError(f"A must be a sparsejit.SparseMatrix; got {type(A).__name__}")
    shape = (A.shape[1], F) if heads == 1 else (A.shape[1], heads, F)
    X = torch.randn(shape).to(dtype)
    vals = A.values.to(dtype) if A.values is not None else None
    cands = _candidates()
    bar = _Progress(len(cands), f"sparsejit.tune spmm F={F}",
                    sys.stderr.isatty() if progress is None else progress)
    times: Dict[str, float] = {}
    ref = None
    for header in cands:
        plan = materialize(A, header)
        fn = lambda: ops.spmm(A.indptr, A.indices, vals, X, reduce, A.shape[1],  # noqa: E731
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
    mkey = memory_key("spmm", width, dtype, reduce)
    A._s.extra.setdefault("plans", {})[mkey] = materialize(A, best)
    A._s.extra.setdefault("tuned_keys", set()).add(mkey)
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
    from .ops.rgms import TypedSparseMatrix

    if isinstance(A, TypedSparseMatrix):  # per-relation strategies (rgms_explain)
        from .rgms_tuning import schedule_for

        text = A.explain(F, F)
        sched = schedule_for(A, F, F, dtype, reduce)
        if sched is not None:
            kernel = "fused rows" if sched[2] == 3 else f"GEMM tiles of {sched[1]} groups"
            text += f"\ntuned schedule (sparsejit.tune): strategy id {sched[0]}, {kernel}"
        print(text, file=file or sys.stdout)
        return {"text": text, "tuned": sched}
    if op != "spmm":
        raise ValueError(f"explain supports op='spmm'; got {op!r}")
    out = file or sys.stdout
    width = F * heads
    stats = A.row_stats()
    elem = torch.empty((), dtype=dtype).element_size()
    plan = spmm_plan_for(A, width, dtype, reduce)
    if plan is not None and is_tuned(A, width, dtype, reduce):
        chosen = _core.describe_plan(plan[:_LAYOUT["header_words"]].tolist())
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


