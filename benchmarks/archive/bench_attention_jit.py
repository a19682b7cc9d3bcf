"""The fused attention op alone (forward + backward), JIT-specialized kernel against the
generic one, interleaved in one process (SPARSEJIT_JIT toggled between steps), for the
three score forms at the widths the PyG layers use (4 heads of F / 4, F = 64 and 128).

    python benchmarks/archive/bench_attention_jit.py \
        --graph powerlaw:n=200000,avg=10,alpha=2.1,seed=1

Prints medians and generic / JIT ratios; writes benchmarks/results/attention_jit.json.
Shared 2-core machine: read the ratios.

    python benchmarks/archive/bench_attention_jit.py --bf16

instead times the forward alone in float32 and in bfloat16 (the JIT's native bfloat16 kernel),
interleaved, JIT on; writes benchmarks/results/attention_bf16.json.
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

import sparsejit as sj
from sparsejit import _core
from sparsejit.tools.data import load_graph


def _set_jit(on: bool) -> None:
    os.environ["SPARSEJIT_JIT"] = "1" if on else "0"
    _core.jit_refresh_env()


def _step(A, mode, q, k, v, att, grad):
    for t in (q, k, v, att):
        t.grad = None
    if mode == "dot":
        out = sj.sparse_attention(A, q, k, v)
    elif mode == "gat":
        out = sj.gat_attention(A, q[..., 0], k[..., 0], v)
    else:
        out = sj.gatv2_attention(A, q, k, att, v)
    out.backward(grad)


def _forward(A, mode, q, k, v, att):
    if mode == "dot":
        return sj.sparse_attention(A, q, k, v)
    if mode == "gat":
        return sj.gat_attention(A, q[..., 0], k[..., 0], v)
    return sj.gatv2_attention(A, q, k, att, v)


def main(argv=None) -> int:
    from sparsejit.info import cpu_line
    print(f"CPU: {cpu_line()}", flush=True)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", default="powerlaw:n=200000,avg=10,alpha=2.1,seed=1")
    ap.add_argument("--features", nargs="*", type=int, default=[64, 128])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true",
                    help="forward in float32 against bfloat16 (JIT on) instead of JIT/generic")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = str(Path(__file__).resolve().parents[1] / "results" /
                       ("attention_bf16.json" if args.bf16 else "attention_jit.json"))
    torch.set_num_threads(args.threads)
    g = load_graph(args.graph)
    A = sj.SparseMatrix.from_edge_index(g.edge_index, g.num_nodes)
    rows = []
    for f in args.features:
        H, C = args.heads, f // args.heads
        for mode in ("gat", "dot", "gatv2"):
            qk = 1 if mode == "gat" else C
            q = torch.randn(A.shape[0], H, qk, requires_grad=True)
            k = torch.randn(A.shape[1], H, qk, requires_grad=True)
            v = torch.randn(A.shape[1], H, C, requires_grad=True)
            att = torch.randn(H, C, requires_grad=True)
            grad = torch.randn(A.shape[0], H, C)
            if args.bf16:
                _set_jit(True)
                ins = {dt: [t.detach().to(dt) for t in (q, k, v, att)]
                       for dt in (torch.float32, torch.bfloat16)}
                times = {dt: [] for dt in ins}
                with torch.no_grad():
                    for dt in ins:  # warm-up (compile)
                        _forward(A, mode, *ins[dt])
                    for _ in range(args.repeats):
                        for dt in ins:
                            t0 = time.perf_counter()
                            _forward(A, mode, *ins[dt])
                            times[dt].append(time.perf_counter() - t0)
                f32 = statistics.median(times[torch.float32])
                b16 = statistics.median(times[torch.bfloat16])
                rows.append(dict(mode=mode, F=f, heads=H, width=C, float32_s=f32,
                                 bfloat16_s=b16, speedup=f32 / b16))
                print(f"{mode:<6} H={H} C={C:<4} forward float32 {f32 * 1e3:8.2f} ms  "
                      f"bfloat16 {b16 * 1e3:8.2f} ms  x{f32 / b16:.2f}", flush=True)
                continue
            times = {True: [], False: []}
            for on in (True, False):  # warm-up (compile, transpose)
                _set_jit(on)
                _step(A, mode, q, k, v, att, grad)
            for _ in range(args.repeats):
                for on in (True, False):
                    _set_jit(on)
                    t0 = time.perf_counter()
                    _step(A, mode, q, k, v, att, grad)
                    times[on].append(time.perf_counter() - t0)
            jit, gen = statistics.median(times[True]), statistics.median(times[False])
            rows.append(dict(mode=mode, F=f, heads=H, width=C, jit_s=jit, generic_s=gen,
                             speedup=gen / jit))
            print(f"{mode:<6} H={H} C={C:<4} jit {jit * 1e3:8.2f} ms  generic {gen * 1e3:8.2f} "
                  f"ms  x{gen / jit:.2f}", flush=True)
    _set_jit(True)
    geo = math.exp(sum(math.log(r["speedup"]) for r in rows) / len(rows))
    print(f"geomean {'float32 / bfloat16' if args.bf16 else 'generic / JIT'}: x{geo:.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(graph=g.name, nodes=g.num_nodes,
                                              edges=g.num_edges, threads=args.threads,
                                              load_average=os.getloadavg(), rows=rows,
                                              geomean=geo), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
