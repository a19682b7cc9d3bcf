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


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def paired_median_ms(fns: Sequence[Callable[[], object]], repeat: int, warmup: int = 2,
                     clock: str = "wall", rotate: bool = False,
                     device: str = "cpu") -> List[float]:
    """Median milliseconds of each of `fns`, their calls interleaved (a, b, a, b, ...) after
    `warmup` calls of each, so that a drift in the machine's state (threads spinning up, first
    page faults, a neighbour's load) reaches all of them alike.

    ``clock="cpu"`` counts this process's CPU time instead of elapsed time (robust to other
    jobs; use with one thread). `rotate` starts each round with the next function (a, b; b, a;
    ...), so that none always runs second and finds its input in cache. On a CUDA `device`
    each call is timed with CUDA events on the current stream (whatever `clock` says), and the
    device is synchronised once, at the end."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {tuple(CLOCKS)}; got {clock!r}")
    for fn in fns:
        for _ in range(warmup):
            fn()
    n = len(fns)
    rounds = [[(rep + j) % n if rotate else j for j in range(n)] for rep in range(repeat)]
    if device != "cpu":
        import torch
        events: List[list] = [[] for _ in fns]
        for order in rounds:
            for i in order:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fns[i]()
                end.record()
                events[i].append((start, end))
        _sync(device)
        times = [[a.elapsed_time(b) for a, b in ev] for ev in events]
    else:
        tick = CLOCKS[clock]
        times = [[] for _ in fns]
        for order in rounds:
            for i in order:
                t0 = tick()
                fns[i]()
                times[i].append((tick() - t0) * 1e3)
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
