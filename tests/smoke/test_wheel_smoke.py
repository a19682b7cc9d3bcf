"""Smoke suite of an installed wheel: run from outside the source tree, in a venv that holds
only the wheel and its dependencies (`make test-wheel`). Every op family, the JIT, a PyG-style
layer, an spconv module, ``sparsify``, ``python -m sparsejit.info``, the benchmark console
script and the C++ package found by CMake. Beside it: test_families.py (each family forward and
backward against a plain reference), test_compile_export.py (every layer under torch.compile
and torch.export) and test_optional_deps.py (no optional package imported at import time or
in traced code)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

import sparsejit as sj
from sparsejit import _core, spconv

REPO = Path(os.environ.get("SPARSEJIT_SOURCE_DIR", Path(__file__).resolve().parents[2]))


def test_imported_from_the_installed_wheel():
    pkg = Path(sj.__file__).resolve().parent
    site = Path(sysconfig.get_paths()["platlib"]).resolve()
    assert pkg.parent == site, f"sparsejit imported from {pkg}, not from {site}"
    assert not any(p.name.endswith("sparsejit-dev.pth") for p in site.iterdir())
    for lib in ("libsparsejit_ops.so", "libsparsejit_core.so"):
        assert (pkg / lib).exists(), lib
    # The torch release the op library was built against, and (on the stable ABI) the oldest
    # one it loads under, read by `import sparsejit`.
    lines = (pkg / "libsparsejit_ops.torch_version").read_text().split("\n")
    running = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    if len(lines) > 1 and lines[1].startswith("stable-abi "):
        minimum = tuple(int(v) for v in lines[1].split()[1].split("."))
        assert running >= minimum, lines
        assert sj._library.STABLE_ABI
    else:
        assert tuple(int(v) for v in lines[0].split(".")[:2]) == running, lines


def _graph(n=3000, avg=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (n * avg,), generator=g)
    dst = torch.randint(0, n, (n * avg,), generator=g)
    return torch.stack([src, dst]), g


def test_spmm_family_and_the_jit(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSEJIT_CACHE_DIR", str(tmp_path))
    _core.jit_refresh_env()
    ei, g = _graph()
    x = torch.randn(3000, 64, generator=g)
    A = sj.SparseMatrix.from_edge_index(ei, 3000)
    ref = torch.zeros(3000, 64).index_add_(0, ei[1], x[ei[0]])
    torch.testing.assert_close(sj.spmm(A, x), ref)
    s = sj.sddmm(A, x, x)
    assert s.shape == (A.nnz,)
    p = sj.edge_softmax(A, s)
    assert torch.isfinite(p).all()
    info = _core.jit_spmm(0, 1, "sum", 0, 1, 64, 0, 0)
    assert info["ok"] and _core.jit_enabled(), info["error"]
    assert any(tmp_path.rglob("*.so")), "the JIT wrote no shared object into its cache"


def test_attention_and_a_pyg_layer():
    ei, g = _graph(seed=1)
    x = torch.randn(3000, 16, generator=g, requires_grad=True)
    conv = sj.nn.GATConv(16, 8, heads=2)
    out = conv(x, ei)
    assert out.shape == (3000, 16)
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    gcn = sj.nn.GCNConv(16, 4)
    assert gcn(x, ei).shape == (3000, 4)


def test_rgms():
    ei, g = _graph(seed=2)
    et = torch.randint(0, 3, (ei.shape[1],), generator=g)
    conv = sj.nn.RGCNConv(8, 4, 3)
    x = torch.randn(3000, 8, generator=g)
    assert conv(x, ei, et).shape == (3000, 4)


def test_point_conv_spconv_module():
    g = torch.Generator().manual_seed(3)
    xyz = torch.unique(torch.randint(0, 32, (4000, 3), generator=g, dtype=torch.int32), dim=0)
    coords = torch.cat([torch.zeros(len(xyz), 1, dtype=torch.int32), xyz], 1)
    feats = torch.randn(len(xyz), 4, generator=g)
    x = spconv.SparseConvTensor(feats, coords, [32, 32, 32], 1)
    y = spconv.SubMConv3d(4, 8, 3, indice_key="a")(x)
    assert y.features.shape == (len(xyz), 8)


def test_filter_conv():
    conv = torch.nn.Conv2d(8, 8, 3, padding=1)
    with torch.no_grad():
        conv.weight.mul_((torch.rand_like(conv.weight) > 0.7).float())
    x = torch.randn(1, 8, 12, 12)
    torch.testing.assert_close(sj.nn.PrunedConv2d.from_dense(conv)(x), conv(x), rtol=1e-4, atol=1e-4)


def test_sparsify_a_pruned_block():
    """sparsify swaps the pruned convolutions it measures faster (or keeps them) and the model
    computes the same either way."""
    torch.manual_seed(4)
    block = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 8, 3, padding=1)).eval()
    with torch.no_grad():
        for conv in (block[0], block[2]):
            conv.weight[torch.rand_like(conv.weight) < 0.8] = 0
    x = torch.randn(1, 8, 12, 12)
    fast = sj.sparsify(block, x, repeat=3, progress=False, verbose=False)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), block(x), rtol=1e-4, atol=1e-4)


def test_info_module():
    """``python -m sparsejit.info --json``: the report of the installed package."""
    import json
    r = subprocess.run([sys.executable, "-m", "sparsejit.info", "--json"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["sparsejit"]["version"] == sj.__version__
    assert Path(report["sparsejit"]["package"]).resolve() == Path(sj.__file__).resolve().parent
    assert report["torch"]["version"] == torch.__version__
    text = subprocess.run([sys.executable, "-m", "sparsejit.info"], capture_output=True,
                          text=True, timeout=300)
    assert text.returncode == 0 and sj.__version__ in text.stdout, text.stderr[-3000:]


@pytest.mark.skipif(shutil.which("cmake") is None,
                    reason="cmake is not on PATH: find_package(sparsejit) not checked")
def test_cpp_package_found_by_cmake(tmp_path):
    prefix = f"{sj.cmake_prefix_path};{torch.utils.cmake_prefix_path}"
    assert Path(sj.cmake_prefix_path, "sparsejit", "sparsejitConfig.cmake").exists()
    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", str(REPO / "examples" / "cpp"), "-B", str(build),
                    f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release"],
                   check=True, capture_output=True, text=True)
    r = subprocess.run(["cmake", "--build", str(build), "-j", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    run = subprocess.run([str(build / "spmm_example")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_benchmark_console_script(tmp_path):
    """The installed `sparsejit-bench` runs two families against their peers."""
    exe = Path(sys.executable).parent / "sparsejit-bench"
    assert exe.exists(), f"{exe} was not installed"
    out = tmp_path / "r.json"
    r = subprocess.run([str(exe), "--quick", "--families", "rgms", "filter_conv", "--out-json",
                        str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    import json
    recs = json.loads(out.read_text())["records"]
    assert {x["family"] for x in recs} == {"rgms", "filter_conv"}
    assert all(x["ok"] for x in recs)
