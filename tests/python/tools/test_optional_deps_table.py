"""scripts/optional_deps.py (the CI check of which tests need which optional package) on a small
test tree of its own: each way a test can need a package is found, a test module that breaks
without one is reported, and a table that differs from the tests fails the check."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "optional_deps.py"

TREE = {
    "test_module_skip.py": """
        import pytest
        sp = pytest.importorskip("scipy.sparse")
        def test_a():
            assert sp is not None
        """,
    "test_marks.py": """
        import pytest
        try:
            import spconv
        except ImportError:
            spconv = None
        @pytest.mark.skipif(spconv is None, reason="needs spconv")
        def test_against_spconv():
            assert spconv is not None
        @pytest.mark.skipif(True, reason="never runs here, for another reason")
        def test_other_skip():
            pass
        def helper():
            return pytest.importorskip("torch_geometric")
        @pytest.mark.parametrize("n", [1, 2])
        def test_through_a_helper(n):
            assert helper() is not None
        def test_needs_nothing():
            assert 1 + 1 == 2
        """,
}


def run(tree: Path, table: Path, *args):
    env = dict(os.environ, SPARSEJIT_OPTIONAL_DEPS_TESTS=str(tree))
    return subprocess.run([sys.executable, str(SCRIPT), "--table", str(table), *args], env=env,
                          capture_output=True, text=True, timeout=600)


def write_tree(root: Path, files: dict) -> Path:
    tree = root / "tree"
    tree.mkdir()
    for name, text in files.items():
        (tree / name).write_text(textwrap.dedent(text))
    return tree


def test_finds_each_kind_of_need_and_checks_the_table(tmp_path):
    tree, table = write_tree(tmp_path, TREE), tmp_path / "table.txt"
    r = run(tree, table, "--update")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [ln for ln in table.read_text().splitlines() if not ln.startswith("#")]
    assert rows == ["test_marks.py::test_against_spconv  spconv",
                    "test_marks.py::test_through_a_helper  torch_geometric",
                    "test_module_skip.py  scipy"], rows
    assert run(tree, table).returncode == 0
    # a row the tests no longer justify fails the check, naming it
    table.write_text(table.read_text() + "test_marks.py::test_needs_nothing  scipy\n")
    r = run(tree, table)
    assert r.returncode == 1
    assert "in table.txt but not found in the tests: test_marks.py::test_needs_nothing" \
        in r.stdout, r.stdout


def test_a_module_that_breaks_without_a_package_fails(tmp_path):
    tree = write_tree(tmp_path, {"test_plain_import.py": """
        import scipy
        def test_a():
            assert scipy
        """})
    r = run(tree, tmp_path / "table.txt", "--update")
    assert r.returncode == 1
    assert "test_plain_import.py fails to collect without the optional packages" in r.stdout, \
        r.stdout
    assert "scipy" in r.stdout, r.stdout
