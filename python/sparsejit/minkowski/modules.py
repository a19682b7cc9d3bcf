"""MinkowskiEngine 0.5's layers on sparsejit's kernel maps and gather-GEMM-scatter core.

Same names, constructor arguments, parameter names and layouts as ME (``kernel`` ``[K, C_in,
C_out]`` with the first spatial axis fastest, ``[C_in, C_out]`` for a 1-volume kernel at stride
1; ``bias`` ``[1, C_out]``; ``bn.*``, ``linear.*``), so an ME ``state_dict`` loads as it is.
"""

from __future__ import annotations

import enum
import math
from typing import List, Optional

import torch
from torch import nn

from sparsejit.families.point_conv.lattice import even_lower
from sparsejit.families.point_conv.ops import plan_pairs, point_conv
from sparsejit.minkowski.tensor import CoordinateMapKey, SparseTensor, _int_list


class MinkowskiModuleBase(nn.Module):
    """Marks modules that take and return a ``sparsejit.minkowski.SparseTensor``."""


class MinkowskiNetwork(nn.Module):
    """ME's network base class: an ``nn.Module`` that records its spatial dimension."""

    def __init__(self, D: int):
        super().__init__()
        self.D = D


def _check_input(module: nn.Module, x, dims: Optional[int] = None,
                 channels: Optional[int] = None) -> None:
    name = type(module).__name__
    if not isinstance(x, SparseTensor):
        raise TypeError(f"{name}: input must be a sparsejit.minkowski.SparseTensor; got "
                        f"{type(x).__name__}")
    if dims is not None and x.D != dims:
        raise ValueError(f"{name}: the layer is {dims}-D (dimension={dims}) but the input is "
                         f"{x.D}-D")
    if channels is not None and x.F.shape[1] != channels:
        raise ValueError(f"{name}: input has {x.F.shape[1]} channels but in_channels = "
                         f"{channels}")


def _dimension(dimension, name: str) -> int:
    if not isinstance(dimension, int) or not 1 <= dimension <= 4:
        raise ValueError(f"{name}: dimension must be 1 to 4 (spatial axes); got {dimension!r}")
    return dimension


def _positive(v: List[int], what: str, name: str) -> List[int]:
    if any(e < 1 for e in v):
        raise ValueError(f"{name}: {what} must be >= 1 on every axis; got {v}")
    return v


def _output_key(x: SparseTensor, coordinates, name: str) -> Optional[CoordinateMapKey]:
    """ME's `coordinates` argument of forward: a key or SparseTensor of the same manager."""
    if coordinates is None:
        return None
    if isinstance(coordinates, SparseTensor):
        if coordinates.coordinate_manager is not x.coordinate_manager:
            raise ValueError(f"{name}: coordinates must share the input's coordinate manager")
        return coordinates.coordinate_map_key
    if isinstance(coordinates, CoordinateMapKey):
        if not x.coordinate_manager.exists(coordinates):
            raise KeyError(f"{name}: coordinates {coordinates} is not in the input's manager")
        return coordinates
    if isinstance(coordinates, torch.Tensor):
        return SparseTensor(coordinates.new_zeros(coordinates.shape[0], 0, dtype=x.dtype),
                            coordinates=coordinates, tensor_stride=x.tensor_stride,
                            coordinate_manager=x.coordinate_manager).coordinate_map_key
    raise TypeError(f"{name}: coordinates must be a SparseTensor, CoordinateMapKey or tensor; "
                    f"got {type(coordinates).__name__}")


