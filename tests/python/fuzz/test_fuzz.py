"""Fuzz test (issue 8): the public wrappers (sj.spmm / sddmm / edge_softmax, SparseMatrix
builders, sj.nn layers) and the raw ops (torch.ops.sparsejit.*) called with randomly malformed
arguments: dtypes (float16, int, bool, complex), shapes, sizes that disagree, zero-size and
non-contiguous tensors, meta tensors, bad reduce / activation strings, garbage, foreign,
truncated and tampered plans, plans of other structures, broken CSR arrays. Every case must
end in a Python exception (TypeError, ValueError, RuntimeError, IndexError,
NotImplementedError) or a result equal to a float64 reference; float16 must give correct
results (accumulated in float32), not garbage and not a crash.

The cases (tests/python/fuzz/) run in a worker subprocess, one JSON line each, so a segfault,
abort or hang fails this test naming the seed and case (the worker is then restarted after
that case, and the case rerun alone to tell a crash of its own from memory corrupted by an
earlier case). Reproduce one case with the command printed next to it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]  # tests/python: the worker runs as `-m fuzz.worker`
SEEDS = (101, 202, 303)
WORKER_TIMEOUT_S = 240  # per worker process; each case also has its own watchdog (60 s)
MAX_CRASHES = 12  # per seed: after this many, the rest of the batch is skipped


def run_worker(seed: int, *args) -> tuple:
    """(events, stderr, returncode) of one worker run; returncode None on timeout."""
    cmd = [sys.executable, "-m", "fuzz.worker", "--seed", str(seed), *map(str, args)]
    try:
        p = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True,
                           timeout=WORKER_TIMEOUT_S)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, err, rc = _text(e.stdout), _text(e.stderr), None
    events = [json.loads(line[5:]) for line in out.splitlines() if line.startswith("FUZZ ")]
    return events, err, rc


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def _how_it_died(rc) -> str:
    if rc is None:
        return f"timed out after {WORKER_TIMEOUT_S} s"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with status {rc}"


def _tail(text: str, lines: int = 14) -> str:
    return "\n".join("      " + ln for ln in text.strip().splitlines()[-lines:])


def _rerun(seed: int, idx: int) -> str:
    python = Path(sys.executable).name
    return f"cd tests/python && {python} -m fuzz.worker --seed {seed} --only {idx}"


def fuzz_seed(seed: int) -> tuple:
    """Runs every case of `seed`; returns (failure messages, Counter of outcomes)."""
    failures, counts = [], Counter()
    start, crashes = 0, 0
    while True:
        events, err, rc = run_worker(seed, "--start", start)
        current = None  # the case started and not ended
        for ev in events:
            if ev["event"] in ("start", "built"):
                current = {**(current or {}), **ev}
            elif ev["event"] == "end":
                current = None
                counts[ev["status"]] += 1
                if ev["status"] == "fail":
                    failures.append(f"seed={seed} #{ev['idx']} {ev['case']} {ev['params']}:\n"
                                    f"    {ev['detail']}\n    rerun: {_rerun(seed, ev['idx'])}")
        if any(ev["event"] == "done" for ev in events):
            break
        if current is None:
            failures.append(f"seed={seed}: the worker {_how_it_died(rc)} outside any case:\n"
                            f"{_tail(err)}")
            break
        idx = current["idx"]
        counts["crash"] += 1
        alone, _, alone_rc = run_worker(seed, "--only", idx)
        alone_end = next((ev for ev in alone if ev["event"] == "end"), None)
        if alone_end is None:
            again = _how_it_died(alone_rc).replace("killed", "killed again")
            where = f"and run alone it is {again}"
        else:  # heap corruption shows up late: by this case or one before it in the batch
            where = (f"but not when run alone (then: {alone_end['status']} "
                     f"{alone_end['detail'][:300]}); memory corrupted by #{start}..#{idx}?")
        failures.append(
            f"seed={seed} #{idx} {current['case']} {current.get('params', {})}:\n"
            f"    the process {_how_it_died(rc)} ({current.get('expect', '?')} case), {where}\n"
            f"{_tail(err)}\n    rerun: {_rerun(seed, idx)}")
        start, crashes = idx + 1, crashes + 1
        if crashes >= MAX_CRASHES:
            failures.append(f"seed={seed}: {crashes} crashes; cases after #{idx} not run")
            break
    return failures, counts


# One seed runs every case kind in `make test`; the full size (all seeds) in the slow tier.
@pytest.mark.parametrize("seed", [SEEDS[0]] + [pytest.param(s, marks=pytest.mark.slow)
                                                for s in SEEDS[1:]])
def test_fuzz(seed):
    failures, counts = fuzz_seed(seed)
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    print(f"fuzz seed {seed}: {summary}")
    assert not failures, (f"{len(failures)} fuzz failures for seed {seed} ({summary}):\n"
                          + "\n".join(failures))
    assert counts["ok"] >= 20 and counts["raised"] >= 20, f"too few decided cases: {summary}"
