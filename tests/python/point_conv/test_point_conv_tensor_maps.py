"""The device-generic kernel-map builders (torch_ext/composite/point_conv_tensor_map.h), which the
CUDA ``point_conv_plan`` runs, on CPU tensors: ``SPARSEJIT_STRUCTURE_ATEN=1`` routes the CPU op
through them, and every plan and output-coordinate tensor must equal the CPU core's word for
word (header, fingerprint, pairs and their order, row indexes), for submanifold, strided
(spconv), coarse, transposed and generalized (caller's output sites) maps over 1 to 4 axes, odd kernels, dilation, padding, mixed
strides, empty, one-site, clustered and grid-edge inputs; invalid input still gets the core's
errors."""

import pytest
import torch

from conftest import random_sites

point_conv_plan = torch.ops.sparsejit.point_conv_plan
ENV = "SPARSEJIT_STRUCTURE_ATEN"


def _both(monkeypatch, fn):
    monkeypatch.delenv(ENV, raising=False)
    want = fn()
    monkeypatch.setenv(ENV, "1")
    try:
        got = fn()
    finally:
        monkeypatch.delenv(ENV)
    return got, want


def _cluster(shape, batch_size=1):
    grids = torch.meshgrid(*[torch.arange(min(s, 6)) for s in shape], indexing="ij")
    cols = torch.stack(grids, -1).reshape(-1, len(shape))
    rows = [torch.cat([torch.full((len(cols), 1), b), cols], 1) for b in range(batch_size)]
    return torch.cat(rows).int()


SITES = {
    "random": lambda shape: random_sites(400, shape, batch_size=3, seed=1),
    "sparse": lambda shape: random_sites(25, shape, batch_size=2, seed=2),
    "one": lambda shape: random_sites(1, shape, batch_size=1, seed=3),
    "empty": lambda shape: torch.zeros(0, len(shape) + 1, dtype=torch.int32),
    "cluster": lambda shape: _cluster(shape, 2),
    "edges": lambda shape: torch.tensor([[0] + [0] * len(shape), [0] + [s - 1 for s in shape],
                                         [1] + [s - 1 if d % 2 else 0 for d, s in enumerate(shape)]],
                                        dtype=torch.int32),
}

# (shape, kind, kernel, stride, padding, dilation)
GEOMETRIES = [
    ([12, 12, 12], "subm", [3, 3, 3], [1, 1, 1], [0, 0, 0], [1, 1, 1]),
    ([12, 10, 9], "subm", [5, 3, 1], [1, 1, 1], [0, 0, 0], [1, 2, 1]),
    ([30], "subm", [3], [1], [0], [1]),
    ([7, 8, 6, 5], "subm", [3, 3, 3, 3], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]),
    ([12, 12, 12], "spconv", [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1]),
    ([12, 12, 12], "spconv", [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1]),
    ([13, 11, 12], "spconv", [3, 2, 3], [2, 1, 3], [0, 1, 2], [1, 1, 2]),
    ([16, 16], "spconv", [2, 2], [2, 2], [0, 0], [1, 1]),
    ([9, 8, 7, 6], "spconv", [3, 3, 3, 3], [2, 2, 2, 2], [1, 1, 1, 1], [1, 1, 1, 1]),
    ([12, 12, 12], "coarse", [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1]),
    ([13, 12, 11], "coarse", [3, 3, 3], [2, 3, 2], [1, 1, 1], [1, 1, 1]),
    ([12, 12, 12], "transposed", [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1]),
    ([10, 9, 8], "transposed", [2, 3, 3], [2, 1, 2], [0, 1, 0], [1, 1, 2]),
    ([20, 20], "transposed", [4, 4], [4, 4], [0, 0], [1, 1]),
]


@pytest.mark.parametrize("sites", list(SITES))
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: f"{g[1]}-{len(g[0])}d-k{g[2]}-s{g[3]}")
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_tensor_maps_equal_the_core(monkeypatch, sites, geometry, dtype):
    shape, kind, kernel, stride, padding, dilation = geometry
    coords = SITES[sites](shape).to(dtype)
    batch_size = 3
    got, want = _both(monkeypatch, lambda: point_conv_plan(coords, shape, batch_size, kind, kernel,
                                                     stride, padding, dilation, None))
    assert got[0].dtype == want[0].dtype == torch.int64
    assert torch.equal(got[0], want[0]), f"plans differ at {(got[0] != want[0]).nonzero()[:5].tolist()}" \
        if got[0].shape == want[0].shape else f"plan lengths {got[0].shape} != {want[0].shape}"
    assert got[1].dtype == want[1].dtype == torch.int32
    assert torch.equal(got[1], want[1])


