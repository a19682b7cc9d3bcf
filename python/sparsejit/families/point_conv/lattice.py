"""Kernel maps between coordinate sets given in *world* units with a tensor stride, the data
model of MinkowskiEngine and TorchSparse (``sparsejit.minkowski``, ``sparsejit.torchsparse``).

A site at tensor stride ``ts`` has coordinates that are multiples of ``ts`` (any integers,
negative included). A convolution from ``in`` (stride ``ts``) to ``out`` (stride ``ts * s``)
pairs input ``c`` with output ``o`` by kernel offset ``e`` (``0 <= e < kernel``) when

    c = o + (lower + e) * dilation * ts            (per axis)

with ``lower = -(k - 1) // 2`` for odd and ``0`` for even kernels in both engines. Both number
the offsets with the first spatial axis fastest (``k = e_x + K_x * (e_y + K_y * e_z)``);
sparsejit's maps number them with axis 0 slowest, so the axes are handed to ``point_conv_plan`` in
reverse order (``reverse_axes=True``) and the engine's weight ``[K, C_in, C_out]`` is used
as it is, without a permutation. The world coordinates are shifted onto sparsejit's
non-negative grid (``g = (c - origin) / ts`` with ``origin`` a multiple of the output
stride, so that ``floor`` commutes with the shift) and the plan is built by the family's
``point_conv_plan``: ``subm`` when the output sites are the input sites, ``coarse`` for new
strided sites (``floor(c / (ts * s)) * ts * s``), ``generalized`` for given output sites.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch

from sparsejit.families.point_conv.ops import point_conv_plan


def even_lower(kernel_size: Sequence[int]) -> List[int]:
    """The first offset of each axis: ``-(k - 1) // 2`` for odd, 0 for even kernel sizes."""
    return [0 if k % 2 == 0 else -(k // 2) for k in kernel_size]


def floor_to(c: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """``floor(c / step) * step`` per column (int64)."""
    return torch.div(c, step, rounding_mode="floor") * step


def unique_rows(c: torch.Tensor) -> torch.Tensor:
    """The distinct rows of an integer ``[N, W]`` tensor, sorted lexicographically (column 0
    slowest), as int64: one packed key per row and a 1-D unique where the key fits 62 bits."""
    c = c.long()
    if c.shape[0] == 0:
        return c
    lo = c.amin(0)
    ext = (c.amax(0) - lo + 1).tolist()
    if math.prod(ext) >= 2**62:
        return torch.unique(c, dim=0)
    key = c[:, 0] - lo[0]
    for d in range(1, c.shape[1]):
        key = key * ext[d] + (c[:, d] - lo[d])
    key = torch.unique(key)
    cols = []
    for d in range(c.shape[1] - 1, 0, -1):
        cols.append(key % ext[d] + lo[d])
        key = key // ext[d]
    cols.append(key + lo[0])
    return torch.stack(cols[::-1], 1)


def lattice_plan(in_coords: torch.Tensor, in_stride: Sequence[int],
                 out_stride: Sequence[int], kernel_size: Sequence[int],
                 dilation: Sequence[int], lower: Sequence[int],
                 out_coords: Optional[torch.Tensor] = None, same_sites: bool = False,
                 reverse_axes: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(plan, out_coords)`` of the map from `in_coords` ``[N, 1 + D]`` (batch first, world
    units, stride `in_stride`) to `out_coords` (stride `out_stride`, a multiple of
    `in_stride` per axis); `out_coords` None: the strided sites ``floor(c / out_stride) *
    out_stride``, returned as int32 world coordinates (``same_sites``: the input sites)."""
    dims = in_coords.shape[1] - 1
    ts_in = [int(v) for v in in_stride]
    ts_out = [int(v) for v in out_stride]
    step = []
    for d in range(dims):
        if ts_in[d] <= 0 or ts_out[d] % ts_in[d] != 0:
            raise ValueError(f"output tensor stride {ts_out} must be a multiple of the input "
                             f"tensor stride {ts_in} on every axis")
        step.append(ts_out[d] // ts_in[d])
    dev = in_coords.device
    c_in = in_coords.long()
    # The same sites (submanifold) need the shift of one set only.
    c_out = None if out_coords is None or same_sites else out_coords.long()
    n_in = c_in.shape[0]
    n_out = None if c_out is None else c_out.shape[0]
    ts_out_t = torch.tensor(ts_out, dtype=torch.long, device=dev)
    ts_in_t = torch.tensor(ts_in, dtype=torch.long, device=dev)
    mins = []
    if n_in:
        mins.append(c_in[:, 1:].amin(0))
    if n_out:
        mins.append(c_out[:, 1:].amin(0))
    lo = torch.stack(mins).amin(0) if mins else torch.zeros(dims, dtype=torch.long,
                                                            device=dev)
    origin = floor_to(lo, ts_out_t)

    def to_grid(c, ts, ts_t):
        g = c[:, 1:] - origin
        return g if all(t == 1 for t in ts) else torch.div(g, ts_t, rounding_mode="floor")

    g_in = to_grid(c_in, ts_in, ts_in_t)
    g_out = None if c_out is None else to_grid(c_out, ts_out, ts_out_t)
    kernel, dil, low = list(kernel_size), list(dilation), list(lower)
    stride = list(step)
    if reverse_axes:
        g_in = g_in.flip(1)
        g_out = None if g_out is None else g_out.flip(1)
        kernel, dil, low, stride = kernel[::-1], dil[::-1], low[::-1], stride[::-1]
    padding = [-lw * dl for lw, dl in zip(low, dil)]
    ext = [1] * dims
    if n_in:
        ext = [max(e, int(m) + 1) for e, m in zip(ext, g_in.max(0).values.tolist())]
    if n_out:
        ext = [max(e, (int(m) + 1) * s) for e, m, s in
               zip(ext, g_out.max(0).values.tolist(), stride)]
    batches = [int(c_in[:, 0].max()) + 1] if n_in else [1]
    if n_out:
        batches.append(int(c_out[:, 0].max()) + 1)
    batch_size = max(batches)
    grid_in = torch.cat([c_in[:, :1], g_in], 1).int()
    centred = all(lw == -(k // 2) and k % 2 == 1 for lw, k in zip(low, kernel))
    if same_sites and all(s == 1 for s in stride) and centred:
        plan, _ = point_conv_plan(grid_in, ext, batch_size, "subm", kernel, stride, padding, dil)
        return plan, in_coords if in_coords.dtype == torch.int32 else in_coords.int()
    if same_sites:  # the same sites with an even or off-centre kernel
        c_out, g_out = c_in, g_in
    if c_out is not None:
        grid_out = torch.cat([c_out[:, :1], g_out], 1).int()
        plan, _ = point_conv_plan(grid_in, ext, batch_size, "generalized", kernel, stride, padding,
                            dil, out_coords=grid_out)
        sites = in_coords if same_sites else out_coords
        return plan, sites if sites.dtype == torch.int32 else sites.int()
    plan, grid_out = point_conv_plan(grid_in, ext, batch_size, "coarse", kernel, stride, padding, dil)
    g = grid_out[:, 1:].long()
    if reverse_axes:
        g = g.flip(1)
    world = torch.cat([grid_out[:, :1].long(), g * ts_out_t + origin], 1)
    return plan, world.int()
