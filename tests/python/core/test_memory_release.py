"""Memory comes back when the user drops a graph (issue 45).

Nothing in sparsejit keeps a user's tensor alive once the user drops every reference to it,
in every family; the caches that hold built structures are bounded by one byte budget; and
``sj.clear_caches()`` empties every cache and table (``sj.cache_stats()`` shows them). The loop
of ``python -m sparsejit.tools.memory_loop`` (a new graph every step, forward + backward,
everything dropped) runs for every family in a subprocess against the same loop in pure torch.
"""

import gc
import weakref

import pytest
import torch

import sparsejit as sj
from sparsejit.runtime import caches


def _collect():
    gc.collect()
    gc.collect()


def _dead(refs):
    _collect()
    return [r() is None for r in refs]


def _graph(n=300, e=3000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (2, e), generator=g), n


def _refs(*tensors):
    return [weakref.ref(t) for t in tensors]


def test_spmm_family_structures_die_with_the_user():
    ei, n = _graph()
    A = sj.SparseMatrix.from_edge_index(ei, n)
    x = torch.randn(n, 8, requires_grad=True)
    q, k = torch.randn(n, 8), torch.randn(n, 8)
    y = sj.spmm(A, x, reduce="mean")
    y = y + sj.spmm(A.with_values(sj.edge_softmax(A, sj.sddmm(A, q, k))), x)
    y.sum().backward()
    t = A.transpose_arrays()
    refs = _refs(A.indptr, A.indices, *t)
    assert sj.cache_stats() and any(r["entries"] for r in sj.cache_stats()
                                    if r["name"].startswith("ops.validated"))
    del A, y, t
    assert all(_dead(refs)), "a SparseMatrix's arrays outlived it"


def test_attention_structures_die_with_the_user():
    ei, n = _graph(seed=1)
    A = sj.SparseMatrix.from_edge_index(ei, n)
    q, k, v = (torch.randn(n, 2, 8, requires_grad=True) for _ in range(3))
    sj.sparse_attention(A, q, k, v).sum().backward()
    refs = _refs(A.indptr, A.indices)
    del A
    assert all(_dead(refs))


def test_rgms_plan_dies_with_the_user():
    ei, n = _graph(seed=2)
    et = torch.randint(0, 3, (ei.shape[1],))
    A = sj.TypedSparseMatrix.from_edge_index(ei, n, edge_type=et, num_relations=3)
    x = torch.randn(n, 8, requires_grad=True)
    w = torch.randn(3, 8, 4, requires_grad=True)
    sj.rgms(A, x, w, reduce="mean").sum().backward()
    refs = _refs(A.plan)
    del A
    assert all(_dead(refs))


def test_filter_conv_buffers_die_with_the_layer():
    w = torch.randn(8, 8, 3, 3)
    w[torch.rand(w.shape) < 0.8] = 0
    layer = sj.nn.PrunedConv2d(w, padding=1)
    layer(torch.randn(1, 8, 10, 10))
    refs = _refs(layer.plan, layer.rowptr, layer.taps, layer.values)
    del layer
    assert all(_dead(refs))


def test_layers_keep_no_graph_of_the_user():
    """Layers given an edge_index cache what they derive from it by content, never the
    user's tensor; clear_caches drops what they derived."""
    ei, n = _graph(seed=3)
    x = torch.randn(n, 16, requires_grad=True)
    for layer, args in ((sj.nn.GCNConv(16, 8), ()), (sj.nn.GATConv(16, 4, heads=2), ()),
                        (sj.nn.RGCNConv(16, 8, num_relations=3),
                         (torch.randint(0, 3, (ei.shape[1],)),))):
        e = ei.clone()
        ref = weakref.ref(e)
        layer(x, e, *args).sum().backward()
        del e
        assert _dead([ref]) == [True], type(layer).__name__
    sj.clear_caches()
    assert all(r["entries"] == 0 for r in sj.cache_stats()), sj.cache_stats()


def test_raw_op_tensors_are_released_by_clear_caches():
    """Tensors no sparsejit object owns (a raw op call) are what the op library's table may
    hold (stable ABI, within a small bound); clear_caches() lets them go."""
    ei, n = _graph(seed=4)
    A = sj.SparseMatrix.from_edge_index(ei, n)
    rowptr, col = A.indptr.clone(), A.indices.clone()
    del A
    x = torch.randn(n, 4)
    y = torch.ops.sparsejit.spmm(rowptr, col, None, x, "sum", n, None, None, None, None, None,
                                 "none", 0.01, 1.0, False)[0]
    assert y.shape == (n, 4)
    refs = _refs(rowptr, col)
    del rowptr, col
    sj.clear_caches()
    assert all(_dead(refs))


