"""A/B timing of sparsejit alone (no peers) for comparing two builds on one machine.

    PYTHONPATH=<build A>/python python3 benchmarks/ab_sparsejit.py --out a.json
    PYTHONPATH=<build B>/python python3 benchmarks/ab_sparsejit.py --out b.json
    python3 benchmarks/ab_sparsejit.py --compare 'a*.json' 'b*.json'

Run the two builds alternately (several rounds) on a quiet machine: each run times every
case as the median of --repeat calls after warm-ups. --compare prints per (family, op) the
geometric mean of B / A over the cases, using each case's best run.

Cases cover every op family, through the public API only (so any two layouts compare):
spmm (SpMM sum/mean/max/min, SDDMM and edge softmax on real and generated graphs), attention
(fused dot-product attention, forward and forward + backward), rgms (an R-GCN layer's op,
forward and forward + backward; narrow rows over 50 relations also in bfloat16), point_conv
(a SubMConv3d with its kernel map built on each call, and forward + backward on a cached map)
and filter_conv (pruned 3x3 Conv2d layers at batch 1, and three of ResNet-50's shapes at
batch 8 and 90%: a 3x3 and two 1x1s). `--families` picks a subset. Generated inputs are
seeded, so both builds see the same data.

`--isa avx2` (or avx512, baseline) runs as on a CPU of that tier, for the "nothing got slower
on the other ISA" check on one machine: SPARSEJIT_MAX_ISA caps sparsejit (its JIT's -march,
its ahead-of-time copies and feature checks), ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA /
MKL_ENABLE_INSTRUCTIONS cap the dense products, and a build from before the cap compiles its
JIT through benchmarks/cxx_max_isa.sh, the same -march rewrite.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections import defaultdict

GRAPHS = ["cora", "pubmed", "facebook", "blogcatalog",
          "powerlaw:n=200000,avg=12,alpha=2.1,seed=1", "rmat:scale=18,ef=10,seed=2"]



def _pruned_conv2d(sj):
    """The pruned Conv2d layer under either name (SparseConv2d before 0.x's rename)."""
    return getattr(sj.nn, "PrunedConv2d", None) or getattr(sj.nn, "SparseConv2d")

def _median_ms(fn, warmup=3, repeat=7):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


FAMILIES = ("spmm", "attention", "rgms", "point_conv", "filter_conv")


def _record(records, family, case, F, op, variant, ms):
    records.append({"family": family, "graph": case, "F": F, "op": op, "reduce": variant,
                    "ms": ms})


def run_spmm(records, features, repeat: int) -> None:
    import torch
    import sparsejit as sj
    try:
        from sparsejit.tools import data
    except ImportError:  # the layout before sparsejit.tools
        from sparsejit import data
    for spec in GRAPHS:
        try:
            g = data.load_graph(spec)
        except Exception as e:  # noqa: BLE001 - a missing data folder skips real graphs
            print(f"skip {spec}: {e}")
            continue
        A = sj.SparseMatrix.from_edge_index(g.edge_index, g.num_nodes)
        for F in features:
            X = torch.randn(A.shape[1], F)
            Q = torch.randn(A.shape[0], F)
            for red in ("sum", "mean", "max", "min"):
                t = _median_ms(lambda: sj.spmm(A, X, red), repeat=repeat)
                _record(records, "spmm", spec, F, "spmm", red, t)
            t = _median_ms(lambda: sj.sddmm(A, Q, X), repeat=repeat)
            _record(records, "spmm", spec, F, "sddmm", "-", t)
        S = torch.randn(A.nnz)
        t = _median_ms(lambda: sj.edge_softmax(A, S), repeat=repeat)
        _record(records, "spmm", spec, 1, "edge_softmax", "-", t)
        print(f"{spec} done", flush=True)


def _powerlaw_edges(n: int, avg: int, seed: int):
    import torch
    g = torch.Generator().manual_seed(seed)
    e = n * avg
    # sources drawn from a heavy-tailed distribution, targets uniform: skewed in-degrees
    src = (torch.rand(e, generator=g) ** 3 * n).long().clamp_(max=n - 1)
    dst = torch.randint(0, n, (e,), generator=g)
    return torch.stack([src, dst]), g


def run_attention(records, repeat: int) -> None:
    import torch
    import sparsejit as sj
    n, heads, d = 50_000, 4, 16
    ei, g = _powerlaw_edges(n, 10, 3)
    A = sj.SparseMatrix.from_edge_index(ei, n)
    q, k, v = (torch.randn(n, heads, d, generator=g) for _ in range(3))
    t = _median_ms(lambda: sj.sparse_attention(A, q, k, v), repeat=repeat)
    _record(records, "attention", f"powerlaw n={n}", heads * d, "sparse_attention", "fwd", t)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))

    def fwd_bwd():
        sj.sparse_attention(A, qg, kg, vg).sum().backward()
    t = _median_ms(fwd_bwd, repeat=repeat)
    _record(records, "attention", f"powerlaw n={n}", heads * d, "sparse_attention", "fwd+bwd", t)
    print("attention done", flush=True)


