"""Page faults on large outputs: SpMM (and the SDDMM / sparse-conv outputs that grow with the
data) with sparsejit's huge-page advice on and off, beside torch.sparse.mm and PyTorch's own
switch (THP_MEM_ALLOC_ENABLE=1, which advises every allocation of 2 MiB or more).

Each configuration runs in its own process (the settings are read once per process); the
rounds alternate between configurations, and the table gives medians over rounds of the
per-round medians, with minor page faults and system time per call.

    python3 benchmarks/archive/bench_huge_pages.py    # 76k-node power law + 2M-edge R-MAT
    python3 benchmarks/archive/bench_huge_pages.py --rounds 5 --graphs rmat:scale=17,ef=16,seed=0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from sparsejit.info import cpu_line

CONFIGS = {  # name -> environment
    "advice off": {"SPARSEJIT_HUGE_PAGES": "0"},
    "advice on (default)": {},
    "torch THP_MEM_ALLOC_ENABLE=1": {"SPARSEJIT_HUGE_PAGES": "0", "THP_MEM_ALLOC_ENABLE": "1"},
}

CHILD = r"""
import json, resource, statistics, sys, time, warnings
import torch, sparsejit as sj
from sparsejit.tools.data import load_graph
warnings.filterwarnings("ignore")
torch.set_num_threads(2)
spec, widths, repeat = sys.argv[1], [int(f) for f in sys.argv[2].split(",")], int(sys.argv[3])
g = load_graph(spec)
A = sj.SparseMatrix.from_edge_index(g.edge_index, g.num_nodes)
T = torch.sparse_coo_tensor(g.edge_index.flip(0), torch.ones(g.num_edges),
                            (g.num_nodes, g.num_nodes)).coalesce().to_sparse_csr()
out = []
for F in widths:
    X = torch.randn(g.num_nodes, F)
    for name, fn in (("sparsejit", lambda: sj.spmm(A, X)),
                     ("torch.sparse.mm", lambda: torch.sparse.mm(T, X))):
        for _ in range(3):
            fn()
        ts, flt, sys_ms = [], [], []
        for _ in range(repeat):
            r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter(); r1 = resource.getrusage(resource.RUSAGE_SELF)
            ts.append((t1 - t0) * 1e3); flt.append(r1.ru_minflt - r0.ru_minflt)
            sys_ms.append((r1.ru_stime - r0.ru_stime) * 1e3)
        out.append(dict(graph=spec, nodes=g.num_nodes, edges=g.num_edges, F=F, peer=name,
                        out_mib=g.num_nodes * F * 4 / 2**20, ms=statistics.median(ts),
                        faults=statistics.median(flt), sys_ms=statistics.median(sys_ms)))
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", default="powerlaw:n=76000,avg=10,seed=1,rmat:scale=17,ef=16,seed=0")
    ap.add_argument("--widths", default="64,128,256")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" /
                                         "huge_pages.json"))
    args = ap.parse_args()
    # Graph specs contain commas: split on the generator names.
    specs, cur = [], ""
    for part in args.graphs.split(","):
        if ":" in part and cur:
            specs.append(cur)
            cur = part
        else:
            cur = f"{cur},{part}" if cur else part
    specs.append(cur)

    rows = {}  # (graph, F, peer, config) -> list of per-round dicts
    total = args.rounds * len(specs) * len(CONFIGS)
    done = 0
    for r in range(args.rounds):
        for spec in specs:
            for cname, env in CONFIGS.items():
                res = subprocess.run([sys.executable, "-c", CHILD, spec, args.widths,
                                      str(args.repeat)], capture_output=True, text=True,
                                     env={**os.environ, **env, "OMP_NUM_THREADS": "2"})
                if res.returncode != 0:
                    sys.exit(f"child failed ({cname}, {spec}):\n{res.stderr[-3000:]}")
                for d in json.loads(res.stdout.strip().splitlines()[-1]):
                    rows.setdefault((d["graph"], d["F"], d["peer"], cname), []).append(d)
                done += 1
                print(f"\r[{done}/{total}] round {r + 1}: {spec} / {cname}" + " " * 20,
                      end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    def med(key, field):
        return statistics.median(d[field] for d in rows[key])

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    print(f"CPU: {cpu_line()}, 2 threads; THP mode: "
          f"{thp.read_text().strip() if thp.exists() else 'n/a'}; {args.rounds} rounds x "
          f"{args.repeat} calls\n")
    print("| graph | F | output | peer | config | ms | faults/call | sys ms/call | vs advice off |")
    print("|---|---|---|---|---|---|---|---|---|")
    table = []
    for (graph, F, peer, cname) in sorted(rows, key=lambda k: (k[0], k[1], k[2])):
        base = med((graph, F, peer, "advice off"), "ms")
        ms = med((graph, F, peer, cname), "ms")
        d0 = rows[(graph, F, peer, cname)][0]
        line = dict(graph=graph, F=F, out_mib=d0["out_mib"], peer=peer, config=cname, ms=ms,
                    faults=med((graph, F, peer, cname), "faults"),
                    sys_ms=med((graph, F, peer, cname), "sys_ms"), speedup=base / ms)
        table.append(line)
        print(f"| {graph} | {F} | {d0['out_mib']:.0f} MiB | {peer} | {cname} | {ms:.2f} | "
              f"{line['faults']:.0f} | {line['sys_ms']:.1f} | {base / ms:.2f}x |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(cpu=cpu_line(), rows=table), indent=1))


if __name__ == "__main__":
    main()
