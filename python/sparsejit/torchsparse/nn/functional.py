"""TorchSparse 2.0's ``torchsparse.nn.functional`` on sparsejit: ``conv3d`` on the point_conv
family's kernel maps, global pooling, and the hashing / voxelization ops SPVCNN's point-voxel
helpers are written with (``sphash``, ``sphashquery``, ``spcount``, ``spvoxelize``,
``spdevoxelize``, ``calc_ti_weights``), as differentiable torch ops."""

from __future__ import annotations

import math
from typing import Optional

import torch

from sparsejit.families.point_conv.lattice import lattice_plan, unique_rows
from sparsejit.families.point_conv.ops import point_conv
from sparsejit.torchsparse.tensor import SparseTensor, make_ntuple

# sphash packs (x, y, z, batch) into one int64: 19 bits per axis (offset 2^18), 6 for the batch.
_AXIS_BITS, _BATCH_BITS = 19, 6
_HALF = 1 << (_AXIS_BITS - 1)


def ts_lower(k: int) -> int:
    """TorchSparse's first kernel offset: ``-k // 2 + 1`` (-1 for 3, 0 for 2, -1 for 4)."""
    return (-k) // 2 + 1


def spdownsample(coords: torch.Tensor, stride=2, kernel_size=2, tensor_stride=1
                 ) -> torch.Tensor:
    """Strided sites as TorchSparse 2.0 on the CPU: ``trunc(c / (s * ts)) * s * ts``, unique,
    sorted by (batch, x, y, z); a stride other than 1 or the kernel size per axis raises."""
    stride = make_ntuple(stride, 3, "stride")
    kernel_size = make_ntuple(kernel_size, 3, "kernel_size")
    tensor_stride = make_ntuple(tensor_stride, 3, "tensor_stride")
    if not all(s in (1, k) for s, k in zip(stride, kernel_size)):
        raise NotImplementedError(
            f"conv3d: stride {stride} with kernel_size {kernel_size}: TorchSparse 2.0 builds "
            "strided sites on the CPU only for stride 1 or stride = kernel_size per axis")
    step = torch.tensor([s * t for s, t in zip(stride, tensor_stride)], dtype=torch.long,
                        device=coords.device)
    c = coords.long()
    xyz = torch.div(c[:, :3], step, rounding_mode="trunc") * step
    out = unique_rows(torch.cat([c[:, 3:], xyz], 1))  # sorted by (b, x, y, z)
    return out[:, [1, 2, 3, 0]].int()


def _plan(coords, in_stride, out_stride, kernel_size, out_coords=None):
    """A sparsejit plan in TorchSparse's offset order (odd volume: x fastest, like ME;
    even volume: z fastest, sparsejit's own order)."""
    batch_first = coords[:, [3, 0, 1, 2]]
    out_bf = None if out_coords is None else out_coords[:, [3, 0, 1, 2]]
    odd = math.prod(kernel_size) % 2 == 1
    plan, _ = lattice_plan(batch_first, in_stride, out_stride, kernel_size, [1, 1, 1],
                           [ts_lower(k) for k in kernel_size], out_coords=out_bf,
                           same_sites=out_coords is None, reverse_axes=odd)
    return plan


