"""Graph loaders and generators, the benchmark harness and the demo."""

import gzip

import numpy as np
import pytest
import torch

from sparsejit.tools import bench, data, demo


def test_generators_are_seeded_and_sized():
    a, b = data.load_graph("rmat:scale=10,ef=8,seed=3"), data.load_graph("rmat:scale=10,ef=8,seed=3")
    assert torch.equal(a.edge_index, b.edge_index)
    assert a.num_nodes == 1024 and a.num_edges == 8192
    assert not torch.equal(a.edge_index, data.load_graph("rmat:scale=10,ef=8,seed=4").edge_index)
    p = data.load_graph("powerlaw:n=5000,avg=6,alpha=2.1,seed=0")
    assert p.num_edges == 30000 and int(p.edge_index.max()) < 5000
    deg = torch.bincount(p.edge_index[1], minlength=5000).float()
    assert deg.max() > 20 * deg.mean()  # heavy tail
    u = data.load_graph("uniform:n=5000,avg=6,seed=0")
    udeg = torch.bincount(u.edge_index[1], minlength=5000).float()
    assert udeg.max() < 5 * udeg.mean()


def test_snap_loader(tmp_path):
    text = "# comment\n# FromNodeId ToNodeId\n0 1\n1 2\n3 0\n"
    (tmp_path / "g.txt").write_text(text)
    with gzip.open(tmp_path / "g.txt.gz", "wt") as f:
        f.write(text)
    for name in ("g.txt", "g.txt.gz"):
        g = data.load_graph(str(tmp_path / name))
        assert g.num_nodes == 4
        assert g.edge_index.tolist() == [[0, 1, 3], [1, 2, 0]]


def test_snap_nm_loader(tmp_path):
    d = tmp_path / "snap_nm"
    d.mkdir()
    (d / "g.txt").write_text("3 2\n1 2\n2 3\n")
    g = data.load_snap_nm(d / "g.txt")
    assert g.num_nodes == 3
    assert sorted(map(tuple, g.edge_index.T.tolist())) == [(0, 1), (1, 0), (1, 2), (2, 1)]


def test_mtx_and_npz_loaders(tmp_path):
    import scipy.io
    import scipy.sparse as sp

    m = sp.coo_matrix((np.ones(3), ([0, 1, 2], [1, 2, 0])), shape=(3, 3))
    scipy.io.mmwrite(str(tmp_path / "m.mtx"), m)
    g = data.load_graph(str(tmp_path / "m.mtx"))
    assert g.edge_index.tolist() == [[1, 2, 0], [0, 1, 2]]  # column -> row
    adj = sp.csr_matrix(m)
    attr = sp.csr_matrix(np.eye(3, 4, dtype=np.float32))
    np.savez(tmp_path / "g.npz", adj_data=adj.data, adj_indices=adj.indices,
             adj_indptr=adj.indptr, adj_shape=adj.shape, attr_data=attr.data,
             attr_indices=attr.indices, attr_indptr=attr.indptr, attr_shape=attr.shape,
             labels=np.array([0, 1, 1]))
    g = data.load_graph(str(tmp_path / "g.npz"))
    assert g.num_edges == 6 and g.x.shape == (3, 4) and g.y.tolist() == [0, 1, 1]


def test_unknown_and_missing_graphs(monkeypatch):
    with pytest.raises(ValueError, match="unknown graph"):
        data.load_graph("no-such-graph")
    monkeypatch.setenv("SPARSEJIT_DATA", "/nonexistent")
    with pytest.raises(FileNotFoundError, match="SPARSEJIT_DATA"):
        data.load_graph("cora")


@pytest.mark.skipif(data.data_dir() is None, reason="no data folder (SPARSEJIT_DATA)")
@pytest.mark.parametrize("name,nodes,edges", [("cora", 2708, 10556), ("citeseer", 3327, 9104),
                                              ("pubmed", 19717, 88648)])
def test_planetoid_matches_published_counts(name, nodes, edges):
    g = data.load_graph(name)
    assert g.num_edges == edges and g.num_nodes == nodes
    assert g.y is not None and g.y.shape[0] == nodes


@pytest.mark.skipif(data.data_dir() is None, reason="no data folder (SPARSEJIT_DATA)")
def test_snap_graphs_load():
    assert data.load_graph("facebook").num_edges == 2 * 88234
    assert data.load_graph("email-eu").num_edges == 25571


def test_bench_quick_every_peer_agrees(tmp_path):
    recs = bench.run(["--quick", "--reduce", "sum", "mean", "max", "--out-json",
                      str(tmp_path / "r.json"), "--out-md", str(tmp_path / "r.md")])
    assert recs and all(r["ok"] for r in recs), [r for r in recs if not r["ok"]]
    impls = {r["impl"] for r in recs}
    assert {"sparsejit", "torch.sparse", "scatter", "gather-dot"} <= impls
    assert all(r["median_ms"] > 0 for r in recs)
    assert "geometric mean" in (tmp_path / "r.md").read_text()


def test_demo_losses_match(capsys):
    assert demo.main(["powerlaw:n=2000,avg=5,seed=1", "--epochs", "2", "--hidden", "16"]) == 0
    assert "losses match: yes" in capsys.readouterr().out


def test_default_data_dir_is_beside_the_repository(monkeypatch):
    """Without SPARSEJIT_DATA the loaders look in <repo>/../shared/data."""
    from pathlib import Path

    monkeypatch.delenv("SPARSEJIT_DATA", raising=False)
    expected = Path(__file__).resolve().parents[4] / "shared" / "data"
    got = data.data_dir()
    if expected.is_dir():
        assert got == expected
    else:
        assert got is None
