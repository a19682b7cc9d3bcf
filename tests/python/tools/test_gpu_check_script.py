"""scripts/gpu_check.sh's driver, on a machine without a GPU: the step budget (a step past it
is stopped, later ones skipped), the status file, and what it leaves in $OUT for the device
tool (the summaries and one archive: at most 8 files)."""

import os
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _run(tmp_path, budget, *steps):
    env = dict(os.environ, OUT=str(tmp_path / "out"), GPU_CHECK_WORK=str(tmp_path / "work"),
               GPU_CHECK_BUDGET_S=str(budget), BUILD_DIR=str(tmp_path / "no-build"))
    p = subprocess.run(["bash", str(SCRIPT), *steps], env=env, capture_output=True, text=True,
                       timeout=120)
    status = (tmp_path / "work" / "status.txt").read_text().splitlines()
    return p, status


def test_steps_run_and_the_results_fit_the_device_tool(tmp_path):
    p, status = _run(tmp_path, 60, "env", "nosuchstep")
    assert p.returncode == 1, p.stdout + p.stderr  # the unknown step fails the run
    assert status[0].startswith("env 0 ")
    assert "unknown step 'nosuchstep'" in (tmp_path / "work" / "gpu_check.log").read_text()
    out = sorted(f.name for f in (tmp_path / "out").iterdir())
    assert "gpu_check_logs.tar.gz" in out and "status.txt" in out and "env.txt" in out
    assert len(out) <= 8
    with tarfile.open(tmp_path / "out" / "gpu_check_logs.tar.gz") as t:
        assert "./env.log" in t.getnames()


def test_a_spent_budget_skips_the_later_steps(tmp_path):
    p, status = _run(tmp_path, 3, "env", "cpp")
    assert p.returncode == 1
    assert status == ["env skipped (budget)", "cpp skipped (budget)"], status


def test_the_cpp_step_says_when_there_are_no_tests(tmp_path):
    p, status = _run(tmp_path, 60, "cpp")
    assert p.returncode == 1 and status[0].startswith("cpp 1 ")
    assert "GoogleTest missing" in (tmp_path / "work" / "cpp.log").read_text()