class MinkowskiConvolutionBase(MinkowskiModuleBase):
    def __init__(self, in_channels: int, out_channels: int, kernel_size=-1, stride=1,
                 dilation=1, bias: bool = False, kernel_generator=None,
                 is_transpose: bool = False, expand_coordinates: bool = False,
                 convolution_mode=None, dimension: int = -1):
        super().__init__()
        name = type(self).__name__
        dims = _dimension(dimension, name)
        if kernel_generator is not None:
            raise NotImplementedError(f"{name}: kernel_generator (custom kernel regions) is not "
                                      "supported by sparsejit.minkowski; give kernel_size")
        if expand_coordinates:
            raise NotImplementedError(f"{name}: expand_coordinates=True is not supported by "
                                      "sparsejit.minkowski")
        if not isinstance(in_channels, int) or not isinstance(out_channels, int) or \
                in_channels < 1 or out_channels < 1:
            raise ValueError(f"{name}: in_channels and out_channels must be ints >= 1; got "
                             f"{in_channels!r}, {out_channels!r}")
        self.kernel_size = _positive(_int_list(kernel_size, dims, "kernel_size"),
                                     "kernel_size", name)
        self.stride = _positive(_int_list(stride, dims, "stride"), "stride", name)
        self.dilation = _positive(_int_list(dilation, dims, "dilation"), "dilation", name)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.dimension = dims
        self.is_transpose = is_transpose
        self.kernel_volume = math.prod(self.kernel_size)
        self.use_mm = self.kernel_volume == 1 and all(s == 1 for s in self.stride)
        shape = (in_channels, out_channels) if self.use_mm else \
            (self.kernel_volume, in_channels, out_channels)
        self.kernel = nn.Parameter(torch.empty(shape))
        self.bias = nn.Parameter(torch.empty(1, out_channels)) if bias else None
        # How the sums are computed (same results; see sparsejit.families.point_conv.ops).
        self.dataflow = "auto"
        self.reset_parameters(is_transpose)

    def reset_parameters(self, is_transpose: bool = False) -> None:
        with torch.no_grad():
            n = (self.out_channels if is_transpose else self.in_channels) * self.kernel_volume
            bound = 1.0 / math.sqrt(n)
            self.kernel.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    def extra_repr(self) -> str:
        return (f"in={self.in_channels}, out={self.out_channels}, kernel_size="
                f"{self.kernel_size}, stride={self.stride}, dilation={self.dilation}")

    def forward(self, input: SparseTensor, coordinates=None) -> SparseTensor:
        name = type(self).__name__
        _check_input(self, input, self.dimension, self.in_channels)
        if input.dtype != self.kernel.dtype:
            raise TypeError(f"{name}: input features are {input.dtype} but the kernel is "
                            f"{self.kernel.dtype} (convert one, e.g. model.double())")
        bias = None if self.bias is None else self.bias.reshape(-1)
        out_key = _output_key(input, coordinates, name)
        mgr, in_key = input.coordinate_manager, input.coordinate_map_key
        if self.use_mm and out_key is None:
            y = input.F.mm(self.kernel)
            return SparseTensor(y if bias is None else y + bias, coordinate_map_key=in_key,
                                coordinate_manager=mgr)
        kernel = self.kernel.reshape(self.kernel_volume, self.in_channels, self.out_channels)
        lower = even_lower(self.kernel_size)
        geometry = (self.kernel_size, self.dilation, lower)
        if not self.is_transpose:
            if out_key is None:
                out_key = in_key if all(s == 1 for s in self.stride) else \
                    mgr.stride_key(in_key, self.stride, *geometry)
            plan = mgr.plan(in_key, out_key, *geometry)
            y = point_conv(input.F, kernel, bias, plan, mgr.size(out_key),
                            dataflow=self.dataflow)
        else:
            if out_key is None:
                out_key = in_key if all(s == 1 for s in self.stride) else \
                    mgr.transposed_key(in_key, self.stride, *geometry)
            # The map of the strided convolution from the finer key, read backwards.
            plan = mgr.plan(out_key, in_key, *geometry)
            y = point_conv(input.F, kernel, bias, plan, mgr.size(out_key), swap=True,
                            dataflow=self.dataflow)
        return SparseTensor(y, coordinate_map_key=out_key, coordinate_manager=mgr)


class MinkowskiConvolution(MinkowskiConvolutionBase):
    """Sparse convolution: stride 1 keeps the input sites; stride s gives the sites
    ``floor(c / (s * tensor_stride)) * s * tensor_stride`` at ``tensor_stride * s``."""

    def __init__(self, in_channels, out_channels, kernel_size=-1, stride=1, dilation=1,
                 bias=False, kernel_generator=None, expand_coordinates=False,
                 convolution_mode=None, dimension=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, dilation, bias,
                         kernel_generator, False, expand_coordinates, convolution_mode,
                         dimension)


class MinkowskiConvolutionTranspose(MinkowskiConvolutionBase):
    """Transposed convolution: back to the coordinate set at ``tensor_stride / stride`` (the
    finer key the strided convolution came from), through that convolution's map."""

    def __init__(self, in_channels, out_channels, kernel_size=-1, stride=1, dilation=1,
                 bias=False, kernel_generator=None, expand_coordinates=False,
                 convolution_mode=None, dimension=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, dilation, bias,
                         kernel_generator, True, expand_coordinates, convolution_mode,
                         dimension)


