"""sj.tune for point-cloud sparse convolution (python/sparsejit/families/point_conv/tuner.py):
both dataflows measured on the real kernel map, the winner stored on disk and consulted by point_conv and
the spconv modules (forward and the backward's feature gradient)."""

import json

import pytest
import torch

import sparsejit as sj
import sparsejit.spconv as spconv
from sparsejit.families.point_conv import tuner as conv_tuning
from sparsejit.families.point_conv.ops import point_conv_plan, point_conv


def sites(n=400, side=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    flat = torch.randperm(side ** 3, generator=g)[:n]
    return torch.stack([torch.zeros_like(flat), flat // side ** 2, flat // side % side,
                        flat % side], 1).int(), [side] * 3


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSEJIT_CACHE_DIR", str(tmp_path))
    sj._core.jit_refresh_env()
    conv_tuning.clear_schedule_cache()
    yield tmp_path
    conv_tuning.clear_schedule_cache()
    monkeypatch.delenv("SPARSEJIT_CACHE_DIR")
    sj._core.jit_refresh_env()


class CallLog:
    """Wraps torch.ops.sparsejit.point_conv{,_backward} to record the dataflow each call got."""

    def __init__(self, monkeypatch):
        self.fwd, self.bwd, self.wgrad = [], [], []
        ns = torch.ops.sparsejit
        real_f, real_b = ns.point_conv, ns.point_conv_backward

        def f(*a):
            self.fwd.append(a[6] & 3)  # bits 2-3 carry the backward's choice
            return real_f(*a)

        def b(*a):
            self.bwd.append(a[5] & 3)  # bits 2-3: the weight-gradient path
            self.wgrad.append(a[5] >> 2)
            return real_b(*a)

        f.default = f  # point_conv calls the overload (runtime.autograd.call_op)
        monkeypatch.setattr(ns, "point_conv", f)
        monkeypatch.setattr(ns, "point_conv_backward", b)


def test_nothing_tuned_means_cost_model(cache, monkeypatch):
    idx, shape = sites()
    plan, _ = point_conv_plan(idx, shape, 1, "subm", 3)
    assert conv_tuning.tuned_dataflow(plan, 8, 8, torch.float32, False) == 0
    log = CallLog(monkeypatch)
    point_conv(torch.randn(len(idx), 8), torch.randn(27, 8, 8), None, plan, len(idx))
    assert log.fwd == [0]


def test_tune_plan_stores_and_is_consulted(cache, monkeypatch, capsys):
    idx, shape = sites(seed=1)
    plan, _ = point_conv_plan(idx, shape, 1, "subm", 3)
    res = sj.tune(plan, F=8, F_out=16, repeat=1, progress=True)
    assert "sparsejit.tune conv" in capsys.readouterr().err      # the progress bar
    assert set(res["times_ms"]) == {f"{p}/{d}" for p in ("forward", "backward")
                                    for d in ("gather_gemm_scatter", "output_stationary")} | \
        {"wgrad/registers", "wgrad/gemm"}
    for part in ("forward", "backward", "wgrad"):  # the winner is the faster measured one
        win = res["best"][part]
        assert all(res["times_ms"][f"{part}/{win}"] <= t for k, t in res["times_ms"].items()
                   if k.startswith(part))
    stored = list((cache / "tuned").glob("point_conv-*.json"))
    assert len(stored) == 1
    entry = json.loads(stored[0].read_text())[res["key"]]
    ids = {v: k for k, v in conv_tuning.DATAFLOW_NAMES.items()}
    wids = {v: k for k, v in conv_tuning.WGRAD_NAMES.items()}
    assert (entry["forward"], entry["backward"], entry["wgrad"]) == (
        ids[res["best"]["forward"]], ids[res["best"]["backward"]], wids[res["best"]["wgrad"]])
    # "A new process": memory dropped, the store read from disk by a rebuilt (equal) plan.
    conv_tuning.clear_schedule_cache()
    plan2, _ = point_conv_plan(idx, shape, 1, "subm", 3)
    assert conv_tuning.plan_fingerprint(plan2) == res["fingerprint"]
    log = CallLog(monkeypatch)
    x = torch.randn(len(idx), 8, requires_grad=True)
    w = torch.randn(27, 8, 16, requires_grad=True)
    y = point_conv(x, w, None, plan2, len(idx))
    y.sum().backward()
    assert log.fwd == [entry["forward"]] and log.bwd == [entry["backward"]]
    assert log.wgrad == [entry["wgrad"]]
    # Other widths, dtypes or directions are not tuned; a forced dataflow is kept.
    assert conv_tuning.tuned_dataflow(plan2, 8, 8, torch.float32, False) == 0
    assert conv_tuning.tuned_dataflow(plan2, 8, 16, torch.float64, False) == 0
    assert conv_tuning.tuned_dataflow(plan2, 8, 16, torch.float32, True) == 0
    point_conv(x, w, None, plan2, len(idx), dataflow="gather_gemm_scatter")
    assert log.fwd[-1] == 1
    # The result does not depend on the choice.
    ref = point_conv(x.double(), w.double(), None, plan2, len(idx), dataflow=1)
    torch.testing.assert_close(y.double(), ref, atol=1e-4, rtol=1e-4)


def test_corrupt_or_foreign_store_is_ignored(cache):
    idx, shape = sites(seed=2)
    plan, _ = point_conv_plan(idx, shape, 1, "subm", 3)
    fp = conv_tuning.plan_fingerprint(plan)
    (cache / "tuned").mkdir()
    path = cache / "tuned" / f"point_conv-{fp}.json"
    key = conv_tuning.schedule_key(8, 8, torch.float32, False)
    for text in ("{not json", json.dumps({key: {"forward": 7, "backward": 1, "wgrad": 1}}),
                 json.dumps({key: {"forward": 1, "backward": 1}}), json.dumps({key: "x"})):
        path.write_text(text)
        conv_tuning.clear_schedule_cache()
        assert conv_tuning.tuned_dataflow(plan, 8, 8, torch.float32, False) == 0
    path.write_text(json.dumps({key: {"forward": 2, "backward": 1, "wgrad": 2}}))
    conv_tuning.clear_schedule_cache()
    assert conv_tuning.tuned_choices(plan, 8, 8, torch.float32, False) == (2, 1, 2)
    # A store under the prefix before the rename ("conv-") is not read: measured again.
    path.rename(cache / "tuned" / f"conv-{fp}.json")
    conv_tuning.clear_schedule_cache()
    assert conv_tuning.tuned_choices(plan, 8, 8, torch.float32, False) == (0, 0, 0)


def test_tune_model_covers_every_layer_and_keeps_results(cache, monkeypatch):
    idx, shape = sites(n=600, side=16, seed=3)
    torch.manual_seed(0)
    net = spconv.SparseSequential(
        spconv.SubMConv3d(4, 8, 3, indice_key="s0"),
        spconv.SparseConv3d(8, 16, 3, stride=2, padding=1, indice_key="d0"),
        spconv.SubMConv3d(16, 16, 3),
        spconv.SparseInverseConv3d(16, 8, 3, indice_key="d0"))
    feats = torch.randn(len(idx), 4)

    def run():
        return net(spconv.SparseConvTensor(feats, idx, shape, 1)).features

    before = run()
    res = sj.tune(net, spconv.SparseConvTensor(feats, idx, shape, 1), repeat=1, progress=False)
    got = {(l["c_in"], l["c_out"], l["swap"]) for l in res["layers"]}
    assert got == {(4, 8, False), (8, 16, False), (16, 16, False), (16, 8, True)}
    assert all(l["module"] != "?" for l in res["layers"])
    log = CallLog(monkeypatch)
    after = run()
    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)
    ids = {v: k for k, v in conv_tuning.DATAFLOW_NAMES.items()}
    want = [ids[l["best"]["forward"]] for l in res["layers"]]
    assert sorted(log.fwd) == sorted(want) and 0 not in log.fwd


