"""Point-cloud sparse convolution: sparsejit vs spconv-CPU (2.3.8) side by side, one process.

    python benchmarks/bench_sparse_conv.py [--reps 7] [--out benchmarks/results/sparse_conv.json]

Cases: 20k random voxels in a 128^3 grid (issue 10's setting) and KITTI scans from
$SPARSEJIT_DATA/pointclouds/kitti_pointpillars voxelized at 5 cm. Per case and channel count
(16, 32, 64), medians over --reps runs of:
  - kernel-map build: submanifold 3x3x3 and stride-2 3x3x3 (sparsejit conv_plan vs spconv
    get_indice_pairs);
  - SubMConv3d forward and forward+backward, each including the first map build (a fresh
    SparseConvTensor per run), and the forward with the map cached (both dataflows);
plus GFLOP/s of the cached forward (2 * pairs * C_in * C_out) against the dense GEMM rate of
the same product as one torch.mm ([pairs, C] x [C, C]), the roofline of this op. 2 threads (torch.set_num_threads(2)), OMP_WAIT_POLICY=passive unless given (see below);
the machine is shared, so read ratios.
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

# OpenMP workers that spin while waiting starve the working threads when the machine is
# oversubscribed (2 shared cores, several helpers compiling): measured here, conv_plan went
# from 3 ms (passive) to 150 ms (spinning). libgomp reads this once, when torch loads it, so
# it is set before the import; --omp-wait-policy is recorded in the results. It applies to
# both libraries (torch's and sparsejit's OpenMP regions run on the same libgomp).
if "OMP_WAIT_POLICY" not in os.environ:
    _policy = "passive"
    for _i, _a in enumerate(sys.argv):
        if _a.startswith("--omp-wait-policy"):
            _policy = _a.split("=", 1)[1] if "=" in _a else sys.argv[_i + 1]
    if _policy != "default":
        os.environ["OMP_WAIT_POLICY"] = _policy

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import sparsejit as sj  # noqa: E402
import sparsejit.spconv as sjsp  # noqa: E402
from sparsejit.ops.sparse_conv import conv_plan, plan_info, sparse_conv  # noqa: E402
from sparsejit.tools.data import data_dir  # noqa: E402

try:
    import spconv.pytorch as spconv
    import spconv.pytorch.ops as spops
    from spconv.core import ConvAlgo
    spops.get_current_stream = lambda: 0  # spconv's CPU backward needs this
except Exception:  # noqa: BLE001
    spconv = None


def median_ms(fn, reps):
    fn()  # warm-up
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def random_case(n=20000, side=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    flat = torch.randperm(side ** 3, generator=g)[:n]
    idx = torch.stack([torch.zeros_like(flat), flat // side ** 2, flat // side % side,
                       flat % side], 1).int()
    return idx, [side] * 3


def kitti_cases(limit):
    d = data_dir()
    if d is None:
        return []
    out = []
    for f in sorted((d / "pointclouds" / "kitti_pointpillars").glob("*.bin"))[:limit]:
        pts = torch.from_numpy(np.fromfile(f, dtype=np.float32).reshape(-1, 4))
        coords, _, _ = sj.voxelize(pts, 0.05)
        shape = (coords[:, 1:].max(0).values + 1).tolist()
        out.append((f"kitti_{f.stem}_5cm", coords, shape))
    return out


def bench_case(name, idx, shape, channels, reps, args_threads=2):
    rows = []
    n = idx.shape[0]
    res = {"case": name, "voxels": n, "spatial_shape": shape}
    # kernel maps
    res["kmap_subm_ms_sparsejit"] = median_ms(
        lambda: conv_plan(idx, shape, 1, "subm", 3), reps)
    res["kmap_stride2_ms_sparsejit"] = median_ms(
        lambda: conv_plan(idx, shape, 1, "spconv", 3, 2, 1), reps)
    plan, _ = conv_plan(idx, shape, 1, "subm", 3)
    pairs = plan_info(plan)["pairs"]
    res["pairs_subm"] = pairs
    if spconv is not None:
        res["kmap_subm_ms_spconv"] = median_ms(lambda: spops.get_indice_pairs(
            idx, 1, shape, ConvAlgo.Native, [3] * 3, [1] * 3, [1] * 3, [1] * 3, [0] * 3, True),
            reps)
        res["kmap_stride2_ms_spconv"] = median_ms(lambda: spops.get_indice_pairs(
            idx, 1, shape, ConvAlgo.Native, [3] * 3, [2] * 3, [1] * 3, [1] * 3, [0] * 3, False),
            reps)
    for c in channels:
        r = dict(res, channels=c)
        feats = torch.randn(n, c)
        ours = sjsp.SubMConv3d(c, c, 3, bias=True)

        def sj_fwd():
            return ours(sjsp.SparseConvTensor(feats, idx, shape, 1)).features

        def sj_fwd_bwd():
            f = feats.clone().requires_grad_()
            ours(sjsp.SparseConvTensor(f, idx, shape, 1)).features.sum().backward()

        r["fwd_ms_sparsejit"] = median_ms(sj_fwd, reps)
        r["fwd_bwd_ms_sparsejit"] = median_ms(sj_fwd_bwd, reps)
        w = ours._kernel_weight().detach().contiguous()
        for df in ("gather_gemm_scatter", "output_stationary", "auto"):
            r[f"fwd_cached_ms_sparsejit_{df}"] = median_ms(
                lambda: sparse_conv(feats, w, None, plan, n, dataflow=df), reps)
        best = min(r[f"fwd_cached_ms_sparsejit_{d}"]
                   for d in ("gather_gemm_scatter", "output_stationary"))
        r["gflops_cached_fwd_sparsejit_auto"] = 2 * pairs * c * c / r[
            "fwd_cached_ms_sparsejit_auto"] / 1e6
        r["gflops_cached_fwd_sparsejit_best"] = 2 * pairs * c * c / best / 1e6
        a, b = torch.randn(pairs, c), torch.randn(c, c)
        r["gflops_dense_gemm_torch_mm"] = 2 * pairs * c * c / median_ms(lambda: a @ b, reps) / 1e6
        if spconv is not None:
            theirs = spconv.SubMConv3d(c, c, 3, bias=True)
            theirs.load_state_dict(ours.state_dict())

            def sp_fwd():
                return theirs(spconv.SparseConvTensor(feats, idx, shape, 1)).features

            def sp_fwd_bwd():
                f = feats.clone().requires_grad_()
                theirs(spconv.SparseConvTensor(f, idx, shape, 1)).features.sum().backward()

            r["fwd_ms_spconv"] = median_ms(sp_fwd, reps)
            r["fwd_bwd_ms_spconv"] = median_ms(sp_fwd_bwd, reps)
            t = spconv.SparseConvTensor(feats, idx, shape, 1)
            theirs_k = spconv.SubMConv3d(c, c, 3, bias=True, indice_key="k")
            theirs_k(t)  # builds and stores the pairs under key "k"
            r["fwd_cached_ms_spconv"] = median_ms(lambda: theirs_k(t), reps)
            # Results: ours against spconv run single-threaded (its 2-thread CPU kernels race:
            # a few rows come out wrong in some runs); count the rows the raced run got wrong.
            ref_2t = sp_fwd()
            torch.set_num_threads(1)
            ref_1t = sp_fwd()
            torch.set_num_threads(args_threads)
            torch.testing.assert_close(sj_fwd(), ref_1t, atol=1e-3, rtol=1e-3)
            r["spconv_2thread_wrong_rows"] = int(((ref_2t - ref_1t).abs().max(1).values
                                                  > 1e-3).sum())
            for k in ("fwd_ms", "fwd_bwd_ms", "fwd_cached_ms"):
                ours_k = f"{k}_sparsejit" if k != "fwd_cached_ms" else "fwd_cached_ms_sparsejit_auto"
                r[f"speedup_{k}"] = r[f"{k}_spconv"] / r[ours_k]
            r["speedup_kmap_subm"] = r["kmap_subm_ms_spconv"] / r["kmap_subm_ms_sparsejit"]
            r["speedup_kmap_stride2"] = r["kmap_stride2_ms_spconv"] / r["kmap_stride2_ms_sparsejit"]
        rows.append(r)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()
                          if k != "spatial_shape"}), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--channels", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--kitti", type=int, default=2, help="number of KITTI scans (0 = none)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--omp-wait-policy", default="passive",
                    help="passive, active or default (environment untouched); see the top")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sparse_conv.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    idx, shape = random_case()
    rows += bench_case("random_20k_128cube", idx, shape, args.channels, args.reps, args.threads)
    for name, coords, shp in kitti_cases(args.kitti):
        rows += bench_case(name, coords, shp, args.channels, args.reps, args.threads)
    meta = {"threads": torch.get_num_threads(), "torch": torch.__version__,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
            "spconv": getattr(sys.modules.get("spconv"), "__version__", None),
            "machine": platform.processor() or platform.machine(),
            "note": "2-core shared machine with concurrent builds: timings noisy, read ratios",
            "reps": args.reps}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
