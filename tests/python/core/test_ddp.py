"""Two processes (gloo, loopback) train sparsejit models under DDP with examples/ddp_train.py:
a GNN taking edge_index, an R-GCN whose ranks see different relations (relations absent from
a rank's batch get a zero gradient there), and a submanifold sparse-conv net. After training,
the ranks hold the same parameters, equal (within float tolerance) to one process trained on
the union of the two ranks' batches."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "ddp_train.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(model: str, world: int, out: str, extra=(), steps: int = 3):
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--model", model, "--steps", str(steps), "--out", out,
             *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log
    return logs


@pytest.mark.parametrize("model", ["gnn", "rgcn", "conv"])
def test_ddp_matches_one_process_on_the_union(tmp_path, model):
    logs = _launch(model, 2, str(tmp_path / "ddp{rank}.pt"))
    assert f"{model} step 2" in logs[0]
    _launch(model, 1, str(tmp_path / "single{rank}.pt"), extra=("--batches", "0", "1",
                                                                "--all-batches", "2"))
    r0, r1 = torch.load(tmp_path / "ddp0.pt"), torch.load(tmp_path / "ddp1.pt")
    single = torch.load(tmp_path / "single0.pt")
    init = None
    assert r0.keys() == r1.keys() == single.keys() and len(r0) > 0
    for k in r0:
        assert torch.equal(r0[k], r1[k]), f"{k} differs between ranks"
        torch.testing.assert_close(r0[k], single[k], rtol=1e-4, atol=1e-5, msg=k)
    # training moved the parameters (a comparison of untouched ones would prove nothing)
    torch.manual_seed(0)
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import ddp_train
        init = ddp_train.MODELS[model][0]().state_dict()
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    moved = [k for k in r0 if r0[k].is_floating_point() and not torch.equal(r0[k], init[k])]
    assert len(moved) >= len([k for k in r0 if r0[k].is_floating_point()]) // 2, moved
