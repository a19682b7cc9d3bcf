"""Measured plan choice (:func:`tune`) and introspection (:func:`explain`) for SpMM.

:func:`tune` runs every candidate plan on the real structure with random features, keeps the
fastest on the structure and stores its recipe on disk (``sparsejit.families.spmm.plans``),
so the next process starts tuned. :func:`explain` prints the plan an op call would use and why.
"""

from __future__ import annotations

import sys
from typing import Dict, List, Optional

import torch

from sparsejit import _core
from sparsejit._library import ops
from sparsejit.families.spmm.matrix import SparseMatrix
from sparsejit.families.spmm.spmm import spmm
from sparsejit.runtime import caches, tuners
from sparsejit.runtime.timing import Progress, median_ms
from sparsejit.families.spmm.plans import (_LAYOUT, _load_store, _plan_key, _remember,
                                           _save_store, fingerprint, is_tuned, materialize,
                                           memory_key, spmm_plan_for)

_DTYPE_KIND = {t: _core.enums()["scalar"][k] for t, k in
               ((torch.float32, "f32"), (torch.float64, "f64"), (torch.bfloat16, "bf16"))}
_REDUCES = ("sum", "mean", "max", "min")


# ---- tuning -----------------------------------------------------------------------------


def _candidates() -> List[List[int]]:
    cands = [_core.spmm_recipe("generic", 0)]
    if _core.jit_enabled():
        cands += [_core.spmm_recipe("jit", pf) for pf in (0, 4, 8, 16, 32)]
    # Rows regrouped by length (csrc/spmm/spmm_plan.h): up to 8 or 32 entries per bucket.
    cands += [_core.spmm_recipe("bucketed", pf, k) for k, pf in ((3, 0), (5, 0), (5, 16))]
    return cands


def _describe(header: List[int]) -> str:
    d = _core.describe_plan(list(header[:_LAYOUT["header_words"]]))
    if d["kernel"] == "bucketed":
        return f"bucketed(max_log2={d['max_log2']}, prefetch={d['prefetch']})"
    return d["kernel"] if d["kernel"] == "generic" else f"jit(prefetch={d['prefetch']})"


def tune(A: SparseMatrix, op: str = "spmm", F: int = 64, reduce: str = "sum",
         dtype: torch.dtype = torch.float32, heads: int = 1, repeat: int = 7,
         progress: Optional[bool] = None, store: bool = True, F_out: Optional[int] = None
         ) -> dict:
    """Measures every candidate plan for ``op`` on A with random ``[cols, heads, F]``
    features, keeps the fastest for this process (on A) and on disk (unless store=False).

    Returns ``{"best": name, "times_ms": {name: median_ms}, "key": ..., "header": [...]}``.
    ``sj.tune`` reaches this for a SparseMatrix; the other families register their own tuner
    (``sparsejit.runtime.tuners``): a TypedSparseMatrix (rgms), a point-cloud conv plan or a
    model with its example input (point_conv).
    """
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
    bar = Progress(len(cands), f"sparsejit.tune spmm F={F}", progress)
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
        times[_describe(header)] = median_ms(fn, repeat)
        bar.step(_describe(header))
    best_name = min(times, key=times.get)
    best = next(h for h in cands if _describe(h) == best_name)
    width = F * heads
    key = _plan_key("spmm", width, dtype, reduce)
    mkey = memory_key("spmm", width, dtype, reduce)
    plan = A._s.extra.setdefault("plans", {})[mkey] = materialize(A, best)
    caches.own(A._s, plan)
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
        int32 = A.index_dtype == torch.int32 and chosen["kernel"] == "jit"
        index = _core.enums()["index"]["i32" if int32 else "i64"]
        info["kernel"] = _core.jit_spmm(_DTYPE_KIND[dtype], index, reduce, vmode, heads, F, 0,
                                        int(chosen["prefetch"]))
    if time_it:
        shape = (A.shape[1], F) if heads == 1 else (A.shape[1], heads, F)
        X = torch.randn(shape).to(dtype)

        B = A if A.values is None else A.with_values(A.values.to(dtype))
        info["run_ms"] = median_ms(lambda: spmm(B, X, reduce), 5)
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


def _accepts(obj, args, kwargs) -> bool:
    return isinstance(obj, SparseMatrix)


tuners.register_tuner("spmm", _accepts, tune, explain)