def run_rgms(records, repeat: int) -> None:
    import torch
    import sparsejit as sj
    n, rels = 20_000, 8
    ei, g = _powerlaw_edges(n, 10, 4)
    et = torch.randint(0, rels, (ei.shape[1],), generator=g)
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=rels)
    for f_in, f_out in ((16, 16), (64, 64)):
        X = torch.randn(n, f_in, generator=g)
        W = torch.randn(rels, f_in, f_out, generator=g) / f_in ** 0.5
        case = f"typed n={n} R={rels}"
        t = _median_ms(lambda: sj.rgms(A, X, W), repeat=repeat)
        _record(records, "rgms", case, f_in, "rgms", "fwd", t)
        Xg, Wg = X.clone().requires_grad_(), W.clone().requires_grad_()

        def fwd_bwd():
            sj.rgms(A, Xg, Wg).sum().backward()
        t = _median_ms(fwd_bwd, repeat=repeat)
        _record(records, "rgms", case, f_in, "rgms", "fwd+bwd", t)
    # Narrow rows over many relations (the fused row kernels; one entry per group on
    # average): float32 forward, forward + backward, and the bfloat16 forward.
    n, rels, e = 100_000, 50, 1_000_000
    ei = torch.randint(0, n, (2, e), generator=g)
    et = torch.randint(0, rels, (e,), generator=g)
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=rels)
    case = f"uniform n={n} R={rels}"
    X = torch.randn(n, 16, generator=g)
    W = torch.randn(rels, 16, 16, generator=g) / 4
    _record(records, "rgms", case, 16, "rgms", "fwd",
            _median_ms(lambda: sj.rgms(A, X, W, reduce="mean"), repeat=repeat))
    Xb, Wb = X.bfloat16(), W.bfloat16()
    _record(records, "rgms", case, 16, "rgms bf16", "fwd",
            _median_ms(lambda: sj.rgms(A, Xb, Wb, reduce="mean"), repeat=repeat))
    Xg, Wg = X.clone().requires_grad_(), W.clone().requires_grad_()

    def fwd_bwd_narrow():
        sj.rgms(A, Xg, Wg, reduce="mean").sum().backward()
    _record(records, "rgms", case, 16, "rgms", "fwd+bwd",
            _median_ms(fwd_bwd_narrow, repeat=repeat))
    print("rgms done", flush=True)


def _cloud(n: int, seed: int):
    """A generated scan-like cloud: points on a few planes and a sphere shell, voxelized."""
    import torch
    g = torch.Generator().manual_seed(seed)
    per = n // 4
    floor = torch.cat([torch.rand(per, 2, generator=g) * 200, torch.full((per, 1), 2.0)], 1)
    wall = torch.cat([torch.rand(per, 1, generator=g) * 200, torch.full((per, 1), 5.0),
                      torch.rand(per, 1, generator=g) * 40], 1)
    ang = torch.rand(2 * per, 2, generator=g) * torch.tensor([6.2832, 3.1416])
    shell = torch.stack([torch.cos(ang[:, 0]) * torch.sin(ang[:, 1]),
                         torch.sin(ang[:, 0]) * torch.sin(ang[:, 1]), torch.cos(ang[:, 1])], 1)
    shell = shell * 30 + 100
    pts = torch.cat([floor, wall, shell]).floor().int()
    pts = torch.unique(pts, dim=0)
    coords = torch.cat([torch.zeros(pts.shape[0], 1, dtype=torch.int32), pts], 1)
    return coords, g