# ---- normalisation, nonlinearities, linear ------------------------------------------------

class MinkowskiBatchNorm(MinkowskiModuleBase):
    """``torch.nn.BatchNorm1d`` on the features (held as ``.bn``, as ME)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True):
        super().__init__()
        self.bn = nn.BatchNorm1d(num_features, eps=eps, momentum=momentum, affine=affine,
                                 track_running_stats=track_running_stats)

    def forward(self, input: SparseTensor) -> SparseTensor:
        _check_input(self, input, channels=self.bn.num_features)
        return input._like(self.bn(input.F))


class MinkowskiLinear(MinkowskiModuleBase):
    """``torch.nn.Linear`` on the features (held as ``.linear``)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)

    def forward(self, input: SparseTensor) -> SparseTensor:
        _check_input(self, input, channels=self.linear.in_features)
        return input._like(self.linear(input.F))


class MinkowskiNonlinearityBase(MinkowskiModuleBase):
    MODULE = None

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.module = self.MODULE(*args, **kwargs)

    def forward(self, input: SparseTensor) -> SparseTensor:
        _check_input(self, input)
        return input._like(self.module(input.F))


def _nonlinearity(name: str, module: type) -> type:
    return type(name, (MinkowskiNonlinearityBase,), {"MODULE": module,
                                                     "__doc__": f"``torch.nn.{module.__name__}``"
                                                                " on the features."})


_NONLINEAR = ["ELU", "Hardshrink", "Hardsigmoid", "Hardtanh", "Hardswish", "LeakyReLU",
              "LogSigmoid", "PReLU", "ReLU", "ReLU6", "RReLU", "SELU", "CELU", "GELU",
              "Sigmoid", "SiLU", "Softplus", "Softshrink", "Softsign", "Tanh", "Tanhshrink",
              "Threshold", "Softmin", "Softmax", "LogSoftmax", "Dropout", "AlphaDropout"]
NONLINEARITIES = {f"Minkowski{n}": _nonlinearity(f"Minkowski{n}", getattr(nn, n))
                  for n in _NONLINEAR}
globals().update(NONLINEARITIES)


# ---- pooling ------------------------------------------------------------------------------

class PoolingMode(enum.Enum):
    """The reductions of ME's pooling modules (the index/kernel variants are one here)."""
    LOCAL_SUM_POOLING = 0
    LOCAL_AVG_POOLING = 1
    LOCAL_MAX_POOLING = 2
    GLOBAL_SUM_POOLING_DEFAULT = 3
    GLOBAL_AVG_POOLING_DEFAULT = 4
    GLOBAL_MAX_POOLING_DEFAULT = 5
    GLOBAL_SUM_POOLING_KERNEL = 6
    GLOBAL_AVG_POOLING_KERNEL = 7
    GLOBAL_MAX_POOLING_KERNEL = 8
    GLOBAL_SUM_POOLING_PYTORCH_INDEX = 9
    GLOBAL_AVG_POOLING_PYTORCH_INDEX = 10
    GLOBAL_MAX_POOLING_PYTORCH_INDEX = 11


def _reduce(kind: str, feats: torch.Tensor, rows: torch.Tensor, n_out: int) -> torch.Tensor:
    """sum / avg / max of ``feats`` rows grouped by ``rows`` into ``n_out`` rows (rows with
    no input stay 0, as in ME)."""
    c = feats.shape[1]
    if kind == "max":
        return feats.new_zeros(n_out, c).scatter_reduce(
            0, rows[:, None].expand(-1, c), feats, "amax", include_self=False)
    y = feats.new_zeros(n_out, c).index_add(0, rows, feats)
    if kind == "avg":
        counts = torch.bincount(rows, minlength=n_out).clamp(min=1).to(feats.dtype)
        y = y / counts[:, None]
    return y


