"""Point-cloud engines side by side in one process (issue 49): sparsejit against spconv 2.3.8,
MinkowskiEngine 0.5.4 and TorchSparse 2.0, each where it imports.

    # the peers live in their own venvs (benchmarks/peers/README.md); run with that python:
    OPENBLAS_NUM_THREADS=1 ~/.cache/sparsejit-peers/minkowski/venv/bin/python \\
        benchmarks/bench_point_engines.py [--quick] [--reps 7] [--channels 16 32 64 128] \\
        [--voxels 0.05 0.1] [--scenes kitti scannet open3d] [--kitti 2] [--out ...]

Per scan (benchmarks/pointcloud_scenes.py: KITTI, ScanNet, the Open3D fragment from
$SPARSEJIT_DATA, default ../shared/data) and voxel size, and per channel count C (C -> C):
  - kernel-map build time of each engine (submanifold 3x3x3 and kernel-2 stride-2);
  - forward + backward, the kernel maps built inside every step (a fresh sparse tensor), of
    "subm" (3x3x3 submanifold), "strided" (kernel 2, stride 2) and "strided+transposed" (the
    strided conv and the transposed conv back to the input sites, sharing its map);
  - sparsejit's conv with its map cached: forward and forward + backward GFLOP/s (useful
    multiply-adds: 2 * pairs * C * C per product, the gathers' time included, so a lower bound
    on its GEMMs' rate) against this CPU's FMA peak and the dense GEMM of the same shape;
and whole networks on the first scan per voxel size: MinkUNet14A (MinkowskiEngine's
definition, benchmarks/point_engines.py) forward + backward and inference on every engine,
where MinkowskiEngine imports, also ME's own MinkUNet14A module after
``sparsejit.accelerate(net)`` (row "sj.accelerate(ME)": its time and ME / it); and SECOND's
middle encoder (examples/pointcloud_unet.py, spconv semantics: kernel-3 stride-2
convolutions, which MinkowskiEngine and TorchSparse 2.0 do not express) on sparsejit and spconv,
on the same scan voxelized 4x coarser (as the example: it ends in a dense bird's-eye map).

Before timing, every engine's outputs, input gradients and weight gradients are checked
against sparsejit's on the same weights (max abs diff printed and stored); spconv is checked
at 1 thread (its 2-thread CPU kernels return wrong rows on real scans; the count of rows the
2-thread run got wrong is stored) and timed at --threads. Timing: medians of --reps rounds,
the engines interleaved in every round (order reversed every other round), one warm-up step
each. MinkowskiEngine resets OpenMP's thread count when it creates a tensor:
torch.set_num_threads(--threads) is restored before every step. Run with
OPENBLAS_NUM_THREADS=1 (set here when unset): ME's OpenBLAS threads otherwise busy-wait
against its OpenMP threads.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before MinkowskiEngine loads OpenBLAS

import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))
from point_engines import (MinkUNet14A, SpconvLike, canonical_weights, engines,  # noqa: E402
                           load_weights)
from pointcloud_scenes import case_by_name, case_names  # noqa: E402
import sparsejit as sj  # noqa: E402
from sparsejit.info import cpu_line  # noqa: E402
from sparsejit.families.point_conv.ops import point_conv_plan, plan_info, point_conv  # noqa: E402
from sparsejit.runtime.timing import Progress  # noqa: E402
from sparsejit.tools.roofline import gemm_peak_gflops  # noqa: E402

THREADS = 2
ACCEL = "sj.accelerate(ME)"  # MinkowskiEngine's network object after sparsejit.accelerate


def set_threads(n: int) -> None:
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def interleaved(steps, reps, errors=None):
    """Median ms of each step in `steps` ({name: fn}), one warm-up each, the engines
    interleaved within every round. A step whose warm-up raises is left out (and its error
    kept in `errors`)."""
    names = []
    for n in steps:
        set_threads(THREADS)
        try:
            steps[n]()
            names.append(n)
        except Exception as exc:  # noqa: BLE001  (a peer that fails is reported, not fatal)
            if errors is None:
                raise
            errors[n] = f"{type(exc).__name__}: {exc}"[:300]
    ts = {n: [] for n in names}
    for r in range(reps):
        for n in (names if r % 2 == 0 else names[::-1]):
            set_threads(THREADS)
            t0 = time.perf_counter()
            steps[n]()
            ts[n].append((time.perf_counter() - t0) * 1e3)
    return {n: statistics.median(v) for n, v in ts.items()}


def set_shape(engs, shape) -> None:
    """The spatial shape the spconv-API engines' tensors get (the others need none)."""
    for e in engs.values():
        if isinstance(e, SpconvLike):
            e.shape = shape


