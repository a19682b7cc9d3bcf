"""GNN layers taking ``(x, edge_index)`` export with dynamic node and edge counts: the exported
program runs graphs of other sizes than the export example and matches eager.

Before, something on the edge_index path turned the node count into a Python int (a
specialization), so ``torch.export`` failed with "Constraints violated (N)" and a deployed GNN
ran only on graphs of the exact size it was exported with."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.export import Dim

import sparsejit as sj


def random_graph(n: int, e: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, n, (2, e), generator=g)
    x = torch.randn(n, 16, generator=g)
    return x, edge_index


class TwoLayer(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        if kind == "gcn":
            self.a, self.b = sj.nn.GCNConv(16, 32), sj.nn.GCNConv(32, 8)
        elif kind == "sage":
            self.a, self.b = sj.nn.SAGEConv(16, 32), sj.nn.SAGEConv(32, 8)
        elif kind == "gat":
            self.a, self.b = sj.nn.GATConv(16, 8, heads=4), sj.nn.GATConv(32, 8, heads=1)
        else:
            self.a, self.b = sj.nn.GraphConv(16, 32), sj.nn.GINConv(torch.nn.Linear(32, 8))

    def forward(self, x, edge_index):
        return self.b(torch.relu(self.a(x, edge_index)), edge_index)


def export_dynamic(model, x, edge_index):
    nodes, edges = Dim("nodes", min=2), Dim("edges", min=2)
    return torch.export.export(model, (x, edge_index),
                               dynamic_shapes={"x": {0: nodes}, "edge_index": {1: edges}})


@pytest.mark.parametrize("kind", ["gcn", "sage", "gat", "graphconv_gin"])
def test_gnn_exports_with_dynamic_nodes_and_edges(kind):
    torch.manual_seed(0)
    model = TwoLayer(kind).eval()
    ep = export_dynamic(model, *random_graph(40, 160, seed=1))
    # the graph's node and edge dimensions stay symbolic
    x_meta = [n for n in ep.graph.nodes if n.op == "placeholder"]
    shapes = [tuple(n.meta["val"].shape) for n in x_meta if "val" in n.meta]
    assert any(not isinstance(s[0], int) for s in shapes if len(s) == 2 and s[1] == 16), shapes
    run = ep.module()
    for n, e, seed in [(40, 160, 2), (7, 3, 3), (300, 2000, 4), (513, 50, 5)]:
        x, edge_index = random_graph(n, e, seed)
        with torch.no_grad():
            want = model(x, edge_index)
            got = run(x, edge_index)
        assert got.shape == (n, 8)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_exported_gnn_rejects_a_bad_edge_index():
    model = TwoLayer("gcn").eval()
    run = export_dynamic(model, *random_graph(40, 160, seed=1)).module()
    x, edge_index = random_graph(20, 50, seed=2)
    edge_index[0, 3] = 25  # a source beyond the 20 nodes
    with pytest.raises(Exception, match="edge_index|num_nodes|out of range|node"):
        run(x, edge_index)


class RGCN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = sj.nn.RGCNConv(16, 32, 3)
        self.b = sj.nn.RGCNConv(32, 8, 3, num_bases=2)

    def forward(self, x, edge_index, edge_type):
        return self.b(torch.relu(self.a(x, edge_index, edge_type)), edge_index, edge_type)


def test_rgcn_exports_with_dynamic_nodes_and_edges():
    def graph(n, e, seed):
        x, edge_index = random_graph(n, e, seed)
        return x, edge_index, torch.randint(0, 3, (e,), generator=torch.Generator().manual_seed(seed))

    torch.manual_seed(0)
    model = RGCN().eval()
    nodes, edges = Dim("nodes", min=2), Dim("edges", min=2)
    ep = torch.export.export(model, graph(40, 160, 1), dynamic_shapes={
        "x": {0: nodes}, "edge_index": {1: edges}, "edge_type": {0: edges}})
    for n, e in [(7, 3), (300, 2000)]:
        args = graph(n, e, n)
        with torch.no_grad():
            torch.testing.assert_close(ep.module()(*args), model(*args), rtol=1e-5, atol=1e-5)


class UNet(torch.nn.Module):
    """examples/pointcloud_unet.py's MinkUNet taking (features, coordinates)."""

    def __init__(self, c: int = 16):
        super().__init__()
        import sparsejit.spconv as spconv
        sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
        from pointcloud_unet import MinkUNet
        self.spconv = spconv
        self.net = MinkUNet(spconv, c=c)

    def forward(self, feats, coords):
        return self.net(self.spconv.SparseConvTensor(feats, coords, [64, 64, 32], 1))


def random_cloud(n, seed):
    """n distinct sites in a 64 x 64 x 32 grid (batch 0) with 4 features."""
    g = torch.Generator().manual_seed(seed)
    key = torch.randperm(64 * 64 * 32, generator=g)[:n]
    coords = torch.stack([torch.zeros_like(key), key // (64 * 32), (key // 32) % 64,
                          key % 32], 1).int()
    return torch.randn(n, 4, generator=g), coords


def test_sparse_conv_unet_exports_with_dynamic_points():
    cloud = random_cloud
    torch.manual_seed(0)
    model = UNet().eval()
    points = Dim("points", min=2)
    ep = torch.export.export(model, cloud(500, 1),
                             dynamic_shapes={"feats": {0: points}, "coords": {0: points}})
    for n in (37, 3000):
        args = cloud(n, n)
        with torch.no_grad():
            torch.testing.assert_close(ep.module()(*args), model(*args), rtol=1e-4, atol=1e-4)


def test_sparsified_conv_block_exports_with_dynamic_batch_and_size():
    torch.manual_seed(0)
    block = torch.nn.Sequential(
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 8, 3, padding=1)).eval()
    with torch.no_grad():
        for conv in (block[0], block[3]):
            conv.weight[torch.rand_like(conv.weight) < 0.7] = 0
    model = sj.sparsify(block, torch.randn(2, 8, 16, 16))
    dims = {0: Dim("batch", min=1, max=64), 2: Dim("h", min=4, max=512),
            3: Dim("w", min=4, max=512)}
    ep = torch.export.export(model, (torch.randn(2, 8, 16, 16),),
                             dynamic_shapes={"input": dims})
    for shape in [(1, 8, 9, 13), (3, 8, 32, 20)]:
        x = torch.randn(*shape)
        with torch.no_grad():
            torch.testing.assert_close(ep.module()(x), block(x), rtol=1e-4, atol=1e-4)
