"""The Python package's import graph has no cycle, counting imports inside functions (a cycle
hidden in a function is still a cycle: it only moves the failure to run time), and its rooms
depend one way: ``runtime`` imports no family; a family's stored-result readers
(``schedules``, ``plans``, ``plan``) import no op, tuner or layer; no op module imports a tuner.

An edge is an import of a sparsejit module: ``import a.b``, ``from a import b`` where ``b`` is
a submodule (an edge to ``a.b``, not to ``a``), ``from a.b import name`` (an edge to ``a.b``).
The implicit import of a parent package's ``__init__`` is not an edge (a package may import
its children).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

PKG = Path(__file__).resolve().parents[3] / "python" / "sparsejit"


def modules(root: Path, name: str) -> Dict[str, Path]:
    """Module name -> file for every .py under `root` (a package named `name`)."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).with_suffix("")
        parts = [name, *rel.parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def import_graph(root: Path, name: str, extensions=("_core",)) -> Dict[str, Set[str]]:
    """Edges between the package's modules. `extensions` are compiled modules of the package
    (``sparsejit._core``): leaves with no imports of their own."""
    mods = modules(root, name)
    for ext in extensions:
        mods.setdefault(f"{name}.{ext}", root / ext)

    def resolve(cur: str, is_pkg: bool, level: int, module: str | None) -> str:
        base = cur.split(".") if is_pkg else cur.split(".")[:-1]
        if level > 1:
            base = base[:len(base) - (level - 1)]
        return ".".join(base + ([module] if module else []))

    graph: Dict[str, Set[str]] = {m: set() for m in mods}
    for cur, path in mods.items():
        if path.suffix != ".py":
            continue
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = resolve(cur, is_pkg, node.level, node.module) if node.level else \
                    (node.module or "")
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in mods else base)
            for t in targets:
                # the longest known module that `t` names (import a.b.c of a module a.b.c)
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != cur:
                    graph[cur].add(t)
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):  # iterative enough for a package of ~100 modules
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _path(graph, comp):
    """One cycle through a component, for the failure message."""
    start = comp[0]
    seen, path = {start}, [start]
    while True:
        nxt = sorted(w for w in graph[path[-1]] if w in comp)
        back = [w for w in nxt if w == start]
        if back and len(path) > 1:
            return path + [start]
        step = next((w for w in nxt if w not in seen), None)
        if step is None:
            return path + [nxt[0]] if nxt else path
        seen.add(step)
        path.append(step)


def test_no_import_cycle():
    graph = import_graph(PKG, "sparsejit")
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(_path(graph, c)) for c in found)


def room_violations(graph: Dict[str, Set[str]]) -> List[str]:
    bad = []
    for mod, deps in graph.items():
        for d in deps:
            if mod.startswith("sparsejit.runtime") and d.startswith("sparsejit.families"):
                bad.append(f"{mod} imports {d}: runtime imports no family")
            leaf = mod.rsplit(".", 1)[-1]
            dleaf = d.rsplit(".", 1)[-1]
            if mod.startswith("sparsejit.families.") and leaf in ("schedules", "plans", "plan") \
                    and (dleaf in ("tuner", "layers") or dleaf == "ops" or
                         d.startswith("sparsejit.families.") and dleaf in (
                             "spmm", "sddmm", "edge_softmax") and d.count(".") == 3):
                bad.append(f"{mod} imports {d}: stored-result readers sit below the ops")
            if mod.startswith("sparsejit.families.") and d.startswith("sparsejit.families.") \
                    and mod.split(".")[2] != d.split(".")[2] and \
                    any(part.startswith("_") for part in d.split(".")[3:]):
                bad.append(f"{mod} imports {d}: another family's private module")
            family_pkg = mod.startswith("sparsejit.families.") and mod.count(".") == 2
            if mod.startswith("sparsejit.families.") and not family_pkg and leaf != "tuner" and \
                    dleaf == "tuner":
                bad.append(f"{mod} imports {d}: only a family's __init__ loads its tuner")
    return sorted(bad)


def test_rooms_depend_one_way():
    bad = room_violations(import_graph(PKG, "sparsejit"))
    assert not bad, "\n".join(bad)


def test_planted_room_violations_are_found():
    graph = {
        "sparsejit.runtime.store": {"sparsejit.families.spmm.plans"},
        "sparsejit.families.rgms.schedules": {"sparsejit.families.rgms.ops"},
        "sparsejit.families.spmm.spmm": {"sparsejit.families.spmm.tuner"},
        "sparsejit.families.spmm": {"sparsejit.families.spmm.tuner"},   # allowed
        "sparsejit.families.spmm.tuner": {"sparsejit.families.spmm.spmm"},  # allowed
    }
    bad = room_violations(graph)
    assert len(bad) == 3, bad
    assert bad[0].startswith("sparsejit.families.rgms.schedules imports")
    assert bad[1].startswith("sparsejit.families.spmm.spmm imports")
    assert bad[2].startswith("sparsejit.runtime.store imports")