def test_tune_bad_arguments(cache):
    idx, shape = sites(seed=4)
    plan, _ = point_conv_plan(idx, shape, 1, "subm", 3)
    with pytest.raises(ValueError, match="channel"):
        sj.tune(plan, F=0)
    with pytest.raises(TypeError, match="dtype"):
        sj.tune(plan, F=4, dtype=torch.int32)
    x, w = torch.randn(len(idx), 4), torch.randn(27, 4, 4)
    dy = torch.randn(len(idx), 4)
    for bad in (3, 7, 12 << 2, 64, -1):  # the ops themselves name the argument
        with pytest.raises(ValueError, match="dataflow"):
            torch.ops.sparsejit.point_conv(x, w, None, plan, len(idx), False, bad)
    for bad in (3, 12, 16, -1):
        with pytest.raises(ValueError, match="dataflow"):
            torch.ops.sparsejit.point_conv_backward(x, w, dy, plan, False, bad, True, True)
    torch.testing.assert_close(  # bits 2-5 (the backward's choices) do not change the forward
        torch.ops.sparsejit.point_conv(x, w, None, plan, len(idx), False, 1 | 8 | 32),
        torch.ops.sparsejit.point_conv(x, w, None, plan, len(idx), False, 2))
    for wpath in (4, 8):  # both weight-gradient paths agree with a float64 reference
        got = torch.ops.sparsejit.point_conv_backward(x, w, dy, plan, False, wpath, True,
                                                       True)
        ref = torch.ops.sparsejit.point_conv_backward(x.double(), w.double(), dy.double(),
                                                       plan, False, 1, True, True)
        for g, r in zip(got, ref):
            torch.testing.assert_close(g.double(), r, atol=1e-4, rtol=1e-4)
    assert not conv_tuning.is_conv_plan(torch.zeros(20, dtype=torch.long))
    assert not conv_tuning.is_conv_plan(plan.int())