GENERALIZED = [  # (shape, kernel, stride, padding, dilation)
    ([12, 12, 12], [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1]),
    ([12, 12, 12], [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1]),
    ([13, 11], [2, 3], [3, 1], [0, 2], [2, 1]),
    ([9, 8, 7, 6], [3, 3, 3, 3], [2, 2, 2, 2], [1, 1, 1, 1], [1, 1, 1, 1]),
]


@pytest.mark.parametrize("sites", list(SITES))
@pytest.mark.parametrize("outs", ["random", "shuffled", "one", "empty", "beyond"])
@pytest.mark.parametrize("geometry", GENERALIZED, ids=lambda g: f"{len(g[0])}d-k{g[1]}-s{g[2]}")
def test_generalized_tensor_maps_equal_the_core(monkeypatch, sites, outs, geometry):
    """Output sites given by the caller (rows kept in their order, sites past the input grid,
    empty, one): pairs searched among them, plan and output coordinates word for word."""
    shape, kernel, stride, padding, dilation = geometry
    coords = SITES[sites](shape)
    out_shape = [max(1, (s + st - 1) // st) for s, st in zip(shape, stride)]
    if outs == "beyond":
        out_shape = [s + 3 for s in shape]
    out = {"random": lambda: random_sites(60, out_shape, batch_size=3, seed=5),
           "shuffled": lambda: random_sites(90, out_shape, batch_size=2, seed=6)[
               torch.randperm(90, generator=torch.Generator().manual_seed(0))],
           "one": lambda: random_sites(1, out_shape, batch_size=1, seed=7),
           "empty": lambda: torch.zeros(0, len(shape) + 1, dtype=torch.int32),
           "beyond": lambda: random_sites(70, out_shape, batch_size=3, seed=8)}[outs]()
    if outs == "beyond":
        out = out.long()  # both index dtypes
    got, want = _both(monkeypatch, lambda: point_conv_plan(coords, shape, 3, "generalized", kernel,
                                                     stride, padding, dilation, out))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    if out.numel():  # a new tensor, as the core returns, not the caller's
        assert got[1].data_ptr() != out.data_ptr()


@pytest.mark.parametrize("bad,match", [
    (torch.tensor([[0, 1, 2, 3], [0, -1, 0, 0]]), r"out_coords.*coords\[1, 1\]"),
    (torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]]), "duplicate"),
    (torch.tensor([[0, 1, 2, 3], [7, 1, 2, 3]]), r"coords\[1, 0\]"),
])
def test_generalized_tensor_maps_leave_bad_output_sites_to_the_core(monkeypatch, bad, match):
    coords = random_sites(30, [12, 12, 12], batch_size=2, seed=1)
    monkeypatch.setenv(ENV, "1")
    with pytest.raises(ValueError, match=match):
        point_conv_plan(coords, [12, 12, 12], 2, "generalized", [3] * 3, [1] * 3, [1] * 3, [1] * 3, bad)


def test_tensor_maps_on_a_scan_sized_input(monkeypatch):
    """Thousands of sites in a large grid: both strided and submanifold plans equal."""
    shape = [200, 180, 40]
    coords = random_sites(20000, shape, batch_size=2, seed=9)
    for kind, k, s, p in [("subm", 3, 1, 0), ("spconv", 3, 2, 1), ("transposed", 3, 2, 1),
                          ("coarse", 2, 2, 0)]:
        got, want = _both(monkeypatch, lambda: point_conv_plan(coords, shape, 2, kind, [k] * 3, [s] * 3,
                                                         [p] * 3, [1] * 3, None))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), kind


@pytest.mark.parametrize("kind", ["subm", "spconv", "transposed", "coarse"])
@pytest.mark.parametrize("bad,match", [
    (torch.tensor([[0, 1, 2, 3], [0, 12, 0, 0]]), r"coords\[1, 1\]"),
    (torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]]), "duplicate"),
    (torch.tensor([[0, 1, 2, 3], [5, 1, 2, 3]]), r"coords\[1, 0\]"),
])
def test_tensor_maps_leave_invalid_input_to_the_core(monkeypatch, kind, bad, match):
    kernel, stride, padding = ([3] * 3, [1] * 3, [0] * 3) if kind == "subm" else \
        ([3] * 3, [2] * 3, [1] * 3) if kind != "coarse" else ([2] * 3, [2] * 3, [0] * 3)
    monkeypatch.setenv(ENV, "1")
    with pytest.raises(ValueError, match=match):
        point_conv_plan(bad.int(), [12, 12, 12], 2, kind, kernel, stride, padding, [1] * 3, None)