def test_a_planted_private_import_across_families_is_found():
    graph = {
        "sparsejit.families.rgms.ops": {"sparsejit.families.spmm._common"},
        "sparsejit.families.spmm.spmm": {"sparsejit.families.spmm._common"},   # its own: allowed
        "sparsejit.families.attention.ops": {"sparsejit.families.spmm.checks"},  # public: allowed
    }
    assert room_violations(graph) == [
        "sparsejit.families.rgms.ops imports sparsejit.families.spmm._common: another "
        "family's private module"]


def test_a_planted_cycle_is_found(tmp_path):
    pkg = tmp_path / "toy"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from toy import a\n")
    (pkg / "a.py").write_text("from toy.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g  # hidden in a function\n")
    (pkg / "c.py").write_text("import toy.a\n\ndef g():\n    pass\n")
    graph = import_graph(pkg, "toy")
    assert graph["toy.sub.b"] == {"toy.c"} and graph["toy.c"] == {"toy.a"}
    assert cycles(graph) == [["toy.a", "toy.c", "toy.sub.b"]]
    (pkg / "c.py").write_text("def g():\n    pass\n")
    assert cycles(import_graph(pkg, "toy")) == []


def test_package_imports_of_submodules_are_edges_to_the_submodule(tmp_path):
    pkg = tmp_path / "toy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from toy import a, b\nx = 1\n")
    (pkg / "a.py").write_text("from toy import x\n")   # a name of the package: edge to toy
    (pkg / "b.py").write_text("from toy import a\n")   # a submodule: edge to toy.a only
    graph = import_graph(pkg, "toy")
    assert graph["toy.b"] == {"toy.a"} and graph["toy.a"] == {"toy"}
    # toy -> toy.b -> toy.a -> toy: the package's own import of b closes the loop through b
    assert cycles(graph) == [["toy", "toy.a", "toy.b"]]
    (pkg / "a.py").write_text("from toy import b\n")  # now a submodule: no edge to toy
    assert cycles(import_graph(pkg, "toy")) == [["toy.a", "toy.b"]]


# ---- one way per concern: eager autograd, stored results, timing ---------------------------
#
# Every family builds these the same way (issue 46, points 1 and 2): an op's gradient is the
# formula registered with torch.library.register_autograd, and its eager calls go through
# runtime.autograd.call_op (every torch.autograd.Function is made in runtime/autograd.py);
# measured results go through runtime.store.JsonStore; timing loops are runtime.timing's.

_AUTOGRAD_HOME = "runtime/autograd.py"
_CLOCK_NAMES = {"perf_counter_ns", "process_time", "process_time_ns", "monotonic",
                "monotonic_ns", "thread_time", "elapsed_time"}
_STORE_MODULES = {"json", "pickle", "shelve", "sqlite3", "marshal"}
_STORE_INTERNALS = {"read_json", "write_json_atomic"}


def _sources(root: Path, under: str = ""):
    base = root / under if under else root
    for p in sorted(base.rglob("*.py")):
        yield p.relative_to(root).as_posix(), ast.parse(p.read_text(), str(p))


def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def autograd_violations(root: Path) -> List[str]:
    """(1) `autograd.Function` is named (subclassed, built, imported) only in
    runtime/autograd.py; (2) each op a family registers a formula for
    (``register_autograd("sparsejit::X", ...)``) is called eagerly through ``call_op(ops.X...)``
    somewhere in that family's package."""
    bad = []
    registered: Dict[str, List[str]] = {}   # family -> ops with a registered formula
    routed: Dict[str, Set[str]] = {}        # family -> ops passed to call_op
    for rel, tree in _sources(root):
        family = rel.split("/")[1] if rel.startswith("families/") else None
        for node in ast.walk(tree):
            if rel != _AUTOGRAD_HOME:
                if isinstance(node, ast.Attribute) and node.attr == "Function" and \
                        _dotted(node.value).endswith("autograd"):
                    bad.append(f"{rel}:{node.lineno}: a torch.autograd.Function of its own "
                               "(use runtime.autograd.call_op or composite)")
                if isinstance(node, ast.ImportFrom) and node.module == "torch.autograd" and \
                        any(a.name == "Function" for a in node.names):
                    bad.append(f"{rel}:{node.lineno}: imports torch.autograd.Function")
            if not isinstance(node, ast.Call):
                continue
            name = _dotted(node.func)
            if name.endswith("register_autograd") and node.args and \
                    isinstance(node.args[0], ast.Constant) and \
                    str(node.args[0].value).startswith("sparsejit::"):
                op = str(node.args[0].value).split("::", 1)[1]
                registered.setdefault(family or rel, []).append(f"{op} ({rel}:{node.lineno})")
            if name.split(".")[-1] == "call_op" and node.args and family:
                chain = _dotted(node.args[0]).split(".")
                if "ops" in chain and chain.index("ops") + 1 < len(chain):
                    routed.setdefault(family, set()).add(chain[chain.index("ops") + 1])
    for family, ops in registered.items():
        for entry in ops:
            op = entry.split(" ", 1)[0]
            if op not in routed.get(family, set()):
                bad.append(f"families/{family}: {entry} has a registered formula but no eager "
                           f"call through call_op(ops.{op}...)")
    return sorted(bad)


