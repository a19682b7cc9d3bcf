"""Timing helpers and the one progress bar of long work (tuning, sparsify, benchmarks)."""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional


def _sync(device: str) -> None:
    if device != "cpu":
        import torch
        torch.cuda.synchronize(device if ":" in device else None)


def median_ms(fn: Callable[[], object], repeat: int, warmup: int = 1,
              device: str = "cpu") -> float:
    """Median wall milliseconds of `repeat` calls after `warmup` calls (which also compile).
    On a CUDA `device` each call is timed up to the device's synchronisation, so the time is
    the work's, not the launch's."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


class Progress:
    """A one-line progress bar on stderr, drawn when stderr is a terminal (``enabled=None``)
    or when forced (``enabled=True``)."""

    def __init__(self, total: int, label: str, enabled: Optional[bool] = None):
        self.total, self.label, self.done = max(int(total), 0), label, 0
        self.enabled = sys.stderr.isatty() if enabled is None else bool(enabled)

    def step(self, what: str = "") -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        bar = "#" * filled + "-" * (width - filled)
        end = "\n" if self.done >= self.total else ""
        sys.stderr.write(f"\r{self.label} [{bar}] {self.done}/{self.total} {what:<28}{end}")
        sys.stderr.flush()