def conv3d(input: SparseTensor, weight: torch.Tensor, kernel_size, bias=None, stride=1,
           dilation=1, transposed: bool = False, epsilon: float = 0.0, mm_thresh: int = 0,
           kmap_mode: str = "hashmap") -> SparseTensor:
    """TorchSparse 2.0's ``F.conv3d``: weight ``[K, C_in, C_out]`` (``[C_in, C_out]`` for one
    offset); kernel maps cached in ``input.kmaps`` under (stride, kernel, stride, dilation)."""
    if not isinstance(input, SparseTensor):
        raise TypeError(f"conv3d: input must be a sparsejit.torchsparse.SparseTensor; got "
                        f"{type(input).__name__}")
    kernel_size = make_ntuple(kernel_size, 3, "kernel_size")
    stride = make_ntuple(stride, 3, "stride")
    dilation = make_ntuple(dilation, 3, "dilation")
    if dilation != (1, 1, 1):
        raise NotImplementedError(f"conv3d: dilation {dilation}: TorchSparse 2.0's CPU kernel "
                                  "maps ignore dilation (its offsets omit it), so sparsejit "
                                  "refuses it rather than differ")
    feats, coords = input.feats, input.coords
    if coords.shape[1] != 4:
        raise ValueError(f"conv3d: input coords must be [N, 4] (x, y, z, batch); got "
                         f"{tuple(coords.shape)} (batch samples with sparse_collate)")
    # TorchSparse registers a stride's coords when a conv outputs them; registering the
    # input's too lets a transposed conv return to a network's input sites.
    input.cmaps.setdefault(input.stride, coords)
    volume = math.prod(kernel_size)
    w = weight if weight.dim() == 3 else weight.reshape(1, *weight.shape)
    if w.dim() != 3 or w.shape[0] != volume or w.shape[1] != feats.shape[1]:
        raise ValueError(f"conv3d: weight {tuple(weight.shape)} does not fit kernel_size "
                         f"{kernel_size} ({volume} offsets) and {feats.shape[1]} input channels")
    if w.dtype != feats.dtype:
        raise TypeError(f"conv3d: feats are {feats.dtype} but the weight is {w.dtype}")
    if kernel_size == (1, 1, 1) and stride == (1, 1, 1):
        y = feats.matmul(w[0])
        output = input._derive(y if bias is None else y + bias)
    elif not transposed:
        key = (input.stride, kernel_size, stride, dilation)
        kmap = input.kmaps.get(key)
        if kmap is None:
            if coords.shape[0] and int(coords[:, 3].min()) < 0:
                r = int((coords[:, 3] < 0).nonzero()[0, 0])
                raise ValueError(f"conv3d: coords[{r}, 3] = {int(coords[r, 3])} is a negative "
                                 "batch index (TorchSparse's batch column is the last)")
            out_stride = tuple(a * b for a, b in zip(input.stride, stride))
            if not any(s > 1 for s in stride):
                kmap = (_plan(coords, input.stride, out_stride, kernel_size), coords)
            elif volume % 2 == 0 and coords.shape[0] and int(coords[:, :3].min()) >= 0:
                spdownsample(coords[:0], stride, kernel_size, input.stride)  # its checks
                # trunc = floor here, and the coarse map's sites come sorted by (batch, x, y,
                # z) when the axes keep their order (even volumes): TorchSparse's rows.
                plan, sites = lattice_plan(coords[:, [3, 0, 1, 2]], input.stride, out_stride,
                                           kernel_size, [1, 1, 1],
                                           [ts_lower(k) for k in kernel_size],
                                           reverse_axes=False)
                kmap = (plan, sites[:, [1, 2, 3, 0]].contiguous())
            else:
                out_coords = spdownsample(coords, stride, kernel_size, input.stride)
                kmap = (_plan(coords, input.stride, out_stride, kernel_size, out_coords),
                        out_coords)
            input.kmaps[key] = kmap
        plan, out_coords = kmap
        y = point_conv(feats, w, bias, plan, out_coords.shape[0])
        output = input._derive(y, out_coords, tuple(a * b for a, b in zip(input.stride, stride)))
    else:
        fine = tuple(a // b for a, b in zip(input.stride, stride))
        key = (fine, kernel_size, stride, dilation)
        if key not in input.kmaps or fine not in input.cmaps:
            raise KeyError(f"conv3d(transposed=True): no strided convolution with kernel_size "
                           f"{kernel_size} and stride {stride} from tensor stride {fine} ran "
                           "on this tensor's ancestors (its map is what the transposed "
                           "convolution reads backwards)")
        plan, _ = input.kmaps[key]
        out_coords = input.cmaps[fine]
        y = point_conv(feats, w, bias, plan, out_coords.shape[0], swap=True)
        output = input._derive(y, out_coords, fine)
    output.cmaps.setdefault(output.stride, output.coords)
    return output


def _per_batch(inputs: SparseTensor, kind: str) -> torch.Tensor:
    b = inputs.coords[:, -1].long()
    n = int(b.max()) + 1 if b.numel() else 0
    f = inputs.feats
    if kind == "max":
        return f.new_zeros(n, f.shape[1]).scatter_reduce(
            0, b[:, None].expand(-1, f.shape[1]), f, "amax", include_self=False)
    counts = torch.bincount(b, minlength=n).to(f.dtype)
    return f.new_zeros(n, f.shape[1]).index_add(0, b, f) / counts[:, None]


def global_avg_pool(inputs: SparseTensor) -> torch.Tensor:
    """``[batch_size, C]``: the mean of each cloud's feats."""
    return _per_batch(inputs, "avg")


def global_max_pool(inputs: SparseTensor) -> torch.Tensor:
    """``[batch_size, C]``: the channel-wise maximum of each cloud's feats."""
    return _per_batch(inputs, "max")


# ---- hashing and point-voxel ops ----------------------------------------------------------

def sphash(coords: torch.Tensor, offsets: Optional[torch.Tensor] = None) -> torch.Tensor:
    """int64 keys of ``[N, 4]`` (x, y, z, batch) int coords; with `offsets` ``[K, 3]``, the
    keys of every coord + offset as ``[K, N]``. Injective for |x|, |y|, |z| < 2^18 and
    batch < 64 (checked)."""
    if not isinstance(coords, torch.Tensor) or coords.dim() != 2 or coords.shape[1] != 4 or \
            coords.dtype.is_floating_point:
        raise ValueError("sphash: coords must be an integer [N, 4] (x, y, z, batch) tensor")
    c = coords.long()
    xyz = c[:, :3]
    if offsets is not None:
        if offsets.dim() != 2 or offsets.shape[1] != 3:
            raise ValueError(f"sphash: offsets must be [K, 3]; got {tuple(offsets.shape)}")
        xyz = xyz[None] + offsets.long()[:, None]
    if c.shape[0]:
        if int(xyz.abs().max()) >= _HALF or int(c[:, 3].min()) < 0 or \
                int(c[:, 3].max()) >= (1 << _BATCH_BITS):
            raise ValueError(f"sphash: coords must lie in (-2^18, 2^18) with batch ids in "
                             f"[0, 64); got {int(xyz.min())} to {int(xyz.max())}, batch "
                             f"{int(c[:, 3].min())} to {int(c[:, 3].max())}")
    key = c[:, 3] if offsets is None else c[:, 3][None].expand(xyz.shape[0], -1)
    for d in range(3):
        key = (key << _AXIS_BITS) | (xyz[..., d] + _HALF)
    return key


def sphashquery(queries: torch.Tensor, references: torch.Tensor) -> torch.Tensor:
    """For each query key, its row in `references` (-1 where absent); the shape of
    `queries`."""
    q = queries.reshape(-1)
    if references.numel() == 0:
        return torch.full_like(queries, -1)
    ref, order = torch.sort(references.reshape(-1))
    pos = torch.searchsorted(ref, q).clamp(max=ref.numel() - 1)
    hit = ref[pos] == q
    return torch.where(hit, order[pos], torch.full_like(q, -1)).reshape(queries.shape)


def spcount(idx: torch.Tensor, num: int) -> torch.Tensor:
    """Points per voxel: how often each of ``0 .. num-1`` occurs in `idx` (-1 ignored)."""
    i = idx.long()
    return torch.bincount(i[i >= 0], minlength=int(num)).int()


def spvoxelize(feats: torch.Tensor, idx: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``[num_voxels, C]``: the mean of the rows of `feats` with ``idx == v`` (rows with -1
    dropped; voxels without rows 0)."""
    i = idx.long()
    keep = i >= 0
    n = counts.shape[0]
    s = feats.new_zeros(n, feats.shape[1]).index_add(0, i[keep], feats[keep])
    return s / counts.clamp(min=1).to(feats.dtype)[:, None]


def spdevoxelize(feats: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor
                 ) -> torch.Tensor:
    """``out[p] = sum_k weights[p, k] * feats[idx[p, k]]`` over ``idx != -1``."""
    i = idx.long()
    w = torch.where(i >= 0, weights, torch.zeros((), dtype=weights.dtype)).to(feats.dtype)
    g = feats[i.clamp(min=0)]                                 # [P, K, C]
    return (g * w[..., None]).sum(1)


def calc_ti_weights(coords: torch.Tensor, idx_query: torch.Tensor, scale: float = 1
                    ) -> torch.Tensor:
    """Trilinear weights ``[8, P]`` of each point towards the 8 corners of its cell of size
    `scale` (corner order: z fastest), missing corners 0, normalised to sum 1."""
    with torch.no_grad():
        p = coords[:, :3]
        pf = torch.floor(p / scale) * scale if scale != 1 else torch.floor(p)
        pc = pf + scale
        lo, hi = p - pf, pc - p                       # distances to the lower / upper face
        ws = []
        for cx in (0, 1):
            for cy in (0, 1):
                for cz in (0, 1):
                    w = (lo[:, 0] if cx else hi[:, 0]) * (lo[:, 1] if cy else hi[:, 1]) * \
                        (lo[:, 2] if cz else hi[:, 2])
                    ws.append(w)
        w = torch.stack(ws)
        if scale != 1:
            w = w / scale ** 3
        w = torch.where(idx_query == -1, torch.zeros((), dtype=w.dtype), w)
        return w / (w.sum(0) + 1e-8)
