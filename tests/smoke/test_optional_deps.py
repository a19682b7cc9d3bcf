"""No module of the installed package imports an optional dependency (PyG, spconv, scipy, DGL,
tqdm, matplotlib, ...) at import time or inside code torch.compile traces: every module is
imported and every layer run and compiled with fullgraph=True while an import hook treats
those packages as absent (optional_deps_check.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECK = Path(__file__).resolve().parent / "optional_deps_check.py"


def test_no_optional_dependency_at_import_or_in_traced_code(tmp_path):
    r = subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True,
                       timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert "0 optional imports, 0 failures" in r.stdout
