"""Voxelized point-cloud scenes for benchmarks/bench_sparse_conv.py (issue 10's protocol).

Real scans from ``$SPARSEJIT_DATA`` (default ``../shared/data``; see its README for the
formats), each voxelized at every requested voxel size:
  - KITTI 3D-object scans ``pointclouds/kitti_pointpillars/*.bin`` (float32 x, y, z, intensity),
  - the ScanNet scene ``pointclouds/scannet/scene0000_00.bin`` (float32 x, y, z, r, g, b),
  - the Open3D living-room fragment ``pointclouds/open3d/fragment.pcd`` (binary PCD);
and generated clouds that need no data: uniform random voxels in a cube (the issue's
20k-in-128^3 setting) and a synthetic "room" (points on the walls and floor of a box and on
a few boxes inside, i.e. surfaces like the indoor scans). Every case is rebuilt from its name
(``case_by_name``), so a fresh subprocess can measure one case's peak memory.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

import sparsejit as sj
from sparsejit.tools.data import data_dir

Case = Tuple[str, torch.Tensor, List[int]]  # name, coords [N, 4] int32 (batch first), shape


def read_pcd(path: Path) -> np.ndarray:
    """Points of a PCD file with ``DATA binary`` or ``ascii`` as float32 [N, fields]."""
    raw = path.read_bytes()
    header: Dict[str, List[str]] = {}
    at = 0
    while True:
        end = raw.index(b"\n", at)
        line = raw[at:end].decode("ascii", "replace").strip()
        at = end + 1
        if not line or line.startswith("#"):
            continue
        key, *vals = line.split()
        header[key.upper()] = vals
        if key.upper() == "DATA":
            break
    fields, sizes, types = header["FIELDS"], header["SIZE"], header["TYPE"]
    counts = [int(c) for c in header.get("COUNT", ["1"] * len(fields))]
    n = int(header["POINTS"][0])
    kind = header["DATA"][0].lower()
    if kind == "ascii":
        return np.loadtxt(raw[at:].decode().splitlines(), dtype=np.float32).reshape(n, -1)
    if kind != "binary":
        raise ValueError(f"{path}: PCD DATA {kind} is not supported here (binary or ascii)")
    np_type = {"F": "f", "I": "i", "U": "u"}
    dtype = np.dtype([(f"{f}_{j}", f"<{np_type[t]}{s}") for f, s, t, c in
                      zip(fields, sizes, types, counts) for j in range(c)])
    rec = np.frombuffer(raw, dtype=dtype, count=n, offset=at)
    # Only the float fields (x, y, z, normals, ...): the packed rgb float is kept as is.
    return np.stack([rec[name].astype(np.float32) for name in dtype.names], 1)


def _points(kind: str, stem: str) -> Optional[torch.Tensor]:
    d = data_dir()
    if d is None:
        return None
    pc = d / "pointclouds"
    if kind == "kitti":
        f = pc / "kitti_pointpillars" / f"{stem}.bin"
        return torch.from_numpy(np.fromfile(f, np.float32).reshape(-1, 4)) if f.exists() else None
    if kind == "scannet":
        f = pc / "scannet" / f"{stem}.bin"
        return torch.from_numpy(np.fromfile(f, np.float32).reshape(-1, 6)) if f.exists() else None
    if kind == "open3d":
        f = pc / "open3d" / f"{stem}.pcd"
        if not f.exists():
            return None
        pts = read_pcd(f)
        return torch.from_numpy(np.ascontiguousarray(pts[np.isfinite(pts[:, :3]).all(1), :3]))
    raise ValueError(kind)


def random_cube(n: int = 20000, side: int = 128, seed: int = 0) -> Tuple[torch.Tensor, List[int]]:
    g = torch.Generator().manual_seed(seed)
    flat = torch.randperm(side ** 3, generator=g)[:n]
    idx = torch.stack([torch.zeros_like(flat), flat // side ** 2, flat // side % side,
                       flat % side], 1).int()
    return idx, [side] * 3


def synthetic_room(n: int = 200000, seed: int = 0) -> torch.Tensor:
    """Points on the floor and four walls of a 6 x 5 x 2.5 m box and on 6 boxes inside."""
    g = torch.Generator().manual_seed(seed)
    size = torch.tensor([6.0, 5.0, 2.5])
    u = torch.rand(n, 3, generator=g) * size
    face = torch.randint(0, 8, (n,), generator=g)
    u[face == 0, 2] = 0.0                      # floor
    u[face == 1, 0] = 0.0
    u[face == 2, 0] = size[0]
    u[face == 3, 1] = 0.0
    u[face == 4, 1] = size[1]
    furn = face >= 5                           # furniture: tops of boxes
    m = int(furn.sum())
    corner = torch.rand(6, 2, generator=g) * torch.tensor([5.0, 4.0])
    which = torch.randint(0, 6, (m,), generator=g)
    u[furn, :2] = corner[which] + torch.rand(m, 2, generator=g) * 0.8
    u[furn, 2] = 0.5 + 0.3 * (which % 3).float()
    return u


def _voxel_case(name: str, pts: torch.Tensor, voxel: float) -> Case:
    coords, _, _ = sj.voxelize(pts, voxel)
    shape = (coords[:, 1:].max(0).values + 1).tolist()
    return name, coords.int(), shape


def _cm(voxel: float) -> str:
    return f"{round(voxel * 100)}cm"


def case_names(kitti: int, voxels: List[float], scenes: List[str]) -> List[str]:
    """Names of every case to run, in order (real scans only when their files exist)."""
    names = ["random_20k_128cube"] if "random" in scenes else []
    d = data_dir()
    for v in voxels:
        if "kitti" in scenes and d is not None:
            stems = sorted(p.stem for p in (d / "pointclouds/kitti_pointpillars").glob("*.bin"))
            names += [f"kitti_{s}_{_cm(v)}" for s in stems[:kitti]]
        if "scannet" in scenes and _points("scannet", "scene0000_00") is not None:
            names.append(f"scannet_scene0000_00_{_cm(v)}")
        if "open3d" in scenes and _points("open3d", "fragment") is not None:
            names.append(f"open3d_fragment_{_cm(v)}")
        if "room" in scenes:
            names.append(f"synthetic_room_{_cm(v)}")
    return names


def case_by_name(name: str) -> Case:
    if name == "random_20k_128cube":
        idx, shape = random_cube()
        return name, idx, shape
    m = re.fullmatch(r"(kitti|scannet|open3d|synthetic)_(.+)_(\d+)cm", name)
    if m is None:
        raise ValueError(f"unknown case {name!r}")
    kind, stem, cm = m.group(1), m.group(2), int(m.group(3))
    pts = synthetic_room() if kind == "synthetic" else _points(kind, stem)
    if pts is None:
        raise FileNotFoundError(f"case {name}: data not found under {data_dir()}")
    return _voxel_case(name, pts, cm / 100.0)


