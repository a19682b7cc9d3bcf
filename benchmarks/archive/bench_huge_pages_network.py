"""Page faults in a whole network: the `sparsify(fold_bn=True)`-ed pruned ResNet-50 of
bench_resnet50_sparse.py, forwards with sparsejit's huge-page advice threshold switched at run
time (`_core.set_huge_page_threshold`), the settings alternated forward by forward (the order
flipped every round) in one process, with minor page faults and system time per forward.

Each layer's output (6-26 MB at batch 8) is allocated while the previous one is alive; whether
glibc hands back memory it already faulted in or fresh heap depends on the process's history,
so run the script more than once (`--processes`): each process prints its own table.

    PYTHONPATH=python python3 benchmarks/archive/bench_huge_pages_network.py [--sparsity 0.9]
        [--batch 8] [--thresholds 32 4] [--rounds 8] [--processes 3]

Writes benchmarks/results/huge_pages_network.json (CPU named)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1] + "/python"); sys.path.insert(0, sys.argv[1] + "/benchmarks")
import torch, sparsejit as sj
from sparsejit import _core
import bench_resnet50_sparse as R
sparsity, batch, rounds = float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
thresholds = [int(t) << 20 for t in sys.argv[5].split(",")]
torch.set_num_threads(int(sys.argv[6])); torch.manual_seed(0)
dense = R.ResNet50().eval(); R.randomize_bn(dense); R.prune_by_magnitude(dense, sparsity)
x = torch.randn(batch, 3, 224, 224)
def usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt, r.ru_stime
out = {t: [] for t in thresholds}
with torch.no_grad():
    model = sj.sparsify(dense, x, fold_bn=True, verbose=False)
    ref = model(x)
    for r in range(rounds):
        for t in (thresholds if r % 2 == 0 else thresholds[::-1]):
            _core.set_huge_page_threshold(t)
            f0, s0 = usage(); t0 = time.perf_counter()
            y = model(x)
            ms = (time.perf_counter() - t0) * 1e3
            f1, s1 = usage()
            assert torch.equal(y, ref)  # the advice never changes a result
            out[t].append({"ms": ms, "faults": f1 - f0, "sys_ms": (s1 - s0) * 1e3})
print(json.dumps({str(t >> 20): v for t, v in out.items()}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sparsity", type=float, default=0.9)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--thresholds", type=int, nargs="+", default=[32, 4],
                    help="advice thresholds in MiB (0: off)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/huge_pages_network.json"))
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "python"))
    from sparsejit.info import cpu_line

    procs = []
    for p in range(args.processes):
        r = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), str(args.sparsity),
                            str(args.batch), str(args.rounds),
                            ",".join(str(t) for t in args.thresholds), str(args.threads)],
                           capture_output=True, text=True, env={**os.environ})
        if r.returncode != 0:
            sys.exit(f"process {p} failed:\n{r.stderr[-3000:]}")
        res = json.loads(r.stdout.strip().splitlines()[-1])
        # The first round of each process includes its warm-up of the fresh setting.
        summary = {t: {k: statistics.median(v[k] for v in runs[1:])
                       for k in ("ms", "faults", "sys_ms")} for t, runs in res.items()}
        base = summary[str(args.thresholds[0])]["ms"]
        print(f"process {p}: " + " | ".join(
            f"{t} MiB: {s['ms']:.1f} ms ({s['ms'] / base:.3f}x), {s['faults']:.0f} faults, "
            f"{s['sys_ms']:.0f} ms sys" for t, s in summary.items()), flush=True)
        procs.append({"runs": res, "medians": summary})
    rec = {"cpu": cpu_line(), "threads": args.threads, "sparsity": args.sparsity,
           "batch": args.batch, "thresholds_mib": args.thresholds, "processes": procs}
    Path(args.out).write_text(json.dumps(rec, indent=1))
    print(f"CPU: {rec['cpu']}; wrote {args.out}")


if __name__ == "__main__":
    main()
