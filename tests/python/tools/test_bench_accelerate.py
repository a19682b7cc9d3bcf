"""benchmarks/bench_accelerate.py runs end to end on a small generated graph (--quick) and
writes its JSON rows: every model (native, generic, genconv, attention in two score forms on
the graph; the
EdgeConv stack on a scan's k-NN graph; a to_hetero SAGE model), their outputs checked equal to PyG's before timing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytest.importorskip("torch_geometric")


@pytest.mark.slow  # (8-23 s: runs in make test-slow)
def test_bench_accelerate_quick(tmp_path):
    out = tmp_path / "acc.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_accelerate.py"),
                        "--quick", "--no-compile", "--repeats", "1", "--graphs",
                        "uniform:n=400,avg=4,seed=0", "--points", "200", "--hetero-nodes", "300", "--out",
                        str(out)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [row["model"] for row in rows] == ["native", "generic", "genconv", "attention",
                                              "attention_v2", "edgeconv", "hetero"]
    for row in rows:
        assert row["pyg_ms"] > 0 and row["accelerated_ms"] > 0 and row["max_rel_err"] < 1e-4
    assert out.with_suffix(".md").read_text().count("| uniform:n=400,avg=4 |") == 5
    assert rows[-2]["nodes"] == 200 and rows[-2]["edges"] == 200 * 20
    assert rows[-1]["nodes"] == 450 and rows[-1]["edges"] == 9000


@pytest.mark.slow
def test_bench_accelerate_split(tmp_path):
    """--split profiles both sides: graph operators, matrix products, the rest."""
    out = tmp_path / "acc.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_accelerate.py"),
                        "--quick", "--no-compile", "--repeats", "1", "--graphs",
                        "uniform:n=400,avg=4,seed=0", "--models", "native", "--split", "2",
                        "--out", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    for side in ("split_pyg", "split_accelerated"):
        assert set(row[side]) == {"graph_ms", "dense_ms", "rest_ms"}
        assert all(v >= 0 for v in row[side].values()) and row[side]["dense_ms"] > 0
    assert row["split_pyg"]["graph_ms"] > 0  # PyG's gathers and scatters
    assert row["bound_without_pyg_graph_ops"] >= 1.0


@pytest.mark.slow  # (8-23 s: runs in make test-slow)
def test_bench_accelerate_minibatch_quick(tmp_path):
    out = tmp_path / "mb.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_accelerate.py"),
                        "--quick", "--minibatch", "--steps", "3", "--clock", "cpu",
                        "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["clock"] == "cpu"
    rows = result["rows"]
    assert [row["model"] for row in rows] == ["minibatch_sage", "minibatch_gcn"]
    for row in rows:
        assert row["pyg_ms"] > 0 and row["accelerated_ms"] > 0
        assert row["accelerated_sorting_op_ms"] > 0 and 0 < row["structure_share"] < 1
