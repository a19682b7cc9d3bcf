"""The baked JIT variant (every tap an immediate offset) against the precompiled loop
("generic") and the shaped JIT loop ("jit") on small pruned convolutions, where baking could
pay: its code grows with the stored taps (about 60 bytes each), so only small layers fit the
instruction cache, and its compile time grows with them too.

    python3 benchmarks/archive/bench_filter_conv_baked.py [--threads 1] [--clock cpu] [--repeat 41]

One image; random unstructured patterns (seeded). Reported per layer: generic ms, the speed-up
of jit and jit_baked over generic (medians of alternated runs, outputs checked bit-identical),
and each JIT variant's first call (prepare + compile; set SPARSEJIT_CACHE_DIR to a fresh
directory so that the compiles are not disk-cache hits).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_filter_conv import first_call_ms, geomean, median_many  # noqa: E402
from sparsejit.families.filter_conv.layers import PrunedConv2d  # noqa: E402
from sparsejit.families.filter_conv.ops import VARIANTS  # noqa: E402

# (C_in, C_out, k, H = W, density)
LAYERS = [(3, 16, 3, 32, 0.3), (16, 16, 3, 56, 0.1), (16, 16, 3, 32, 0.2),
          (64, 64, 1, 8, 0.1), (32, 32, 3, 8, 0.1), (32, 32, 3, 16, 0.1), (3, 64, 7, 56, 0.1)]


def main():
    from sparsejit.info import cpu_line
    print(f"CPU: {cpu_line()}", flush=True)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="cpu")
    ap.add_argument("--repeat", type=int, default=41)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    g = torch.Generator().manual_seed(0)
    print(f"{'layer':<26} {'nnz':>6} {'generic ms':>10} {'jit':>7} {'baked':>7} "
          f"{'jit 1st ms':>10} {'baked 1st ms':>12}")
    ratios = {"jit": [], "jit_baked": []}
    with torch.no_grad():
        for c_in, c_out, k, h, density in LAYERS:
            w = torch.randn(c_out, c_in, k, k, generator=g)
            w[torch.rand(w.shape, generator=g) > density] = 0
            x = torch.randn(1, c_in, h, h, generator=g)
            m = PrunedConv2d(w, None, 1, k // 2)
            fns = [lambda kid=VARIANTS[v]: m(x, variant=kid)
                   for v in ("generic", "jit", "jit_baked")]
            first = [first_call_ms(f) for f in fns[1:]]
            ref = fns[0]()
            assert all(torch.equal(f(), ref) for f in fns[1:])
            t = median_many(fns, args.repeat, clock)
            ratios["jit"].append(t[0] / t[1])
            ratios["jit_baked"].append(t[0] / t[2])
            name = f"{c_in}->{c_out} k{k} {h}x{h} d{density}"
            print(f"{name:<26} {m.nnz:>6} {t[0]:>10.4f} {t[0] / t[1]:>6.2f}x {t[0] / t[2]:>6.2f}x "
                  f"{first[0]:>10.0f} {first[1]:>12.0f}", flush=True)
    print(f"geomean over generic: jit {geomean(ratios['jit']):.3f}x, "
          f"jit_baked {geomean(ratios['jit_baked']):.3f}x")


if __name__ == "__main__":
    main()
