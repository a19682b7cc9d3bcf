"""Benchmark harness: sparsejit against its peers, side by side in one process.

    python -m sparsejit.tools.bench [--graphs cora rmat:scale=16] [--ops spmm sddmm]
                                    [--features 32 64 128 256] [--reduce sum mean max min]
                                    [--out-json results.json] [--out-md results.md] [--quick]

Peers run on the same tensors, each checked against sparsejit's output before it is timed
(a peer that disagrees is reported with ok=false, not hidden). Times are medians of
``--repeat`` runs after ``--warmup`` runs; ratios are peer_ms / sparsejit_ms (above 1:
sparsejit is faster). Achieved bandwidth uses the no-reuse byte count and is reported
against a measured copy bandwidth (the roofline).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from typing import Callable, Dict, List

import torch

from sparsejit.tools import data as sjdata
from sparsejit.families.spmm.sddmm import sddmm
from sparsejit.families.spmm.spmm import spmm
from sparsejit.families.spmm.matrix import SparseMatrix
from sparsejit.runtime.timing import median_ms
from sparsejit.tools.roofline import sddmm_min_bytes, spmm_min_bytes, stream_bandwidth_gbs

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def _agrees(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> bool:
    # Scaled by the output's magnitude: float32 sums over rows of 10^4+ entries legitimately
    # differ by more than a fixed 1e-3 when peers add in another order.
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-3
    scale = max(1.0, float(ref.abs().max())) if ref.numel() else 1.0
    return bool(torch.allclose(got.double(), ref.double(), atol=tol * scale, rtol=tol))


def _spmm_peers(A: SparseMatrix, X: torch.Tensor, reduce: str, src, dst, n: int):
    """name -> callable computing the same aggregation (only peers that support it)."""
    peers: Dict[str, Callable[[], torch.Tensor]] = {}
    F = X.shape[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        csr = torch.sparse_csr_tensor(A.indptr, A.indices,
                                      torch.ones(A.nnz, dtype=X.dtype, device=X.device),
                                      size=A.shape)
    if reduce == "sum":
        peers["torch.sparse"] = lambda: torch.sparse.mm(csr, X)
    elif X.device.type == "cpu":  # CSR reductions: CPU only in PyTorch
        torch_reduce = {"mean": "mean", "max": "amax", "min": "amin"}[reduce]
        peers["torch.sparse"] = lambda: torch.sparse.mm(csr, X, torch_reduce)
    if reduce in ("sum", "mean"):
        deg = torch.bincount(dst, minlength=n).clamp(min=1).to(X.dtype).view(-1, 1)

        def scatter_add():
            out = torch.zeros(n, F, dtype=X.dtype, device=X.device).index_add_(
                0, dst, X.index_select(0, src))
            return out / deg if reduce == "mean" else out

        peers["scatter"] = scatter_add
    else:
        how = "amax" if reduce == "max" else "amin"
        idx = dst.view(-1, 1).expand(-1, F)
        peers["scatter"] = lambda: torch.zeros(n, F, dtype=X.dtype, device=X.device).scatter_reduce_(
            0, idx, X.index_select(0, src), reduce=how, include_self=False)
    if reduce == "sum" and X.device.type == "cpu" and X.dtype != torch.bfloat16:
        sp = A.to_scipy().astype(X.numpy().dtype)
        Xn = X.numpy()
        peers["scipy"] = lambda: torch.from_numpy(sp @ Xn)
    return peers


def _records_for(case: dict, timings: Dict[str, float], oks: Dict[str, bool], nbytes: int,
                 roof: float) -> List[dict]:
    base = timings["sparsejit"]
    out = []
    for impl, ms in timings.items():
        r = dict(case, impl=impl, median_ms=round(ms, 4), ok=oks.get(impl, True))
        if impl == "sparsejit":
            gbs = nbytes / (ms * 1e-3) / 1e9 if ms > 0 else 0.0
            r.update(bytes_min=nbytes, gbps=round(gbs, 2), roofline_gbps=round(roof, 2),
                     roofline_frac=round(gbs / roof, 3) if roof else None)
        else:
            r["ratio"] = round(ms / base, 3) if base > 0 else None
        out.append(r)
    return out


def bench_graph(g: sjdata.Graph, args, roof: float) -> List[dict]:
    device = args.device
    dtype = _DTYPES[args.dtype]
    ei = g.edge_index.to(device)
    src, dst = ei[0], ei[1]
    n = g.num_nodes
    A = SparseMatrix.from_edge_index(ei, n)
    row, col = A.row_indices(), A.indices.long()
    recs: List[dict] = []
    gen = torch.Generator(device="cpu").manual_seed(0)
    for F in args.features:
        X = torch.randn(n, F, generator=gen).to(device=device, dtype=dtype)
        common = dict(graph=g.name, rows=n, nnz=A.nnz, F=F, dtype=args.dtype, device=device,
                      threads=torch.get_num_threads())
        if "spmm" in args.ops:
            for reduce in args.reduce:
                ours = lambda: spmm(A, X, reduce)  # noqa: E731
                ref = ours()
                timings = {"sparsejit": median_ms(ours, args.repeat, args.warmup, device)}
                oks = {}
                for name, fn in _spmm_peers(A, X, reduce, src, dst, n).items():
                    oks[name] = _agrees(fn(), ref, dtype)
                    timings[name] = median_ms(fn, args.repeat, args.warmup, device)
                nbytes = spmm_min_bytes(n, A.nnz, F, X.element_size(), 8, False)
                recs += _records_for(dict(common, op="spmm", reduce=reduce), timings, oks,
                                     nbytes, roof)
        if "sddmm" in args.ops:
            Q = torch.randn(n, F, generator=gen).to(device=device, dtype=dtype)
            ours = lambda: sddmm(A, Q, X)  # noqa: E731
            gather = lambda: (Q[row] * X[col]).sum(-1)  # noqa: E731
            timings = {"sparsejit": median_ms(ours, args.repeat, args.warmup, device)}
            oks = {"gather-dot": _agrees(gather(), ours(), dtype)}
            timings["gather-dot"] = median_ms(gather, args.repeat, args.warmup, device)
            nbytes = sddmm_min_bytes(n, A.nnz, F, X.element_size(), 8)
            recs += _records_for(dict(common, op="sddmm", reduce="-"), timings, oks, nbytes, roof)
        if args.verbose:
            print(f"  {g.name} F={F} done", file=sys.stderr)
    return recs


def geomean(xs: List[float]) -> float:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def _rate(r: dict) -> str:
    """The record's rate against the machine's limit: GB/s against the copy bandwidth
    (memory-bound ops) or GFLOP/s against the dense GEMM peak (compute-bound ones)."""
    frac = r.get("roofline_frac")
    if not frac:
        return "-"
    if "gflops" in r:
        return f"{r['gflops']:.1f} GFLOP/s ({100 * frac:.0f}% of GEMM)"
    return f"{r.get('gbps', 0):.1f} GB/s ({100 * frac:.0f}% of copy)"


def markdown(records: List[dict]) -> str:
    """One row per (op, graph, F, reduce): each impl's median ms and ratio to sparsejit,
    then geometric means of the ratios per (op, peer)."""
    cases: Dict[tuple, Dict[str, dict]] = {}
    impls: List[str] = []
    for r in records:
        key = (r["op"], r["graph"], r["nnz"], r["F"], r["reduce"])
        cases.setdefault(key, {})[r["impl"]] = r
        if r["impl"] != "sparsejit" and r["impl"] not in impls:
            impls.append(r["impl"])
    head = ["op", "graph", "nnz", "F", "reduce", "sparsejit ms", "rate (% of machine limit)"]
    for i in impls:
        head += [f"{i} ms", f"x vs {i}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios: Dict[tuple, List[float]] = {}
    for key, by in cases.items():
        me = by["sparsejit"]
        cells = [str(k) for k in key[:2]] + [str(key[2]), str(key[3]), str(key[4]),
                                              f"{me['median_ms']:.3f}", _rate(me)]
        for i in impls:
            r = by.get(i)
            if r is None:
                cells += ["-", "-"]
                continue
            flag = "" if r["ok"] else " (disagrees)"
            cells += [f"{r['median_ms']:.3f}", f"{r['ratio']:.2f}{flag}"]
            ratios.setdefault((key[0], i), []).append(r["ratio"])
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| op | peer | geometric mean of peer_ms / sparsejit_ms | cases |")
    lines.append("|---|---|---|---|")
    for (op, peer), rs in sorted(ratios.items()):
        lines.append(f"| {op} | {peer} | {geomean(rs):.2f} | {len(rs)} |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m sparsejit.tools.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", nargs="+", default=None,
                    help="graph names, files or generator specs (default: the standard suite)")
    ap.add_argument("--ops", nargs="+", default=["spmm", "sddmm"], choices=["spmm", "sddmm"])
    ap.add_argument("--features", nargs="+", type=int, default=[32, 64, 128, 256])
    ap.add_argument("--reduce", nargs="+", default=["sum"], choices=["sum", "mean", "max", "min"])
    ap.add_argument("--dtype", default="float32", choices=sorted(_DTYPES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--out-json")
    ap.add_argument("--out-md")
    ap.add_argument("--quick", action="store_true",
                    help="two small generated graphs, F in {16, 32}, few repeats (for tests)")
    ap.add_argument("--verbose", action="store_true")
    return ap.parse_args(argv)


def run(argv=None, quiet: bool = False) -> List[dict]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.graphs = args.graphs or ["powerlaw:n=3000,avg=8,seed=1", "uniform:n=2000,avg=5,seed=2"]
        args.features = [16, 32]
        args.warmup, args.repeat = 1, 3
    specs = args.graphs or list(sjdata.DEFAULT_SUITE)
    if sjdata.data_dir() is None:
        skipped = [s for s in specs if not sjdata.is_generated(s) and not __import__("os").path.exists(s)]
        if skipped:
            print(f"note: no data folder (set SPARSEJIT_DATA); skipping {', '.join(skipped)}",
                  file=sys.stderr)
        specs = [s for s in specs if s not in skipped]
    roof = stream_bandwidth_gbs(device=args.device)
    records: List[dict] = []
    for spec in specs:
        g = sjdata.load_graph(spec)
        if args.verbose:
            print(f"{g.name}: {g.num_nodes} nodes, {g.num_edges} edges", file=sys.stderr)
        records += bench_graph(g, args, roof)
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump({"roofline_copy_gbps": roof, "records": records}, f, indent=1)
    table = markdown(records)
    if args.out_md:
        with open(args.out_md, "w") as f:
            f.write(table)
    if not quiet:
        print(table)
        print(f"measured copy bandwidth (roofline): {roof:.1f} GB/s; threads: "
              f"{torch.get_num_threads()}; device: {args.device}")
    return records


if __name__ == "__main__":
    run()