def store_and_timer_violations(root: Path) -> List[str]:
    """Under families/: (1) no module of its own file store: no import of json / pickle /
    shelve / sqlite3 / marshal or of runtime.store's file internals (read_json,
    write_json_atomic), no ``write_text`` / ``write_bytes``: results go through JsonStore;
    (2) no timer of its own: no clock but ``time.perf_counter``, and that one only called
    directly, outside any loop (a one-off duration); no ``torch.cuda.Event``. Timing loops
    are runtime.timing's (median_ms, paired_median_ms)."""
    bad = []
    for rel, tree in _sources(root, "families"):
        loops = [n for n in ast.walk(tree) if isinstance(
            n, (ast.For, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp))]
        in_loop = {id(c) for lp in loops for c in ast.walk(lp) if c is not lp}
        calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        for node in ast.walk(tree):
            where = f"{rel}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in _STORE_MODULES:
                        bad.append(f"{where}: imports {a.name} (store results in a JsonStore)")
            elif isinstance(node, ast.ImportFrom):
                if (node.module or "").split(".")[0] in _STORE_MODULES:
                    bad.append(f"{where}: imports from {node.module}")
                for a in node.names:
                    if a.name in _STORE_INTERNALS:
                        bad.append(f"{where}: imports {a.name} (a store of its own; use "
                                   "JsonStore)")
                    if node.module == "time" and a.name != "perf_counter":
                        bad.append(f"{where}: imports time.{a.name}")
            elif isinstance(node, ast.Attribute):
                name = _dotted(node)
                if node.attr in ("write_text", "write_bytes", "dump", "dumps"):
                    bad.append(f"{where}: {name} writes a file of its own (use JsonStore)")
                elif node.attr in _CLOCK_NAMES or name in ("time.time", "torch.cuda.Event",
                                                           "cuda.Event"):
                    bad.append(f"{where}: {name}: a timer of its own (runtime.timing)")
                elif name == "time.perf_counter":
                    if id(node) not in calls:
                        bad.append(f"{where}: time.perf_counter passed around as a clock "
                                   "(runtime.timing)")
                    elif id(node) in in_loop:
                        bad.append(f"{where}: time.perf_counter read in a loop: a timing loop "
                                   "of its own (runtime.timing)")
    return sorted(bad)


def test_one_eager_autograd_path():
    bad = autograd_violations(PKG)
    assert not bad, "\n".join(bad)


def test_one_store_and_one_timer():
    bad = store_and_timer_violations(PKG)
    assert not bad, "\n".join(bad)


def test_planted_autograd_and_store_violations_are_found(tmp_path):
    """The old ways, planted in a toy tree: each is found, and the one way passes."""
    fam = tmp_path / "families" / "toy"
    fam.mkdir(parents=True)
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "autograd.py").write_text(
        "import torch\nclass F(torch.autograd.Function):\n    pass\n")   # its home: allowed
    (fam / "ops.py").write_text(
        "import torch\nfrom torch.autograd import Function\n"
        "class _ToyFunction(torch.autograd.Function):\n    pass\n"
        "def toy(x):\n    return torch.ops.sparsejit.toy(x)\n"
        "torch.library.register_autograd('sparsejit::toy', None, setup_context=None)\n"
        "torch.library.register_autograd('sparsejit::routed', None, setup_context=None)\n"
        "def routed(x):\n    return call_op(ops.routed.default, None, None, (x,), (x,))\n")
    bad = autograd_violations(tmp_path)
    assert len(bad) == 3, bad
    assert "imports torch.autograd.Function" in bad[0] and "Function of its own" in bad[1]
    assert "sparsejit::toy" not in bad[2] and "toy (families/toy/ops.py:7)" in bad[2]
    (fam / "tuner.py").write_text(
        "import json, time\nfrom sparsejit.runtime.store import read_json, write_json_atomic\n"
        "_CLOCKS = {'wall': time.perf_counter, 'cpu': time.process_time}\n"
        "def measure(fns):\n    t = []\n    for f in fns:\n        t0 = time.perf_counter()\n"
        "        f()\n        t.append(time.perf_counter() - t0)\n"
        "    e = torch.cuda.Event(enable_timing=True)\n    return t\n"
        "def save(p, d):\n    p.write_text(json.dumps(d))\n"
        "def once(f):\n    t0 = time.perf_counter()\n    f()\n"
        "    return time.perf_counter() - t0\n")
    bad = store_and_timer_violations(tmp_path)
    found = "\n".join(bad)
    for what in ("imports json", "imports read_json", "imports write_json_atomic",
                 "time.perf_counter passed around", "time.process_time", "read in a loop",
                 "torch.cuda.Event", "write_text", "json.dumps"):
        assert what in found, (what, found)
    assert not any(":15:" in b or ":17:" in b for b in bad), bad   # once(): a one-off duration