def test_clear_caches_empties_every_cache():
    ei, n = _graph(seed=5)
    x = torch.randn(n, 8, requires_grad=True)
    sj.spmm(ei, x, reduce="mean").sum().backward()
    sj.nn.GCNConv(8, 8)(x, ei).sum().backward()
    A = sj.SparseMatrix.from_edge_index(ei, n)
    sj.spmm(A, x)
    assert any(r["entries"] for r in sj.cache_stats())
    sj.clear_caches()
    left = [r for r in sj.cache_stats() if r["entries"]]
    assert not left, left
    assert caches.cache_budget() > 0


def test_byte_budget_evicts_least_recently_used_and_skips_what_does_not_fit():
    old = caches.cache_budget()
    sj.clear_caches()
    try:
        sj.set_cache_budget(64 << 20)  # a window of 4 MiB for graphs seen once
        window = caches.window_bytes()
        assert window == 4 << 20
        lru = caches.LruCache("test.budget")
        blob = lambda mib: torch.empty(mib << 20, dtype=torch.uint8)  # noqa: E731
        lru.put("a", blob(1))
        lru.put("b", blob(2))
        assert lru.get("a") is not None  # found again: to the main area (60 MiB)
        lru.put("c", blob(2))
        lru.put("d", blob(1))  # the window holds b, c, d = 5 MiB > 4: b leaves
        assert "b" not in lru and {"a", "c", "d"} <= set(lru._d)
        lru.put("big", blob(5))  # larger than the window: used, not kept, key remembered
        assert "big" not in lru
        lru.put("big", blob(5))  # seen again: kept in the main area
        assert "big" in lru
        lru.put("huge", blob(70))  # larger than the whole budget: never kept
        lru.put("huge", blob(70))
        assert "huge" not in lru
        entries, nbytes = lru.stats()
        assert entries == len(lru) and nbytes == sum(t.numel() for t in lru.values())
        sj.set_cache_budget(1 << 20)  # shrinking evicts at once
        assert len(lru) == 0
        with pytest.raises(ValueError, match="nbytes"):
            sj.set_cache_budget(-5)
    finally:
        sj.set_cache_budget(None)
        caches._CLEARERS.pop("test.budget", None)
        caches._STATS.pop("test.budget", None)
    assert caches.cache_budget() == old


def test_a_graph_larger_than_the_budget_still_works():
    ei, n = _graph(n=2000, e=40000, seed=6)
    x = torch.randn(n, 4)
    ref = sj.spmm(sj.SparseMatrix.from_edge_index(ei, n), x)
    try:
        sj.set_cache_budget(1024)
        for _ in range(3):
            torch.testing.assert_close(sj.spmm(ei, x), ref)
            assert sj.nn.GCNConv(4, 4)(x, ei).shape == (n, 4)
        assert all(r["entries"] == 0 for r in sj.cache_stats()
                   if not r["name"].startswith(("ops.", "runtime.")))
    finally:
        sj.set_cache_budget(None)


def test_info_reports_every_cache():
    from sparsejit.info import collect
    mem = collect()["memory_caches"]
    assert mem["budget_bytes"] == caches.cache_budget()
    assert "spmm.edge_index_structures" in mem


# ---- the loop, every family, in subprocesses (the slow tier: `make test-slow`) ----------------

LOOP_ARGS = ["--nodes=40000", "--edges=400000", "--features=16", "--voxels=20000",
             "--channels=16", "--steps=9", "--every=3", "--threads=2"]


@pytest.fixture(scope="module")
def torch_loop():
    from sparsejit.tools.memory_loop import run_in_subprocess
    return run_in_subprocess("torch", LOOP_ARGS)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["spmm_matrix", "spmm_edge_index_mean", "sddmm_softmax",
                                  "attention", "gcn", "gat", "rgcn", "point_conv",
                                  "filter_conv"])
def test_memory_plateaus_in_a_loop_of_new_graphs(case, torch_loop, monkeypatch):
    """RSS grows from the first checkpoint to the last by at most 48 MiB more than the pure
    torch loop's, and after clear_caches() is within 32 MiB of that loop's (the issue's
    bounds at full size: 100 and 32 MiB). The budget is 128 MiB here, so the window for graphs
    seen once (8 MiB) is smaller than one graph: nothing of theirs is kept."""
    from sparsejit.tools.memory_loop import run_in_subprocess
    monkeypatch.setenv("SPARSEJIT_CACHE_BYTES", str(128 << 20))
    r = run_in_subprocess(case, LOOP_ARGS)
    grow = lambda res: res["marks"][-1][1] - res["marks"][0][1]  # noqa: E731
    assert grow(r) - grow(torch_loop) <= 48, (r, torch_loop)
    assert r["after_clear"] - torch_loop["after_clear"] <= 32, (r, torch_loop)
