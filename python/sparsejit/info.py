"""What a bug report needs, in one command: ``python -m sparsejit.info`` (``--json`` for a dict).

Versions (sparsejit, torch, Python), where the libraries were loaded from and how they were
built, the CPU and the instruction sets the JIT compiles for, whether the JIT's compiler was
found, the JIT cache directory and its size, threads, the dense-product backend and CUDA.
Each field is read from the running process, never assumed: a field that cannot be read says
so ("unavailable: <why>") instead of failing the report.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Callable, Dict, List

# x86 flags that change what the JIT and the dense products run (/proc/cpuinfo names).
_ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_line() -> str:
    """The CPU for a benchmark table: model, cores and the instruction sets that matter (and
    the cap when ``SPARSEJIT_MAX_ISA`` holds sparsejit below them)."""
    c = _cpu()
    line = f"{c['model']}, {c['cores']} cores, ISA: {' '.join(c['isa']) or 'baseline'}"
    cap = os.environ.get("SPARSEJIT_MAX_ISA", "")
    if cap in ("avx512", "avx2", "baseline"):
        line += f"; sparsejit capped at SPARSEJIT_MAX_ISA={cap}"
    return line


def _try(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a report field must never abort the report
        return f"unavailable: {type(e).__name__}: {e}"


def _cpu() -> Dict[str, object]:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name":
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "machine": platform.machine(), "cores": os.cpu_count(),
            "isa": [f for f in _ISA_FLAGS if f in flags]}


def _dir_size(path: Path) -> Dict[str, object]:
    if not path.is_dir():
        return {"path": str(path), "exists": False, "files": 0, "bytes": 0}
    files = total = 0
    for root, _, names in os.walk(path):
        for n in names:
            try:
                total += os.path.getsize(os.path.join(root, n))
                files += 1
            except OSError:
                pass
    return {"path": str(path), "exists": True, "files": files, "bytes": total}


def _jit(core) -> Dict[str, object]:
    command = _try(core.compiler_command)
    march = "unknown"
    if isinstance(command, str):
        march = next((w.split("=", 1)[1] for w in command.split() if w.startswith("-march=")),
                     "compiler default")
    return {"enabled": _try(core.jit_enabled), "compiler": _try(core.compiler_version),
            "command": command, "target": march,
            "isa": _try(core.isa_state),
            "env": {k: os.environ[k] for k in ("SPARSEJIT_JIT", "SPARSEJIT_CXX",
                                               "SPARSEJIT_CACHE_DIR", "SPARSEJIT_MAX_ISA")
                    if k in os.environ}}


def _huge_pages(core) -> Dict[str, object]:
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    try:
        os_mode = mode.read_text().strip()
    except OSError:
        os_mode = "unavailable"
    return {"threshold_bytes": _try(core.huge_page_threshold), "os_mode": os_mode,
            "SPARSEJIT_HUGE_PAGES": os.environ.get("SPARSEJIT_HUGE_PAGES", "(unset)")}


def _cuda(torch) -> Dict[str, object]:
    has_kernel = _try(lambda: torch._C._dispatch_has_kernel_for_dispatch_key(
        "sparsejit::spmm", "CUDA"))
    out = {"torch_cuda": torch.version.cuda, "available": _try(torch.cuda.is_available),
           "sparsejit_cuda_kernels": has_kernel,
           "nvrtc_dirs": os.environ.get("SPARSEJIT_NVRTC_DIRS", "")}
    if out["available"] is True:
        out["devices"] = _try(lambda: [torch.cuda.get_device_name(i)
                                       for i in range(torch.cuda.device_count())])
    return out


def _torch_parallel_backend() -> str:
    import torch
    for line in torch.__config__.parallel_info().splitlines():
        if line.startswith("ATen parallel backend:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def collect() -> Dict[str, object]:
    """The report as a dict (what ``--json`` prints)."""
    import torch

    import sparsejit
    from sparsejit import _core

    here = Path(sparsejit.__file__).resolve().parent
    libs = {p.name: str(p) for p in sorted(here.glob("*.so"))}
    cache = _try(lambda: _dir_size(Path(_core.cache_dir())))
    from sparsejit import _library
    if _library.STABLE_ABI:
        abi = "stable ABI: loads under torch >= " + ".".join(map(str, _library.MIN_TORCH))
    else:
        abi = "torch C++ ABI: bound to the torch it was built against"
    return {
        "sparsejit": {"version": sparsejit.__version__, "package": str(here), "libraries": libs,
                      "op_library": abi, "openmp": bool(getattr(_core, "openmp", False))},
        "torch": {"version": torch.__version__, "debug": torch.version.debug,
                  "parallel": _try(_torch_parallel_backend)},
        "python": {"version": sys.version.split()[0], "executable": sys.executable,
                   "platform": platform.platform()},
        "cpu": _cpu(),
        "jit": _jit(_core),
        "cache": cache,
        "memory_caches": _try(_memory_caches),
        "threads": {"torch": torch.get_num_threads(),
                    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "(unset)")},
        "dense_products": _try(_core.gemm_backend),
        "dense_tiles_on_brgemm_ukernel": _try(_core.gemm_ukernel),
        "huge_pages": _huge_pages(_core),
        "cuda": _cuda(torch),
    }


def _memory_caches() -> Dict[str, object]:
    """What each in-memory cache holds now (entries, bytes) against the one byte budget."""
    from sparsejit.runtime import caches
    out: Dict[str, object] = {"budget_bytes": caches.cache_budget()}
    for row in caches.cache_stats():
        name = row.pop("name")
        out[name] = ", ".join(f"{k} {v}" for k, v in row.items())
    return out


def _lines(d: Dict[str, object], indent: int = 0) -> List[str]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.append(" " * indent + f"{k}:")
            out += _lines(v, indent + 2)
        elif isinstance(v, dict):
            out.append(" " * indent + f"{k}: (none)")
        elif isinstance(v, list):
            out.append(" " * indent + f"{k}: {', '.join(map(str, v)) or '(none)'}")
        else:
            out.append(" " * indent + f"{k}: {v}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparsejit.info", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    report = collect()
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print("\n".join(_lines(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
