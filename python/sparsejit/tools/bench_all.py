"""``sparsejit-bench``: every op family against the peers installed on this machine, side by
side in one process.

    sparsejit-bench                                   # all five families, default sizes
    sparsejit-bench --families spmm rgms --quick      # a subset, small sizes (seconds)
    sparsejit-bench --out-json r.json --out-md r.md --out-svg r.svg
    sparsejit-bench --device cuda --train             # on a GPU, forward + backward

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

``--device cuda`` runs every family on the GPU (each call timed up to a device
synchronisation): the peers are then cuSPARSE (``torch.sparse.mm``), PyG's layers, spconv's
CUDA build when installed, and cuDNN's dense convolutions. ``--train`` times forward and
backward (one ``backward`` of a fixed random gradient per call) wherever the op trains (every
family but ``filter_conv``, which is inference only, and the ``spmm`` family's SDDMM table),
and adds a ``GATConv`` layer against PyG's to the ``attention`` family.

Each peer's output is checked against sparsejit's before it is timed (``ok``); times are
medians of ``--repeat`` calls after warm-ups; ``ratio`` is peer / sparsejit (above 1:
sparsejit is faster). The CPU (model, ISA) and thread count are printed with the tables.
Every forward case also gives sparsejit's rate against this machine's limit: the no-reuse
bytes of the memory-bound ops (SpMM, SDDMM, attention, RGMS at these widths) against the
measured copy bandwidth, the FLOPs of the compute-bound ones (point-cloud and filter-sparse
convolution) against the measured dense GEMM rate (``sparsejit.tools.roofline``).
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


def _with_backward(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """fn's forward, then one backward of a fixed random gradient; returns the forward output."""
    grad: List[torch.Tensor] = []

    def step() -> torch.Tensor:
        out = fn()
        if not grad:
            grad.append(torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
                        .to(out.device, out.dtype))
        out.backward(grad[0])
        return out.detach()
    return step


def _limit(base_ms: float, device: str, nbytes: Optional[int] = None,
           flops: Optional[int] = None) -> dict:
    """sparsejit's rate against the machine's limit (see the module docstring)."""
    from sparsejit.tools.roofline import gemm_peak_gflops, stream_bandwidth_gbs
    if base_ms <= 0:
        return {}
    if nbytes is not None:
        gbs, roof = nbytes / base_ms / 1e6, stream_bandwidth_gbs(device=device)
        return dict(bytes_min=nbytes, gbps=round(gbs, 2), roofline_gbps=round(roof, 2),
                    roofline_frac=round(gbs / roof, 3))
    if flops is not None:
        gf, peak = flops / base_ms / 1e6, gemm_peak_gflops(device=device)
        return dict(flops=flops, gflops=round(gf, 2), gemm_peak_gflops=round(peak, 2),
                    roofline_frac=round(gf / peak, 3))
    return {}


def _case(family: str, op: str, graph: str, nnz: int, F: int, variant: str,
          ours: Callable[[], torch.Tensor], peers: Dict[str, Callable[[], torch.Tensor]],
          args, skipped: List[str], train: bool = False, nbytes: Optional[int] = None,
          flops: Optional[int] = None) -> List[dict]:
    """Times sparsejit and each peer on one case (forward + backward when `train`); records
    in the shape of sparsejit.tools.bench (so its markdown table and the plot read them).
    `nbytes` / `flops`: the forward's no-reuse bytes or FLOPs, for the rate column."""
    if train:
        ours = _with_backward(ours)
        peers = {name: _with_backward(fn) for name, fn in peers.items()}
        op += " fwd+bwd"
    ref = ours()
    base = median_ms(ours, args.repeat, args.warmup, args.device)
    common = dict(family=family, op=op, graph=graph, nnz=nnz, F=F, reduce=variant,
                  threads=torch.get_num_threads(), device=args.device)
    limit = {} if train else _limit(base, args.device, nbytes, flops)
    recs = [dict(common, impl="sparsejit", median_ms=round(base, 4), ok=True, **limit)]
    for name, fn in peers.items():
        try:
            ok = _agrees(fn(), ref)
            ms = median_ms(fn, args.repeat, args.warmup, args.device)
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
    argv += ["--device", args.device]
    argv += ["--reduce", "sum", "mean", "max"]
    if not args.quick:
        argv += ["--features", "64", "128", "--repeat", str(args.repeat)]
    recs = bench.run(argv, quiet=True)
    for r in recs:
        r["family"] = "spmm"
    return recs


