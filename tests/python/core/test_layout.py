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
