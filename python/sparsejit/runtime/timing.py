"""Timing helpers and the one progress bar of long work (tuning, sparsify, benchmarks)."""

from __future__ import annotations

import sys
import time
from typing import Callable, List, Optional, Sequence


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


def paired_median_ms(fns: Sequence[Callable[[], object]], repeat: int,
                     warmup: int = 2) -> List[float]:
    """Median wall milliseconds of each of `fns`, their calls interleaved (a, b, a, b, ...)
    after `warmup` calls of each, so that a drift in the machine's state (threads spinning
    up, first page faults, a neighbour's load) reaches all of them alike."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times: List[List[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
    return [sorted(ts)[len(ts) // 2] for ts in times]


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
