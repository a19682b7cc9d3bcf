"""Point clouds: sj.SparseTensor (validated voxel coordinates + features) and sj.voxelize."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from sparsejit.families.point_conv.spconv.core import SparseConvTensor


def _first_bad(mask: torch.Tensor) -> int:
    return int(mask.nonzero()[0, 0])


def validate_coords(coords: torch.Tensor, spatial_shape: Sequence[int], batch_size: int,
                    name: str = "coords") -> None:
    """Errors name the argument, row, column and value: integer dtype, width, negative or
    out-of-grid coordinates, batch ids outside [0, batch_size), duplicate sites."""
    dims = len(spatial_shape)
    if coords.dim() != 2 or coords.shape[1] != dims + 1:
        raise ValueError(f"{name} must be [N, 1 + {dims}] (batch index first); got shape "
                         f"{tuple(coords.shape)}")
    if coords.shape[0] == 0:
        return
    c = coords.long()
    bad = (c[:, 0] < 0) | (c[:, 0] >= batch_size)
    if bool(bad.any()):
        r = _first_bad(bad)
        raise ValueError(f"{name}[{r}, 0] = {int(c[r, 0])}: batch index outside "
                         f"[0, batch_size = {batch_size})")
    for d in range(dims):
        bad = (c[:, 1 + d] < 0) | (c[:, 1 + d] >= spatial_shape[d])
        if bool(bad.any()):
            r = _first_bad(bad)
            raise ValueError(f"{name}[{r}, {1 + d}] = {int(c[r, 1 + d])}: coordinate outside "
                             f"[0, spatial_shape[{d}] = {spatial_shape[d]})")
    key = c[:, 0]
    for d in range(dims):
        key = key * int(spatial_shape[d]) + c[:, 1 + d]
    order = torch.argsort(key, stable=True)
    same = key[order][1:] == key[order][:-1]
    if bool(same.any()):
        i = _first_bad(same)
        a, b = int(order[i]), int(order[i + 1])
        raise ValueError(f"{name}: rows {a} and {b} are the same site {c[a].tolist()} "
                         f"(duplicates; merge them with sj.voxelize)")


class SparseTensor(SparseConvTensor):
    """``feats [N, C]`` at ``coords [N, 1 + D]`` (integers, batch index first, D = 1..4),
    validated once here. `spatial_shape` defaults to the largest coordinate + 1 per axis,
    `batch_size` to the largest batch index + 1. The spconv modules accept it directly."""

    def __init__(self, coords: torch.Tensor, feats: torch.Tensor,
                 spatial_shape: Optional[Sequence[int]] = None,
                 batch_size: Optional[int] = None):
        if not isinstance(coords, torch.Tensor) or not isinstance(feats, torch.Tensor):
            raise TypeError("SparseTensor: coords and feats must be tensors")
        if coords.dtype.is_floating_point or coords.dtype.is_complex or \
                coords.dtype == torch.bool:
            raise TypeError(f"SparseTensor: coords must hold integers; got {coords.dtype}")
        if coords.dim() != 2 or not 2 <= coords.shape[1] <= 5:
            raise ValueError(f"SparseTensor: coords must be [N, 1 + D] with D in 1..4 (batch "
                             f"index first); got shape {tuple(coords.shape)}")
        if feats.dim() != 2 or feats.shape[0] != coords.shape[0]:
            raise ValueError(f"SparseTensor: feats must be [N, C] with N = {coords.shape[0]} "
                             f"(one row per coordinate row); got shape {tuple(feats.shape)}")
        dims = coords.shape[1] - 1
        n = coords.shape[0]
        if spatial_shape is None:
            spatial_shape = (coords[:, 1:].max(0).values + 1).tolist() if n else [1] * dims
        if batch_size is None:
            batch_size = int(coords[:, 0].max()) + 1 if n else 1
        if len(spatial_shape) != dims:
            raise ValueError(f"SparseTensor: spatial_shape {list(spatial_shape)} must have "
                             f"{dims} axes (coords has {dims + 1} columns)")
        if coords.dtype != torch.int32 and n:
            lo, hi = int(coords.min()), int(coords.max())
            if lo < -2**31 or hi >= 2**31:
                raise ValueError(f"SparseTensor: coords hold values outside int32 ({lo}, {hi})")
        validate_coords(coords, list(spatial_shape), int(batch_size))
        super().__init__(feats, coords, spatial_shape, batch_size)

    @property
    def coords(self) -> torch.Tensor:
        return self.indices

    @property
    def feats(self) -> torch.Tensor:
        return self.features


def voxelize(points: torch.Tensor, voxel_size: Union[float, Sequence[float]],
             point_range: Optional[Sequence[float]] = None, reduce: str = "mean",
             batch: Optional[torch.Tensor] = None
             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw points ``[P, 3 + C]`` -> ``(coords [V, 4] int32 (batch, x, y, z), feats [V, 3 + C],
    point_to_voxel [P])``. Voxel (i, j, k) holds the points with
    ``floor((xyz - lo) / voxel_size) = (i, j, k)``; `lo` is ``point_range[:3]`` (points outside
    ``point_range = (x0, y0, z0, x1, y1, z1)`` are dropped, index -1) or the smallest
    coordinate. Features are the ``reduce`` ("mean", "sum", "max") of the voxel's point rows;
    `batch` ``[P]`` gives each point's cloud. Voxels come sorted by (batch, x, y, z)."""
    if not isinstance(points, torch.Tensor) or points.dim() != 2 or points.shape[1] < 3 or \
            not points.dtype.is_floating_point:
        raise ValueError("voxelize: points must be a floating [P, 3 + C] tensor; got "
                         f"{tuple(points.shape) if isinstance(points, torch.Tensor) else points}")
    if reduce not in ("mean", "sum", "max"):
        raise ValueError(f"voxelize: reduce must be 'mean', 'sum' or 'max'; got {reduce!r}")
    p = points.shape[0]
    vs = torch.as_tensor(voxel_size, dtype=torch.float64).reshape(-1)
    if vs.numel() not in (1, 3) or not bool((vs > 0).all()):  # NaN fails `> 0` too
        raise ValueError(f"voxelize: voxel_size must be one or three values > 0; got "
                         f"{vs.tolist()}")
    vs = vs.expand(3)
    if batch is None:
        batch = torch.zeros(p, dtype=torch.long, device=points.device)
    elif not isinstance(batch, torch.Tensor) or batch.dim() != 1 or batch.shape[0] != p or \
            batch.dtype.is_floating_point or batch.dtype.is_complex or batch.dtype == torch.bool:
        raise ValueError(f"voxelize: batch must be an integer [P] = [{p}] tensor")
    elif p and (int(batch.min()) < 0 or int(batch.max()) >= 2**31):
        raise ValueError(f"voxelize: batch ids must lie in [0, 2^31); got {int(batch.min())} "
                         f"to {int(batch.max())}")
    xyz = points[:, :3].double()
    keep = torch.isfinite(xyz).all(1)
    if point_range is not None:
        r = torch.as_tensor(point_range, dtype=torch.float64)
        if r.numel() != 6:
            raise ValueError(f"voxelize: point_range must be (x0, y0, z0, x1, y1, z1); got "
                             f"{list(point_range)}")
        lo, hi = r[:3], r[3:]
        keep &= ((xyz >= lo) & (xyz < hi)).all(1)
    else:
        lo = xyz[keep].min(0).values if bool(keep.any()) else torch.zeros(3, dtype=torch.float64)
    cells = torch.floor((xyz - lo) / vs)
    # Voxel coordinates are int32 (and the keys below products of extents): a point that far
    # from `lo` would wrap around into another voxel.
    far = keep & (cells >= 2**31 - 1).any(1)
    if bool(far.any()):
        i = int(far.nonzero()[0, 0])
        raise ValueError(f"voxelize: points[{i}] = {points[i, :3].tolist()} lies "
                         f"{cells[i].tolist()} voxels from {lo.tolist()}: voxel coordinates "
                         f"must stay below 2^31 - 1 (larger voxel_size or a point_range)")
    grid = cells.long()
    point_to_voxel = torch.full((p,), -1, dtype=torch.long, device=points.device)
    idx = keep.nonzero()[:, 0]
    if idx.numel() == 0:
        return (torch.empty(0, 4, dtype=torch.int32), points.new_empty(0, points.shape[1]),
                point_to_voxel)
    g = grid[idx]
    b = batch[idx].long()
    ext = g.max(0).values + 1
    if (int(b.max()) + 1) * int(ext[0]) * int(ext[1]) * int(ext[2]) < 2**62:
        key = ((b * ext[0] + g[:, 0]) * ext[1] + g[:, 1]) * ext[2] + g[:, 2]
        uniq, inverse = torch.unique(key, return_inverse=True)
        v = uniq.shape[0]
        coords = torch.empty(v, 4, dtype=torch.long)
        rest = uniq
        for col, e in ((3, ext[2]), (2, ext[1]), (1, ext[0])):
            coords[:, col] = rest % e
            rest = rest // e
        coords[:, 0] = rest
    else:  # the packed key would wrap around (distinct voxels, one key): unique rows
        coords, inverse = torch.unique(torch.cat([b[:, None], g], 1), dim=0,
                                       return_inverse=True)
        v = coords.shape[0]
    feats_in = points[idx]
    c = points.shape[1]
    if reduce == "max":
        feats = feats_in.new_full((v, c), float("-inf")).scatter_reduce(
            0, inverse[:, None].expand(-1, c), feats_in, "amax", include_self=True)
    else:
        feats = feats_in.new_zeros(v, c).index_add_(0, inverse, feats_in)
        if reduce == "mean":
            counts = torch.bincount(inverse, minlength=v).to(feats.dtype)
            feats = feats / counts[:, None]
    point_to_voxel[idx] = inverse
    return coords.int(), feats, point_to_voxel
