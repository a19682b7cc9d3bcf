"""MinkowskiEngine 0.5's data model: SparseTensor, CoordinateManager, CoordinateMapKey.

A coordinate manager holds every coordinate set a network derives from its input (one per
tensor stride, as ME keys them: ``(tensor_stride, string_id)``) and the kernel maps between
them, so layers that convolve the same key with the same geometry share one map (and a
transposed convolution reuses the strided one it undoes, read backwards).
"""

from __future__ import annotations

import enum
import math
import warnings
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

from sparsejit.families.point_conv.lattice import lattice_plan, unique_rows

StrideType = Union[int, Sequence[int], torch.Tensor]


def _shape(t) -> str:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def _int_list(v: StrideType, dims: int, name: str) -> List[int]:
    if isinstance(v, torch.Tensor):
        v = v.reshape(-1).tolist()
    if isinstance(v, int):
        v = [v] * dims
    v = [int(e) for e in v]
    if len(v) != dims:
        raise ValueError(f"{name} must be an int or {dims} ints; got {v}")
    return v


class SparseTensorQuantizationMode(enum.Enum):
    """How rows sharing a coordinate are merged when a SparseTensor is created."""
    RANDOM_SUBSAMPLE = 0
    UNWEIGHTED_AVERAGE = 1
    UNWEIGHTED_SUM = 2
    NO_QUANTIZATION = 3


class CoordinateMapKey:
    """Names one coordinate set of a manager: ``(tensor_stride, string_id)``."""

    def __init__(self, tensor_stride, string_id: str = ""):
        self._stride = tuple(int(s) for s in tensor_stride)
        self._id = str(string_id)

    def get_tensor_stride(self) -> List[int]:
        return list(self._stride)

    def get_key(self) -> Tuple[List[int], str]:
        return list(self._stride), self._id

    def get_coordinate_size(self) -> int:
        return len(self._stride) + 1

    def __eq__(self, other) -> bool:
        return isinstance(other, CoordinateMapKey) and \
            (self._stride, self._id) == (other._stride, other._id)

    def __hash__(self) -> int:
        return hash((self._stride, self._id))

    def __repr__(self) -> str:
        return f"CoordinateMapKey(tensor_stride={list(self._stride)}, id={self._id!r})"


