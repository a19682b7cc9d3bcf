"""Fuzz worker: runs a seeded batch of malformed-argument cases against sparsejit, one JSON
line per case, so that tests/python/fuzz/test_fuzz.py can run it in a subprocess (a segfault or
abort then fails that test, naming the case, instead of killing pytest).

Each case builds arguments from its own generator (seeded by seed and case number, so any case
can be rerun alone), calls a public wrapper or a raw op ``torch.ops.sparsejit.*``, and ends in
one of three ways, by what the case expects:

    valid    the arguments are valid: the result must equal a float64 reference
    invalid  no correct result exists (out-of-range reads, wrong dtypes, ...): must raise
    either   raising is fine, and so is a result, which must then equal the reference

Raising means one of ALLOWED; anything else (AttributeError, KeyError, ...) fails.

    cd tests/python && python -m fuzz.worker --seed 3             # the batch of seed 3
    cd tests/python && python -m fuzz.worker --seed 3 --only 41   # case 41 alone
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import traceback
import warnings

import torch

from .cases_spmm_api import API_CASES
from .cases_attention import ATTENTION_CASES
from .cases_spmm_build import BUILD_CASES
from .cases_point_conv import CONV_CASES
from .cases_filter_conv import FILTER_CASES
from .cases_filter_conv_fused import FUSED_CASES
from .cases_point_conv_api import POINTCLOUD_CASES
from .cases_spmm_raw import RAW_CASES
from .cases_rgms import RGMS_CASES
from .refs import Rand

ROSTER = (API_CASES + BUILD_CASES + RAW_CASES + RGMS_CASES + CONV_CASES + POINTCLOUD_CASES
          + FILTER_CASES + FUSED_CASES + ATTENTION_CASES)

ALLOWED = (TypeError, ValueError, RuntimeError, IndexError, NotImplementedError)
REPEATS = 2  # every case kind runs this many times per seed, with different draws
CASE_TIMEOUT_S = 60  # a case that hangs (or compiles forever) ends the worker with a traceback


def _short(x, n=300) -> str:
    s = str(x).replace("\n", " | ")
    return s if len(s) <= n else s[:n] + "..."


def _summary(result) -> str:
    if isinstance(result, torch.Tensor):
        d = f"tensor{tuple(result.shape)} {result.dtype} {result.device}"
        if result.device.type == "cpu" and result.is_floating_point() and result.numel():
            r = result.double()
            d += f" nan={int(r.isnan().sum())} max|.|={float(r.nan_to_num().abs().max()):.3g}"
        return d
    if isinstance(result, (tuple, list)):
        return "(" + ", ".join(_summary(r) for r in result) + ")"
    return _short(repr(result), 80)


def run_case(case) -> tuple:
    """(status, detail): status is ok, raised or fail."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = case.call()
    except ALLOWED as e:
        if case.expect == "valid":
            return "fail", f"raised {type(e).__name__} for valid input ({case.why}): {_short(e)}"
        if case.names and not any(n.lower() in str(e).lower() for n in case.names):
            return "fail", (f"the message does not name the argument (one of {list(case.names)}"
                            f"; {case.why}): {type(e).__name__}: {_short(e)}")
        return "raised", f"{type(e).__name__}: {_short(e, 160)}"
    except Exception as e:  # noqa: BLE001 - the point is to classify every exception
        return "fail", f"unexpected exception type {type(e).__name__}: {_short(e)}"
    if case.expect == "invalid":
        return "fail", f"returned a result for invalid input ({case.why}): {_summary(result)}"
    try:
        err = case.check(result) if case.check else None
    except Exception as e:  # noqa: BLE001
        err = f"result could not be checked ({type(e).__name__}: {_short(e)}): {_summary(result)}"
    if err:
        tag = "FLOAT16 (must be correct, accumulated in float32): " if case.f16 else ""
        return "fail", f"{tag}wrong result ({case.why}): {err}"
    return "ok", ""


def cases_for(seed: int):
    """(number, kind) of every case of a seed: each kind REPEATS times, in roster order."""
    return [(i, ROSTER[i % len(ROSTER)]) for i in range(len(ROSTER) * REPEATS)]


def emit(**kw) -> None:
    print("FUZZ " + json.dumps(kw), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--start", type=int, default=0, help="first case number to run")
    ap.add_argument("--only", type=int, default=None, help="run just this case")
    args = ap.parse_args(argv)
    faulthandler.enable()  # a crash prints the Python stack of the case to stderr
    for i, kind in cases_for(args.seed):
        if i < args.start or (args.only is not None and i != args.only):
            continue
        emit(event="start", seed=args.seed, idx=i, case=kind.__name__)
        faulthandler.dump_traceback_later(CASE_TIMEOUT_S, exit=True)
        params = {}
        try:
            case = kind(Rand(args.seed * 1_000_003 + i))
            params = case.params
        except Exception:  # noqa: BLE001 - building calls a few valid ops (plans); or a bug here
            status, detail = "fail", "error building the case: " + _short(
                traceback.format_exc(limit=4), 800)
        else:
            emit(event="built", seed=args.seed, idx=i, expect=case.expect, params=params)
            status, detail = run_case(case)
        faulthandler.cancel_dump_traceback_later()
        emit(event="end", seed=args.seed, idx=i, case=kind.__name__, status=status,
             detail=detail, params=params)
    emit(event="done", seed=args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
