"""Resident memory over a loop of graphs the user drops: does anything keep them alive?

Each step builds a NEW random graph (or point cloud, or pruned weight), runs one op or layer
forward + backward, drops every tensor and calls ``gc.collect()``. The resident set size
(``/proc/self/statm``) is read every ``--every`` steps and once more after
``sj.clear_caches()``. A loop of pure torch (``index_select`` + ``index_add_``, the same
sizes) is the baseline: what the allocator itself keeps.

    python -m sparsejit.tools.memory_loop                         # every case, fresh processes
    python -m sparsejit.tools.memory_loop --case gcn --nodes 200000 --edges 2000000

Every case runs in a process of its own (``--case`` runs one in this process); the table
prints the RSS in MiB after each checkpoint and the growth from the first checkpoint to the
last, beside the pure-torch loop's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from typing import Callable, Dict, List

import torch

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _malloc_trim() -> None:
    # Through libc, not _core.trim_heap: the tool also measures builds from before it.
    import ctypes
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def rss_mib(trim: bool = False) -> float:
    """The resident set size of this process in MiB (Linux); with `trim`, after glibc has
    returned its free heap pages (what is then left is what is alive, plus fragmentation)."""
    if trim:
        _malloc_trim()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def _graph(g: torch.Generator, n: int, e: int):
    return torch.randint(0, n, (2, e), generator=g)


def _x(g, n, f):
    return torch.randn(n, f, generator=g).requires_grad_()


def _step_torch(g, a):
    ei, x = _graph(g, a.nodes, a.edges), _x(g, a.nodes, a.features)
    y = torch.zeros_like(x).index_add_(0, ei[1], x.index_select(0, ei[0]))
    y.sum().backward()


def _step_spmm_matrix(g, a):
    import sparsejit as sj
    A = sj.SparseMatrix.from_edge_index(_graph(g, a.nodes, a.edges), a.nodes)
    sj.spmm(A, _x(g, a.nodes, a.features)).sum().backward()


def _step_spmm_edge_index(g, a):
    import sparsejit as sj
    ei, x = _graph(g, a.nodes, a.edges), _x(g, a.nodes, a.features)
    sj.spmm(ei, x, reduce="mean").sum().backward()


def _step_sddmm_softmax(g, a):
    import sparsejit as sj
    A = sj.SparseMatrix.from_edge_index(_graph(g, a.nodes, a.edges), a.nodes)
    q, k, v = (_x(g, a.nodes, a.features) for _ in range(3))
    p = sj.edge_softmax(A, sj.sddmm(A, q, k))
    sj.spmm(A.with_values(p), v).sum().backward()


def _step_attention(g, a):
    import sparsejit as sj
    A = sj.SparseMatrix.from_edge_index(_graph(g, a.nodes, a.edges), a.nodes)
    q, k, v = (_x(g, a.nodes, a.features) for _ in range(3))
    sj.sparse_attention(A, q, k, v).sum().backward()


def _layer_step(make: Callable, with_type: bool = False):
    state: Dict[str, torch.nn.Module] = {}

    def step(g, a):
        if "layer" not in state:
            state["layer"] = make(a)
        ei, x = _graph(g, a.nodes, a.edges), _x(g, a.nodes, a.features)
        args = (x, ei, torch.randint(0, 8, (a.edges,), generator=g)) if with_type else (x, ei)
        state["layer"](*args).sum().backward()
    return step


def _step_point_conv(g, a):
    from sparsejit import spconv
    state = _step_point_conv.__dict__
    if "layer" not in state:
        state["layer"] = spconv.SubMConv3d(a.channels, a.channels, 3, bias=False)
    # Unique voxels of a random cloud in a 512^3 grid (one batch).
    n, side = a.voxels, 512
    keys = torch.unique(torch.randint(0, side ** 3, (n,), generator=g))
    coords = torch.stack([torch.zeros_like(keys), keys // side ** 2, keys // side % side,
                          keys % side], 1).int()
    feats = torch.randn(coords.shape[0], a.channels, generator=g).requires_grad_()
    x = spconv.SparseConvTensor(feats, coords, [side] * 3, 1)
    state["layer"](x).features.sum().backward()


def _step_filter_conv(g, a):
    import sparsejit as sj
    c = a.channels * 4
    w = torch.randn(c, c, 3, 3, generator=g)
    w[torch.rand(w.shape, generator=g) < 0.9] = 0
    layer = sj.nn.PrunedConv2d(w, padding=1)
    layer(torch.randn(2, c, 28, 28, generator=g)).sum()


def _cases() -> Dict[str, Callable]:
    import sparsejit as sj
    return {
        "torch": _step_torch,
        "spmm_matrix": _step_spmm_matrix,
        "spmm_edge_index_mean": _step_spmm_edge_index,
        "sddmm_softmax": _step_sddmm_softmax,
        "attention": _step_attention,
        "gcn": _layer_step(lambda a: sj.nn.GCNConv(a.features, a.features)),
        "gat": _layer_step(lambda a: sj.nn.GATConv(a.features, a.features // 2, heads=2)),
        "rgcn": _layer_step(lambda a: sj.nn.RGCNConv(a.features, a.features, num_relations=8),
                            with_type=True),
        "point_conv": _step_point_conv,
        "filter_conv": _step_filter_conv,
    }


CASES = ("torch", "spmm_matrix", "spmm_edge_index_mean", "sddmm_softmax", "attention", "gcn",
         "gat", "rgcn", "point_conv", "filter_conv")


def run_case(name: str, a) -> dict:
    """The loop for one case in this process: RSS (MiB) at every checkpoint and after
    sj.clear_caches()."""
    import sparsejit as sj
    torch.set_num_threads(a.threads)
    step = _cases()[name]
    g = torch.Generator().manual_seed(a.seed)
    marks: List[List[float]] = []
    for i in range(1, a.steps + 1):
        step(g, a)
        gc.collect()
        if i % a.every == 0:
            marks.append([i, round(rss_mib(a.trim), 1)])
    sj.clear_caches()
    gc.collect()
    return {"case": name, "marks": marks, "after_clear": round(rss_mib(a.trim), 1)}


def run_in_subprocess(name: str, argv: List[str], timeout: float = 900) -> dict:
    out = subprocess.run([sys.executable, "-m", "sparsejit.tools.memory_loop", "--case", name,
                          "--json"] + argv, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"memory loop case {name} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(results: List[dict]) -> str:
    base = next((r for r in results if r["case"] == "torch"), None)
    grow = lambda r: r["marks"][-1][1] - r["marks"][0][1]  # noqa: E731
    head = [str(int(m[0])) for m in results[0]["marks"]]
    lines = ["| case | " + " | ".join(f"after {h}" for h in head) +
             " | after clear_caches() | growth | growth - torch's | clear - torch's |",
             "|---" * (len(head) + 5) + "|"]
    for r in results:
        rel = "" if base is None else f"{grow(r) - grow(base):+.0f}"
        clr = "" if base is None else f"{r['after_clear'] - base['after_clear']:+.0f}"
        lines.append(f"| {r['case']} | " + " | ".join(f"{m[1]:.0f}" for m in r["marks"]) +
                     f" | {r['after_clear']:.0f} | {grow(r):+.0f} | {rel} | {clr} |")
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", choices=CASES, help="run one case in this process")
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--edges", type=int, default=2_000_000)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--voxels", type=int, default=120_000)
    ap.add_argument("--channels", type=int, default=16)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--every", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trim", action="store_true",
                    help="trim glibc's heap before every reading (RSS then tracks what is "
                         "alive, not what the allocator keeps free)")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON line")
    ap.add_argument("--out", help="write every case's result to this JSON file")
    return ap.parse_args(argv)


def forward_args(a) -> List[str]:
    return [f"--{k}={getattr(a, k)}" for k in ("nodes", "edges", "features", "voxels",
                                                "channels", "steps", "every", "threads",
                                                "seed")] + (["--trim"] if a.trim else [])


def main(argv=None) -> None:
    a = parse_args(argv)
    if a.case:
        r = run_case(a.case, a)
        print(json.dumps(r) if a.json else table([r]))
        return
    from sparsejit.info import cpu_line
    results = []
    for name in a.cases:
        results.append(run_in_subprocess(name, forward_args(a)))
        print(f"{name}: {results[-1]['marks']} clear {results[-1]['after_clear']}",
              file=sys.stderr, flush=True)
    print(f"CPU: {cpu_line()}; {a.edges} edges on {a.nodes} nodes, F = {a.features}; "
          f"{a.voxels} voxels x {a.channels} channels; {a.threads} threads; RSS in MiB"
          f"{', heap trimmed before each reading' if a.trim else ''}\n")
    print(table(results))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