class MinkowskiPoolingBase(MinkowskiModuleBase):
    KIND = "avg"

    def __init__(self, kernel_size=-1, stride=1, dilation=1, kernel_generator=None,
                 dimension=None):
        super().__init__()
        name = type(self).__name__
        dims = _dimension(dimension, name)
        if kernel_generator is not None:
            raise NotImplementedError(f"{name}: kernel_generator (custom kernel regions) is not "
                                      "supported by sparsejit.minkowski; give kernel_size")
        self.kernel_size = _positive(_int_list(kernel_size, dims, "kernel_size"),
                                     "kernel_size", name)
        self.stride = _positive(_int_list(stride, dims, "stride"), "stride", name)
        self.dilation = _positive(_int_list(dilation, dims, "dilation"), "dilation", name)
        self.dimension = dims

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, "
                f"dilation={self.dilation}")

    def forward(self, input: SparseTensor, coordinates=None) -> SparseTensor:
        _check_input(self, input, self.dimension)
        mgr, in_key = input.coordinate_manager, input.coordinate_map_key
        # kernel == stride pools each stride cell (ME's stride map), else ME's kernel region.
        lower = [0] * self.dimension if self.kernel_size == self.stride else \
            even_lower(self.kernel_size)
        geometry = (self.kernel_size, self.dilation, lower)
        out_key = _output_key(input, coordinates, type(self).__name__)
        if out_key is None:
            out_key = in_key if all(s == 1 for s in self.stride) else \
                mgr.stride_key(in_key, self.stride, *geometry)
        plan = mgr.plan(in_key, out_key, *geometry)
        _, in_idx, out_idx = plan_pairs(plan)
        y = _reduce(self.KIND, input.F[in_idx], out_idx, mgr.size(out_key))
        return SparseTensor(y, coordinate_map_key=out_key, coordinate_manager=mgr)


class MinkowskiAvgPooling(MinkowskiPoolingBase):
    """Average of the inputs in each output's kernel region."""
    KIND = "avg"


class MinkowskiSumPooling(MinkowskiPoolingBase):
    """Sum of the inputs in each output's kernel region."""
    KIND = "sum"


class MinkowskiMaxPooling(MinkowskiPoolingBase):
    """Channel-wise maximum of the inputs in each output's kernel region."""
    KIND = "max"


class MinkowskiGlobalPooling(MinkowskiModuleBase):
    """Each cloud reduced to one site at the origin ``(b, 0, ..., 0)`` (tensor stride 0)."""

    def __init__(self, mode: PoolingMode = PoolingMode.GLOBAL_AVG_POOLING_PYTORCH_INDEX):
        super().__init__()
        if not isinstance(mode, PoolingMode) or not mode.name.startswith("GLOBAL_"):
            raise ValueError(f"{type(self).__name__}: mode must be a global PoolingMode; got "
                             f"{mode!r}")
        self.pooling_mode = mode
        self.kind = "sum" if "_SUM_" in mode.name else "max" if "_MAX_" in mode.name else "avg"

    def forward(self, input: SparseTensor, coordinates=None) -> SparseTensor:
        _check_input(self, input)
        if coordinates is not None:
            raise NotImplementedError(f"{type(self).__name__}: coordinates is not supported")
        mgr = input.coordinate_manager
        batch = input.C[:, 0].long()
        ids, rows = torch.unique(batch, return_inverse=True)
        y = _reduce(self.kind, input.F, rows, ids.numel())
        origin = torch.cat([ids[:, None], ids.new_zeros(ids.numel(), input.D)], 1).int()
        key = CoordinateMapKey([0] * input.D, "")
        if not (mgr.exists(key) and torch.equal(mgr.get_coordinates(key), origin)):
            key = mgr.insert(origin, [0] * input.D)
        return SparseTensor(y, coordinate_map_key=key, coordinate_manager=mgr)


class MinkowskiGlobalSumPooling(MinkowskiGlobalPooling):
    def __init__(self, mode: PoolingMode = PoolingMode.GLOBAL_SUM_POOLING_PYTORCH_INDEX):
        super().__init__(mode)


class MinkowskiGlobalAvgPooling(MinkowskiGlobalPooling):
    def __init__(self, mode: PoolingMode = PoolingMode.GLOBAL_AVG_POOLING_PYTORCH_INDEX):
        super().__init__(mode)


class MinkowskiGlobalMaxPooling(MinkowskiGlobalPooling):
    def __init__(self, mode: PoolingMode = PoolingMode.GLOBAL_MAX_POOLING_PYTORCH_INDEX):
        super().__init__(mode)


class MinkowskiPoolingTranspose(MinkowskiModuleBase):
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("MinkowskiPoolingTranspose (unpooling) is not implemented in "
                                  "sparsejit.minkowski; use MinkowskiConvolutionTranspose")