class CoordinateManager:
    """The coordinate sets (int32 ``[N, 1 + D]``, batch first, world units) of one network
    pass and the kernel maps between them (sparsejit plans)."""

    def __init__(self, D: int = 3, **_ignored):
        if not isinstance(D, int) or not 1 <= D <= 4:
            raise ValueError(f"CoordinateManager: D must be 1 to 4 spatial dimensions "
                             f"(sparsejit's kernel maps); got {D!r}")
        self.D = D
        self._coords: Dict[CoordinateMapKey, torch.Tensor] = {}
        self._plans: Dict[tuple, torch.Tensor] = {}
        self._serial = 0

    # ---- coordinate sets ----------------------------------------------------------------

    def _new_key(self, stride: Sequence[int], string_id: str = "") -> CoordinateMapKey:
        key = CoordinateMapKey(stride, string_id)
        while key in self._coords:  # ME adds a random suffix on a collision
            self._serial += 1
            key = CoordinateMapKey(stride, f"{string_id}_{self._serial}")
        return key

    def insert(self, coords: torch.Tensor, stride: Sequence[int], string_id: str = "",
               ) -> CoordinateMapKey:
        key = self._new_key(stride, string_id)
        self._coords[key] = coords
        return key

    def exists(self, key: CoordinateMapKey) -> bool:
        return key in self._coords

    def get_coordinates(self, key: CoordinateMapKey) -> torch.Tensor:
        if key not in self._coords:
            raise KeyError(f"{key} is not a coordinate set of this coordinate manager")
        return self._coords[key]

    def size(self, key: CoordinateMapKey) -> int:
        return int(self.get_coordinates(key).shape[0])

    def number_of_unique_batch_indices(self) -> int:
        batches = [c[:, 0] for c in self._coords.values() if c.shape[0]]
        return int(torch.unique(torch.cat(batches)).numel()) if batches else 0

    def stride_key(self, key: CoordinateMapKey, stride: Sequence[int],
                   kernel_size: Sequence[int], dilation: Sequence[int],
                   lower: Sequence[int]) -> CoordinateMapKey:
        """The key at ``tensor_stride * stride`` with the sites ``floor(c / ts') * ts'``,
        created on first use (its map for this geometry is built by the same call)."""
        ts = key.get_tensor_stride()
        out_ts = [t * s for t, s in zip(ts, stride)]
        out_key = CoordinateMapKey(out_ts, key.get_key()[1])
        if out_key not in self._coords:
            plan, out = lattice_plan(self._coords[key], ts, out_ts, kernel_size, dilation,
                                     lower)
            self._coords[out_key] = out
            self._plans[self._plan_key(key, out_key, kernel_size, dilation, lower)] = plan
        return out_key

    def transposed_key(self, key: CoordinateMapKey, stride: Sequence[int],
                       kernel_size: Sequence[int], dilation: Sequence[int],
                       lower: Sequence[int]) -> CoordinateMapKey:
        """The finer key at ``tensor_stride / stride``: the existing one (ME's default), else
        new sites: every coarse site plus each kernel offset at the finer stride."""
        ts = key.get_tensor_stride()
        if any(t % s for t, s in zip(ts, stride)):
            raise ValueError(f"MinkowskiConvolutionTranspose: stride {list(stride)} does not "
                             f"divide the input's tensor_stride {ts}")
        fine = [t // s for t, s in zip(ts, stride)]
        out_key = CoordinateMapKey(fine, "")
        if out_key in self._coords:
            return out_key
        c = self._coords[key].long()
        axes = [torch.arange(lw, lw + k, device=c.device) * d * f
                for lw, k, d, f in zip(lower, kernel_size, dilation, fine)]
        offsets = torch.cartesian_prod(*axes).reshape(-1, len(fine))
        cand = (c[:, None, 1:] + offsets[None]).reshape(-1, len(fine))
        batch = c[:, :1].expand(-1, offsets.shape[0]).reshape(-1, 1)
        self._coords[out_key] = unique_rows(torch.cat([batch, cand], 1)).int()
        return out_key

    # ---- kernel maps --------------------------------------------------------------------

    @staticmethod
    def _plan_key(in_key, out_key, kernel_size, dilation, lower) -> tuple:
        return (in_key, out_key, tuple(kernel_size), tuple(dilation), tuple(lower))

    def plan(self, in_key: CoordinateMapKey, out_key: CoordinateMapKey,
             kernel_size: Sequence[int], dilation: Sequence[int],
             lower: Sequence[int]) -> torch.Tensor:
        """The sparsejit plan from `in_key` (finer or equal stride) to `out_key`, built once
        (offsets numbered as ME's kernel)."""
        pk = self._plan_key(in_key, out_key, kernel_size, dilation, lower)
        plan = self._plans.get(pk)
        if plan is None:
            plan, _ = lattice_plan(self._coords[in_key], in_key.get_tensor_stride(),
                                   out_key.get_tensor_stride(), kernel_size, dilation, lower,
                                   out_coords=None if in_key == out_key else
                                   self._coords[out_key], same_sites=in_key == out_key)
            self._plans[pk] = plan
        return plan

    # ---- ME's public manager methods ----------------------------------------------------

    def insert_and_map(self, coordinates: torch.Tensor, tensor_stride=1, string_id: str = ""
                       ) -> Tuple[CoordinateMapKey, Tuple[torch.Tensor, torch.Tensor]]:
        """A new coordinate set from `coordinates` (duplicates merged): ``(key,
        (unique_map, inverse_map))`` with ``coordinates[unique_map]`` its rows and
        ``coordinates[unique_map][inverse_map] == coordinates``."""
        c = SparseTensor._check_coordinates(coordinates, coordinates[:, :0], tensor_stride)
        if c.shape[1] - 1 != self.D:
            raise ValueError(f"insert_and_map: coordinates have {c.shape[1] - 1} spatial "
                             f"columns but the manager is {self.D}-D")
        first, inverse = _unique_map(c)
        key = self.insert(c[first], _int_list(tensor_stride, self.D, "tensor_stride"),
                          string_id)
        return key, (first, inverse)

    def stride(self, coordinate_map_key: CoordinateMapKey, stride, string_id: str = ""
               ) -> CoordinateMapKey:
        """The key at ``tensor_stride * stride`` (sites ``floor(c / ts') * ts'``)."""
        s = _int_list(stride, self.D, "stride")
        return self.stride_key(coordinate_map_key, s, s, [1] * self.D, [0] * self.D)

    def kernel_map(self, in_key: CoordinateMapKey, out_key: CoordinateMapKey, stride=1,
                   kernel_size=3, dilation=1, region_type=None, region_offset=None,
                   is_transpose: bool = False, is_pool: bool = False) -> dict:
        """``{kernel_index: IntTensor [2, M]}`` (input rows, output rows) as ME returns it."""
        from sparsejit.families.point_conv.plan import plan_pairs
        ks = _int_list(kernel_size, self.D, "kernel_size")
        st = _int_list(stride, self.D, "stride")
        dil = _int_list(dilation, self.D, "dilation")
        lower = [0] * self.D if is_pool and ks == st else \
            [0 if k % 2 == 0 else -(k // 2) for k in ks]
        fine, coarse = (out_key, in_key) if is_transpose else (in_key, out_key)
        ptr, i_in, i_out = plan_pairs(self.plan(fine, coarse, ks, dil, lower))
        if is_transpose:
            i_in, i_out = i_out, i_in
        return {k: torch.stack([i_in[ptr[k]:ptr[k + 1]], i_out[ptr[k]:ptr[k + 1]]]).int()
                for k in range(ptr.numel() - 1) if ptr[k + 1] > ptr[k]}

    def __repr__(self) -> str:
        return f"CoordinateManager(D={self.D}, keys={list(self._coords)})"


def _unique_map(coordinates: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(first, inverse)``: the first row of each distinct coordinate, in input order, and
    each row's index among them."""
    n = coordinates.shape[0]
    if n == 0:
        e = torch.zeros(0, dtype=torch.long, device=coordinates.device)
        return e, e
    c = coordinates.long()
    lo = c.amin(0)
    ext = (c.amax(0) - lo + 1).tolist()
    if math.prod(ext) < 2**62:  # one packed int64 key per row: a 1-D unique (a sort)
        key = c[:, 0] - lo[0]
        for d in range(1, c.shape[1]):
            key = key * ext[d] + (c[:, d] - lo[d])
        uniq, inverse = torch.unique(key, return_inverse=True)
    else:
        uniq, inverse = torch.unique(c, dim=0, return_inverse=True)
    if uniq.shape[0] == n:
        ar = torch.arange(n, device=coordinates.device)
        return ar, ar
    first = torch.full((uniq.shape[0],), n, dtype=torch.long, device=coordinates.device)
    first.scatter_reduce_(0, inverse, torch.arange(n, device=coordinates.device), "amin")
    order = torch.argsort(first)            # unique sites in first-occurrence order
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    return first[order], rank[inverse]


def _quantize(coordinates: torch.Tensor, features: torch.Tensor,
              mode: SparseTensorQuantizationMode) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rows sharing a coordinate merged (first-occurrence order); identity when unique."""
    n = coordinates.shape[0]
    if n == 0 or mode == SparseTensorQuantizationMode.NO_QUANTIZATION:
        return coordinates, features
    first, row = _unique_map(coordinates)
    if first.numel() == n:
        return coordinates, features
    coords = coordinates[first]
    if mode == SparseTensorQuantizationMode.RANDOM_SUBSAMPLE:
        return coords, features[first]
    summed = features.new_zeros(first.numel(), features.shape[1]).index_add(0, row, features)
    if mode == SparseTensorQuantizationMode.UNWEIGHTED_AVERAGE:
        counts = torch.bincount(row, minlength=first.numel()).to(features.dtype)
        summed = summed / counts[:, None]
    return coords, summed


class SparseTensor:
    """``MinkowskiEngine.SparseTensor``: features ``[N, C]`` at integer coordinates
    ``[N, 1 + D]`` (batch index first) of tensor stride `tensor_stride`, in a coordinate
    manager. Either `coordinates` or (`coordinate_map_key`, `coordinate_manager`)."""

    def __init__(self, features: torch.Tensor, coordinates: Optional[torch.Tensor] = None,
                 tensor_stride: StrideType = 1,
                 coordinate_map_key: Optional[CoordinateMapKey] = None,
                 coordinate_manager: Optional[CoordinateManager] = None,
                 quantization_mode: SparseTensorQuantizationMode =
                 SparseTensorQuantizationMode.RANDOM_SUBSAMPLE,
                 allocator_type=None, minkowski_algorithm=None, requires_grad=None,
                 device=None):
        if not isinstance(features, torch.Tensor) or features.dim() != 2:
            raise ValueError("SparseTensor: features must be a [N, C] tensor; got "
                             f"{_shape(features)}")
        if not isinstance(quantization_mode, SparseTensorQuantizationMode):
            raise TypeError(f"SparseTensor: quantization_mode must be a "
                            f"SparseTensorQuantizationMode; got {quantization_mode!r}")
        if coordinate_map_key is not None:
            if not isinstance(coordinate_map_key, CoordinateMapKey):
                raise TypeError("SparseTensor: coordinate_map_key must be a CoordinateMapKey")
            if coordinate_manager is None or coordinates is not None:
                raise ValueError("SparseTensor: coordinate_map_key needs coordinate_manager "
                                 "and no coordinates")
        if coordinate_manager is not None and not isinstance(coordinate_manager,
                                                             CoordinateManager):
            raise TypeError("SparseTensor: coordinate_manager must be a CoordinateManager")
        if coordinates is None and coordinate_map_key is None:
            raise ValueError("SparseTensor: give coordinates, or coordinate_map_key with "
                             "coordinate_manager")
        if device is not None:
            features = features.to(device)
        if coordinates is not None:
            coordinates = self._check_coordinates(coordinates, features, tensor_stride)
            dims = coordinates.shape[1] - 1
            if coordinate_manager is None:
                coordinate_manager = CoordinateManager(D=dims)
            elif coordinate_manager.D != dims:
                raise ValueError(f"SparseTensor: coordinates have {dims} spatial columns but "
                                 f"coordinate_manager is {coordinate_manager.D}-D")
            coordinates, features = _quantize(coordinates, features, quantization_mode)
            coordinate_map_key = coordinate_manager.insert(
                coordinates, _int_list(tensor_stride, dims, "tensor_stride"))
        elif not coordinate_manager.exists(coordinate_map_key):
            raise KeyError(f"SparseTensor: {coordinate_map_key} is not in coordinate_manager")
        elif coordinate_manager.size(coordinate_map_key) != features.shape[0]:
            raise ValueError(f"SparseTensor: features has {features.shape[0]} rows but "
                             f"{coordinate_map_key} holds "
                             f"{coordinate_manager.size(coordinate_map_key)} coordinates")
        if requires_grad is not None:
            features.requires_grad_(requires_grad)
        self._F = features
        self.coordinate_map_key = coordinate_map_key
        self._manager = coordinate_manager
        self.quantization_mode = quantization_mode

    @staticmethod
    def _check_coordinates(coordinates, features, tensor_stride) -> torch.Tensor:
        if not isinstance(coordinates, torch.Tensor) or coordinates.dim() != 2 or \
                not 2 <= coordinates.shape[1] <= 5:
            raise ValueError("SparseTensor: coordinates must be [N, 1 + D] (batch index "
                             "first, D = 1 to 4); got "
                             f"{_shape(coordinates)}")
        if coordinates.shape[0] != features.shape[0]:
            raise ValueError(f"SparseTensor: coordinates has {coordinates.shape[0]} rows but "
                             f"features has {features.shape[0]}")
        if coordinates.dtype.is_floating_point:
            if coordinates.numel() and not bool(torch.isfinite(coordinates).all()):
                raise ValueError("SparseTensor: coordinates hold NaN or infinity")
            warnings.warn("SparseTensor: coordinates implicitly converted to int32 (floor), "
                          "as MinkowskiEngine does; pass .int() coordinates to avoid this")
            coordinates = torch.floor(coordinates)
        elif coordinates.dtype.is_complex or coordinates.dtype == torch.bool:
            raise TypeError(f"SparseTensor: coordinates must hold integers; got "
                            f"{coordinates.dtype}")
        if coordinates.numel():
            lo, hi = float(coordinates.min()), float(coordinates.max())
            if lo < -2**30 or hi >= 2**30:
                raise ValueError(f"SparseTensor: coordinates must lie in [-2^30, 2^30); got "
                                 f"{lo:.0f} to {hi:.0f}")
            if int(coordinates[:, 0].min()) < 0:
                r = int((coordinates[:, 0] < 0).nonzero()[0, 0])
                raise ValueError(f"SparseTensor: coordinates[{r}, 0] = "
                                 f"{int(coordinates[r, 0])} is a negative batch index")
        coordinates = coordinates.int()
        dims = coordinates.shape[1] - 1
        ts = _int_list(tensor_stride, dims, "tensor_stride")
        if any(t < 1 for t in ts):
            raise ValueError(f"SparseTensor: tensor_stride must be >= 1; got {ts}")
        if any(t > 1 for t in ts) and coordinates.shape[0]:
            t = torch.tensor(ts, dtype=torch.long, device=coordinates.device)
            bad = (coordinates[:, 1:].long() % t != 0).any(1)
            if bool(bad.any()):
                r = int(bad.nonzero()[0, 0])
                raise ValueError(f"SparseTensor: coordinates[{r}] = {coordinates[r].tolist()} "
                                 f"is not a multiple of tensor_stride {ts}")
        return coordinates

    # ---- ME's accessors -----------------------------------------------------------------

    @property
    def F(self) -> torch.Tensor:
        return self._F

    features = F

    @property
    def C(self) -> torch.Tensor:
        return self._manager.get_coordinates(self.coordinate_map_key)

    coordinates = C

    @property
    def coordinate_manager(self) -> CoordinateManager:
        return self._manager

    @property
    def tensor_stride(self) -> List[int]:
        return self.coordinate_map_key.get_tensor_stride()

    @property
    def D(self) -> int:
        return self._manager.D

    @property
    def shape(self) -> torch.Size:
        return self._F.shape

    @property
    def dtype(self) -> torch.dtype:
        return self._F.dtype

    @property
    def device(self) -> torch.device:
        return self._F.device

    @property
    def requires_grad(self) -> bool:
        return self._F.requires_grad

    def __len__(self) -> int:
        return self._F.shape[0]

    def __repr__(self) -> str:
        return (f"SparseTensor(features={tuple(self._F.shape)}, tensor_stride="
                f"{self.tensor_stride}, key={self.coordinate_map_key})")

    def _like(self, features: torch.Tensor) -> "SparseTensor":
        return SparseTensor(features, coordinate_map_key=self.coordinate_map_key,
                            coordinate_manager=self._manager)

    def detach(self) -> "SparseTensor":
        return self._like(self._F.detach())

    def double(self) -> "SparseTensor":
        return self._like(self._F.double())

    def float(self) -> "SparseTensor":
        return self._like(self._F.float())

    def to(self, *args, **kwargs) -> "SparseTensor":
        return self._like(self._F.to(*args, **kwargs))

    def cpu(self) -> "SparseTensor":
        return self._like(self._F.cpu())

    @property
    def decomposed_coordinates(self) -> List[torch.Tensor]:
        c = self.C
        return [c[c[:, 0] == b, 1:] for b in torch.unique(c[:, 0]).tolist()]

    @property
    def decomposed_features(self) -> List[torch.Tensor]:
        c = self.C
        return [self._F[c[:, 0] == b] for b in torch.unique(c[:, 0]).tolist()]

    def coordinates_at(self, batch_index: int) -> torch.Tensor:
        c = self.C
        return c[c[:, 0] == batch_index, 1:]

    def features_at(self, batch_index: int) -> torch.Tensor:
        return self._F[self.C[:, 0] == batch_index]

    def dense(self, shape: Optional[torch.Size] = None,
              min_coordinate: Optional[torch.Tensor] = None, contract_stride: bool = True
              ) -> Tuple[torch.Tensor, torch.Tensor, List[int]]:
        """``(dense [B, C, *spatial], min_coordinate [1, D], tensor_stride)`` (int32) as ME:
        the site at ``c`` lands at ``(c - min_coordinate) / tensor_stride``
        (``contract_stride``)."""
        c = self.C.long()
        dims = self.D
        ts = torch.tensor(self.tensor_stride, dtype=torch.long)
        if len(self) == 0:
            if shape is None:
                raise ValueError("SparseTensor.dense: shape is required for an empty tensor")
            return (self._F.new_zeros(shape), torch.zeros(dims, dtype=torch.int32),
                    torch.tensor(self.tensor_stride, dtype=torch.int32))
        if min_coordinate is None:
            min_coordinate = c[:, 1:].min(0).values
            if bool((min_coordinate < 0).any()):
                raise ValueError(f"SparseTensor.dense: coordinates reach {min_coordinate.tolist()}"
                                 "; give min_coordinate for negative coordinates")
        elif isinstance(min_coordinate, int) and min_coordinate == 0:
            min_coordinate = torch.zeros(dims, dtype=torch.long)
        else:
            min_coordinate = torch.as_tensor(min_coordinate).reshape(-1).long()
            if min_coordinate.numel() != dims:
                raise ValueError(f"SparseTensor.dense: min_coordinate must have {dims} values")
        if bool((min_coordinate % ts != 0).any()):
            raise ValueError(f"SparseTensor.dense: min_coordinate {min_coordinate.tolist()} "
                             f"must be a multiple of the tensor stride {ts.tolist()}")
        g = c[:, 1:] - min_coordinate
        if bool((g < 0).any()):
            raise ValueError("SparseTensor.dense: coordinates below min_coordinate")
        if contract_stride:
            g = torch.div(g, ts, rounding_mode="floor")
        nch = self._F.shape[1]
        if shape is None:
            shape = torch.Size([int(c[:, 0].max()) + 1, nch, *(g.max(0).values + 1).tolist()])
        else:
            shape = torch.Size([shape[0], nch, *shape[2:]])
            if len(shape) != dims + 2:
                raise ValueError(f"SparseTensor.dense: shape must have {dims + 2} entries")
            if int(c[:, 0].max()) >= shape[0] or any(
                    int(m) >= s for m, s in zip(g.max(0).values, shape[2:])):
                raise ValueError(f"SparseTensor.dense: shape {list(shape)} does not hold every "
                                 "site")
        out = _scatter_dense(self._F.new_zeros(shape), c[:, 0], g, self._F)
        return (out, min_coordinate.int().reshape(1, dims),
                torch.tensor(self.tensor_stride, dtype=torch.int32))

    def slice(self, X) -> "TensorField":  # noqa: F821
        """The features of the site holding each point of the TensorField `X`."""
        take = getattr(X, "_features_from", None)  # TensorField's (field.py imports this module)
        if take is None:
            raise TypeError(f"SparseTensor.slice: X must be a TensorField; got "
                            f"{type(X).__name__}")
        return take(self)

    # ---- arithmetic on the features of one key -----------------------------------------

    def _binary(self, other, op) -> "SparseTensor":
        if isinstance(other, SparseTensor):
            if other._manager is not self._manager or \
                    other.coordinate_map_key != self.coordinate_map_key:
                raise ValueError("SparseTensor arithmetic needs both operands on the same "
                                 f"coordinate_map_key and manager; got {self.coordinate_map_key}"
                                 f" and {other.coordinate_map_key}")
            other = other._F
        return self._like(op(self._F, other))

    def __add__(self, other):
        return self._binary(other, torch.add)

    __radd__ = __add__

    def __sub__(self, other):
        return self._binary(other, torch.sub)

    def __mul__(self, other):
        return self._binary(other, torch.mul)

    __rmul__ = __mul__

    def __truediv__(self, other):
        return self._binary(other, torch.div)

    def __neg__(self):
        return self._like(-self._F)


def _scatter_dense(out: torch.Tensor, batch: torch.Tensor, g: torch.Tensor,
                   feats: torch.Tensor) -> torch.Tensor:
    """``out[b, :, *g] = feats`` (differentiable in feats)."""
    view = out.movedim(1, -1)
    idx = (batch,) + tuple(g[:, d] for d in range(g.shape[1]))
    return view.index_put(idx, feats).movedim(-1, 1)


def cat(*sparse_tensors: SparseTensor) -> SparseTensor:
    """Features of sparse tensors on one coordinate key, concatenated along channels."""
    if len(sparse_tensors) == 1 and isinstance(sparse_tensors[0], (list, tuple)):
        sparse_tensors = tuple(sparse_tensors[0])
    if not sparse_tensors:
        raise ValueError("cat: needs at least one SparseTensor")
    first = sparse_tensors[0]
    for i, t in enumerate(sparse_tensors):
        if not isinstance(t, SparseTensor):
            raise TypeError(f"cat: argument {i} is a {type(t).__name__}, not a SparseTensor")
        if t._manager is not first._manager or t.coordinate_map_key != first.coordinate_map_key:
            raise ValueError(f"cat: argument {i} is on {t.coordinate_map_key}, argument 0 on "
                             f"{first.coordinate_map_key}; all must share one coordinate key")
    return first._like(torch.cat([t.F for t in sparse_tensors], 1))

