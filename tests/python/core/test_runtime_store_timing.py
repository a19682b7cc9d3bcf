"""runtime.timing.paired_median_ms (interleaved, rotated, wall or CPU clock) and
runtime.store.JsonStore (a caller's root, several entries in one write): what every tuner,
sparsify's included, measures and stores with."""

from __future__ import annotations

import json
import time

import pytest
import torch

from sparsejit.runtime.store import JsonStore
from sparsejit.runtime.timing import paired_median_ms


def test_paired_median_ms_orders_warmup_and_rotation():
    calls = []
    fns = [lambda: calls.append("a"), lambda: calls.append("b"), lambda: calls.append("c")]
    out = paired_median_ms(fns, 3, warmup=1)
    assert len(out) == 3 and all(t >= 0 for t in out)
    assert calls == ["a", "b", "c"] + ["a", "b", "c"] * 3
    calls.clear()
    paired_median_ms(fns, 3, warmup=0, rotate=True)  # who runs first changes each round
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert paired_median_ms([], 3) == []


def test_paired_median_ms_clocks_measure_what_they_say():
    def sleep():
        time.sleep(0.02)

    def spin():
        t0 = time.process_time()
        while time.process_time() - t0 < 0.02:
            pass

    wall = paired_median_ms([sleep, spin], 3, warmup=0)
    cpu = paired_median_ms([sleep, spin], 3, warmup=0, clock="cpu")
    assert wall[0] >= 19 and wall[1] >= 19
    assert cpu[0] < 10 <= 19 <= cpu[1]  # sleeping costs no CPU time, spinning does
    with pytest.raises(ValueError, match="clock must be one of"):
        paired_median_ms([sleep], 1, clock="gpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_paired_median_ms_times_cuda_work_with_events():
    x = torch.randn(2048, 2048, device="cuda")
    small, big = paired_median_ms([lambda: x[:64] @ x[:, :64], lambda: x @ x], 5, warmup=1,
                                  device="cuda")
    assert 0 < small < big


def test_json_store_root_and_update(tmp_path):
    store = JsonStore("", what="test results", root=tmp_path / "sub")
    assert store.root() == tmp_path / "sub" and not store.any()
    assert store.load("decisions") == {}
    assert store.update("decisions", {"a": 1, "b": {"x": 2}})
    assert json.loads((tmp_path / "sub" / "decisions.json").read_text()) == {"a": 1,
                                                                           "b": {"x": 2}}
    assert store.put("decisions", "a", 3) and store.get("decisions", "a") == 3
    assert store.load("decisions") == {"a": 3, "b": {"x": 2}}  # update keeps the others
    store.forget()
    assert store.any()
    (tmp_path / "sub" / "decisions.json").write_text("{ damaged")
    assert store.load("decisions") == {}  # measured again, then rewritten
