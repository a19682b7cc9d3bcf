"""The CPU model string that keys every stored measurement (a result tuned on one CPU is not
reused on another, nor under another ``SPARSEJIT_MAX_ISA`` cap: the kernels differ)."""

from __future__ import annotations

import functools
import os
import platform


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    model = platform.processor() or "unknown-cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cap = os.environ.get("SPARSEJIT_MAX_ISA", "")
    return f"{model} [SPARSEJIT_MAX_ISA={cap}]" if cap in ("avx512", "avx2", "baseline") else model
