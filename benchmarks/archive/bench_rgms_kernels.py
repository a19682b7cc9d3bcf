"""Where RGMS's products should run: oneDNN GEMM tiles (gemm=1) against the fused row kernels
(gemm=3, kernels/cpu/row_tile_kernel.h kinds 2-4), each pass alone (forward, grad X, grad W), on
AIFB and an AIFB-sized random typed graph, F = 16 / 32 / 64. Medians; ratios > 1 mean the
fused kernels are faster. Sets the `kFusedMaxAuto` policy in csrc/rgms/rgms_run.h.

    python benchmarks/archive/bench_rgms_kernels.py --threads 2
    python benchmarks/archive/bench_rgms_kernels.py --threads 1 --clock cpu   # loaded machine
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from bench_rgms import aifb_graph, random_typed  # noqa: E402

import sparsejit  # noqa: E402,F401  (registers the ops)


def median_ms(fn, repeat, clock):
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times) * 1e3


def main(argv=None):
    from sparsejit.info import cpu_line
    print(f"CPU: {cpu_line()}", flush=True)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=25)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    graphs = {"aifb": aifb_graph(), "aifb-sized random": random_typed(8285, 58086, 90)}
    ops = torch.ops.sparsejit
    print(f"| graph | F | pass | oneDNN tiles ms | fused rows ms | fused speed-up |")
    print("|---|---|---|---|---|---|")
    for name, g in graphs.items():
        if g is None:
            continue
        ei, et, n, r = g
        plan = ops.rgms_plan(ei, et, n, n, r)
        for f in (16, 32, 64):
            gen = torch.Generator().manual_seed(f)
            x = torch.randn(n, f, generator=gen)
            w = torch.randn(r, f, f, generator=gen) * 0.1
            dy = torch.randn(n, f, generator=gen)
            passes = {
                "forward": lambda gm: ops.rgms(plan, x, w, None, "mean", n, gm, 0, 0),
                "grad X": lambda gm: ops.rgms_backward(plan, x, w, None, dy, "mean", True,
                                                       False, False, gm, 0, 0),
                "grad W": lambda gm: ops.rgms_backward(plan, x, w, None, dy, "mean", False,
                                                       True, False, gm, 0, 0),
            }
            for pname, run in passes.items():
                t_tiles = median_ms(lambda: run(1), args.repeat, clock)
                t_fused = median_ms(lambda: run(3), args.repeat, clock)
                print(f"| {name} | {f} | {pname} | {t_tiles:.3f} | {t_fused:.3f} | "
                      f"{t_tiles / t_fused:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