def run_point_conv(records, repeat: int) -> None:
    import torch
    from sparsejit import spconv
    coords, g = _cloud(200_000, 5)
    shape = [int(x) + 1 for x in coords[:, 1:].max(0).values]
    for c_in, c_out in ((16, 16), (64, 64)):
        feats = torch.randn(coords.shape[0], c_in, generator=g)
        conv = spconv.SubMConv3d(c_in, c_out, 3, indice_key="subm1")
        case = f"cloud n={coords.shape[0]}"

        def with_map():  # a fresh tensor: the kernel map is built on each call
            conv(spconv.SparseConvTensor(feats, coords, shape, 1))
        t = _median_ms(with_map, repeat=repeat)
        _record(records, "point_conv", case, c_in, "subm3d", "map+fwd", t)
        x = spconv.SparseConvTensor(feats.clone().requires_grad_(), coords, shape, 1)

        def fwd_bwd():  # the map cached on x after the first call
            conv(x).features.sum().backward()
        t = _median_ms(fwd_bwd, repeat=repeat)
        _record(records, "point_conv", case, c_in, "subm3d", "fwd+bwd", t)
    print("point_conv done", flush=True)


def run_filter_conv(records, repeat: int) -> None:
    import torch
    import sparsejit as sj
    torch.manual_seed(6)
    for c, hw in ((64, 56), (256, 14)):
        conv = torch.nn.Conv2d(c, c, 3, padding=1)
        with torch.no_grad():  # 80% of the weights pruned at random
            conv.weight.mul_((torch.rand_like(conv.weight) > 0.8).float())
        layer = _pruned_conv2d(sj).from_dense(conv)
        x = torch.randn(1, c, hw, hw)
        with torch.no_grad():
            t = _median_ms(lambda: layer(x), repeat=repeat)
        _record(records, "filter_conv", f"conv3x3 {hw}x{hw} 80%", c, "sparse_conv2d", "fwd", t)
    # Batch 8, ResNet-50's deep shapes at 90%: a 3x3 and 1x1s whose images are smaller than
    # a whole number of pixel tiles.
    for c_in, c_out, k, hw in ((256, 256, 3, 14), (1024, 256, 1, 14), (512, 2048, 1, 7)):
        conv = torch.nn.Conv2d(c_in, c_out, k, padding=k // 2)
        with torch.no_grad():
            conv.weight.mul_((torch.rand_like(conv.weight) > 0.9).float())
        layer = _pruned_conv2d(sj).from_dense(conv, relu=True)
        x = torch.randn(8, c_in, hw, hw)
        with torch.no_grad():
            t = _median_ms(lambda: layer(x), repeat=repeat)
        _record(records, "filter_conv", f"conv{k}x{k} {c_in}->{c_out} {hw}x{hw} b8 90%", c_in,
                "sparse_conv2d", "fwd", t)
    print("filter_conv done", flush=True)


def _cpu() -> str:
    """The CPU line of the benchmark tables (sparsejit.info.cpu_line); where the build under
    test predates it, the same function from this tree's python/sparsejit/info.py (it imports
    nothing of sparsejit), so both sides name one CPU."""
    try:
        from sparsejit.info import cpu_line
    except ImportError:
        import importlib.util
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python",
                            "sparsejit", "info.py")
        spec = importlib.util.spec_from_file_location("_sparsejit_info_here", path)
        info = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(info)
        cpu_line = info.cpu_line
    return cpu_line()


