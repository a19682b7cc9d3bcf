"""The wheel's optional-dependency check (tests/smoke/optional_deps_check.py) in the main suite,
where PyG, spconv and scipy are installed and would hide an import of one: every sparsejit
module imported and every layer compiled with fullgraph=True while those packages are refused.
And the check itself catches a planted import at import time and one inside traced code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECK = Path(__file__).resolve().parents[2] / "smoke" / "optional_deps_check.py"


def run_check(cwd, *args):
    return subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True,
                          timeout=900, cwd=cwd)


def test_sparsejit_imports_no_optional_dependency(tmp_path):
    r = run_check(tmp_path)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert "0 optional imports, 0 failures" in r.stdout


def test_the_check_catches_planted_imports(tmp_path):
    (tmp_path / "planted_mod.py").write_text(
        "import torch\n"
        "try:\n"
        "    import scipy.sparse  # at import time, even when the ImportError is caught\n"
        "except ImportError:\n"
        "    pass\n"
        "def f(x):\n"
        "    import tqdm  # inside traced code\n"
        "    return x + 1\n"
        "try:\n"
        "    torch.compile(f, fullgraph=True)(torch.ones(2))\n"
        "except Exception:\n"
        "    pass\n")
    r = run_check(tmp_path, "--no-compile", "--watch", str(tmp_path), "--extra", "planted_mod")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    # `import scipy.sparse` imports the parent package first: that is the refused import.
    assert f"'scipy' imported by the package's code: {tmp_path.resolve()}/planted_mod.py:3" \
        in r.stdout, r.stdout
    assert f"'tqdm' inside code torch.compile traces: {tmp_path.resolve()}/planted_mod.py:7 " \
        "(traced)" in r.stdout, r.stdout
    assert "2 optional imports" in r.stdout, r.stdout
