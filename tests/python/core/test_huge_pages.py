"""Huge-page advice on large outputs (csrc/core/huge_pages.h): the ops' results are unchanged,
the advice lands on the output's pages (VmFlags "hg" in /proc/self/smaps) above the threshold
only, SPARSEJIT_HUGE_PAGES=0 turns it off, and _core.set_huge_page_threshold changes it at
run time. Each case runs in a fresh process (the variable is read once)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
thp_modes = THP.read_text() if THP.exists() else "[never]"

CHILD = r"""
import json, os, sys, torch, sparsejit as sj
from sparsejit import _core
torch.manual_seed(0)
prev = None
if "SJ_SET_THRESHOLD" in os.environ:  # the run-time setter, before any output
    prev = _core.set_huge_page_threshold(int(os.environ["SJ_SET_THRESHOLD"]))

def advised(t):
    # VmFlags of the mapping that holds the middle of t's buffer ("hg": MADV_HUGEPAGE).
    addr = t.data_ptr() + t.nbytes // 2
    cur = None
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and len(line.split()) >= 5 and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            cur = lo <= addr < hi
        elif line.startswith("VmFlags:") and cur:
            return "hg" in line.split()[1:]
    return None

n, f = int(sys.argv[1]), int(sys.argv[2])
src = torch.randint(0, n, (4 * n,)); dst = torch.randint(0, n, (4 * n,))
A = sj.SparseMatrix.from_edge_index(torch.stack([src, dst]), n)
x = torch.randn(n, f)
y = sj.spmm(A, x)
ref = torch.zeros(n, f).index_add_(0, dst, x[src])
err = (y - ref).abs().max().item()
q = torch.randn(n, 2, 8); k = torch.randn(n, 2, 8); v = torch.randn(n, 2, f // 2)
att = sj.sparse_attention(A, q, k, v)
print(json.dumps(dict(threshold=_core.huge_page_threshold(), nbytes=y.nbytes, prev=prev,
                      spmm_err=err, spmm_advised=advised(y), att_advised=advised(att),
                      att_finite=bool(torch.isfinite(att).all()))))
"""


def _run(n, f, env):
    r = subprocess.run([sys.executable, "-c", CHILD, str(n), str(f)], capture_output=True,
                       text=True, timeout=300, env={**os.environ, **env})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_off_by_variable_and_results_unchanged():
    d = _run(20000, 128, {"SPARSEJIT_HUGE_PAGES": "0"})
    assert d["threshold"] == 0
    assert d["spmm_err"] < 1e-3 and d["att_finite"]
    assert d["spmm_advised"] is not True


@pytest.mark.skipif("[never]" in thp_modes, reason="the OS has transparent huge pages off")
def test_large_outputs_are_advised_and_correct():
    # 20000 x 128 float32 = 9.8 MiB output; threshold lowered to 4 MiB.
    d = _run(20000, 128, {"SPARSEJIT_HUGE_PAGES": "4"})
    assert d["threshold"] == 4 << 20
    assert d["nbytes"] > d["threshold"]
    assert d["spmm_err"] < 1e-3
    assert d["spmm_advised"] is True
    assert d["att_advised"] is True and d["att_finite"]


@pytest.mark.skipif("[never]" in thp_modes, reason="the OS has transparent huge pages off")
def test_small_outputs_are_left_alone():
    d = _run(2000, 64, {"SPARSEJIT_HUGE_PAGES": "4"})  # 0.5 MiB output
    assert d["nbytes"] < d["threshold"]
    assert d["spmm_advised"] is not True and d["spmm_err"] < 1e-3


def test_default_threshold_and_bad_value():
    d = _run(100, 8, {"SPARSEJIT_HUGE_PAGES": "lots"})  # not a number: the default
    assert d["threshold"] == (0 if "[never]" in thp_modes else 4 << 20)


@pytest.mark.skipif("[never]" in thp_modes, reason="the OS has transparent huge pages off")
def test_threshold_set_at_run_time():
    # off by the variable, turned on (4 MiB) by _core.set_huge_page_threshold before the call
    d = _run(20000, 128, {"SPARSEJIT_HUGE_PAGES": "0", "SJ_SET_THRESHOLD": str(4 << 20)})
    assert d["prev"] == 0 and d["threshold"] == 4 << 20
    assert d["spmm_advised"] is True and d["spmm_err"] < 1e-3
    # and off again at run time: a large output is left alone
    d = _run(20000, 128, {"SPARSEJIT_HUGE_PAGES": "4", "SJ_SET_THRESHOLD": "0"})
    assert d["prev"] == 4 << 20 and d["threshold"] == 0
    assert d["spmm_advised"] is not True and d["spmm_err"] < 1e-3
