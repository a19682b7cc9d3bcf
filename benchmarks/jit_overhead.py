"""JIT costs against the issue's budgets: first compile of a specialization (<= 3 s), extra
time of a call that hits the disk cache in a fresh process (< 50 ms), and what a warm call
adds over the kernel itself (<= 50 us).

    python3 benchmarks/jit_overhead.py [--out-json PATH]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

PROBE = textwrap.dedent(
    """
    import json, sys, time, torch
    import sparsejit as sj
    from sparsejit import _core
    from sparsejit.families.spmm import plans
    g = torch.Generator().manual_seed(0)
    n = 20000
    indptr = torch.arange(0, 16 * n + 1, 16)
    A = sj.SparseMatrix.from_csr(indptr, torch.randint(0, n, (16 * n,), generator=g), shape=(n, n))
    X = torch.randn(n, 40, generator=g)
    plan = plans.materialize(A, _core.spmm_recipe("jit", 16))
    run = lambda: sj.ops.spmm(A.indptr, A.indices, None, X, "sum", n, plan=plan)
    f32, i64 = _core.enums()["scalar"]["f32"], _core.enums()["index"]["i64"]
    t0 = time.perf_counter(); info = _core.jit_spmm(f32, i64, "sum", 0, 1, 40, 0, 16)
    lookup_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter(); run(); first_ms = (time.perf_counter() - t0) * 1e3
    times = []
    for _ in range(20):
        t0 = time.perf_counter(); run(); times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    # Warm-call overhead: a one-entry matrix, so the kernel itself is negligible.
    T = sj.SparseMatrix.from_csr(torch.tensor([0, 1]), torch.tensor([0]), shape=(1, 1))
    x1 = torch.randn(1, 40)
    for _ in range(50):
        sj.spmm(T, x1)
    tiny = []
    for _ in range(2000):
        t0 = time.perf_counter(); sj.spmm(T, x1); tiny.append((time.perf_counter() - t0) * 1e6)
    tiny.sort()
    empty = []
    for _ in range(2000):
        t0 = time.perf_counter(); torch.empty(1); empty.append((time.perf_counter() - t0) * 1e6)
    empty.sort()
    print(json.dumps({"disk_hit": info["disk_hit"], "compile_ms": info["compile_ms"],
                      "lookup_ms": lookup_ms, "first_call_ms": first_ms,
                      "median_call_ms": times[10], "tiny_call_us": tiny[1000],
                      "torch_empty_us": empty[1000]}))
    """
)


def probe(cache_dir):
    env = dict(os.environ, SPARSEJIT_CACHE_DIR=cache_dir)
    p = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                       check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None):
    from sparsejit.info import cpu_line
    print(f"CPU: {cpu_line()}", flush=True)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        cold = probe(d)
        warm = probe(d)
    result = {
        "first_compile_ms": cold["compile_ms"],
        "fresh_process_disk_hit_extra_ms": warm["lookup_ms"]
        + max(0.0, warm["first_call_ms"] - warm["median_call_ms"]),
        "warm_call_total_us_tiny_problem": warm["tiny_call_us"],
        "torch_empty_us": warm["torch_empty_us"],
        "disk_hit_in_fresh_process": warm["disk_hit"],
    }
    print(f"first compile of a new specialization: {result['first_compile_ms']:.0f} ms (budget 3000)")
    print(f"fresh process, disk-cache hit, extra time: "
          f"{result['fresh_process_disk_hit_extra_ms']:.1f} ms (budget 50)")
    print(f"warm sj.spmm call on a 1-entry matrix (all overhead): "
          f"{result['warm_call_total_us_tiny_problem']:.1f} us (budget 50; torch.empty(1) takes "
          f"{result['torch_empty_us']:.1f} us)")
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
