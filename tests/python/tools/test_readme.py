"""The README's Python code blocks run. A block may be preceded by an HTML comment
``<!-- readme-test setup: ... -->`` with the inputs it assumes (invisible on the rendered
page); each block runs in a fresh namespace, in a temporary directory, with its own JIT and
tuning cache."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[3] / "README.md"
_BLOCK = re.compile(r"(?:<!-- readme-test setup:\n(?P<setup>.*?)-->\n)?```python\n(?P<code>.*?)```",
                    re.S)


def _blocks():
    text = README.read_text()
    out = []
    for m in _BLOCK.finditer(text):
        line = text.count("\n", 0, m.start("code")) + 1
        out.append(pytest.param(m.group("setup") or "", m.group("code"), line,
                                id=f"README.md:{line}"))
    return out


def test_the_readme_has_python_blocks():
    assert len(_blocks()) >= 4


@pytest.mark.parametrize("setup,code,line", _blocks())
def test_readme_block_runs(setup, code, line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPARSEJIT_CACHE_DIR", str(tmp_path / "cache"))
    ns: dict = {"__name__": "readme"}
    exec(compile(setup, f"README.md setup before line {line}", "exec"), ns)
    # The block's own line numbers, so a failure points into README.md.
    exec(compile("\n" * (line - 1) + code, str(README), "exec"), ns)
