"""The benchmark scripts behind issue 21's measurements (most now in benchmarks/archive/) run
end to end on small inputs and print what their recorded results quote (so a refactor that
breaks them fails here, not at the next measurement): the SpMM locality experiment, the
filter-conv lane-width A/B, the filter-conv batch split (stages and chunked prefixes),
bench_bf16's RGMS rows and DeepSparse's side-by-side runner (which must name its missing peer,
not crash, where deepsparse is not installed, as in CI)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "benchmarks"
DATA = Path(os.environ.get("SPARSEJIT_DATA", ROOT.parent / "shared" / "data"))


def run(script, *args, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    return subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.slow  # an archived experiment's script (benchmarks/archive/)
def test_spmm_locality_rows():
    r = run("archive/bench_spmm_locality.py", "--graph", "powerlaw:n=3000,avg=8,alpha=2.1,seed=3",
            "--features", "16")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("| ") and "| 16 |" in line]
    names = [row.split("|")[1].strip() for row in rows]
    assert names[:3] == ["the graph's own columns", "sequential columns",
                         "random columns within 1/8 of X"]
    assert sum("column segments" in n for n in names) == 3 and "copy_" in names[-1]
    for row in rows:
        ms, gbs = (float(v) for v in row.split("|")[3:5])
        assert ms >= 0 and gbs > 0


@pytest.mark.slow  # an archived experiment's script (benchmarks/archive/)
@pytest.mark.skipif(not (DATA / "dlmc/rn50/magnitude_pruning/0.8").is_dir(),
                    reason="no DLMC patterns")
def test_filter_conv_lanes_two_layers(tmp_path):
    out = tmp_path / "lanes.json"
    r = run("archive/bench_filter_conv_lanes.py", "--limit", "2", "--batch", "1", "--repeat", "3",
            "--out", str(out))
    assert r.returncode == 0, r.stderr
    rec = json.loads(out.read_text())
    assert len(rec["layers"]) == 2 and rec["geomean"] > 0
    assert all(l["ms_8_lanes"] > 0 and l["ms_16_lanes"] > 0 for l in rec["layers"])


@pytest.mark.skipif(importlib.util.find_spec("deepsparse") is not None,
                    reason="deepsparse installed: the runner would benchmark")
def test_deepsparse_runner_names_its_missing_peer():
    r = run("bench_deepsparse.py", "--sparsities", "0.9", "--batches", "1", timeout=120)
    assert r.returncode != 0
    assert "deepsparse is not installed" in (r.stdout + r.stderr)


@pytest.mark.slow  # an archived experiment's script (benchmarks/archive/)
def test_filter_conv_batch_split_two_layers(tmp_path):
    out = tmp_path / "batch.json"
    r = run("archive/bench_filter_conv_batch.py", "--batch", "2", "--limit", "2", "--repeat", "1",
            "--chunks", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    rec = json.loads(out.read_text())
    assert [l["layer"] for l in rec["layers"]] == ["layer1.0.downsample.0", "layer1.0.conv1"]
    assert all(l["batch_ms"] > 0 and l["slices_ms"] > 0 and l["gmacs"] > 0
               for l in rec["layers"])
    assert set(rec["whole"]) == {"whole", "chunks of 1", "stem..layer1 in chunks of 1",
                                 "stem..layer2 in chunks of 1"}
    assert all(v > 0 for v in rec["whole"].values())
    # every stage timed in the batch forward and in one-image forwards
    assert {"conv1", "layer1", "layer2", "layer3", "layer4", "fc"} <= set(rec["stages"])
    assert all(b > 0 and one > 0 for b, one in rec["stages"].values())
    assert "| layer1.0.conv1 |" in r.stdout and "| layer4 |" in r.stdout



def test_bf16_rgms_rows_and_their_products_ab():
    """bench_bf16.py's RGMS rows: bfloat16 against float32, and the bfloat16 call with its
    bfloat16 products against SPARSEJIT_RGMS_BF16_GEMM=0 (the switch restored after)."""
    r = run("bench_bf16.py", "--families", "rgms", "--repeat", "3")
    assert r.returncode == 0, r.stderr
    assert "| op | bfloat16 products | float32 products | speed-up |" in r.stdout
    rows = [l for l in r.stdout.splitlines() if l.startswith("| rgms mean")]
    assert len(rows) == 6  # three cases, in both tables
    for row in rows:
        a, b = (float(c.strip().split()[0]) for c in row.split("|")[2:4])
        assert a > 0 and b > 0


@pytest.mark.slow  # an archived experiment's script (benchmarks/archive/)
def test_filter_conv_pairs_counts_channel_partners():
    spec = importlib.util.spec_from_file_location("filter_conv_pairs",
                                                  BENCH / "archive" / "filter_conv_pairs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import numpy as np
    # row 0: (c0, t2) and (c1, t2) are partners, (c2, t5) has none; row 1: (c3, t5) alone
    # (its partner c2 is stored in row 0 only); row 2 empty
    rowptr = np.array([0, 3, 4, 4])
    cols = np.array([0 * 9 + 2, 1 * 9 + 2, 2 * 9 + 5, 3 * 9 + 5])
    assert mod.paired_fraction(rowptr, cols, 9) == 0.5
    assert mod.paired_fraction(np.array([0]), np.array([], dtype=np.int64), 9) == 0.0
    r = run("archive/filter_conv_pairs.py", timeout=300)
    assert r.returncode == 0, r.stderr
    last = [line for line in r.stdout.splitlines() if line.startswith("uniform random 90%")]
    assert len(last) == 1
    p = float(last[0].split("paired ")[1].split(":")[0])
    assert 0.08 < p < 0.12  # a kept tap's partner is kept with probability 0.1
