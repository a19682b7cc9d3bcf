"""TorchSparse 2.0's data model: SparseTensor (coords ``[N, 4]`` = x, y, z, batch: the batch
index LAST, as in TorchSparse up to 2.0), PointTensor and cat.

``cmaps`` (tensor stride -> coordinates) and ``kmaps`` (conv geometry -> kernel map) are
shared by every tensor a network derives from its input, as in TorchSparse: layers at one
stride with one geometry build their map once, and a transposed convolution finds the map and
the finer coordinates of the strided convolution it undoes there.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any, Dict, Tuple, Union

import torch


def make_ntuple(x, ndim: int, name: str = "value") -> Tuple[int, ...]:
    if isinstance(x, int):
        x = tuple(repeat(x, ndim))
    elif isinstance(x, (list, tuple)):
        x = tuple(int(e) for e in x)
    elif isinstance(x, torch.Tensor):
        x = tuple(x.reshape(-1).tolist())
    if not isinstance(x, tuple) or len(x) != ndim:
        raise ValueError(f"{name} must be an int or {ndim} ints; got {x!r}")
    return x


def check_coords(coords, feats, who: str = "SparseTensor", unbatched: bool = False) -> None:
    if not isinstance(coords, torch.Tensor) or not isinstance(feats, torch.Tensor):
        raise TypeError(f"{who}: coords and feats must be tensors")
    if coords.dim() != 2 or coords.shape[1] not in ((3, 4) if unbatched else (4,)):
        raise ValueError(f"{who}: coords must be [N, 4] (x, y, z, batch index last)"
                         f"{' or [N, 3] (one sample, before sparse_collate)' if unbatched else ''}"
                         f"; got {tuple(coords.shape)}")
    if feats.dim() != 2 or feats.shape[0] != coords.shape[0]:
        raise ValueError(f"{who}: feats must be [N, C] with N = {coords.shape[0]} (one row "
                         f"per coords row); got {tuple(feats.shape)}")


class SparseTensor:
    """``feats [N, C]`` at integer ``coords [N, 4]`` (x, y, z, batch) of tensor `stride`."""

    def __init__(self, feats: torch.Tensor, coords: torch.Tensor,
                 stride: Union[int, Tuple[int, ...]] = 1) -> None:
        check_coords(coords, feats, unbatched=True)
        if coords.dtype.is_floating_point or coords.dtype.is_complex or \
                coords.dtype == torch.bool:
            raise TypeError(f"SparseTensor: coords must hold integers; got {coords.dtype}")
        self.feats = feats
        self.coords = coords
        self.stride = make_ntuple(stride, 3, "stride")
        if any(s < 1 for s in self.stride):
            raise ValueError(f"SparseTensor: stride must be >= 1; got {self.stride}")
        self.cmaps: Dict[Tuple[int, ...], torch.Tensor] = {}
        self.kmaps: Dict[Tuple[Any, ...], Any] = {}

    @property
    def F(self) -> torch.Tensor:
        return self.feats

    @F.setter
    def F(self, feats: torch.Tensor) -> None:
        self.feats = feats

    @property
    def C(self) -> torch.Tensor:
        return self.coords

    @C.setter
    def C(self, coords: torch.Tensor) -> None:
        self.coords = coords

    @property
    def s(self) -> Tuple[int, ...]:
        return self.stride

    @s.setter
    def s(self, stride) -> None:
        self.stride = make_ntuple(stride, 3, "stride")

    def _derive(self, feats: torch.Tensor, coords=None, stride=None) -> "SparseTensor":
        out = SparseTensor(feats, self.coords if coords is None else coords,
                           self.stride if stride is None else stride)
        out.cmaps, out.kmaps = self.cmaps, self.kmaps
        return out

    def cpu(self):
        self.coords, self.feats = self.coords.cpu(), self.feats.cpu()
        return self

    def detach(self):
        self.coords, self.feats = self.coords.detach(), self.feats.detach()
        return self

    def half(self):
        self.feats = self.feats.half()
        return self

    def to(self, device, non_blocking: bool = True):
        self.coords = self.coords.to(device, non_blocking=non_blocking)
        self.feats = self.feats.to(device, non_blocking=non_blocking)
        return self

    def __add__(self, other: "SparseTensor") -> "SparseTensor":
        if not isinstance(other, SparseTensor) or other.feats.shape != self.feats.shape:
            raise ValueError("SparseTensor + : both operands must be SparseTensors with feats "
                             "of one shape (the same coords)")
        return self._derive(self.feats + other.feats)

    def __repr__(self) -> str:
        return f"SparseTensor(feats={tuple(self.feats.shape)}, stride={self.stride})"


class PointTensor:
    """Points (SPVCNN): ``F [P, C]`` at float ``C [P, 4]`` (x, y, z, batch), with the
    point-voxel maps of each stride cached in ``idx_query`` / ``weights`` /
    ``additional_features``."""

    def __init__(self, feats, coords, idx_query=None, weights=None):
        check_coords(coords, feats, "PointTensor")
        self.F = feats
        self.C = coords
        self.idx_query = idx_query if idx_query is not None else {}
        self.weights = weights if weights is not None else {}
        self.additional_features = {"idx_query": {}, "counts": {}}

    def detach(self):
        self.F, self.C = self.F.detach(), self.C.detach()
        return self

    def to(self, device, non_blocking: bool = True):
        self.F = self.F.to(device, non_blocking=non_blocking)
        self.C = self.C.to(device, non_blocking=non_blocking)
        return self

    def __add__(self, other: "PointTensor") -> "PointTensor":
        out = PointTensor(self.F + other.F, self.C, self.idx_query, self.weights)
        out.additional_features = self.additional_features
        return out


def cat(inputs) -> SparseTensor:
    """Feats of sparse tensors on the same coords, concatenated along channels."""
    inputs = list(inputs)
    if not inputs or not all(isinstance(t, SparseTensor) for t in inputs):
        raise TypeError("cat: inputs must be a non-empty list of SparseTensors")
    for i, t in enumerate(inputs):
        if t.coords.shape[0] != inputs[0].coords.shape[0] or t.stride != inputs[0].stride:
            raise ValueError(f"cat: inputs[{i}] has {t.coords.shape[0]} sites at stride "
                             f"{t.stride}, inputs[0] {inputs[0].coords.shape[0]} at "
                             f"{inputs[0].stride}; all must share coords")
    return inputs[0]._derive(torch.cat([t.feats for t in inputs], 1))
