"""Which torch releases the op library loads under, and what `import sparsejit` says under the
others. Built on torch's stable ABI (SPARSEJIT_STABLE_ABI, the default), it loads under every
release from 2.10 up and an older one gets an ImportError naming the minimum. Built on the ATen
backend, it is bound to the C++ ABI of the release it was built against, and under another
release the ImportError names both versions and the fix, not a bare `undefined symbol`."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sparsejit
from sparsejit import _library

aten_only = pytest.mark.skipif(_library.STABLE_ABI, reason="the op library is on the stable ABI")
stable_only = pytest.mark.skipif(not _library.STABLE_ABI,
                                 reason="the op library is on the ATen backend")


def _stamp() -> Path:
    return Path(sparsejit.__file__).resolve().parent / "libsparsejit_ops.torch_version"


def test_stamp_records_the_torch_of_the_build():
    built = _stamp().read_text().strip()
    assert built.split(".")[:2] == torch.__version__.split("+")[0].split(".")[:2], built


def _import_under(version: str, env=None) -> subprocess.CompletedProcess:
    code = ("import torch\n"
            f"torch.__version__ = {version!r}\n"
            "import sparsejit\n"
            "print(sparsejit.spmm(sparsejit.SparseMatrix.from_edge_index("
            "torch.tensor([[0, 1], [1, 0]]), 2), torch.ones(2, 3)).sum().item())\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


@aten_only
def test_other_torch_release_is_refused_with_a_clear_error():
    built = _stamp().read_text().strip()
    r = _import_under("2.99.1+cu130")
    assert r.returncode != 0
    assert "ImportError" in r.stderr
    assert f"built against torch {built}" in r.stderr, r.stderr[-2000:]
    assert "2.99.1+cu130 is installed" in r.stderr
    assert "--no-build-isolation" in r.stderr


def test_same_release_other_patch_or_local_tag_loads():
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    r = _import_under(f"{major}.{minor}.7+cu130")
    assert r.returncode == 0, r.stderr[-2000:]


@aten_only
def test_mismatch_can_be_forced_with_a_warning():
    r = _import_under("2.99.1+cu130", {"SPARSEJIT_ALLOW_TORCH_MISMATCH": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "RuntimeWarning" in r.stderr and "results are not guaranteed" in r.stderr
    assert r.stdout.strip().splitlines()[-1] == "6.0"


@stable_only
def test_stable_abi_library_loads_under_newer_releases():
    """The stamp names the oldest release; a newer one (as torch reports it) loads and runs."""
    assert _stamp().read_text().split()[1:] == ["stable-abi", "2.10"]
    for version in ("2.10.0", "2.99.1+cu130"):
        r = _import_under(version)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.strip().splitlines()[-1] == "6.0"


@stable_only
def test_stable_abi_library_refuses_older_releases_by_name():
    r = _import_under("2.9.1+cu128")
    assert r.returncode != 0
    assert "ImportError" in r.stderr
    assert "stable ABI and loads under torch >= 2.10" in r.stderr, r.stderr[-2000:]
    assert "2.9.1+cu128 is installed" in r.stderr


@stable_only
def test_stable_abi_library_holds_no_cpp_torch_symbol():
    """Every symbol the op library takes from torch is a C function of its stable shim
    (aoti_torch_* / torch_*): no mangled at::, c10:: or torch:: C++ symbol that a later release
    could change."""
    import shutil
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm")
    lib = Path(sparsejit.__file__).resolve().parent / "libsparsejit_ops.so"
    lib = Path(os.environ.get("SPARSEJIT_OPS_LIBRARY", lib))
    out = subprocess.run([nm, "-D", "--undefined-only", str(lib)], capture_output=True,
                         text=True, check=True).stdout
    names = [ln.split()[-1] for ln in out.splitlines() if ln.strip()]
    bad = [n for n in names if any(k in n for k in ("2at", "3c10", "5torch", "5caffe2"))]
    assert not bad, bad[:20]
    assert any(n.startswith("aoti_torch_") for n in names)


def test_undefined_symbol_is_reported_as_a_torch_mismatch(tmp_path):
    """A library whose symbols the running torch lacks (what an ABI change looks like) gives
    the same ImportError, with the loader's message attached."""
    import shutil
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        import pytest
        pytest.skip("no C compiler")
    (tmp_path / "stub.c").write_text(
        "extern void sparsejit_symbol_torch_never_had(void);\n"
        "void f(void) { sparsejit_symbol_torch_never_had(); }\n")
    lib = tmp_path / "libstub.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "stub.c")],
                   check=True)
    (tmp_path / "libstub.torch_version").write_text(torch.__version__.split("+")[0] + "\n")
    r = subprocess.run([sys.executable, "-c", "import sparsejit"], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "SPARSEJIT_OPS_LIBRARY": str(lib)})
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "built against torch" in r.stderr, r.stderr[-2000:]
    assert "undefined symbol: sparsejit_symbol_torch_never_had" in r.stderr
