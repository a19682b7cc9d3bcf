"""The filter-sparse convolution's JIT loop on 16-lane vectors (AVX-512 CPUs) against the same
loop on 8 lanes (SPARSEJIT_FILTER_CONV_WIDE=0), per ResNet-50 layer with its DLMC pattern, in
one process: each layer is prepared twice (the variable is read when a layer is prepared),
outputs checked bit-identical, calls alternated, medians.

    python3 benchmarks/archive/bench_filter_conv_lanes.py --sparsity 0.9 --batch 8

On a CPU without AVX-512 both sides compile to the same 8-lane loop (ratios ~1).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
import bench_filter_conv as B  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    B.add_layer_args(ap, "only the first N layers")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/filter_conv_lanes.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = Path(os.environ.get("SPARSEJIT_DATA", ROOT.parent / "shared" / "data"))
    pdir = data / "dlmc/rn50/magnitude_pruning/0.8"
    if not pdir.is_dir():
        sys.exit(f"no DLMC patterns at {pdir} (set SPARSEJIT_DATA)")
    keep = min((1 - args.sparsity) / 0.2, 1.0)
    saved = os.environ.get("SPARSEJIT_FILTER_CONV_WIDE")
    records = []
    with torch.no_grad():
        for i, (name, c_in, c_out, k, stride, pad, h) in enumerate(
                B.resnet50_layers()[:args.limit]):
            w = B.pattern_weight(pdir / f"{name}.smtx.gz", c_out, c_in, k, keep, seed=i)
            b = torch.randn(c_out)
            x = torch.randn(args.batch, c_in, h, h)
            layers = {}
            for lanes, env in ((8, "0"), (16, "1")):
                os.environ["SPARSEJIT_FILTER_CONV_WIDE"] = env
                layers[lanes] = B.PrunedConv2d(w.clone(), b, stride, pad)
                layers[lanes](x)  # prepares (and compiles) with this setting
            assert torch.equal(layers[8](x), layers[16](x)), name
            times = {8: [], 16: []}
            for r in range(args.repeat):
                for lanes in ((8, 16) if r % 2 else (16, 8)):
                    t0 = time.perf_counter()
                    layers[lanes](x)
                    times[lanes].append((time.perf_counter() - t0) * 1e3)
            m8, m16 = (statistics.median(times[n]) for n in (8, 16))
            records.append(dict(layer=name, shape=f"{c_in}->{c_out} k{k} s{stride} {h}x{h}",
                                ms_8_lanes=m8, ms_16_lanes=m16, speedup=m8 / m16))
            print(f"{name:<58} {records[-1]['shape']:<22} 8 lanes {m8:7.3f} ms  16 lanes "
                  f"{m16:7.3f} ms  {m8 / m16:5.2f}x", flush=True)
    if saved is None:
        os.environ.pop("SPARSEJIT_FILTER_CONV_WIDE", None)
    else:
        os.environ["SPARSEJIT_FILTER_CONV_WIDE"] = saved
    g = math.exp(statistics.fmean(math.log(r["speedup"]) for r in records))
    from sparsejit.info import cpu_line
    cpu = cpu_line()
    print(f"\nCPU: {cpu}; sparsity {args.sparsity:.0%}, batch {args.batch}, {args.threads} "
          f"threads: 16 lanes over 8, geomean {g:.3f}x over {len(records)} layers "
          f"(min {min(r['speedup'] for r in records):.2f}x, max "
          f"{max(r['speedup'] for r in records):.2f}x)")
    Path(args.out).write_text(json.dumps(dict(cpu=cpu, args=vars(args), geomean=g,
                                              layers=records), indent=1))


if __name__ == "__main__":
    main()