def _graph(n: int, avg: int, seed: int = 0, device: str = "cpu"):
    from sparsejit.tools.data import powerlaw
    g = powerlaw(n, avg, 2.1, seed)
    return g.edge_index.to(device), g.num_nodes


def _randn(*shape, generator, device, train=False, scale=1.0):
    """Random input made on the CPU (the same numbers on every device), a leaf that
    requires grad when `train`."""
    t = (torch.randn(*shape, generator=generator) * scale).to(device)
    return t.requires_grad_(train)


def bench_attention(args, skipped) -> List[dict]:
    import sparsejit as sj
    dev, train = args.device, args.train
    n, avg, heads, d = (3000, 8, 2, 16) if args.quick else (100_000, 16, 4, 32)
    ei, n = _graph(n, avg, 1, dev)
    A = sj.SparseMatrix.from_edge_index(ei, n)
    g = torch.Generator().manual_seed(0)
    q, k, v = (_randn(n, heads, d, generator=g, device=dev, train=train) for _ in range(3))
    row, col = A.row_indices().long(), A.indices.long()
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
            mx = torch.full((n, heads), float("-inf"), device=dev).scatter_reduce(
                0, row[:, None].expand_as(s), s.detach(), "amax", include_self=True)
            e = (s - mx[row]).exp()
            p = e / torch.zeros(n, heads, device=dev).index_add(0, row, e)[row]
        return torch.zeros(n, heads, d, device=dev).index_add(0, row, p[..., None] * v[col])

    peers = {"gather-softmax-scatter": lambda: gather_softmax_scatter(False)}
    if pyg_softmax is not None:
        peers["PyG softmax + scatter"] = lambda: gather_softmax_scatter(True)
    es = q.element_size()
    nbytes = (n + 1 + A.nnz) * A.indices.element_size() + (2 * n + 2 * A.nnz) * heads * d * es
    recs = _case("attention", "sparse_attention", f"powerlaw n={n}", A.nnz, d, f"H={heads}",
                 lambda: sj.sparse_attention(A, q, k, v), peers, args, skipped, train,
                 nbytes=nbytes)
    if train:
        recs += _gat_layer(args, skipped, ei, n)
    return recs


