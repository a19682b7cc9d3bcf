"""SPVCNN's point-voxel helpers (its ``core/models/utils.py``) on ``sparsejit.torchsparse``:
points as a PointTensor (float coords x, y, z, batch), voxels as a SparseTensor.

- ``initial_voxelize(z, init_res, after_res)``: the voxels of ``floor(xyz * init_res /
  after_res)``, each the mean of its points' features (voxels sorted by batch, x, y, z);
- ``point_to_voxel(x, z)``: each voxel of `x` gets the mean of the features of the points in
  it (``floor(xyz / s) * s``);
- ``voxel_to_point(x, z, nearest=False)``: each point gets the trilinear interpolation of the
  8 voxels around it (missing voxels drop out and the weights are renormalised); ``nearest``
  keeps only the lower corner's weight (SPVCNN's behaviour, unnormalised).

The maps are cached on `z` per stride, as SPVCNN does.
"""

from __future__ import annotations

import torch

from sparsejit.torchsparse.nn import functional as F
from sparsejit.torchsparse.tensor import PointTensor, SparseTensor

__all__ = ["initial_voxelize", "point_to_voxel", "voxel_to_point"]


def _check(z, who: str) -> None:
    if not isinstance(z, PointTensor):
        raise TypeError(f"{who}: z must be a sparsejit.torchsparse.PointTensor; got "
                        f"{type(z).__name__}")
    if not z.C.dtype.is_floating_point:
        raise TypeError(f"{who}: z.C must be float (x, y, z, batch); got {z.C.dtype}")


def initial_voxelize(z: PointTensor, init_res: float, after_res: float) -> SparseTensor:
    _check(z, "initial_voxelize")
    if not (after_res > 0 and init_res > 0):
        raise ValueError(f"initial_voxelize: init_res and after_res must be > 0; got "
                         f"{init_res}, {after_res}")
    new_float_coord = torch.cat([(z.C[:, :3] * init_res) / after_res, z.C[:, -1:]], 1)
    cells = torch.floor(new_float_coord).int()
    pc_hash = F.sphash(cells)
    sparse_hash, idx_query = torch.unique(pc_hash, return_inverse=True)
    counts = F.spcount(idx_query, sparse_hash.numel())
    first = torch.full((sparse_hash.numel(),), cells.shape[0], dtype=torch.long)
    first.scatter_reduce_(0, idx_query, torch.arange(cells.shape[0]), "amin")
    coords = cells[first]
    # sphash keys sort by (batch, x, y, z): the voxels come in that order.
    feats = F.spvoxelize(z.F, idx_query, counts)
    out = SparseTensor(feats, coords, 1)
    out.cmaps.setdefault(out.stride, out.coords)
    z.additional_features["idx_query"][(1, 1, 1)] = idx_query
    z.additional_features["counts"][(1, 1, 1)] = counts
    z.C = new_float_coord
    return out


def _cell_coords(z: PointTensor, s: int) -> torch.Tensor:
    return torch.cat([torch.floor(z.C[:, :3] / s).int() * s, z.C[:, -1:].int()], 1)


def point_to_voxel(x: SparseTensor, z: PointTensor) -> SparseTensor:
    _check(z, "point_to_voxel")
    idx = z.additional_features["idx_query"].get(x.s)
    if idx is None:
        idx = F.sphashquery(F.sphash(_cell_coords(z, x.s[0])), F.sphash(x.C))
        counts = F.spcount(idx, x.C.shape[0])
        z.additional_features["idx_query"][x.s] = idx
        z.additional_features["counts"][x.s] = counts
    counts = z.additional_features["counts"][x.s]
    return x._derive(F.spvoxelize(z.F, idx, counts))


def _corner_offsets(s: int, device) -> torch.Tensor:
    """The 8 corners {0, s}^3, z fastest (TorchSparse's even-kernel order)."""
    a = torch.tensor([0, s], dtype=torch.int32, device=device)
    return torch.cartesian_prod(a, a, a)


def voxel_to_point(x: SparseTensor, z: PointTensor, nearest: bool = False) -> PointTensor:
    _check(z, "voxel_to_point")
    if z.idx_query.get(x.s) is None or z.weights.get(x.s) is None:
        old_hash = F.sphash(_cell_coords(z, x.s[0]), _corner_offsets(x.s[0], z.F.device))
        idx_query = F.sphashquery(old_hash, F.sphash(x.C))          # [8, P]
        weights = F.calc_ti_weights(z.C, idx_query, scale=x.s[0]).transpose(0, 1).contiguous()
        idx_query = idx_query.transpose(0, 1).contiguous()
        if nearest:
            weights[:, 1:] = 0.0
            idx_query[:, 1:] = -1
        z.idx_query[x.s] = idx_query
        z.weights[x.s] = weights
    feats = F.spdevoxelize(x.F, z.idx_query[x.s], z.weights[x.s])
    out = PointTensor(feats, z.C, idx_query=z.idx_query, weights=z.weights)
    out.additional_features = z.additional_features
    return out
