"""``sparsejit-bench``: every op family against the peers installed on this machine, side by
side in one process.

    sparsejit-bench                                   # all five families, default sizes
    sparsejit-bench --families spmm rgms --quick      # a subset, small sizes (seconds)
    sparsejit-bench --out-json r.json --out-md r.md --out-svg r.svg

Families and peers (a peer that is not installed is skipped and named in the output):

- ``spmm``: SpMM and SDDMM (``sparsejit.tools.bench``): ``torch.sparse.mm`` on CSR, the
  PyG-style gather/scatter path, scipy;
- ``attention``: fused dot-product attention against gather, per-row softmax
  (``torch_geometric.utils.softmax`` when PyG is installed, else ``scatter_reduce``) and
  scatter;
- ``rgms``: the R-GCN aggregation ``sum_r mean_{j in N_r(i)} X_j W_r`` against PyG's
  ``RGCNConv`` (same weights, no root or bias) and a per-relation torch loop;
- ``point_conv``: a SubMConv3d forward including the kernel map, against spconv-CPU (one
  thread: its CPU path is unreliable with more) and a dense ``conv3d`` on the voxel grid;
- ``filter_conv``: a 90%-pruned 3x3 Conv2d, against the dense ``conv2d``.

Each peer's output is checked against sparsejit's before it is timed (``ok``); times are
medians of ``--repeat`` calls after warm-ups; ``ratio`` is peer / sparsejit (above 1:
sparsejit is faster). The CPU (model, ISA) and thread count are printed with the tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Dict, List, Optional

import torch

from sparsejit.runtime.timing import median_ms

FAMILIES = ("spmm", "attention", "rgms", "point_conv", "filter_conv")


def _agrees(got: torch.Tensor, ref: torch.Tensor) -> bool:
    from sparsejit.tools.bench import _agrees as agrees
    return got.shape == ref.shape and agrees(got, ref, ref.dtype)


def _case(family: str, op: str, graph: str, nnz: int, F: int, variant: str,
          ours: Callable[[], torch.Tensor], peers: Dict[str, Callable[[], torch.Tensor]],
          args, skipped: List[str]) -> List[dict]:
    """Times sparsejit and each peer on one case; records in the shape of
    sparsejit.tools.bench (so its markdown table and the plot read them)."""
    ref = ours()
    base = median_ms(ours, args.repeat, args.warmup)
    common = dict(family=family, op=op, graph=graph, nnz=nnz, F=F, reduce=variant,
                  threads=torch.get_num_threads())
    recs = [dict(common, impl="sparsejit", median_ms=round(base, 4), ok=True)]
    for name, fn in peers.items():
        try:
            ok = _agrees(fn(), ref)
            ms = median_ms(fn, args.repeat, args.warmup)
        except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
            skipped.append(f"{family}/{name}: {type(e).__name__}: {str(e)[:120]}")
            continue
        recs.append(dict(common, impl=name, median_ms=round(ms, 4), ok=ok,
                         ratio=round(ms / base, 3) if base > 0 else None))
    return recs


# ---- families ------------------------------------------------------------------------------


def bench_spmm(args, skipped) -> List[dict]:
    from sparsejit.tools import bench
    argv = ["--quick"] if args.quick else ["--graphs", *args.graphs]
    argv += ["--reduce", "sum", "mean", "max"]
    if not args.quick:
        argv += ["--features", "64", "128", "--repeat", str(args.repeat)]
    recs = bench.run(argv, quiet=True)
    for r in recs:
        r["family"] = "spmm"
    return recs


def _graph(n: int, avg: int, seed: int = 0):
    from sparsejit.tools.data import powerlaw
    g = powerlaw(n, avg, 2.1, seed)
    return g.edge_index, g.num_nodes


def bench_attention(args, skipped) -> List[dict]:
    import sparsejit as sj
    n, avg, heads, d = (3000, 8, 2, 16) if args.quick else (100_000, 16, 4, 32)
    ei, n = _graph(n, avg, 1)
    A = sj.SparseMatrix.from_edge_index(ei, n)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, heads, d, generator=g) for _ in range(3))
    row, col = A.row_indices(), A.indices.long()
    scale = d ** -0.5
    try:
        from torch_geometric.utils import softmax as pyg_softmax
    except ImportError:
        pyg_softmax = None
        skipped.append("attention/PyG softmax: torch_geometric not installed")

    def gather_softmax_scatter(use_pyg: bool):
        s = (q[row] * k[col]).sum(-1) * scale
        if use_pyg:
            p = pyg_softmax(s, row, num_nodes=n)
        else:
            mx = torch.full((n, heads), float("-inf")).scatter_reduce(
                0, row[:, None].expand_as(s), s, "amax", include_self=True)
            e = (s - mx[row]).exp()
            p = e / torch.zeros(n, heads).index_add_(0, row, e)[row]
        return torch.zeros(n, heads, d).index_add_(0, row, p[..., None] * v[col])

    peers = {"gather-softmax-scatter": lambda: gather_softmax_scatter(False)}
    if pyg_softmax is not None:
        peers["PyG softmax + scatter"] = lambda: gather_softmax_scatter(True)
    return _case("attention", "sparse_attention", f"powerlaw n={n}", A.nnz, d, f"H={heads}",
                 lambda: sj.sparse_attention(A, q, k, v), peers, args, skipped)


def bench_rgms(args, skipped) -> List[dict]:
    import sparsejit as sj
    n, e, r, f = (2000, 16000, 8, 16) if args.quick else (100_000, 1_000_000, 50, 16)
    g = torch.Generator().manual_seed(0)
    ei, et = torch.randint(0, n, (2, e), generator=g), torch.randint(0, r, (e,), generator=g)
    x, w = torch.randn(n, f, generator=g), torch.randn(r, f, f, generator=g) * 0.1
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)

    def loop():
        out = torch.zeros(n, f)
        for rel in range(r):
            m = et == rel
            s, d = ei[0][m], ei[1][m]
            agg = torch.zeros(n, f).index_add_(0, d, x[s])
            cnt = torch.bincount(d, minlength=n).clamp(min=1)
            out += (agg / cnt[:, None]) @ w[rel]
        return out

    peers = {"per-relation torch loop": loop}
    try:
        from torch_geometric.nn import RGCNConv
        conv = RGCNConv(f, f, r, aggr="mean", root_weight=False, bias=False)
        with torch.no_grad():
            conv.weight.copy_(w)
        peers["PyG RGCNConv"] = lambda: conv(x, ei, et)
    except ImportError:
        skipped.append("rgms/PyG RGCNConv: torch_geometric not installed")
    with torch.no_grad():
        return _case("rgms", "rgms", f"random n={n} E={e} R={r}", e, f, "mean",
                     lambda: sj.rgms(A, x, w, reduce="mean"), peers, args, skipped)


def bench_point_conv(args, skipped) -> List[dict]:
    import sparsejit.spconv as sjs
    side, pts, cin, cout = (24, 2000, 16, 16) if args.quick else (48, 30000, 32, 32)
    g = torch.Generator().manual_seed(0)
    key = torch.randperm(side ** 3, generator=g)[:pts]
    coords = torch.stack([torch.zeros_like(key), key // side ** 2, (key // side) % side,
                          key % side], 1).int()
    feats = torch.randn(pts, cin, generator=g)
    ours_mod = sjs.SubMConv3d(cin, cout, 3, bias=False, indice_key="b")
    shape = [side] * 3

    def ours():  # a new tensor each call: the kernel map is built every time
        return ours_mod(sjs.SparseConvTensor(feats, coords, shape, 1)).features

    # Dense conv3d on the grid, read at the sites (same weights: [C_out, k, k, k, C_in]).
    wd = ours_mod.weight.detach().permute(0, 4, 1, 2, 3).contiguous()
    lc = coords.long()

    def dense():
        grid = torch.zeros(1, cin, side, side, side)
        grid[0, :, lc[:, 1], lc[:, 2], lc[:, 3]] = feats.t()
        return torch.nn.functional.conv3d(grid, wd, padding=1)[0, :, lc[:, 1], lc[:, 2],
                                                                  lc[:, 3]].t()

    peers = {"dense conv3d": dense}
    try:
        import spconv.pytorch as spc
        theirs = spc.SubMConv3d(cin, cout, 3, bias=False, indice_key="b")
        with torch.no_grad():
            theirs.weight.copy_(ours_mod.weight)

        def spconv_1thread():
            t = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                return theirs(spc.SparseConvTensor(feats, coords, shape, 1)).features
            finally:
                torch.set_num_threads(t)
        peers["spconv-CPU (1 thread)"] = spconv_1thread
    except Exception as e:  # noqa: BLE001 - missing or broken install
        skipped.append(f"point_conv/spconv: {type(e).__name__}: {str(e)[:80]}")
    with torch.no_grad():
        return _case("point_conv", "subm3d incl. map", f"random {pts} sites in {side}^3",
                     pts, cin, f"{cin}->{cout}", ours, peers, args, skipped)


def bench_filter_conv(args, skipped) -> List[dict]:
    import sparsejit as sj
    c, hw, batch = (32, 14, 1) if args.quick else (128, 28, 8)
    g = torch.Generator().manual_seed(0)
    conv = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
    with torch.no_grad():
        w = torch.randn(conv.weight.shape, generator=g)
        w[torch.rand(w.shape, generator=g) < 0.9] = 0  # 90% of the weights pruned
        conv.weight.copy_(w)
    x = torch.randn(batch, c, hw, hw, generator=g)
    ours = sj.nn.SparseConv2d.from_dense(conv)
    with torch.no_grad():
        return _case("filter_conv", "sparse_conv2d 90%", f"{batch}x{c}x{hw}x{hw}",
                     int((w != 0).sum()), c, "3x3",
                     lambda: ours(x), {"dense conv2d": lambda: conv(x)}, args, skipped)


RUNNERS = {"spmm": bench_spmm, "attention": bench_attention, "rgms": bench_rgms,
           "point_conv": bench_point_conv, "filter_conv": bench_filter_conv}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="sparsejit-bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--graphs", nargs="+", default=["cora", "pubmed",
                                                    "powerlaw:n=200000,avg=12,alpha=2.1,seed=1"],
                    help="graphs of the spmm family (names, files or generator specs)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="small sizes, few repeats (seconds)")
    ap.add_argument("--out-json")
    ap.add_argument("--out-md")
    ap.add_argument("--out-svg")
    ap.add_argument("--progress", action="store_true", default=None,
                    help="draw the progress bar even when stderr is not a terminal")
    return ap.parse_args(argv)


def markdown(records: List[dict], skipped: List[str], cpu: str) -> str:
    from sparsejit.tools.bench import markdown as table
    parts = [f"CPU: {cpu}; threads: {torch.get_num_threads()}; torch {torch.__version__}\n"]
    for fam in FAMILIES:
        recs = [r for r in records if r.get("family") == fam]
        if recs:
            parts.append(f"## {fam}\n\n" + table(recs))
    if skipped:
        parts.append("Skipped peers:\n" + "".join(f"- {s}\n" for s in skipped))
    return "\n".join(parts)


def run(argv=None) -> List[dict]:
    from sparsejit.info import cpu_line
    from sparsejit.runtime.timing import Progress
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.warmup, args.repeat = 1, 3
    records: List[dict] = []
    skipped: List[str] = []
    bar = Progress(len(args.families), "sparsejit-bench", enabled=args.progress)
    for fam in args.families:
        records += RUNNERS[fam](args, skipped)
        bar.step(fam)
    cpu = cpu_line()
    text = markdown(records, skipped, cpu)
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump({"cpu": cpu, "threads": torch.get_num_threads(), "skipped": skipped,
                       "records": records}, f, indent=1)
    if args.out_md:
        with open(args.out_md, "w") as f:
            f.write(text)
    if args.out_svg:
        from sparsejit.tools.plot import svg
        with open(args.out_svg, "w") as f:
            f.write(svg(records, f"sparsejit speed-up per family ({cpu.split(',')[0]})"))
    print(text)
    return records


def main(argv: Optional[List[str]] = None) -> int:
    records = run(argv)
    return 0 if records else 1


if __name__ == "__main__":
    sys.exit(main())
