"""`python -m sparsejit.info`: the bug-report command reads real values from the process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sparsejit


def _run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "sparsejit.info", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_json_report_matches_the_process(tmp_path):
    env = dict(os.environ, SPARSEJIT_CACHE_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "a.so").write_bytes(b"x" * 1000)
    r = _run("--json", env=env)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["sparsejit"]["version"] == sparsejit.__version__
    assert rep["torch"]["version"] == torch.__version__
    assert rep["python"]["version"] == sys.version.split()[0]
    assert "libsparsejit_ops.so" in rep["sparsejit"]["libraries"]
    from sparsejit import _library
    assert rep["sparsejit"]["op_library"].startswith(
        "stable ABI: loads under torch >= 2.10" if _library.STABLE_ABI else "torch C++ ABI")
    assert Path(rep["sparsejit"]["package"]) == Path(sparsejit.__file__).resolve().parent
    assert rep["cache"]["path"] == str(tmp_path / "cache")
    assert rep["cache"]["files"] == 1 and rep["cache"]["bytes"] == 1000
    assert rep["threads"]["OMP_NUM_THREADS"] == "1"
    assert rep["cpu"]["cores"] == os.cpu_count()
    assert isinstance(rep["jit"]["enabled"], bool)
    assert rep["cuda"]["available"] == torch.cuda.is_available()


def test_jit_off_is_reported():
    r = _run("--json", env=dict(os.environ, SPARSEJIT_JIT="0"))
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["jit"]["enabled"] is False
    assert rep["jit"]["env"]["SPARSEJIT_JIT"] == "0"


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the x86-64 tiers")
def test_isa_cap_is_reported():
    r = _run("--json", env=dict(os.environ, SPARSEJIT_MAX_ISA="baseline"))
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["jit"]["isa"]["cap"] == "baseline" and rep["jit"]["isa"]["tier"] == "baseline"
    assert rep["jit"]["isa"]["avx2_fma"] is False
    assert rep["jit"]["target"] == "x86-64" and rep["jit"]["env"]["SPARSEJIT_MAX_ISA"] == "baseline"


def test_text_report_names_every_section():
    r = _run()
    assert r.returncode == 0, r.stderr
    for section in ("sparsejit:", "torch:", "python:", "cpu:", "jit:", "cache:", "threads:",
                    "dense_products:", "huge_pages:", "cuda:"):
        assert any(line.startswith(section) for line in r.stdout.splitlines()), section
