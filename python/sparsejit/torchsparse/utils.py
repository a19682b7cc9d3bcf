"""TorchSparse 2.0's data helpers (``torchsparse.utils.quantize`` / ``collate``)."""

from __future__ import annotations

import sys
from itertools import repeat
from typing import Any, List

import numpy as np
import torch

from sparsejit.torchsparse.tensor import SparseTensor

__all__ = ["sparse_quantize", "sparse_collate", "sparse_collate_fn"]


def sparse_quantize(coords, voxel_size=1, *, return_index: bool = False,
                    return_inverse: bool = False):
    """``floor(coords / voxel_size)`` with duplicates removed (numpy in, numpy out, as
    TorchSparse): the kept rows are each voxel's first point, ordered by voxel; `indices`
    picks them from the input, `inverse` maps every input row to its voxel."""
    if isinstance(voxel_size, (int, float)):
        voxel_size = tuple(repeat(voxel_size, 3))
    voxel_size = np.asarray(voxel_size, dtype=np.float64)
    coords = np.asarray(coords)
    if coords.ndim != 2 or coords.shape[1] != voxel_size.shape[0]:
        raise ValueError(f"sparse_quantize: coords must be [N, {voxel_size.shape[0]}] (one "
                         f"voxel_size per column); got {coords.shape}")
    if not np.all(voxel_size > 0):
        raise ValueError(f"sparse_quantize: voxel_size must be > 0; got {voxel_size.tolist()}")
    cells = np.floor(coords / voxel_size).astype(np.int32)
    _, indices, inverse = np.unique(cells, axis=0, return_index=True, return_inverse=True)
    out = [cells[indices]]
    if return_index:
        out.append(indices)
    if return_inverse:
        out.append(inverse.reshape(-1))
    return out[0] if len(out) == 1 else out


def sparse_collate(inputs: List[SparseTensor]) -> SparseTensor:
    """Sparse tensors (coords ``[N_i, 3]``, no batch column) -> one batch: the list index
    appended as the batch column."""
    if not inputs:
        raise ValueError("sparse_collate: inputs is empty")
    stride = inputs[0].stride
    coords, feats = [], []
    for k, x in enumerate(inputs):
        c = torch.as_tensor(x.coords)
        if c.dim() != 2 or c.shape[1] != 3:
            raise ValueError(f"sparse_collate: inputs[{k}].coords must be [N, 3] (x, y, z); "
                             f"got {tuple(c.shape)}")
        if x.stride != stride:
            raise ValueError(f"sparse_collate: inputs[{k}] has stride {x.stride}, inputs[0] "
                             f"{stride}")
        coords.append(torch.cat([c.int(), torch.full((c.shape[0], 1), k, dtype=torch.int32)],
                                1))
        feats.append(torch.as_tensor(x.feats))
    return SparseTensor(torch.cat(feats), torch.cat(coords), stride)


def sparse_collate_fn(inputs: List[Any]) -> Any:
    """A DataLoader collate_fn: dicts of samples -> dicts of batches (SparseTensors through
    sparse_collate, arrays and tensors stacked, anything else listed)."""
    if not inputs or not isinstance(inputs[0], dict):
        return inputs
    out = {}
    for name in inputs[0]:
        vals = [x[name] for x in inputs]
        if isinstance(vals[0], dict):
            out[name] = sparse_collate_fn(vals)
        elif isinstance(vals[0], np.ndarray):
            out[name] = torch.stack([torch.as_tensor(v) for v in vals])
        elif isinstance(vals[0], torch.Tensor):
            out[name] = torch.stack(vals)
        elif isinstance(vals[0], SparseTensor):
            out[name] = sparse_collate(vals)
        else:
            out[name] = vals
    return out


# TorchSparse's module paths: torchsparse.utils.quantize, torchsparse.utils.collate.
sys.modules[__name__ + ".quantize"] = sys.modules[__name__]
sys.modules[__name__ + ".collate"] = sys.modules[__name__]
