"""`sparsejit-bench`: every family runs against the peers installed here, each peer agrees with
sparsejit's output, and the JSON, markdown and SVG outputs are written."""

import json

from sparsejit.tools import bench_all


def test_every_family_against_its_peers(tmp_path, capsys):
    out = {k: tmp_path / f"r.{k}" for k in ("json", "md", "svg")}
    recs = bench_all.run(["--quick", "--out-json", str(out["json"]), "--out-md", str(out["md"]),
                          "--out-svg", str(out["svg"])])
    fams = {r["family"] for r in recs}
    assert fams == set(bench_all.FAMILIES)
    for fam in fams:
        impls = {r["impl"] for r in recs if r["family"] == fam}
        assert "sparsejit" in impls and len(impls) >= 2, (fam, impls)  # at least one peer
    bad = [r for r in recs if not r["ok"]]
    assert not bad, bad
    assert all(r["median_ms"] > 0 for r in recs)
    # Every family's forward gives its rate against the machine's limit.
    for fam in fams:
        ours = [r for r in recs if r["family"] == fam and r["impl"] == "sparsejit"]
        assert ours and all(r.get("roofline_frac", 0) > 0 for r in ours), (fam, ours)
    assert {"gflops" in r for r in recs if r["family"] in ("point_conv", "filter_conv")
            and r["impl"] == "sparsejit"} == {True}
    doc = json.loads(out["json"].read_text())
    assert doc["records"] and "ISA" in doc["cpu"]
    md = out["md"].read_text()
    assert all(f"## {f}" in md for f in bench_all.FAMILIES) and "CPU:" in md
    assert out["svg"].read_text().startswith("<svg")
    assert "## rgms" in capsys.readouterr().out


def test_bad_family_is_rejected(capsys):
    import pytest
    with pytest.raises(SystemExit):
        bench_all.run(["--families", "nope"])
    assert "invalid choice" in capsys.readouterr().err


def test_train_times_forward_and_backward():
    recs = bench_all.run(["--quick", "--train", "--families", "attention", "rgms", "point_conv"])
    ops = {r["op"] for r in recs}
    assert {"sparse_attention fwd+bwd", "GATConv layer fwd+bwd", "rgms fwd+bwd",
            "subm3d incl. map fwd+bwd"} <= ops, ops
    bad = [r for r in recs if not r["ok"]]
    assert not bad, bad
    assert all(r["device"] == "cpu" for r in recs)
    assert not any("roofline_frac" in r for r in recs)  # the limits are the forward's


def test_cuda_device_without_a_gpu_is_named():
    import pytest
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present (gpu_check.sh runs the CUDA benchmark)")
    with pytest.raises(SystemExit, match="--device cuda needs a CUDA device"):
        bench_all.run(["--device", "cuda", "--quick"])
