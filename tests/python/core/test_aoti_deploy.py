"""C++ deployment through AOTInductor: each family's model is exported with dynamic sizes,
compiled by ``torch._inductor.aoti_compile_and_package``, and run by the plain C++ program
``examples/cpp/aoti_run`` (which loads sparsejit's op library, nothing else of it) on inputs of
other sizes than the export example; its outputs must match Python eager.

ctest runs this file as `aoti_packages_run_from_cpp`, after `cpp_example_builds_and_runs` built the
runner from the installed CMake package (passed in SPARSEJIT_AOTI_RUNNER); run directly, it
uses build/example/aoti_run or builds the runner the same way. `make test-python` leaves it to
ctest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.export import Dim

import sparsejit as sj

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_export_dynamic import RGCN, UNet, random_cloud, random_graph  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> Path:
    given = os.environ.get("SPARSEJIT_AOTI_RUNNER")
    if given:  # ctest passes the runner its cpp_example test just built
        assert Path(given).is_file(), f"SPARSEJIT_AOTI_RUNNER={given} does not exist"
        return Path(given)
    built = ROOT / "build" / "example" / "aoti_run"
    src = ROOT / "examples" / "cpp" / "aoti_run.cpp"
    if built.exists() and built.stat().st_mtime >= src.stat().st_mtime:
        return built
    if shutil.which("cmake") is None:
        pytest.fail("cmake is needed to build examples/cpp/aoti_run")
    out = tmp_path_factory.mktemp("aoti_build")
    prefix = f"{sj.cmake_prefix_path};{torch.utils.cmake_prefix_path}"
    cfg = ["cmake", "-S", str(ROOT / "examples" / "cpp"), "-B", str(out),
           f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release"]
    if shutil.which("ccache"):
        cfg.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    for cmd in (cfg, ["cmake", "--build", str(out), "--target", "aoti_run"]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return out / "aoti_run"


def deploy_and_compare(runner: Path, tmp: Path, model, example, dynamic_shapes, others,
                       tol=1e-5):
    """Export `model` on `example`, package it, run the package from C++ on every input tuple
    of `others` and compare with eager."""
    ep = torch.export.export(model, example, dynamic_shapes=dynamic_shapes)
    package = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp / "model.pt2"))
    for i, args in enumerate(others):
        inp, out = tmp / f"in{i}.pt", tmp / f"out{i}.pt"
        torch.save(tuple(args), inp)
        r = subprocess.run([str(runner), package, str(inp), str(out)], capture_output=True,
                           text=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
        assert r.returncode == 0, f"aoti_run failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
        got = torch.load(out)
        with torch.no_grad():
            want = model(*args)
        want = want if isinstance(want, tuple) else (want,)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape, (g.shape, w.shape)
            torch.testing.assert_close(g, w, rtol=tol, atol=tol)


class GNN(torch.nn.Module):
    """GCN, SAGE and GAT layers on one (x, edge_index)."""

    def __init__(self):
        super().__init__()
        self.gcn = sj.nn.GCNConv(16, 32)
        self.sage = sj.nn.SAGEConv(32, 32)
        self.gat = sj.nn.GATConv(32, 8, heads=2)

    def forward(self, x, edge_index):
        h = torch.relu(self.gcn(x, edge_index))
        h = torch.relu(self.sage(h, edge_index))
        return self.gat(h, edge_index)


def test_gnn_runs_from_cpp_on_other_graph_sizes(runner, tmp_path):
    torch.manual_seed(0)
    deploy_and_compare(
        runner, tmp_path, GNN().eval(), random_graph(40, 160, seed=1),
        {"x": {0: Dim("nodes", min=2)}, "edge_index": {1: Dim("edges", min=2)}},
        [random_graph(300, 2000, seed=2), random_graph(9, 4, seed=3)])


def test_rgcn_runs_from_cpp_on_other_graph_sizes(runner, tmp_path):
    def graph(n, e, seed):
        x, edge_index = random_graph(n, e, seed)
        g = torch.Generator().manual_seed(seed)
        return x, edge_index, torch.randint(0, 3, (e,), generator=g)

    torch.manual_seed(0)
    edges = Dim("edges", min=2)
    deploy_and_compare(
        runner, tmp_path, RGCN().eval(), graph(40, 160, 1),
        {"x": {0: Dim("nodes", min=2)}, "edge_index": {1: edges}, "edge_type": {0: edges}},
        [graph(300, 2000, 2), graph(9, 4, 3)])


def test_sparse_conv_unet_runs_from_cpp_on_other_clouds(runner, tmp_path):
    torch.manual_seed(0)
    points = Dim("points", min=2)
    deploy_and_compare(runner, tmp_path, UNet(c=8).eval(), random_cloud(500, 1),
                       {"feats": {0: points}, "coords": {0: points}},
                       [random_cloud(3000, 2), random_cloud(37, 3)], tol=1e-4)


def test_sparsified_resnet_block_runs_from_cpp_on_other_sizes(runner, tmp_path):
    class Block(torch.nn.Module):  # a ResNet basic block
        def __init__(self, c=16):
            super().__init__()
            self.c1, self.b1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)
            self.c2, self.b2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)

        def forward(self, x):
            h = torch.relu(self.b1(self.c1(x)))
            return torch.relu(self.b2(self.c2(h)) + x)

    torch.manual_seed(0)
    block = Block().eval()
    with torch.no_grad():
        for conv in (block.c1, block.c2):
            conv.weight[torch.rand_like(conv.weight) < 0.75] = 0
        for bn in (block.b1, block.b2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    model = sj.sparsify(block, torch.randn(2, 16, 16, 16))
    with torch.no_grad():  # the sparsified block is the dense block
        x = torch.randn(2, 16, 16, 16)
        torch.testing.assert_close(model(x), block(x), rtol=1e-4, atol=1e-4)
    dims = {0: Dim("batch", min=1, max=64), 2: Dim("h", min=4, max=512),
            3: Dim("w", min=4, max=512)}
    deploy_and_compare(runner, tmp_path, model, (torch.randn(2, 16, 16, 16),),
                       {"x": dims}, [(torch.randn(1, 16, 9, 13),), (torch.randn(3, 16, 32, 20),)],
                       tol=1e-4)


def test_fused_bottleneck_runs_from_cpp_on_other_sizes(runner, tmp_path):
    # filter_conv's fused group (a pruned ResNet bottleneck as one op over bands of rows)
    from sparsejit.families.filter_conv.fused import FusedBottleneck
    from sparsejit.families.filter_conv.layers import ResidualPrunedConv2d, PrunedConv2d

    g = torch.Generator().manual_seed(0)

    def pruned(*shape):
        w = torch.randn(shape, generator=g)
        return w * (torch.rand(shape, generator=g) > 0.8)
    c1 = PrunedConv2d(pruned(8, 16, 1, 1), torch.randn(8, generator=g), relu=True)
    c2 = PrunedConv2d(pruned(8, 8, 3, 3), torch.randn(8, generator=g), padding=1, relu=True)
    c3 = ResidualPrunedConv2d(PrunedConv2d(pruned(16, 8, 1, 1), torch.randn(16, generator=g)))
    model = FusedBottleneck(c1, c2, c3).eval()
    dims = {0: Dim("batch", min=1, max=64), 2: Dim("h", min=1, max=512),
            3: Dim("w", min=1, max=512)}
    deploy_and_compare(runner, tmp_path, model, (torch.randn(2, 16, 16, 16),),
                       {"x": dims}, [(torch.randn(1, 16, 9, 13),), (torch.randn(3, 16, 32, 20),)],
                       tol=1e-4)
