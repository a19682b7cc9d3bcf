"""The C++ rooms depend one way: kernels/ <- codegen/ <- csrc/ <- torch_ext/ <- Python.

`kernels/` is what the JIT compiles and NVRTC pastes: it may include only `kernels/` and
system headers. `codegen/` turns kernel specs into code: it may include `kernels/` and itself.
`csrc/` (drivers, plans, cost models) is Torch-free: no `torch_ext/`, no Torch headers, and its
`core/` room does not reach into `codegen/`. Only `torch_ext/` includes Torch. The pybind11
module in `csrc/python/` sits beside `torch_ext/` and is Torch-free as well.

This is a lint: it reads every `#include` of the tree, so a new wrong-way include fails CI.
Two more lints hold the rooms' shape: no source file over 800 lines (split by what the code
does), and the adapters in `torch_ext/ops/` only adapt: whatever is built from ATen ops or other
sparsejit ops (a nested op call, an ATen GEMM) lives in `torch_ext/composite/`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.M)
_TORCH = ("torch/", "ATen/", "c10/", "caffe2/")
_SOURCES = ("*.h", "*.hpp", "*.cpp", "*.cc", "*.cu", "*.cuh")

# room -> (project rooms it may include, whether it may include Torch headers)
RULES = {
    "kernels": (("kernels",), False),
    "codegen": (("kernels", "codegen"), False),
    "csrc/core": (("kernels", "csrc/core"), False),
    "csrc": (("kernels", "codegen", "csrc"), False),
    "torch_ext": (("kernels", "codegen", "csrc", "torch_ext"), True),
}
_PROJECT_ROOMS = ("kernels", "codegen", "csrc", "torch_ext")


def _room(rel: str) -> str | None:
    """The most specific room of RULES that holds `rel` (a path relative to the root)."""
    best = None
    for room in RULES:
        if rel == room or rel.startswith(room + "/"):
            if best is None or len(room) > len(best):
                best = room
    return best


def violations(root: Path) -> list[str]:
    """Every include under `root` that goes against RULES, as 'file:line: message'."""
    found = []
    for room in RULES:
        base = root / room
        if not base.is_dir():
            continue
        files = sorted({p for pat in _SOURCES for p in base.rglob(pat)})
        for path in files:
            rel = path.relative_to(root).as_posix()
            if _room(rel) != room:
                continue  # checked under its more specific room
            allowed, torch_ok = RULES[room]
            text = path.read_text(errors="replace")
            for m in _INCLUDE.finditer(text):
                target = m.group(2)
                line = text.count("\n", 0, m.start()) + 1
                if target.startswith(_TORCH) or target in ("torch/extension.h", "torch/library.h"):
                    if not torch_ok:
                        found.append(f"{rel}:{line}: includes Torch header <{target}> "
                                     f"(only torch_ext/ may)")
                    continue
                top = target.split("/")[0]
                if top == "csrc" and target.startswith("csrc/core/"):
                    inc_room = "csrc/core"
                elif top in _PROJECT_ROOMS:
                    inc_room = top
                else:
                    continue  # a system or third-party header
                if not any(inc_room == a or inc_room.startswith(a + "/") for a in allowed):
                    found.append(f"{rel}:{line}: includes \"{target}\" ({room}/ may include "
                                 f"only {', '.join(a + '/' for a in allowed)})")
    return found


def test_includes_run_one_way():
    bad = violations(ROOT)
    assert not bad, "wrong-way includes:\n" + "\n".join(bad)


def test_csrc_python_module_is_torch_free():
    for path in sorted((ROOT / "csrc" / "python").rglob("*.cpp")):
        for m in _INCLUDE.finditer(path.read_text()):
            assert not m.group(2).startswith(_TORCH), f"{path}: includes {m.group(2)}"


@pytest.mark.parametrize("room, include, expect", [
    ("kernels/cpu", '"csrc/core/types.h"', "kernels/ may include only kernels/"),
    ("kernels/cpu", '"torch_ext/common.h"', "kernels/ may include only kernels/"),
    ("kernels/cuda", "<ATen/ATen.h>", "includes Torch header"),
    ("codegen", '"csrc/plan/plan_header.h"', "codegen/ may include only"),
    ("csrc/core", '"codegen/cpu_jit.h"', "csrc/core/ may include only"),
    ("csrc/rgms", "<torch/library.h>", "includes Torch header"),
    ("csrc/rgms", '"torch_ext/common.h"', "csrc/ may include only"),
])
def test_detects_a_planted_wrong_way_include(tmp_path, room, include, expect):
    d = tmp_path / room
    d.mkdir(parents=True)
    (d / "x.h").write_text(f"#pragma once\n#include <vector>\n#include {include}\n")
    bad = violations(tmp_path)
    assert len(bad) == 1 and expect in bad[0] and ":3:" in bad[0], bad


def test_allows_the_right_way(tmp_path):
    for room, inc in (("kernels/cpu", '"kernels/common/enums.h"'),
                      ("codegen", '"kernels/cpu/spmm_kernel.h"'),
                      ("csrc/spmm", '"codegen/cpu_jit.h"'),
                      ("csrc/core", '"kernels/common/types.h"'),
                      ("torch_ext/ops", "<torch/library.h>")):
        d = tmp_path / room
        d.mkdir(parents=True, exist_ok=True)
        (d / "ok.cpp").write_text(f"#include {inc}\n#include <cstdint>\n")
    assert violations(tmp_path) == []


# ---- sizes and adapters ---------------------------------------------------------------------

MAX_LINES = 800
SIZE_ROOMS = ("csrc", "torch_ext", "kernels", "codegen", "python/sparsejit")
_SIZED = _SOURCES + ("*.py", "*.inc")


def oversized(root: Path, limit: int = MAX_LINES) -> list[str]:
    """Every source file of SIZE_ROOMS under `root` longer than `limit` lines."""
    found = []
    for room in SIZE_ROOMS:
        base = root / room
        if not base.is_dir():
            continue
        for path in sorted({p for pat in _SIZED for p in base.rglob(pat)}):
            n = len(path.read_text(errors="replace").splitlines())
            if n > limit:
                found.append(f"{path.relative_to(root).as_posix()}: {n} lines")
    return found


def test_no_source_file_over_800_lines():
    bad = oversized(ROOT)
    assert not bad, (f"files over {MAX_LINES} lines (split them by what they do):\n" +
                     "\n".join(bad))


def test_detects_a_planted_oversized_file(tmp_path):
    d = tmp_path / "csrc" / "toy"
    d.mkdir(parents=True)
    (d / "ok.cpp").write_text("int x;\n" * MAX_LINES)
    (d / "big.cpp").write_text("int x;\n" * (MAX_LINES + 1))
    (tmp_path / "python" / "sparsejit").mkdir(parents=True)
    (tmp_path / "python" / "sparsejit" / "big.py").write_text("x = 1\n" * 900)
    assert oversized(tmp_path) == ["csrc/toy/big.cpp: 801 lines",
                                   "python/sparsejit/big.py: 900 lines"]


# What an adapter does not do itself: call another op through the dispatcher (the CUDA -> CPU
# fallback's call_on_cpu is the exception: it is the same op, on CPU copies) or run ATen's GEMM.
_COMPOSING = re.compile(r"\bcall_boxed\s*<|findSchemaOrThrow|\btx::mm(_out)?\s*\(")


def composing_adapters(root: Path) -> list[str]:
    """Lines of torch_ext/ops/*.{cpp,h,inc} that compose ops instead of adapting one."""
    found = []
    base = root / "torch_ext" / "ops"
    if not base.is_dir():
        return found
    for path in sorted({p for pat in ("*.cpp", "*.h", "*.inc") for p in base.glob(pat)}):
        for k, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("//", 1)[0]
            if _COMPOSING.search(code):
                found.append(f"{path.relative_to(root).as_posix()}:{k}: {line.strip()}")
    return found


def test_adapters_only_adapt():
    bad = composing_adapters(ROOT)
    assert not bad, ("torch_ext/ops/ composes ops (move it to torch_ext/composite/):\n" +
                     "\n".join(bad))


def test_detects_a_composite_in_an_included_cuda_part(tmp_path):
    """The CUDA halves of adapters (torch_ext/ops/*_cuda.inc) are held to the rule too."""
    d = tmp_path / "torch_ext" / "ops"
    d.mkdir(parents=True)
    (d / "toy_cuda.inc").write_text("tx::Tensor f() {\n  return tx::mm(a, b);\n}\n")
    assert composing_adapters(tmp_path) == ["torch_ext/ops/toy_cuda.inc:2: return tx::mm(a, b);"]


def test_detects_a_planted_composite_in_an_adapter(tmp_path):
    d = tmp_path / "torch_ext" / "ops"
    d.mkdir(parents=True)
    (d / "ok.cpp").write_text('// tx::mm_out(y, a, b) in a comment is fine\n'
                              'auto y = call_on_cpu<tx::Tensor>("sparsejit::spmm", x);\n')
    (d / "bad.cpp").write_text("void f() {\n  tx::mm_out(y, a, b);\n"
                               '  tx::call_boxed<1>("sparsejit::spmm", "", x);\n}\n')
    bad = composing_adapters(tmp_path)
    assert [b.split(": ")[0] for b in bad] == ["torch_ext/ops/bad.cpp:2",
                                              "torch_ext/ops/bad.cpp:3"], bad
