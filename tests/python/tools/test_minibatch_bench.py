"""The mini-batch benchmark's sampler draws what it claims (PyG's NeighborLoader semantics),
and the benchmark runs end to end on a small graph."""

import json
import subprocess
import sys
from pathlib import Path

import torch

from sparsejit.tools.data import load_graph

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCH))
from bench_minibatch import NeighborSampler  # noqa: E402


def test_sampler_draws_distinct_in_neighbours_up_to_the_fanout():
    g = load_graph("powerlaw:n=3000,avg=12,alpha=2.1,seed=5")
    fanouts = [6, 3]
    s = NeighborSampler(g.edge_index, g.num_nodes, fanouts, seed=1)
    graph_edges = set(zip(g.edge_index[0].tolist(), g.edge_index[1].tolist()))
    in_degree = torch.bincount(g.edge_index[1], minlength=g.num_nodes)  # with multi-edges
    for _ in range(3):
        nodes, ei = s.sample(40)
        assert len(set(nodes.tolist())) == nodes.numel()  # each node relabelled once
        src, dst = nodes[ei[0]], nodes[ei[1]]
        assert all((a, b) in graph_edges for a, b in zip(src.tolist(), dst.tolist()))
        drawn = torch.bincount(dst, minlength=g.num_nodes)
        seeds = nodes[:40]
        # Every seed: min(in-degree, fanout) distinct graph edges (all of them when fewer).
        assert torch.equal(drawn[seeds], in_degree[seeds].clamp(max=fanouts[0]))
        # Second-hop targets: min(in-degree, fanout) each.
        hop2 = torch.unique(dst[~torch.isin(dst, seeds)])
        assert torch.equal(drawn[hop2], in_degree[hop2].clamp(max=fanouts[1]))
        # Without replacement: an edge (a, b) is drawn at most as often as the graph has it.
        mult = {}
        for a, b in zip(g.edge_index[0].tolist(), g.edge_index[1].tolist()):
            mult[(a, b)] = mult.get((a, b), 0) + 1
        got = {}
        for a, b in zip(src.tolist(), dst.tolist()):
            got[(a, b)] = got.get((a, b), 0) + 1
        assert all(c <= mult[p] for p, c in got.items())
        assert bool((s.local == -1).all())  # scratch map reset for the next batch


def test_benchmark_runs_end_to_end(tmp_path):
    out = tmp_path / "mb.json"
    r = subprocess.run([sys.executable, str(BENCH / "bench_minibatch.py"), "--graph",
                        "powerlaw:n=4000,avg=10,alpha=2.1,seed=0", "--batch", "64", "--steps",
                        "2", "--features", "16", "--hidden", "16", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert {row["layer"] for row in rep["rows"]} == {"sage", "gcn"}
    for row in rep["rows"]:
        assert row["sparsejit_ms"] > 0 and row["pyg_ms"] > 0 and row["preparation_ms"] > 0
    assert "| sage |" in r.stdout and "CPU:" in r.stdout


def test_benchmark_runs_the_accelerated_pyg_model(tmp_path):
    out = tmp_path / "mb.json"
    r = subprocess.run([sys.executable, str(BENCH / "bench_minibatch.py"), "--graph",
                        "powerlaw:n=4000,avg=10,alpha=2.1,seed=0", "--batch", "64", "--steps",
                        "2", "--features", "16", "--hidden", "16", "--layers", "sage",
                        "--accelerate", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert rep["args"]["accelerate"] and [row["layer"] for row in rep["rows"]] == ["sage"]
    assert rep["rows"][0]["sparsejit_ms"] > 0
    assert "sj.accelerate(PyG model)" in r.stdout


def test_structure_build_bench_runs_end_to_end():
    r = subprocess.run([sys.executable, str(BENCH / "bench_structure_build.py"), "--graph",
                        "powerlaw:n=3000,avg=12,alpha=2.1,seed=5", "--batch", "64",
                        "--batches", "4", "--big-edges", "50000", "--threads", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.strip()]
    assert rows[0].startswith("CPU: "), r.stdout  # the table names its CPU first
    rows = rows[1:]
    assert len(rows) == 8, r.stdout
    for name in ("gcn_adjacency, sampled subgraph", "csr_transpose, 50000 entries",
                 "content hash of edge_index", "spmm_plan, new structure"):
        line = next(x for x in rows if name in x)
        assert float(line.split()[-2]) > 0, line
