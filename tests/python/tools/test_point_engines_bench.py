"""benchmarks/point_engines.py and bench_point_engines.py (issue 49's side-by-side benchmark):
the canonical weight layout against dense conv3d references, every engine adapter that imports
here (sparsejit's spconv, MinkowskiEngine and TorchSparse APIs; spconv, MinkowskiEngine and
TorchSparse themselves where installed) against sparsejit on the same weights, MinkUNet14A on
every engine, and the script end to end on generated voxels."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_point_engines as B  # noqa: E402
from point_engines import MinkUNet14A, canonical_weights, engines, load_weights  # noqa: E402

SIDE = 12


def cloud(kind: str, seed: int = 0) -> torch.Tensor:
    """[N, 4] int32 sites (batch first) in a SIDE^3 grid: random, skewed (one dense corner
    plus a line), a single site, or two batches."""
    g = torch.Generator().manual_seed(seed)
    if kind == "one":
        return torch.tensor([[0, 3, 4, 5]], dtype=torch.int32)
    if kind == "skewed":
        corner = torch.stack(torch.meshgrid(*[torch.arange(4)] * 3, indexing="ij"), -1)
        line = torch.stack([torch.arange(SIDE), torch.full((SIDE,), 9), torch.full((SIDE,), 2)], 1)
        xyz = torch.unique(torch.cat([corner.reshape(-1, 3), line]), dim=0)
        return torch.cat([torch.zeros(len(xyz), 1, dtype=torch.long), xyz], 1).int()
    flat = torch.randperm(SIDE ** 3, generator=g)[:300]
    xyz = torch.stack([flat // SIDE ** 2, flat // SIDE % SIDE, flat % SIDE], 1)
    b = torch.randint(0, 2 if kind == "batches" else 1, (len(flat), 1), generator=g)
    return torch.unique(torch.cat([b, xyz], 1), dim=0).int()


def dense(coords, feats, batch):
    d = torch.zeros(batch, feats.shape[1], SIDE, SIDE, SIDE, dtype=feats.dtype)
    c = coords.long()
    d[c[:, 0], :, c[:, 1], c[:, 2], c[:, 3]] = feats
    return d


def at(d, coords):
    c = coords.long()
    return d[c[:, 0], :, c[:, 1], c[:, 2], c[:, 3]]


@pytest.fixture(scope="module")
def engs():
    e = engines()
    B.set_shape(e, [SIDE] * 3)
    return e


@pytest.mark.parametrize("kind", ["random", "skewed", "one", "batches"])
def test_canonical_layout_against_dense_conv3d(engs, kind):
    """sparsejit with the canonical weights [kx, ky, kz, Ci, Co] computes what the module
    docstring says: offset a - 1 for the 3x3x3 kernel, input 2 o + a for kernel 2 stride 2,
    and the transposed convolution as its mirror (float64 dense references)."""
    e = engs["sparsejit"]
    coords = cloud(kind)
    batch = int(coords[:, 0].max()) + 1
    x = torch.randn(len(coords), 5, dtype=torch.float64)
    w3 = torch.randn(3, 3, 3, 5, 6, dtype=torch.float64)
    w2, wt = torch.randn(2, 2, 2, 5, 6, dtype=torch.float64), torch.randn(2, 2, 2, 6, 5,
                                                                          dtype=torch.float64)
    to_conv = lambda w: w.permute(4, 3, 0, 1, 2)  # noqa: E731  [Co, Ci, kx, ky, kz]
    for mods_w, kinds in (([w3], ["subm"]), ([w2], ["down"]), ([w2, wt], ["down", "up"])):
        mods = [e.conv(k, w.shape[3], w.shape[4], w.shape[0], "d") for k, w in zip(kinds, mods_w)]
        for m, w in zip(mods, mods_w):
            m.double()
            e.to_engine(m, w)
        out = B.run_layers(e, mods, coords, x)
        xd = dense(coords, x, batch)
        if kinds == ["subm"]:
            ref, ref_sites = at(F.conv3d(xd, to_conv(w3), padding=1), coords), coords
        else:
            zd = F.conv3d(xd, to_conv(w2), stride=2)
            if kinds == ["down"]:
                sites = torch.unique(torch.cat([coords[:, :1], coords[:, 1:] // 2], 1), dim=0)
                ref, ref_sites = at(zd, sites), sites
            else:  # the transposed conv's input is zero off the strided sites: mask zd
                sites = torch.unique(torch.cat([coords[:, :1], coords[:, 1:] // 2], 1), dim=0)
                mask = torch.zeros_like(zd[:, :1])
                mask[sites[:, 0].long(), 0, sites[:, 1].long(), sites[:, 2].long(),
                     sites[:, 3].long()] = 1
                ud = F.conv_transpose3d(zd * mask, wt.permute(3, 4, 0, 1, 2), stride=2)
                ref, ref_sites = at(ud, coords), coords
        got = B.sorted_rows(e.coords(out), e.feats(out))
        torch.testing.assert_close(got, B.sorted_rows(ref_sites, ref), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kind", ["subm", "strided", "strided+transposed"])
@pytest.mark.parametrize("cloud_kind", ["random", "skewed", "one", "batches"])
def test_every_engine_agrees_with_sparsejit(engs, kind, cloud_kind):
    if len(engs) < 2:
        pytest.skip("no second engine imports here")
    coords = cloud(cloud_kind, seed=1)
    g = torch.Generator().manual_seed(2)
    ws = [torch.randn(k, k, k, 8, 8, generator=g) for k in ((3,) if kind == "subm" else (2, 2))]
    res = B.check_layers(engs, kind, 8, coords, ws)
    for name in engs:
        if name == "sparsejit":
            continue
        assert "error" not in res[name], (name, res[name])
        assert res[name]["agree"], (name, res[name])
        assert res[name]["out"] < 1e-4, (name, res[name])


@pytest.mark.slow  # (8-23 s: runs in make test-slow)
def test_minkunet14_same_on_every_engine(engs):
    # 800 sites in 48^3, two batches: the fourth stride-2 level (16^3 cells) still has
    # more than one site, which training-mode BatchNorm needs
    g = torch.Generator().manual_seed(3)
    flat = torch.randperm(48 ** 3, generator=g)[:800]
    coords = torch.stack([flat % 2, flat // 48 ** 2, flat // 48 % 48, flat % 48], 1).int()
    feats = torch.randn(len(coords), 4, generator=torch.Generator().manual_seed(4))
    r = B.bench_minkunet(engs, "random", coords, [48] * 3, feats, 0.125, 1)
    assert r["errors"] == {}, r["errors"]
    for name in engs:
        if name != "sparsejit":
            # Outputs must agree; the input gradient only roughly. Likely cause (not verified):
            # through 21 ReLUs after training-mode BatchNorm, a pre-activation within rounding
            # of 0 flips between engines that sum in different orders (seen: spconv 2.6% of the largest entry here;
            # ME, spconv and sparsejit.minkowski 0.1-0.2 on a KITTI scan, where TorchSparse and
            # sparsejit.torchsparse agree to 1e-5), so the benchmark reports it and flags it.
            md = r["maxdiff"][name]
            assert md["inference_out"] < 1e-4 and md["train_out"] < 1e-3, (name, md)
            assert md["grad_in"] < 0.05 * md["grad_in_ref_max"], (name, md)
        assert r["fwd_bwd_ms"][name] > 0 and r["inference_ms"][name] > 0


def test_canonical_weights_cover_every_conv(engs):
    net = MinkUNet14A(engs["sparsejit"], width=0.125)
    ws = canonical_weights(net)
    # stem, 4 downs, 8 blocks of two 3x3x3 convs, 4 ups, the head, and a 1x1x1 projection in
    # each block whose width changes (at width 1: all but the first)
    assert len(ws) == len(net.convs())
    full = MinkUNet14A(engs["sparsejit"])
    assert len(full.convs()) == 1 + 4 + 16 + 4 + 1 + 7
    load_weights(net, ws)
    assert {w.shape[0] for w in ws} == {1, 2, 3, 5}


@pytest.mark.slow  # (8-23 s: runs in make test-slow)
def test_script_end_to_end(tmp_path):
    out = tmp_path / "engines.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_point_engines.py"),
                        "--scenes", "random", "--channels", "8", "--reps", "1", "--no-nets",
                        "--out", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads(out.read_text())
    assert rec["meta"]["cpu"] and rec["meta"]["peak"]["measured_mm_2048_gflops"] > 0
    kinds = [row["kind"] for row in rec["convs"]]
    assert kinds == ["subm", "strided", "strided+transposed"]
    for row in rec["convs"]:
        assert row["fwd_bwd_ms"]["sparsejit"] > 0
        assert all(v.get("agree", True) for k, v in row["maxdiff"].items()
                   if isinstance(v, dict) and "error" not in v)
    assert "| random_20k_128cube | 8 | subm |" in rec["summary_md"]
