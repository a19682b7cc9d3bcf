"""ME's batching helpers (``MinkowskiEngine.utils``)."""

from __future__ import annotations

from typing import Sequence

import torch


def batched_coordinates(coords: Sequence[torch.Tensor], dtype: torch.dtype = torch.int32,
                        device=None) -> torch.Tensor:
    """A list of ``[N_i, D]`` coordinate tensors -> ``[sum N_i, 1 + D]`` with the list index
    as the batch column (first)."""
    if not isinstance(coords, (list, tuple)) or not coords:
        raise ValueError("batched_coordinates: coords must be a non-empty list of [N_i, D] "
                         "tensors")
    dims = {torch.as_tensor(c).shape[1] if torch.as_tensor(c).dim() == 2 else -1
            for c in coords}
    if len(dims) != 1 or -1 in dims:
        raise ValueError(f"batched_coordinates: every element must be [N_i, D] with one D; "
                         f"got shapes {[tuple(torch.as_tensor(c).shape) for c in coords]}")
    parts = []
    for b, c in enumerate(coords):
        c = torch.as_tensor(c)
        if c.dtype.is_floating_point:
            c = torch.floor(c)
        parts.append(torch.cat([torch.full((c.shape[0], 1), b, dtype=torch.long),
                                c.long().cpu()], 1))
    out = torch.cat(parts).to(dtype)
    return out if device is None else out.to(device)


def sparse_collate(coords, feats, labels=None, dtype: torch.dtype = torch.int32, device=None):
    """``(batched coordinates, concatenated features[, concatenated labels])``."""
    if len(coords) != len(feats) or (labels is not None and len(labels) != len(coords)):
        raise ValueError("sparse_collate: coords, feats (and labels) must be lists of one "
                         "length")
    c = batched_coordinates(list(coords), dtype=dtype, device=device)
    f = torch.cat([torch.as_tensor(x) for x in feats])
    if labels is None:
        return c, f
    return c, f, torch.cat([torch.as_tensor(x) for x in labels])