def _gat_layer(args, skipped, ei, n) -> List[dict]:
    """One GATConv (4 heads) forward + backward against PyG's, the same weights, structure
    work from edge_index included on both sides."""
    try:
        import torch_geometric.nn as pnn
    except ImportError:
        skipped.append("attention/PyG GATConv: torch_geometric not installed")
        return []
    import sparsejit as sj
    f = 64
    torch.manual_seed(0)
    theirs = pnn.GATConv(f, f // 4, heads=4).to(args.device)
    ours = sj.nn.GATConv(f, f // 4, heads=4).to(args.device)
    ours.load_state_dict(theirs.state_dict(), strict=False)
    x = _randn(n, f, generator=torch.Generator().manual_seed(1), device=args.device, train=True)
    return _case("attention", "GATConv layer", f"powerlaw n={n}", int(ei.shape[1]), f, "H=4",
                 lambda: ours(x, ei), {"PyG GATConv": lambda: theirs(x, ei)}, args, skipped,
                 train=True)


def bench_rgms(args, skipped) -> List[dict]:
    import sparsejit as sj
    dev, train = args.device, args.train
    n, e, r, f = (2000, 16000, 8, 16) if args.quick else (100_000, 1_000_000, 50, 16)
    g = torch.Generator().manual_seed(0)
    ei, et = torch.randint(0, n, (2, e), generator=g), torch.randint(0, r, (e,), generator=g)
    ei, et = ei.to(dev), et.to(dev)
    x = _randn(n, f, generator=g, device=dev, train=train)
    w = _randn(r, f, f, generator=g, device=dev, train=train, scale=0.1)
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=r)

    def loop():
        out = torch.zeros(n, f, device=dev)
        for rel in range(r):
            m = et == rel
            s, d = ei[0][m], ei[1][m]
            agg = torch.zeros(n, f, device=dev).index_add(0, d, x[s])
            cnt = torch.bincount(d, minlength=n).clamp(min=1)
            out += (agg / cnt[:, None]) @ w[rel]
        return out

    peers = {"per-relation torch loop": loop}
    try:
        from torch_geometric.nn import RGCNConv
        conv = RGCNConv(f, f, r, aggr="mean", root_weight=False, bias=False).to(dev)
        with torch.no_grad():
            conv.weight.copy_(w)
        peers["PyG RGCNConv"] = lambda: conv(x, ei, et)
    except ImportError:
        skipped.append("rgms/PyG RGCNConv: torch_geometric not installed")
    with torch.set_grad_enabled(train):
        # No reuse: the edge list, one row of X per edge, W, the output.
        nbytes = e * 2 * 8 + (e * f + r * f * f + n * f) * x.element_size()
        return _case("rgms", "rgms", f"random n={n} E={e} R={r}", e, f, "mean",
                     lambda: sj.rgms(A, x, w, reduce="mean"), peers, args, skipped, train,
                     nbytes=nbytes)


def bench_point_conv(args, skipped) -> List[dict]:
    import sparsejit.spconv as sjs
    dev, train = args.device, args.train
    side, pts, cin, cout = (24, 2000, 16, 16) if args.quick else (48, 30000, 32, 32)
    g = torch.Generator().manual_seed(0)
    key = torch.randperm(side ** 3, generator=g)[:pts]
    coords = torch.stack([torch.zeros_like(key), key // side ** 2, (key // side) % side,
                          key % side], 1).int().to(dev)
    feats = _randn(pts, cin, generator=g, device=dev, train=train)
    ours_mod = sjs.SubMConv3d(cin, cout, 3, bias=False, indice_key="b").to(dev)
    shape = [side] * 3

    def ours():  # a new tensor each call: the kernel map is built every time
        return ours_mod(sjs.SparseConvTensor(feats, coords, shape, 1)).features

    # Dense conv3d on the grid, read at the sites (same weights: [C_out, k, k, k, C_in]).
    wd = ours_mod.weight.detach().permute(0, 4, 1, 2, 3).contiguous()
    lc = coords.long()

    def dense():
        grid = torch.zeros(1, cin, side, side, side, device=dev)
        grid[0, :, lc[:, 1], lc[:, 2], lc[:, 3]] = feats.t()
        return torch.nn.functional.conv3d(grid, wd, padding=1)[0, :, lc[:, 1], lc[:, 2],
                                                                  lc[:, 3]].t()

    peers = {"dense conv3d": dense}
    try:
        import spconv.pytorch as spc
        if dev == "cpu" and train:  # spconv-CPU's backward asks for a CUDA stream otherwise
            import spconv.pytorch.ops as spc_ops
            spc_ops.get_current_stream = lambda: 0
        theirs = spc.SubMConv3d(cin, cout, 3, bias=False, indice_key="b").to(dev)
        with torch.no_grad():
            theirs.weight.copy_(ours_mod.weight)

        def spconv_run():
            return theirs(spc.SparseConvTensor(feats, coords, shape, 1)).features

        def spconv_1thread():
            t = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                return spconv_run()
            finally:
                torch.set_num_threads(t)
        if dev == "cpu":
            peers["spconv-CPU (1 thread)"] = spconv_1thread
        else:
            peers["spconv"] = spconv_run
    except Exception as e:  # noqa: BLE001 - missing or broken install
        skipped.append(f"point_conv/spconv: {type(e).__name__}: {str(e)[:80]}")
    # FLOPs: 2 C_in C_out per (site, occupied neighbour) pair of the 3x3x3 map.
    occ = torch.zeros(1, 1, side, side, side, device=dev)
    occ[0, 0, lc[:, 1], lc[:, 2], lc[:, 3]] = 1.0
    nbrs = torch.nn.functional.conv3d(occ, torch.ones(1, 1, 3, 3, 3, device=dev), padding=1)
    pairs = int(nbrs[0, 0, lc[:, 1], lc[:, 2], lc[:, 3]].sum())
    with torch.set_grad_enabled(train):
        rows = _case("point_conv", "subm3d incl. map", f"random {pts} sites in {side}^3",
                     pts, cin, f"{cin}->{cout}", ours, peers, args, skipped, train,
                     flops=2 * pairs * cin * cout)
    if dev == "cuda":  # the two CUDA dataflows side by side (they set the auto rule)
        rows += _point_conv_dataflows(args, skipped, coords, shape, pts, pairs, g)
    return rows


def _point_conv_dataflows(args, skipped, coords, shape, pts, pairs, g) -> List[dict]:
    """The convolution alone (map built once) through the output-stationary implicit GEMM
    against the cuBLAS gather-GEMM-scatter, at the widths the networks use."""
    from sparsejit.families.point_conv.ops import point_conv_plan, point_conv
    plan, _ = point_conv_plan(coords, shape, 1, "subm", 3)
    rows = []
    for c in (16, 32, 64, 128):
        x = _randn(pts, c, generator=g, device=args.device, train=args.train)
        w = _randn(27, c, c, generator=g, device=args.device, train=args.train, scale=0.1)

        def run(dataflow, x=x, w=w):
            return point_conv(x, w, None, plan, pts, dataflow=dataflow)

        with torch.set_grad_enabled(args.train):
            rows += _case("point_conv", "subm3d conv, output-stationary",
                          f"random {pts} sites", pts, c, f"{c}->{c}",
                          lambda: run("output_stationary"),
                          {"sparsejit gather-GEMM-scatter": lambda: run("gather_gemm_scatter")},
                          args, skipped, args.train, flops=2 * pairs * c * c)
    return rows


def bench_filter_conv(args, skipped) -> List[dict]:
    import sparsejit as sj
    c, hw, batch = (32, 14, 1) if args.quick else (128, 28, 8)
    g = torch.Generator().manual_seed(0)
    conv = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
    with torch.no_grad():
        w = torch.randn(conv.weight.shape, generator=g)
        w[torch.rand(w.shape, generator=g) < 0.9] = 0  # 90% of the weights pruned
        conv.weight.copy_(w)
    x = torch.randn(batch, c, hw, hw, generator=g).to(args.device)
    ours = sj.nn.PrunedConv2d.from_dense(conv).to(args.device)
    conv = conv.to(args.device)
    with torch.no_grad():
        nnz = int((w != 0).sum())  # FLOPs: 2 per stored weight per output pixel
        return _case("filter_conv", "sparse_conv2d 90%", f"{batch}x{c}x{hw}x{hw}", nnz, c,
                     "3x3", lambda: ours(x), {"dense conv2d": lambda: conv(x)}, args, skipped,
                     flops=2 * nnz * hw * hw * batch)


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
    ap.add_argument("--device", default="cpu",
                    help="cpu or cuda[:N]: where every family runs (peers too)")
    ap.add_argument("--train", action="store_true",
                    help="forward + backward where the op trains (see above)")
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


def markdown(records: List[dict], skipped: List[str], cpu: str, device: str = "cpu") -> str:
    from sparsejit.tools.bench import markdown as table
    where = f"CPU: {cpu}; threads: {torch.get_num_threads()}"
    if device != "cpu":
        where = f"GPU: {torch.cuda.get_device_name(device)} ({device}); host {where}"
    parts = [f"{where}; torch {torch.__version__}\n"]
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
    if args.device != "cpu" and not torch.cuda.is_available():
        raise SystemExit(f"sparsejit-bench: --device {args.device} needs a CUDA device; this torch "
                         f"({torch.__version__}) sees none")
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
    text = markdown(records, skipped, cpu, args.device)
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump({"cpu": cpu, "device": args.device, "threads": torch.get_num_threads(), "skipped": skipped,
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
