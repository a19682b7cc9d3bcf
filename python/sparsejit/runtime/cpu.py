"""The CPU model string that keys every stored measurement (a result tuned on one CPU is not
reused on another)."""

from __future__ import annotations

import functools
import platform


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown-cpu"
