#!/usr/bin/env python3
"""Which tests need which optional dependency, checked against tests/optional_deps.txt, so a
test skipped for a missing package is a choice written down, not an accident (issue 50).

    python scripts/optional_deps.py            # exit 1 when the table and the tests differ
    python scripts/optional_deps.py --update   # rewrite the table from the tests

Collection only (no test runs; about a minute on 2 cores). The tests under tests/python are
collected twice: as they are, and with every package of ``OPTIONAL`` made absent by the import
hook of tests/smoke/optional_deps_check.py. A test module skipped by ``pytest.importorskip``,
and a test whose ``skipif`` holds only without the packages, needs the packages its file
tried to import; ``pytest.importorskip`` calls inside a test's body are read from the source
(they run only when the test does). A test module that fails to collect without a package
(a plain top-level import) is an accident and always fails the check.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Overridable (tests of this script run it on a small test tree of their own).
TESTS = Path(os.environ.get("SPARSEJIT_OPTIONAL_DEPS_TESTS", REPO / "tests" / "python")).resolve()
TABLE = REPO / "tests" / "optional_deps.txt"
sys.path.insert(0, str(REPO / "tests" / "smoke"))
from optional_deps_check import OPTIONAL, RefuseOptional  # noqa: E402

_OUT_ENV = "SPARSEJIT_OPTIONAL_DEPS_OUT"
_REFUSE_ENV = "SPARSEJIT_OPTIONAL_DEPS_REFUSE"


# ---- the pytest plugin (this file, loaded with -p optional_deps in the collection runs) ----
_HOOK = None
_SKIPS = []  # [nodeid, kind, reason]


def pytest_configure(config):
    global _HOOK
    if os.environ.get(_REFUSE_ENV) == "1" and _HOOK is None:
        _HOOK = RefuseOptional([str(TESTS)])
        sys.meta_path.insert(0, _HOOK)


def pytest_collectreport(report):
    if report.skipped:
        _SKIPS.append([report.nodeid, "module", str(report.longrepr[-1])])
    elif report.failed:
        _SKIPS.append([report.nodeid, "error", str(report.longrepr)[-600:]])


def pytest_collection_modifyitems(session, config, items):
    from _pytest.skipping import evaluate_skip_marks

    for item in items:
        skip = evaluate_skip_marks(item)
        if skip is not None:
            _SKIPS.append([item.nodeid, "mark", skip.reason])


def pytest_collection_finish(session):
    attempts = defaultdict(set)
    for name, where, _ in (_HOOK.attempts if _HOOK else []):
        attempts[os.path.relpath(where.split(":")[0], TESTS)].add(name.split(".")[0])
    with open(os.environ[_OUT_ENV], "w") as f:
        json.dump({"skips": _SKIPS, "attempts": {k: sorted(v) for k, v in attempts.items()}}, f)


# ---- the check ----------------------------------------------------------------------------
def collect(refuse: bool, out: Path) -> dict:
    env = dict(os.environ, **{_OUT_ENV: str(out), _REFUSE_ENV: "1" if refuse else "0",
                              "PYTHONPATH": os.pathsep.join(
                                  [str(Path(__file__).parent)] +
                                  [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                   if p])})
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                        "-p", "no:cacheprovider", "-p", "optional_deps", "."],
                       cwd=TESTS, env=env, capture_output=True, text=True, timeout=1800)
    if not out.exists():
        sys.exit(f"optional_deps: pytest --collect-only gave no result:\n{r.stdout[-3000:]}"
                 f"\n{r.stderr[-3000:]}")
    return json.loads(out.read_text())


def _module_of(reason: str, attempted) -> list:
    """The optional packages a skip is for: named in importorskip's reason, else those the
    test file tried to import, else "unknown" (a row that asks a person to look)."""
    named = sorted({p for p in OPTIONAL if f"'{p}" in reason or f"{p}." in reason})
    return named or sorted(attempted) or ["unknown"]


def body_importorskips() -> dict:
    """``file::test`` -> packages of the ``pytest.importorskip`` calls inside its body, or
    inside a helper of its file that it calls (one level)."""
    found = defaultdict(set)
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        fns = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        direct = {}
        for fn in fns:
            pkgs = {str(c.args[0].value).split(".")[0] for c in ast.walk(fn)
                    if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                    and c.func.attr == "importorskip" and c.args
                    and isinstance(c.args[0], ast.Constant)}
            direct[fn.name] = pkgs & set(OPTIONAL)
        for fn in fns:
            if not fn.name.startswith("test"):
                continue
            called = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
            pkgs = direct[fn.name].union(*[direct[h] for h in called if h in direct])
            if pkgs:
                found[f"{path.relative_to(TESTS).as_posix()}::{fn.name}"] |= pkgs
    return found


def _relative(nodeid: str) -> str:
    """A node id relative to tests/python (pytest gives a module's own report from the
    repository root)."""
    if not TESTS.is_relative_to(REPO):
        return nodeid
    prefix = TESTS.relative_to(REPO).as_posix() + "/"
    return nodeid[len(prefix):] if nodeid.startswith(prefix) else nodeid


def table_from_tests(tmp: Path):
    """({test: {packages}}, [accidents])."""
    base = collect(False, tmp / "base.json")
    bare = collect(True, tmp / "bare.json")
    skipped_before = {_relative(nodeid) for nodeid, _, _ in base["skips"]}
    needs, accidents = defaultdict(set), []
    for nodeid, kind, reason in bare["skips"]:
        nodeid = _relative(nodeid)
        if nodeid in skipped_before:
            continue  # skipped for another reason (no GPU, no data folder, ...)
        file = nodeid.split("::")[0]
        if kind == "error":
            accidents.append(f"{file} fails to collect without the optional packages: "
                             f"{reason.strip().splitlines()[-1]}")
            continue
        # parametrized copies of one test are one row
        test = nodeid.split("[")[0]
        needs[test] |= set(_module_of(reason, bare["attempts"].get(file, ())))
    for test, pkgs in body_importorskips().items():
        if test.split("::")[0] not in needs:  # a skipped module covers its tests
            needs[test] |= pkgs
    return needs, accidents


def render(needs) -> str:
    lines = ["# Tests that need an optional package, with the packages (scripts/optional_deps.py",
             "# checks this table in CI; `--update` rewrites it). A test not listed runs with only",
             "# torch, numpy and pytest installed."]
    lines += [f"{test}  {' '.join(sorted(pkgs))}" for test, pkgs in sorted(needs.items())]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--update", action="store_true", help="rewrite the table")
    ap.add_argument("--table", type=Path, default=TABLE, help="default: %(default)s")
    args = ap.parse_args(argv)
    table = args.table
    with tempfile.TemporaryDirectory() as tmp:
        needs, accidents = table_from_tests(Path(tmp))
    text = render(needs)
    for a in accidents:
        print(f"optional_deps: {a}")
    if args.update:
        table.write_text(text)
        print(f"optional_deps: wrote {len(needs)} rows to {table}")
        return 1 if accidents else 0
    old = table.read_text() if table.exists() else ""
    want = {ln for ln in old.splitlines() if ln and not ln.startswith("#")}
    got = {ln for ln in text.splitlines() if ln and not ln.startswith("#")}
    for ln in sorted(got - want):
        print(f"optional_deps: not in {table.name}: {ln}")
    for ln in sorted(want - got):
        print(f"optional_deps: in {table.name} but not found in the tests: {ln}")
    ok = got == want and not accidents
    print(f"optional_deps: {len(got)} tests need optional packages; "
          f"{'table up to date' if ok else 'FAILED (fix the tests, or --update the table)'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
