"""Tile-sized products on one thread, data in cache: oneDNN's brgemm micro-kernel (PyTorch's
``at::native::cpublas::brgemm``, the entry csrc/dense/gemm.cpp finds at run time) against the
oneDNN sgemm the dense layer runs otherwise (the same library it opens: Debian's libdnnl).

Two tables:
- forward tiles, C[M, N] = A[M, K] B[K, N], no transposes: what the micro-kernel takes;
- weight-gradient tiles, C[K_in, N] += X[m, K_in]^T dY[m, N], which reduce over a tile's m
  gathered rows: sgemm reads X transposed; the micro-kernel takes no transposes, so it needs
  X^T [K_in, m] written out first. Shown: brgemm on a ready X^T, the transpose alone
  (torch's copy of the transposed view) and the two together.

ctypes' own call cost (a no-op C call, timed the same way) is subtracted. Each product is
checked against numpy before it is timed.

    OMP_NUM_THREADS=1 python3 benchmarks/archive/bench_gemm_tiles.py [--reps 2000] [--json out.json]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(_ROOT, "python"))
from sparsejit.info import cpu_line  # noqa: E402

BRGEMM_F32 = "_ZN2at6native7cpublas6brgemmEllllllbPKfS3_Pfb"
FORWARD = [(256, 64, 64), (64, 64, 64), (256, 32, 32), (256, 16, 16), (256, 128, 128),
           (256, 64, 128), (256, 128, 64)]
GRAD_W = [(16, 16, 256), (32, 32, 256), (64, 64, 64), (64, 64, 256), (64, 64, 1024),
          (128, 128, 256)]


def libraries():
    dnnl = None
    for name in ("libdnnl.so.3", "libdnnl.so.2", "libdnnl.so"):
        try:
            dnnl = ctypes.CDLL(name, mode=ctypes.RTLD_LOCAL | os.RTLD_DEEPBIND)
            break
        except OSError:
            continue
    if dnnl is None:
        raise SystemExit("bench_gemm_tiles: no libdnnl found (apt-get install libdnnl-dev)")
    sg = dnnl.dnnl_sgemm
    sg.restype = ctypes.c_int
    sg.argtypes = [ctypes.c_char, ctypes.c_char] + [ctypes.c_int64] * 3 + [
        ctypes.c_float, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
        ctypes.c_float, ctypes.c_void_p, ctypes.c_int64]
    tc = ctypes.CDLL("libtorch_cpu.so", mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
    try:
        br = getattr(tc, BRGEMM_F32)
    except AttributeError:
        raise SystemExit("bench_gemm_tiles: this torch exports no at::native::cpublas::brgemm")
    br.restype = None
    br.argtypes = [ctypes.c_int64] * 6 + [ctypes.c_bool, ctypes.c_void_p, ctypes.c_void_p,
                                          ctypes.c_void_p, ctypes.c_bool]
    return sg, br


def seconds(fn, reps: int) -> float:
    """Median over 7 batches of `reps` calls, per call."""
    fn()
    per = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        per.append((time.perf_counter() - t0) / reps)
    return statistics.median(per)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    sg, br = libraries()
    noop = ctypes.CDLL(None).getpid
    call = seconds(lambda: noop(), args.reps)
    rng = np.random.default_rng(0)
    rows = []
    print(f"# {cpu_line()}; one thread; GFLOP/s (ctypes call cost {call * 1e6:.2f} us "
          "subtracted)")
    print("# forward tiles C[M, N] = A[M, K] B[K, N]")
    print(f"{'M x N x K':>16} {'brgemm':>8} {'sgemm':>8}")
    for m, n, k in FORWARD:
        a = rng.random((m, k), dtype=np.float32)
        b = rng.random((k, n), dtype=np.float32)
        c = np.zeros((m, n), np.float32)
        ref = a @ b

        def s_fwd():
            assert sg(b"N", b"N", m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, n, 0.0,
                      c.ctypes.data, n) == 0

        def b_fwd():
            br(m, n, k, k, n, n, False, a.ctypes.data, b.ctypes.data, c.ctypes.data, False)

        for fn, name in ((s_fwd, "sgemm"), (b_fwd, "brgemm")):
            c[:] = np.nan
            fn()
            if not np.allclose(c, ref, rtol=1e-4, atol=1e-4):
                raise SystemExit(f"bench_gemm_tiles: {name} {m}x{n}x{k} gave wrong values")
        flop = 2.0 * m * n * k
        gb = flop / (seconds(b_fwd, args.reps) - call) / 1e9
        gs = flop / (seconds(s_fwd, args.reps) - call) / 1e9
        rows.append(dict(kind="forward", M=m, N=n, K=k, brgemm_gflops=gb, sgemm_gflops=gs))
        print(f"{f'{m} x {n} x {k}':>16} {gb:8.0f} {gs:8.0f}")

    print("# weight-gradient tiles C[K_in, N] += X[m, K_in]^T dY[m, N]")
    print(f"{'K_in x N x m':>16} {'sgemm(T)':>9} {'brgemm(X^T)':>12} {'transpose us':>13} "
          f"{'both':>6}")
    for kin, n, m in GRAD_W:
        x = rng.random((m, kin), dtype=np.float32)
        dy = rng.random((m, n), dtype=np.float32)
        xt = np.ascontiguousarray(x.T)
        c = np.zeros((kin, n), np.float32)
        ref = x.T @ dy
        xs, xts = torch.from_numpy(x), torch.from_numpy(xt)

        def s_gw():
            assert sg(b"T", b"N", kin, n, m, 1.0, x.ctypes.data, kin, dy.ctypes.data, n, 1.0,
                      c.ctypes.data, n) == 0

        def b_gw():
            br(kin, n, m, m, n, n, True, xt.ctypes.data, dy.ctypes.data, c.ctypes.data, False)

        def transpose():
            xts.copy_(xs.t())

        for fn, name in ((s_gw, "sgemm"), (b_gw, "brgemm")):
            c[:] = 0
            fn()
            if not np.allclose(c, ref, rtol=1e-4, atol=1e-4):
                raise SystemExit(f"bench_gemm_tiles: {name} grad-W {kin}x{n}x{m} gave wrong "
                                 "values")
        flop = 2.0 * kin * n * m
        ts, tb = seconds(s_gw, args.reps) - call, seconds(b_gw, args.reps) - call
        tt = seconds(transpose, max(args.reps // 4, 50)) - call
        rows.append(dict(kind="grad_w", K_in=kin, N=n, m=m, sgemm_t_gflops=flop / ts / 1e9,
                         brgemm_pretransposed_gflops=flop / tb / 1e9, transpose_us=tt * 1e6,
                         brgemm_with_transpose_gflops=flop / (tb + tt) / 1e9))
        print(f"{f'{kin} x {n} x {m}':>16} {flop / ts / 1e9:9.0f} {flop / tb / 1e9:12.0f} "
              f"{tt * 1e6:13.1f} {flop / (tb + tt) / 1e9:6.0f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(cpu=cpu_line(), threads=1, call_us=call * 1e6, rows=rows), fh,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