def sorted_rows(coords: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    """feats with the rows in the lexicographic order of their (batch, x, y, z) sites."""
    c = coords.long()
    c = c - c.min(0).values
    span = c.max(0).values + 1
    key = ((c[:, 0] * span[1] + c[:, 1]) * span[2] + c[:, 2]) * span[3] + c[:, 3]
    return feats[torch.argsort(key)]


def maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    return float((a - b).abs().max()) if a.numel() else 0.0


def agrees(diffs: dict, refs: dict, rtol: float = 1e-3) -> bool:
    """Every max abs diff within rtol of the reference's largest magnitude (at least 1)."""
    return all(d <= rtol * max(1.0, refs[k]) for k, d in diffs.items())


def amax(t: torch.Tensor) -> float:
    return float(t.abs().max()) if t.numel() else 0.0


# ---- single convolutions ------------------------------------------------------------------

def layer_set(e, kind: str, c: int, ws):
    """The module(s) of one case on engine e, with the canonical weights ws."""
    if kind == "subm":
        mods = [e.conv("subm", c, c, 3, "k")]
    else:
        mods = [e.conv("down", c, c, 2, "d")]
        if kind == "strided+transposed":
            mods.append(e.conv("up", c, c, 2, "d"))
    for m, w in zip(mods, ws):
        e.to_engine(m, w)
    return mods


def run_layers(e, mods, coords, feats):
    t = e.tensor(coords, feats)
    for m in mods:
        t = m(t)
    return t


def check_layers(engs, kind, c, coords, ws, g_seed=1):
    """Outputs, input and weight gradients of every engine against sparsejit's: {engine:
    {"out", "grad_in", "grad_w": max abs diff, "agree": bool} or {"error": ...}}."""
    feats = torch.randn(coords.shape[0], c, generator=torch.Generator().manual_seed(g_seed))
    got, res = {}, {}
    for name, e in engs.items():
        set_threads(1 if name == "spconv" else THREADS)
        try:
            mods = layer_set(e, kind, c, ws)
            f = feats.clone().requires_grad_()
            out = run_layers(e, mods, coords, f)
            y = sorted_rows(e.coords(out), e.feats(out))
            g = torch.randn(y.shape, generator=torch.Generator().manual_seed(g_seed + 1))
            (y * g).sum().backward()
            got[name] = (y.detach(), f.grad, [e.from_engine(m, e.weight(m).grad) for m in mods])
            if name == "spconv":  # rows the 2-thread run gets wrong
                set_threads(THREADS)
                y2 = sorted_rows(e.coords(out), e.feats(run_layers(e, mods, coords, feats)))
                res["spconv_2thread_wrong_rows"] = int(
                    ((y2 - y.detach()).abs().max(1).values > 1e-3).sum()) \
                    if y2.shape == y.shape else -1
        except Exception as exc:  # noqa: BLE001
            res[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    set_threads(THREADS)
    ref = got["sparsejit"]
    scale = {"out": amax(ref[0]), "grad_in": amax(ref[1]), "grad_w": max(map(amax, ref[2]))}
    for name, (y, gx, gw) in got.items():
        if name == "sparsejit":
            continue
        d = {"out": maxdiff(y, ref[0]), "grad_in": maxdiff(gx, ref[1]),
             "grad_w": max(maxdiff(a, b) for a, b in zip(gw, ref[2]))}
        res[name] = dict(d, agree=agrees(d, scale))
    return res


def gemm_rates(coords, shape, c, reps):
    """sparsejit's submanifold conv with the map cached: useful GFLOP/s (gathers included) of
    the forward and forward + backward, and torch.mm's on the same product shape."""
    plan, _ = point_conv_plan(coords, shape, 1, "subm", 3)
    pairs = plan_info(plan)["pairs"]
    n = coords.shape[0]
    x = torch.randn(n, c)
    w = (torch.randn(27, c, c) / (27 * c) ** 0.5).requires_grad_()

    def fb():
        xx = x.clone().requires_grad_()
        point_conv(xx, w, None, plan, n).sum().backward()
    a, b = torch.randn(pairs, c), torch.randn(c, c)
    t = interleaved({"fwd": lambda: point_conv(x, w.detach(), None, plan, n), "fwd_bwd": fb,
                     "mm": lambda: a @ b}, reps)
    flop = 2 * pairs * c * c
    return {"pairs": pairs, "fwd_cached_ms": t["fwd"], "fwd_bwd_cached_ms": t["fwd_bwd"],
            "gflops_fwd_cached": flop / t["fwd"] / 1e6,
            "gflops_fwd_bwd_cached": 3 * flop / t["fwd_bwd"] / 1e6,
            "gflops_dense_mm_same_shape": flop / t["mm"] / 1e6}


def bench_scan(engs, name, coords, shape, channels, kinds, reps, progress):
    rows = []
    set_shape(engs, shape)
    kmap, errors = {}, {}
    for kind, k in (("subm", 3), ("down", 2)):
        # (sparsejit's drop-in APIs build sparsejit's maps: timed once, as "sparsejit")
        kmap[kind] = interleaved({n: (lambda e=e: e.kmap(coords, kind, k))
                                  for n, e in engs.items() if not n.startswith("sparsejit.")},
                                 reps, errors)
    base = {"case": name, "voxels": coords.shape[0], "kmap_ms": kmap}
    print(json.dumps({"case": name, "voxels": coords.shape[0], "kmap_ms": kmap,
                      "kmap_errors": errors}, default=lambda v: round(v, 2)), flush=True)
    for c in channels:
        for kind in kinds:
            progress.step(f"{name} C={c} {kind}")
            g = torch.Generator().manual_seed(c)
            ws = [torch.randn(k, k, k, c, c, generator=g) / (k ** 3 * c) ** 0.5
                  for k in ((3,) if kind == "subm" else (2, 2))]
            r = dict(base, channels=c, kind=kind, errors={})
            r["maxdiff"] = check_layers(engs, kind, c, coords, ws)
            feats = torch.randn(coords.shape[0], c)
            steps = {}
            for n, e in engs.items():
                if "error" in r["maxdiff"].get(n, {}):
                    continue
                mods = layer_set(e, kind, c, ws)

                def step(e=e, mods=mods):
                    f = feats.clone().requires_grad_()
                    e.feats(run_layers(e, mods, coords, f)).sum().backward()
                steps[n] = step
            r["fwd_bwd_ms"] = interleaved(steps, reps, r["errors"])
            r["speedup_vs"] = {n: t / r["fwd_bwd_ms"]["sparsejit"]
                               for n, t in r["fwd_bwd_ms"].items() if n != "sparsejit"}
            if kind == "subm":
                r.update(gemm_rates(coords, shape, c, reps))
            rows.append(r)
            print(json.dumps({k: v for k, v in r.items() if k not in ("kmap_ms",)},
                             default=lambda v: round(v, 3)), flush=True)
    return rows


# ---- networks -----------------------------------------------------------------------------

def _run_all(fns, spconv_one_thread=True):
    """{name: fn()} for every fn that does not raise; {name: error} for those that do."""
    out, err = {}, {}
    for n, fn in fns.items():
        set_threads(1 if n == "spconv" and spconv_one_thread else THREADS)
        try:
            out[n] = fn()
        except Exception as exc:  # noqa: BLE001
            err[n] = f"{type(exc).__name__}: {exc}"[:300]
    set_threads(THREADS)
    return out, err


def _compare(got, names_vals, res):
    """res[engine] gets each named max abs diff against sparsejit's and whether they agree."""
    if "sparsejit" not in got:
        raise RuntimeError("sparsejit itself failed on this case (see the errors above)")
    ref = got["sparsejit"]
    for n, vals in got.items():
        if n == "sparsejit":
            continue
        d = {k: maxdiff(v, ref[i]) for i, (k, v) in enumerate(zip(names_vals, vals))}
        scale = {k: amax(ref[i]) for i, k in enumerate(names_vals)}
        res[n] = dict(d, agree=agrees(d, scale), **{f"{k}_ref_max": v for k, v in scale.items()})


def bench_minkunet(engs, name, coords, shape, feats, width, reps):
    set_shape(engs, shape)
    torch.manual_seed(0)
    nets = {n: MinkUNet14A(e, cin=feats.shape[1], width=width) for n, e in engs.items()}
    if "minkowski" in engs:  # MinkowskiEngine's network, accelerated in one line
        engs = dict(engs, **{ACCEL: engs["minkowski"]})
        nets[ACCEL] = MinkUNet14A(engs[ACCEL], cin=feats.shape[1], width=width)
    ws = canonical_weights(nets["sparsejit"])
    for net in nets.values():
        load_weights(net, ws)
    if ACCEL in nets:
        sj.accelerate(nets[ACCEL])
    res = {"case": name, "voxels": coords.shape[0], "width": width, "maxdiff": {}}

    def infer_out(n):  # first, while the BatchNorm statistics are fresh on every engine
        net, e = nets[n], engs[n]
        net.eval()
        with torch.no_grad():
            o = net(e.tensor(coords, feats))
        return (sorted_rows(e.coords(o), e.feats(o)),)

    def train_out(n):
        net, e = nets[n], engs[n]
        net.train()
        f = feats.clone().requires_grad_()
        o = net(e.tensor(coords, f))
        y = sorted_rows(e.coords(o), e.feats(o))
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        return y.detach(), f.grad
    inf, err = _run_all({n: (lambda n=n: infer_out(n)) for n in nets})
    tr, err2 = _run_all({n: (lambda n=n: train_out(n)) for n in inf})
    res["errors"] = dict(err, **err2)
    if "sparsejit" in res["errors"]:
        raise RuntimeError(f"MinkUNet14A on sparsejit: {res['errors']['sparsejit']}")
    md_inf, md_tr = {}, {}
    _compare(inf, ["inference_out"], md_inf)
    _compare(tr, ["train_out", "grad_in"], md_tr)
    res["maxdiff"] = {}
    for n in md_inf:
        tr_n = md_tr.get(n, {"agree": False})
        res["maxdiff"][n] = {**md_inf[n], **tr_n, "agree": md_inf[n]["agree"] and tr_n["agree"]}

    def train(n):
        net, e = nets[n], engs[n]
        net.train()
        f = feats.clone().requires_grad_()
        e.feats(net(e.tensor(coords, f))).square().mean().backward()

    def infer(n):
        net, e = nets[n], engs[n]
        net.eval()
        with torch.no_grad():
            net(e.tensor(coords, feats))
    res["fwd_bwd_ms"] = interleaved({n: (lambda n=n: train(n)) for n in tr}, reps, res["errors"])
    res["inference_ms"] = interleaved({n: (lambda n=n: infer(n)) for n in inf}, reps,
                                      res["errors"])
    for k in ("fwd_bwd_ms", "inference_ms"):
        res[f"speedup_{k}_vs"] = {n: t / res[k]["sparsejit"] for n, t in res[k].items()
                                  if n != "sparsejit"}
        if ACCEL in res[k] and "minkowski" in res[k]:
            res[f"accelerate_speedup_{k}"] = res[k]["minkowski"] / res[k][ACCEL]
    return res


def bench_second(engs, name, coords, feats, shape, reps):
    """SECOND's middle encoder (examples/pointcloud_unet.py) on the spconv-API engines."""
    from pointcloud_unet import SecondMiddleEncoder
    libs = {n: e for n, e in engs.items() if n in ("sparsejit", "spconv")}
    torch.manual_seed(0)
    models = {n: SecondMiddleEncoder(e.sp, cin=feats.shape[1]) for n, e in libs.items()}
    if "spconv" in models:
        models["sparsejit"].load_state_dict(models["spconv"].state_dict())
    res = {"case": name, "voxels": coords.shape[0],
           "note": "MinkowskiEngine and TorchSparse 2.0 cannot express spconv's kernel-3 "
                   "stride-2 padding-1 output sites; sparsejit and spconv only"}

    def train_out(n):
        models[n].train()
        f = feats.clone().requires_grad_()
        y = models[n](libs[n].sp.SparseConvTensor(f, coords, shape, 1))
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        return y.detach(), f.grad
    tr, res["errors"] = _run_all({n: (lambda n=n: train_out(n)) for n in models})
    if "sparsejit" in res["errors"]:
        raise RuntimeError(f"SECOND on sparsejit: {res['errors']['sparsejit']}")
    res["maxdiff"] = {}
    _compare(tr, ["train_out", "grad_in"], res["maxdiff"])

    def step(n):
        models[n].train()
        x = libs[n].sp.SparseConvTensor(feats, coords, shape, 1)
        models[n](x).square().mean().backward()

    def infer(n):
        models[n].eval()
        with torch.no_grad():
            models[n](libs[n].sp.SparseConvTensor(feats, coords, shape, 1))
    res["fwd_bwd_ms"] = interleaved({n: (lambda n=n: step(n)) for n in tr}, reps, res["errors"])
    res["inference_ms"] = interleaved({n: (lambda n=n: infer(n)) for n in tr}, reps,
                                      res["errors"])
    for k in ("fwd_bwd_ms", "inference_ms"):
        res[f"speedup_{k}_vs"] = {n: t / res[k]["sparsejit"] for n, t in res[k].items()
                                  if n != "sparsejit"}
        if ACCEL in res[k] and "minkowski" in res[k]:
            res[f"accelerate_speedup_{k}"] = res[k]["minkowski"] / res[k][ACCEL]
    return res


# ---- the CPU's ceilings ---------------------------------------------------------------------

def fma_peak_gflops(threads: int) -> dict:
    """Nominal float32 FMA peak of `threads` cores: clock (/proc/cpuinfo "cpu MHz", the base
    clock a VM reports) x lanes x 2 FLOP x 2 FMA units (Sapphire Rapids / Zen 4 server cores),
    and the measured rate of a 2048^3 torch.mm (sparsejit.tools.roofline.gemm_peak_gflops)."""
    mhz, flags = None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            if k.strip() == "cpu MHz" and mhz is None:
                mhz = float(v)
            elif k.strip() == "flags" and not flags:
                flags = set(v.split())
    except OSError:
        pass
    lanes = 16 if "avx512f" in flags else 8 if "fma" in flags else 4
    out = {"measured_mm_2048_gflops": gemm_peak_gflops(), "cpu_mhz": mhz,
           "fp32_lanes": lanes, "fma_units_assumed": 2}
    out["nominal_fma_gflops"] = threads * mhz * 1e-3 * lanes * 2 * 2 if mhz else None
    return out


def _ratio(speedups, maxdiff, p):
    """'2.10x' (peer time / sparsejit time), '2.10x!' where the peer's results disagreed."""
    if p not in speedups:
        return "-"
    return f"{speedups[p]:.2f}x" + ("" if maxdiff.get(p, {}).get("agree", True) else "!")


def summary(rows, nets, engine_names):
    peers = [n for n in engine_names if n != "sparsejit"]
    head = ["case", "C", "kind", "sparsejit ms"] + [f"{p} / sparsejit" for p in peers] + \
        ["GF/s fwd (fwd+bwd) cached"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["case"], str(r["channels"]), r["kind"], f"{r['fwd_bwd_ms']['sparsejit']:.1f}"]
        cells += [_ratio(r["speedup_vs"], r["maxdiff"], p) for p in peers]
        cells.append(f"{r['gflops_fwd_cached']:.0f} ({r['gflops_fwd_bwd_cached']:.0f})"
                     if "gflops_fwd_cached" in r else "")
        lines.append("| " + " | ".join(cells) + " |")
    for n in nets:
        for k in ("fwd_bwd_ms", "inference_ms"):
            if k not in n:
                continue
            sp = n.get(f"speedup_{k}_vs", {})
            cells = [n["case"], "-", f"{n['net']} {k[:-3]}", f"{n[k]['sparsejit']:.1f}"]
            cells += [_ratio(sp, n.get("maxdiff", {}), p) for p in peers] + [""]
            lines.append("| " + " | ".join(cells) + " |")
            if f"accelerate_speedup_{k}" in n:  # ME's own network code, accelerated
                cells = [n["case"], "-", f"{n['net']} {k[:-3]}, {ACCEL}", f"{n[k][ACCEL]:.1f}"]
                cells += [f"{n[f'accelerate_speedup_{k}']:.2f}x" +
                          ("" if n["maxdiff"].get(ACCEL, {}).get("agree", True) else "!")
                          if p == "minkowski" else "-" for p in peers] + [""]
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    global THREADS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: one KITTI scan at 10 cm, C = 16 and 64, 2 reps, "
                         "MinkUNet at width 0.25")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--channels", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--kinds", nargs="+", default=["subm", "strided", "strided+transposed"])
    ap.add_argument("--voxels", type=float, nargs="+", default=[0.05, 0.1])
    ap.add_argument("--scenes", nargs="+", default=["kitti", "scannet", "open3d"])
    ap.add_argument("--kitti", type=int, default=2, help="number of KITTI scans")
    ap.add_argument("--engines", nargs="+", default=None,
                    help="subset of sparsejit spconv minkowski torchsparse (default: all that "
                         "import)")
    ap.add_argument("--unet-width", type=float, default=1.0,
                    help="MinkUNet14A's plane counts times this (1.0 = MinkowskiEngine's)")
    ap.add_argument("--no-nets", action="store_true", help="single convolutions only")
    ap.add_argument("--net-engines", nargs="+", default=None,
                    help="engines for the networks (default: all; TorchSparse 2.0's CPU "
                         "MinkUNet step takes minutes)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "results" / "point_engines.json"))
    args = ap.parse_args()
    if args.quick:
        args.reps, args.channels, args.voxels = 2, [16, 64], [0.1]
        args.scenes, args.kitti, args.unet_width = ["kitti"], 1, 0.25
    THREADS = args.threads
    set_threads(THREADS)
    engs = engines(args.engines)
    if "sparsejit" not in engs:
        sys.exit("sparsejit.spconv does not import")
    meta = {"cpu": cpu_line(), "threads": THREADS, "torch": torch.__version__,
            "python": sys.executable, "machine": platform.machine(),
            "engines": {n: e.version for n, e in engs.items()},
            "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "default"),
            "load_avg_at_start": os.getloadavg(), "reps": args.reps, "quick": args.quick}
    print(f"CPU: {meta['cpu']}, {THREADS} threads; engines: {meta['engines']}", flush=True)
    missing = [n for n in ("spconv", "minkowski", "torchsparse") if n not in engs]
    if missing:
        print(f"not importable here (skipped): {missing}; see benchmarks/peers/README.md",
              flush=True)
    meta["peak"] = fma_peak_gflops(THREADS)
    print("peak:", json.dumps(meta["peak"], default=lambda v: round(v, 1)), flush=True)
    names = case_names(args.kitti, args.voxels, args.scenes)
    if not names:
        sys.exit("no scans found: set SPARSEJIT_DATA to the data folder (../shared/data)")
    progress = Progress(len(names) * len(args.channels) * len(args.kinds), "point engines")
    rows, nets = [], []
    for name in names:
        _, coords, shape = case_by_name(name)
        shape = [-(-s // 16) * 16 for s in shape]  # four kernel-2 stride-2 levels: no site lost
        rows += bench_scan(engs, name, coords, shape, args.channels, args.kinds, args.reps,
                           progress)
    if not args.no_nets:
        for v in args.voxels:
            first = [n for n in names if n.endswith(f"_{round(v * 100)}cm")][:1]
            for name in first:
                _, coords, shape = case_by_name(name)
                feats = torch.randn(coords.shape[0], 4,
                                    generator=torch.Generator().manual_seed(0))
                shape = [-(-s // 16) * 16 for s in shape]
                net_engs = {n: e for n, e in engs.items()
                            if args.net_engines is None or n in args.net_engines
                            or n == "sparsejit"}
                r = bench_minkunet(net_engs, name, coords, shape, feats, args.unet_width,
                                   args.reps)
                r["net"] = "MinkUNet14A" + (f"x{args.unet_width:g}" if args.unet_width != 1
                                           else "")
                nets.append(r)
                print(json.dumps(r, default=lambda x: round(x, 3)), flush=True)
                coarse = name.replace(f"_{round(v * 100)}cm", f"_{round(v * 400)}cm")
                _, c2, s2 = case_by_name(coarse)
                f2 = torch.randn(c2.shape[0], 4, generator=torch.Generator().manual_seed(0))
                r = bench_second(engs, coarse, c2, f2, s2, args.reps)
                r["net"] = "SECOND middle"
                nets.append(r)
                print(json.dumps(r, default=lambda x: round(x, 3)), flush=True)
    table = summary(rows, nets, list(engs))
    print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "convs": rows, "nets": nets,
                                          "summary_md": table}, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
