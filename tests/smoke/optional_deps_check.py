"""Checks that sparsejit never imports an optional dependency at import time or inside code that
``torch.compile`` traces (issue 50). Run it in a fresh interpreter:

    python tests/smoke/optional_deps_check.py [--watch DIR] [--extra MODULE] [--no-compile]

It installs an import hook that treats every package in ``OPTIONAL`` as not installed (an
import of one raises ModuleNotFoundError, as in a venv with only torch and numpy) and records
who tried. Then it imports every module of the package (``pkgutil.walk_packages``, less the
documented ``EXEMPT`` list), runs every layer of ``cases.py`` eagerly, compiles it with
``fullgraph=True`` and exports it. An import attempt counts against sparsejit when the
importing code lives in the package (or in a ``--watch`` directory) or is code that dynamo is
tracing (dynamo executes a traced ``import`` itself). torch's own optional imports (e.g.
``torch.hub`` trying tqdm) are not sparsejit's and are ignored. Exit status 1 lists each
attempt and failure.
The same hook serves the wheel's smoke suite (tests/smoke/test_optional_deps.py) and the main
suite (tests/python/core/test_optional_deps.py); ``--watch`` / ``--extra`` let the main suite
prove the check catches a planted import.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import traceback

# Packages sparsejit may use only lazily, outside traced code (peers and optional interop).
# torch's own dependencies (networkx, sympy, ...) are not optional and not listed.
OPTIONAL = ("torch_geometric", "pyg_lib", "torch_scatter", "torch_sparse", "spconv", "cumm",
            "scipy", "dgl", "tqdm", "matplotlib", "MinkowskiEngine", "torchsparse", "pandas")

# sparsejit modules not imported by the walk, each with the reason. Empty: every benchmark
# harness under sparsejit.tools imports its peers inside the function that runs them.
EXEMPT: dict = {}

_TORCH_DYNAMO = os.sep + os.path.join("torch", "_dynamo") + os.sep


class RefuseOptional(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes the OPTIONAL packages look absent and records each import of one."""

    def __init__(self, watched):
        self.watched = [os.path.realpath(d) + os.sep for d in watched]
        self.attempts = []  # (module, "file:line" of the importer, why it counts)

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in OPTIONAL:
            return None
        self._record(name)
        return importlib.machinery.ModuleSpec(name, self)  # origin None: "not a file"

    def create_module(self, spec):
        raise ModuleNotFoundError(f"No module named {spec.name!r} (refused by "
                                  "optional_deps_check)", name=spec.name)

    def exec_module(self, module):  # never reached: create_module raises
        raise ModuleNotFoundError(module.__name__)

    def _record(self, name):
        frame, importing = sys._getframe(2), False
        while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
            importing |= frame.f_code.co_name == "_find_and_load"
            frame = frame.f_back
        if not importing or frame is None:  # importlib.util.find_spec probes, not imports
            return
        where = os.path.realpath(frame.f_code.co_filename)
        if _TORCH_DYNAMO in where:
            why = "inside code torch.compile traces"
            tracer = frame.f_locals.get("self")  # dynamo's translator: name the traced line
            code = getattr(tracer, "f_code", None)
            if code is not None:
                where = f"{code.co_filename}:{getattr(tracer, 'lineno', '?')} (traced)"
                self.attempts.append((name, where, why))
                return
        elif any(where.startswith(d) for d in self.watched):
            why = "imported by the package's code"
        else:
            return
        self.attempts.append((name, f"{where}:{frame.f_lineno}", why))


def import_everything(extra):
    """Imports every sparsejit module (less EXEMPT) and the `extra` ones; returns failures."""
    import pkgutil

    import sparsejit

    failures = []
    # libsparsejit_*.so are plain shared libraries beside the package, not Python modules.
    names = [m.name for m in pkgutil.walk_packages(sparsejit.__path__, "sparsejit.",
                                                   onerror=lambda n: failures.append(n))
             if not m.name.rpartition(".")[2].startswith("libsparsejit_")]
    for name in sorted(set(names) - set(EXEMPT)) + list(extra):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - reported, with its traceback
            failures.append(f"import {name}:\n{traceback.format_exc(limit=-3)}")
    return failures


def run_layers(compile_layers):
    """Every case eagerly and, with `compile_layers`, compiled with fullgraph=True and
    exported with dynamic sizes."""
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from cases import ALL_CASES, NOT_TRACEABLE

    failures = []
    for name, case in ALL_CASES.items():
        torch.manual_seed(0)
        try:
            model = case.make().eval()
            args = case.inputs(40, 1)
            with torch.no_grad():
                model(*args)
                if compile_layers and name not in NOT_TRACEABLE:
                    torch._dynamo.reset()
                    torch.compile(model, fullgraph=True)(*args)
            if compile_layers and name not in NOT_TRACEABLE:
                torch.export.export(model, args, dynamic_shapes=case.dynamic_shapes())
        except Exception:  # noqa: BLE001 - reported, with its traceback
            failures.append(f"{name}:\n{traceback.format_exc(limit=-3)}")
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--watch", action="append", default=[],
                    help="another directory whose imports count (tests of this check)")
    ap.add_argument("--extra", action="append", default=[],
                    help="another module to import after sparsejit's (tests of this check)")
    ap.add_argument("--no-compile", action="store_true",
                    help="import and run eagerly only (no compile, no export)")
    args = ap.parse_args(argv)
    for d in args.watch:
        sys.path.insert(0, d)
    if "sparsejit" in sys.modules:
        raise SystemExit("optional_deps_check: run it in a fresh interpreter (sparsejit is "
                         "already imported, so its import-time imports would go unseen)")
    # find_spec of a top-level package locates it without importing it.
    package_dir = importlib.util.find_spec("sparsejit").submodule_search_locations[0]
    hook = RefuseOptional(args.watch + [package_dir])
    sys.meta_path.insert(0, hook)
    failures = import_everything(args.extra)
    failures += run_layers(not args.no_compile)
    for name, where, why in dict.fromkeys(hook.attempts):  # each once, in order
        print(f"optional dependency {name!r} {why}: {where}")
    for f in failures:
        print(f"FAILED {f}")
    print(f"optional_deps_check: {len(hook.attempts)} optional imports, {len(failures)} failures")
    return 1 if hook.attempts or failures else 0


if __name__ == "__main__":
    sys.exit(main())