# ---- plans assembled and stamped below the adapters, one hash ------------------------------
#
# Issue 46, point 3: a family's plan is assembled and stamped in csrc/<family>/ (Torch-free),
# and every structure fingerprint is csrc/core's hash_words / fingerprint. The Torch adapters
# (torch_ext/) convert tensors, check arguments and call those: they write no plan header
# (plan::write_header) and define no hash of their own (a mix / hash / fnv function, or the
# multiplicative constants such functions are made of).

TORCH_EXT = PKG.parents[1] / "torch_ext"
_HASH_CONSTANTS = ("9e3779b97f4a7c15", "bf58476d1ce4e5b9", "94d049bb133111eb",
                   "1099511628211", "100000001b3", "cbf29ce484222325", "14695981039346656037")
_HASH_FUNCTION = r"\b[A-Za-z_]\w*\s+(\w*(?:mix|hash|fnv)\w*)\s*\([^;]*\)\s*(?:const\s*)?\{"


def adapter_violations(root: Path) -> List[str]:
    """Under `root` (torch_ext): (1) plan::write_header called (every family's plan is
    assembled and stamped in csrc/<family>/); (2) a hash defined: a function named *mix* /
    *hash* / *fnv*, or a hash constant."""
    import re
    bad = []
    for p in sorted(q for q in root.rglob("*") if q.suffix in (".h", ".cpp", ".inc", ".cu")):
        rel = p.relative_to(root).as_posix()
        text = p.read_text()
        code = re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)   # comments are not code
        for m in re.finditer(r"\bwrite_header\s*\(", code):
            line = code.count("\n", 0, m.start()) + 1
            bad.append(f"torch_ext/{rel}:{line}: writes a plan header (assemble and stamp "
                       "plans in csrc/<family>/)")
        for m in re.finditer(_HASH_FUNCTION, code):
            line = code.count("\n", 0, m.start()) + 1
            bad.append(f"torch_ext/{rel}:{line}: defines {m.group(1)}() (use csrc/core's "
                       "hash_words / fingerprint)")
        for c in _HASH_CONSTANTS:
            if c in code.lower():
                bad.append(f"torch_ext/{rel}: a hash constant 0x{c}... (use csrc/core's "
                           "hash_words / fingerprint)")
    return sorted(bad)


def test_adapters_stamp_no_plan_and_hash_nothing():
    bad = adapter_violations(TORCH_EXT)
    assert not bad, "\n".join(bad)


def test_planted_adapter_stamp_and_hash_are_found(tmp_path):
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "toy.cpp").write_text(
        "// plan::write_header(w, ...) in a comment is not a call\n"
        "uint64_t mix(uint64_t h, uint64_t v) {\n  h ^= v + 0x9E3779B97F4A7C15ull;\n"
        "  return h;\n}\n"
        "inline uint64_t sites_hash(const int64_t* k, int64_t n) { return 0; }\n"
        "void build(int64_t* w) {\n  plan::write_header(w, OpKind::PointConv, 0, 0, 0, s);\n}\n"
        "int64_t h = point_conv::sites_fingerprint(keys, n);  // a call: fine\n")
    (tmp_path / "ops" / "clean.cpp").write_text("void f() {}\n")
    bad = adapter_violations(tmp_path)
    found = "\n".join(bad)
    assert "ops/toy.cpp:8: writes a plan header" in found, found
    assert "defines mix()" in found and "defines sites_hash()" in found, found
    assert "hash constant 0x9e3779b97f4a7c15" in found, found
    assert "clean.cpp" not in found, found
    assert len(bad) == 4, bad
