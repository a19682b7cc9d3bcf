"""ME's TensorField: features at continuous coordinates (one row per point), turned into a
SparseTensor by ``sparse()`` and brought back to the points by ``SparseTensor.slice``."""

from __future__ import annotations

from typing import Optional

import torch

from sparsejit.minkowski.tensor import (CoordinateManager, SparseTensor,
                                        SparseTensorQuantizationMode, _int_list)


def _shape(t) -> str:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def _packed_lookup(query: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Row of each `query` row (int64 ``[M, W]``) in `ref` (distinct rows ``[N, W]``), -1
    where absent."""
    if query.shape[0] == 0 or ref.shape[0] == 0:
        return torch.full((query.shape[0],), -1, dtype=torch.long, device=query.device)
    both = torch.cat([query, ref])
    lo = both.amin(0)
    ext = (both.amax(0) - lo + 1).tolist()

    def pack(c):
        key = c[:, 0] - lo[0]
        for d in range(1, c.shape[1]):
            key = key * ext[d] + (c[:, d] - lo[d])
        return key

    keys, order = torch.sort(pack(ref))
    q = pack(query)
    pos = torch.searchsorted(keys, q).clamp(max=keys.numel() - 1)
    return torch.where(keys[pos] == q, order[pos], torch.full_like(q, -1))


class TensorField:
    """``features [P, C]`` at float ``coordinates [P, 1 + D]`` (batch first)."""

    def __init__(self, features: torch.Tensor, coordinates: torch.Tensor,
                 tensor_stride=1, coordinate_field_map_key=None,
                 coordinate_manager: Optional[CoordinateManager] = None,
                 quantization_mode: SparseTensorQuantizationMode =
                 SparseTensorQuantizationMode.UNWEIGHTED_AVERAGE, allocator_type=None,
                 minkowski_algorithm=None, requires_grad=None, device=None):
        if not isinstance(features, torch.Tensor) or features.dim() != 2:
            raise ValueError("TensorField: features must be a [P, C] tensor")
        if not isinstance(coordinates, torch.Tensor) or coordinates.dim() != 2 or \
                not 2 <= coordinates.shape[1] <= 5 or coordinates.shape[0] != features.shape[0]:
            raise ValueError(f"TensorField: coordinates must be [P, 1 + D] (D = 1 to 4) with "
                             f"P = {features.shape[0]} rows; got "
                             f"{_shape(coordinates)}")
        if coordinates.numel() and not bool(torch.isfinite(coordinates.double()).all()):
            raise ValueError("TensorField: coordinates hold NaN or infinity")
        if not isinstance(quantization_mode, SparseTensorQuantizationMode):
            raise TypeError("TensorField: quantization_mode must be a "
                            "SparseTensorQuantizationMode")
        if device is not None:
            features, coordinates = features.to(device), coordinates.to(device)
        if requires_grad is not None:
            features.requires_grad_(requires_grad)
        dims = coordinates.shape[1] - 1
        self._F, self._C = features, coordinates
        self.tensor_stride = _int_list(tensor_stride, dims, "tensor_stride")
        self.quantization_mode = quantization_mode
        self.coordinate_manager = coordinate_manager if coordinate_manager is not None else \
            CoordinateManager(D=dims)

    @property
    def F(self) -> torch.Tensor:
        return self._F

    features = F

    @property
    def C(self) -> torch.Tensor:
        return self._C

    coordinates = C

    @property
    def D(self) -> int:
        return self._C.shape[1] - 1

    def __len__(self) -> int:
        return self._F.shape[0]

    def __repr__(self) -> str:
        return f"TensorField(features={tuple(self._F.shape)}, D={self.D})"

    def _cells(self, tensor_stride) -> torch.Tensor:
        ts = torch.tensor(tensor_stride, dtype=torch.float64, device=self._C.device)
        c = self._C.double()
        return torch.cat([torch.round(c[:, :1]), torch.floor(c[:, 1:] / ts) * ts], 1).long()

    def _features_from(self, x: SparseTensor) -> "TensorField":
        """What ``x.slice(self)`` returns (SparseTensor.slice calls it)."""
        return slice_field(x, self)

    def sparse(self, tensor_stride=1, coordinate_map_key=None,
               quantization_mode: Optional[SparseTensorQuantizationMode] = None
               ) -> SparseTensor:
        """The SparseTensor of the cells ``floor(c / ts) * ts`` (rows merged by
        `quantization_mode`, this field's by default), in the field's manager."""
        if coordinate_map_key is not None:
            raise NotImplementedError("TensorField.sparse: coordinate_map_key is not supported")
        ts = _int_list(tensor_stride, self.D, "tensor_stride")
        mode = self.quantization_mode if quantization_mode is None else quantization_mode
        return SparseTensor(self._F, coordinates=self._cells(ts).int(), tensor_stride=ts,
                            coordinate_manager=self.coordinate_manager,
                            quantization_mode=mode)


def slice_field(x: SparseTensor, field: TensorField) -> TensorField:
    """Each point of `field` gets the features of the site of `x` holding it (the cell
    ``floor(c / ts) * ts`` at x's tensor stride)."""
    if not isinstance(field, TensorField):
        raise TypeError(f"SparseTensor.slice: X must be a TensorField; got "
                        f"{type(field).__name__}")
    if field.D != x.D:
        raise ValueError(f"SparseTensor.slice: the field is {field.D}-D, the tensor {x.D}-D")
    rows = _packed_lookup(field._cells(x.tensor_stride), x.C.long())
    if bool((rows < 0).any()):
        p = int((rows < 0).nonzero()[0, 0])
        raise ValueError(f"SparseTensor.slice: point {p} ({field.C[p].tolist()}) lies in no "
                         f"site of the tensor (tensor_stride {x.tensor_stride})")
    return TensorField(x.F[rows], field.C, coordinate_manager=x.coordinate_manager,
                       quantization_mode=field.quantization_mode)
