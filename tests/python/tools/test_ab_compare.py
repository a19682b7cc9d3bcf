"""The A/B runner's comparison: ratios per (family, op), the CPU each side ran on, and the
guards against globs that match nothing, match the same file twice, sweep in a stale run, or
compare runs from two CPUs."""

import json
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import ab_sparsejit  # noqa: E402


def _write(path, ms, age_h=0.0, cpu=None):
    rec = [{"family": "spmm", "graph": "g", "F": 8, "op": "spmm", "reduce": "sum", "ms": ms},
           {"family": "spmm", "graph": "h", "F": 8, "op": "spmm", "reduce": "sum", "ms": 2 * ms}]
    if cpu is not None:
        for r in rec:
            r["cpu"] = cpu
    path.write_text(json.dumps(rec))
    t = time.time() - age_h * 3600
    os.utime(path, (t, t))
    return str(path)


def test_compare_reports_the_geomean_and_warns_about_stale_files(tmp_path, capsys):
    a = [_write(tmp_path / "a1.json", 4.0), _write(tmp_path / "a2.json", 3.0)]
    b = [_write(tmp_path / "b1.json", 1.5)]
    ab_sparsejit.compare(a, b)
    out = capsys.readouterr().out
    assert "| spmm | spmm | sum | 2 | 0.500 | 0.50 | 0.50 |" in out  # best of A: 3.0 and 6.0
    assert "warning" not in out
    a.append(_write(tmp_path / "a0.json", 1.0, age_h=30))
    ab_sparsejit.compare(a, b)
    out = capsys.readouterr().out
    assert "warning: the A files were written 30 h apart" in out
    assert "| spmm | spmm | sum | 2 | 1.500 |" in out  # the stale file wins the minimum


def test_compare_refuses_empty_or_overlapping_globs(tmp_path):
    b = [_write(tmp_path / "b1.json", 1.0)]
    with pytest.raises(SystemExit, match="A glob matches no file"):
        ab_sparsejit.compare([], b)
    with pytest.raises(SystemExit, match="matched both globs"):
        ab_sparsejit.compare(b, b)


def test_compare_names_each_sides_cpu_and_warns_when_they_differ(tmp_path, capsys):
    a = [_write(tmp_path / "a1.json", 2.0, cpu="EPYC, 2 cores, ISA: avx2")]
    b = [_write(tmp_path / "b1.json", 1.0, cpu="EPYC, 2 cores, ISA: avx2")]
    ab_sparsejit.compare(a, b)
    out = capsys.readouterr().out
    assert "A CPU: EPYC, 2 cores, ISA: avx2" in out and "B CPU: EPYC, 2 cores, ISA: avx2" in out
    assert "different CPUs" not in out
    b.append(_write(tmp_path / "b2.json", 1.0, cpu="Xeon, 2 cores, ISA: avx512f amx"))
    ab_sparsejit.compare(a, b)
    assert "warning: the two sides ran on different CPUs" in capsys.readouterr().out
    # files from before the field: named as such, no warning
    ab_sparsejit.compare(a, [_write(tmp_path / "b3.json", 1.0)])
    out = capsys.readouterr().out
    assert "B CPU: (not recorded)" in out and "different CPUs" not in out


BENCH = Path(__file__).resolve().parents[3] / "benchmarks"


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the x86-64 tiers")
@pytest.mark.parametrize("isa,has,lacks", [("avx2", "__AVX2__", "__AVX512F__"),
                                           ("baseline", "__SSE2__", "__AVX__")])
def test_the_compiler_wrapper_rewrites_march_as_the_jit_does(isa, has, lacks):
    """benchmarks/cxx_max_isa.sh: what a build from before SPARSEJIT_MAX_ISA compiles with."""
    import subprocess
    env = dict(os.environ, SPARSEJIT_MAX_ISA=isa)
    r = subprocess.run([str(BENCH / "cxx_max_isa.sh"), "-march=native", "-dM", "-E", "-x", "c++",
                        "/dev/null"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    macros = {line.split()[1] for line in r.stdout.splitlines() if line.startswith("#define")}
    assert has in macros and lacks not in macros
    bad = subprocess.run([str(BENCH / "cxx_max_isa.sh"), "--version"], capture_output=True,
                         text=True, env=dict(os.environ, SPARSEJIT_MAX_ISA="avx9"), timeout=60)
    assert bad.returncode == 2 and "SPARSEJIT_MAX_ISA='avx9'" in bad.stderr


def test_isa_option_caps_sparsejit_and_the_dense_libraries():
    """`ab_sparsejit.py --isa avx2` sets the cap before torch loads, and the CPU line says so."""
    import subprocess
    code = ("import sys; sys.path.insert(0, %r); import ab_sparsejit as ab, os; "
            "print(ab.cap_isa('avx2')); from sparsejit import _core; "
            "print(_core.isa_state()['cap'], os.environ['ONEDNN_MAX_CPU_ISA'], "
            "os.environ['ATEN_CPU_CAPABILITY'])" % str(BENCH))
    env = {k: v for k, v in os.environ.items() if k != "SPARSEJIT_MAX_ISA"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[--isa", "avx2]", "avx2", "AVX2", "avx2"]
    late = subprocess.run([sys.executable, "-c", "import torch, sys; sys.path.insert(0, %r); "
                           "import ab_sparsejit as ab; ab.cap_isa('avx2')" % str(BENCH)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert late.returncode != 0 and "before torch is imported" in late.stderr
