"""sparsify's tuner in the registry: ``sj.tune(model, x)`` measures and stores sparsify's
decisions without converting the model, ``sj.explain(model, x)`` reports them without
measuring, and a later ``sparsify`` converts from the store alone."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

import sparsejit as sj
import sparsejit.families.filter_conv.tuner as fc
from sparsejit.families.filter_conv.layers import PrunedConv2d, SparseLinear

from test_filter_conv import pruned_cnn


def _no_measuring(*a, **k):
    raise AssertionError("measured although the decision is stored")


def test_tune_then_explain_then_sparsify_from_the_store(tmp_path, monkeypatch):
    x = torch.randn(1, 3, 12, 12)
    m = pruned_cnn(5)
    with torch.no_grad():
        want = m(x)
    opts = dict(cache_dir=tmp_path, min_speedup=0.0, repeat=1, progress=False)

    out = io.StringIO()
    before = sj.explain(m, x, cache_dir=tmp_path, file=out)  # nothing stored yet
    assert [r["choice"] for r in before["layers"]] == ["not measured"] * 4
    assert "4 of 4 rows not measured" in out.getvalue()
    assert not (tmp_path / "decisions.json").exists()

    res = sj.tune(m, x, **opts)
    assert [r["name"] for r in res["layers"]] == ["c1", "c2", "c3", "fc"]
    assert all(r["choice"] == "sparse" and not r["cached"] for r in res["layers"])
    assert isinstance(m.c2, nn.Conv2d) and isinstance(m.fc, nn.Linear)  # left as it was
    assert isinstance(res["model"].c2, PrunedConv2d) and isinstance(res["model"].fc, SparseLinear)
    stored = fc._store(tmp_path).load(fc._TABLE)
    assert len(stored) == 4 and all("dense_ms" in e and "kernel_ms" in e for e in stored.values())

    monkeypatch.setattr(fc, "measure", _no_measuring)
    after = sj.explain(m, x, cache_dir=tmp_path, min_speedup=0.0, file=io.StringIO())
    assert all(r["cached"] and r["choice"] == "sparse" for r in after["layers"])
    assert "not measured" not in after["text"]
    got = sj.sparsify(m, x, cache_dir=tmp_path, min_speedup=0.0, progress=False, verbose=False)
    assert got is m and isinstance(m.c1, PrunedConv2d) and isinstance(m.fc, SparseLinear)
    with torch.no_grad():
        torch.testing.assert_close(m(x), want, rtol=1e-4, atol=1e-4)


def test_tune_reaches_sparsify_only_for_dense_inputs(tmp_path):
    m = pruned_cnn(6)
    x = torch.randn(1, 3, 8, 8)
    with pytest.raises(TypeError, match="unknown option.*'F'"):
        sj.tune(m, x, F=16)  # sj.tune's sparse-matrix options mean nothing here
    res = sj.tune(m, (x,), cache_dir=tmp_path, repeat=1, progress=False)  # a tuple input
    assert len(res["layers"]) == 4
    # A model with a sparse-tensor input is the point-cloud tuner's: nothing measured here.
    spc = sj.spconv.SparseConvTensor(torch.randn(3, 2), torch.tensor(
        [[0, 0, 0, 0], [0, 1, 0, 0], [0, 2, 1, 0]], dtype=torch.int32), [4, 4, 4], 1)
    net = sj.spconv.SubMConv3d(2, 2, 3)
    r = sj.tune(net, spc, repeat=1, progress=False, store=False)
    assert "layers" in r and r["layers"] and "c_in" in r["layers"][0]