# What `--isa` sets before torch and sparsejit load: sparsejit's own cap, and the same tier
# for ATen's kernels, oneDNN and MKL, so the dense products the families call run that ISA too.
_ISA_ENV = {
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
               "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "baseline": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
                 "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}


def cap_isa(isa: str) -> str:
    """Holds this process to `isa` (before torch loads): SPARSEJIT_MAX_ISA and _ISA_ENV; a build
    without the cap (no `_core.isa_state`) compiles its JIT through benchmarks/cxx_max_isa.sh.
    Returns the suffix the CPU line gets."""
    if isa == "native":
        return ""
    if "torch" in sys.modules:
        raise SystemExit("ab_sparsejit: --isa must be applied before torch is imported")
    os.environ["SPARSEJIT_MAX_ISA"] = isa
    os.environ.update(_ISA_ENV[isa])
    from sparsejit import _core
    if not hasattr(_core, "isa_state"):
        here = os.path.dirname(os.path.abspath(__file__))
        os.environ["SPARSEJIT_CXX"] = os.path.join(here, "cxx_max_isa.sh")
        print(f"this build predates SPARSEJIT_MAX_ISA: its JIT compiles through "
              f"{os.environ['SPARSEJIT_CXX']}", flush=True)
    elif _core.isa_state()["cap"] != isa:
        raise SystemExit(f"ab_sparsejit: the build did not take SPARSEJIT_MAX_ISA={isa}")
    return f" [--isa {isa}]"


def run(out: str, features, repeat: int, families, isa: str = "native") -> None:
    suffix = cap_isa(isa)
    # The cap's own note in the CPU line is replaced by the suffix, which builds from before
    # the cap get too: both sides of a comparison then name the same CPU.
    cpu = _cpu().split("; sparsejit capped at")[0] + suffix
    print(f"CPU: {cpu}", flush=True)
    records = []
    for fam in families:
        if fam == "spmm":
            run_spmm(records, features, repeat)
        else:
            globals()[f"run_{fam}"](records, repeat)
    for r in records:
        r["cpu"] = cpu
    with open(out, "w") as f:
        json.dump(records, f)


def _describe(side: str, files) -> None:
    """Names the files a side reads and warns when their runs lie far apart in time (a stale
    file from an earlier session matched by the glob skews the comparison)."""
    if not files:
        raise SystemExit(f"ab_sparsejit: the {side} glob matches no file")
    times = sorted(os.path.getmtime(f) for f in files)
    print(f"{side}: {len(files)} file(s): {', '.join(files)}")
    if times[-1] - times[0] > 6 * 3600:
        print(f"warning: the {side} files were written {(times[-1] - times[0]) / 3600:.0f} h "
              "apart; a stale file may be in the glob")


def compare(a_files, b_files) -> None:
    shared = set(a_files) & set(b_files)
    if shared:
        raise SystemExit(f"ab_sparsejit: {sorted(shared)} matched both globs")
    _describe("A", a_files)
    _describe("B", b_files)

    def best(side, files):
        """Each case's best time over the side's files; prints the CPUs they name."""
        d, cpus = {}, set()
        for fn in files:
            for r in json.load(open(fn)):
                k = (r.get("family", "spmm"), r["graph"], r["F"], r["op"], r["reduce"])
                d[k] = min(d.get(k, math.inf), r["ms"])
                cpus.add(r.get("cpu", "(not recorded)"))
        print(f"{side} CPU: {'; '.join(sorted(cpus))}")
        return d, cpus - {"(not recorded)"}
    (a, a_cpus), (b, b_cpus) = best("A", a_files), best("B", b_files)
    if a_cpus and b_cpus and a_cpus != b_cpus:
        print("warning: the two sides ran on different CPUs")
    groups = defaultdict(list)
    for k in a.keys() & b.keys():
        groups[(k[0], k[3], k[4])].append(b[k] / a[k])
    print("| family | op | variant | cases | time B / A (geomean) | min | max |")
    print("|---|---|---|---|---|---|---|")
    for (fam, op, red), xs in sorted(groups.items()):
        gm = math.exp(sum(map(math.log, xs)) / len(xs))
        print(f"| {fam} | {op} | {red} | {len(xs)} | {gm:.3f} | {min(xs):.2f} | {max(xs):.2f} |")
    allx = [x for xs in groups.values() for x in xs]
    print(f"\nall {len(allx)} cases: geomean {math.exp(sum(map(math.log, allx)) / len(allx)):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--features", nargs="+", type=int, default=[32, 128])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    ap.add_argument("--compare", nargs=2, metavar=("A_GLOB", "B_GLOB"))
    ap.add_argument("--isa", choices=("native", "avx512", "avx2", "baseline"), default="native",
                    help="run as on a CPU of this tier: SPARSEJIT_MAX_ISA plus the matching caps "
                         "of ATen, oneDNN and MKL (builds from before the cap compile their "
                         "JIT through benchmarks/cxx_max_isa.sh)")
    args = ap.parse_args()
    if args.compare:
        import glob
        compare(sorted(glob.glob(args.compare[0])), sorted(glob.glob(args.compare[1])))
    else:
        run(args.out, args.features, args.repeat, args.families, args.isa)


if __name__ == "__main__":
    main()
