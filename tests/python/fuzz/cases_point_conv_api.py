"""Fuzz case kinds for the point-cloud Python entry points: sj.SparseTensor, sj.voxelize
and the sparsejit.spconv modules (a SubMConv / SparseConv / SparseInverseConv chain against
the formula reference of point_conv_refs.py, and bad module inputs)."""

from __future__ import annotations

import torch

import sparsejit  # noqa: F401  (registers the ops)

from .point_conv_refs import cloud, conv_ref, reference_map
from .refs import Case, Rand, close


def sparse_tensor_and_voxelize(r: Rand) -> Case:
    import sparsejit as sj

    what = r.choice(["st_float_coords", "st_rows", "st_outside", "st_batch", "st_width",
                     "vox_valid", "vox_nan_points", "vox_voxel_size", "vox_batch",
                     "vox_far_points", "vox_points_dtype"])
    dims = 3
    coords = cloud(r, dims, [5, 5, 5], 2, r.randint(1, 12))
    feats = r.data((coords.shape[0], 2), torch.float32)
    if what.startswith("st_"):
        names = {"st_float_coords": ("coords",), "st_rows": ("feats",), "st_outside": ("coords",),
                 "st_batch": ("batch",), "st_width": ("coords",)}[what]
        args = [coords, feats]
        kw = {}
        if what == "st_float_coords":
            args[0] = coords.to(r.choice([torch.float32, torch.complex64, torch.bool]))
        elif what == "st_rows":
            args[1] = r.data((coords.shape[0] + 1, 2), torch.float32)
        elif what == "st_outside":
            kw["spatial_shape"] = [1, 1, 1] if int(coords[:, 1:].max()) > 0 else [1, 1, 0]
        elif what == "st_batch":
            kw["batch_size"] = 0 if int(coords[:, 0].max()) == 0 else int(coords[:, 0].max())
        elif what == "st_width":
            args[0] = torch.cat([coords, coords], 1)
        return Case("invalid", lambda: sj.SparseTensor(*args, **kw), None, what,
                    dict(what=what), names=names)
    p = r.randint(1, 30)
    pts = r.data((p, 3 + r.randint(0, 2)), torch.float64) * 3
    vs = r.choice([0.5, 1.0, [0.5, 1.0, 2.0]])
    kw = dict(voxel_size=vs, reduce=r.choice(["mean", "sum", "max"]))
    if what == "vox_valid":
        batch = torch.randint(0, 3, (p,), generator=r.g) if r.coin() else None
        kw["batch"] = batch

        def check(result):
            coords_v, feats_v, p2v = result
            lo = pts[:, :3].min(0).values
            grid = torch.floor((pts[:, :3] - lo) / torch.tensor(vs).expand(3)).long()
            b = batch if batch is not None else torch.zeros(p, dtype=torch.long)
            want = torch.cat([b[:, None], grid], 1)
            if not torch.equal(coords_v[p2v].long(), want):
                return "point_to_voxel / coords do not give each point's voxel"
            if coords_v.unique(dim=0).shape[0] != coords_v.shape[0]:
                return "duplicate voxels"
            return None
        return Case("valid", lambda: sj.voxelize(pts, **kw), check, "valid voxelize",
                    dict(what=what, p=p))
    names = ("points",)
    if what == "vox_nan_points":  # non-finite points are dropped (index -1), never a voxel
        pts[r.randint(0, p - 1), r.randint(0, 2)] = r.choice([float("nan"), float("inf")])

        def check(result):
            coords_v, feats_v, p2v = result
            bad = ~torch.isfinite(pts[:, :3]).all(1)
            if not bool((p2v[bad] == -1).all()) or bool((p2v[~bad] < 0).any()):
                return f"point_to_voxel {p2v.tolist()} for non-finite rows {bad.nonzero()}"
            if not bool(torch.isfinite(feats_v[:, :3]).all()):
                return "a voxel holds a non-finite point"
            return None
        return Case("valid", lambda: sj.voxelize(pts, **kw), check, "voxelize with NaN / inf "
                    "points", dict(what=what))
    if what == "vox_voxel_size":
        kw["voxel_size"] = r.choice([0.0, -1.0, float("nan"), [1.0, float("nan"), 1.0],
                                     [1.0, 1.0]])
        names = ("voxel_size",)
    elif what == "vox_batch":
        kw["batch"] = r.choice([-torch.ones(p, dtype=torch.long),
                                torch.zeros(p + 1, dtype=torch.long),
                                torch.zeros(p, dtype=torch.float32)])
        names = ("batch",)
    elif what == "vox_far_points":  # grid coordinates past int32
        pts[0, r.randint(0, 2)] = r.choice([1e12, 1e30, -1e30])
        kw["voxel_size"] = r.choice([1e-3, 1.0])
        names = ("points", "voxel", "int32", "range")
    elif what == "vox_points_dtype":
        pts = pts.to(r.choice([torch.int64, torch.complex64]))
    return Case("invalid", lambda: sj.voxelize(pts, **kw), None, what, dict(what=what),
                names=names)


def spconv_modules(r: Rand) -> Case:
    """sparsejit.spconv modules: a valid SubMConv / SparseConv / inverse chain against the
    dense float64 reference of the same weights, or a bad input (channels, dims, int64
    indices past int32, features of another row count, a wrong indice_key)."""
    import sparsejit.spconv as spconv

    dims = r.choice([2, 3])
    shape = [r.randint(3, 6) for _ in range(dims)]
    coords = cloud(r, dims, shape, 2, r.randint(1, 20))
    n, c_in, c_out = coords.shape[0], r.randint(1, 3), r.randint(1, 3)
    feats = r.data((n, c_in), torch.float64)
    subm_cls = {2: spconv.SubMConv2d, 3: spconv.SubMConv3d}[dims]
    conv_cls = {2: spconv.SparseConv2d, 3: spconv.SparseConv3d}[dims]
    inv_cls = {2: spconv.SparseInverseConv2d, 3: spconv.SparseInverseConv3d}[dims]
    torch.manual_seed(r.randint(0, 2**31))
    subm = subm_cls(c_in, c_out, 3, bias=r.coin(), indice_key="s").double()
    down = conv_cls(c_out, c_out, 2, stride=2, indice_key="d").double()
    inv = inv_cls(c_out, c_in, 2, indice_key="d").double()
    what = r.choice(["valid", "valid", "channels", "dims", "indices_int64_past_int32",
                     "feature_rows", "indice_key", "indices_float"])
    idx, f, spatial = coords, feats, shape
    if what == "valid":
        x = spconv.SparseConvTensor(f, idx, spatial, 2)

        def check(y):
            # the chain, by the formulas: subm (centred 3^D), strided 2 / stride 2, inverse
            geo1 = ([3] * dims, [1] * dims, [1] * dims, [1] * dims)
            outs, pairs = reference_map(idx, "subm", spatial, *geo1)
            rows1 = {o: j for j, o in enumerate(outs)}
            w1 = subm.weight.detach().reshape(c_out, -1, c_in).permute(1, 2, 0)
            h = conv_ref(f, w1, subm.bias, [(i, rows1[o], k) for i, o, k in pairs], n)
            geo2 = ([2] * dims, [2] * dims, [0] * dims, [1] * dims)
            outs2, pairs2 = reference_map(idx, "spconv", spatial, *geo2)
            rows2 = {o: j for j, o in enumerate(outs2)}
            w2 = down.weight.detach().reshape(c_out, -1, c_out).permute(1, 2, 0)
            h2 = conv_ref(h, w2, down.bias, [(i, rows2[o], k) for i, o, k in pairs2], len(outs2))
            w3 = inv.weight.detach().reshape(c_in, -1, c_out).permute(1, 2, 0)
            ref = conv_ref(h2, w3, inv.bias, [(rows2[o], i, k) for i, o, k in pairs2], n)
            if not torch.equal(y.indices, idx):
                return "the inverse conv's output sites are not the input's"
            return close(y.features, ref, conv_ref(h2.abs(), w3.abs(), None, [
                (rows2[o], i, k) for i, o, k in pairs2], n) + 1, torch.float64)
        return Case("valid", lambda: inv(down(subm(x))), check, "spconv chain",
                    dict(dims=dims, n=n, c=(c_in, c_out)))
    names = (what.split("_")[0],)
    if what == "channels":
        f = r.data((n, c_in + 1), torch.float64)
        names = ("channels",)
    elif what == "dims":
        spatial = shape + [4]
        idx = torch.cat([coords, torch.zeros(n, 1, dtype=torch.int32)], 1)
        names = ("spatial_shape", "-D")
    elif what == "indices_int64_past_int32":  # .int() would wrap 2^32 + c to c
        idx = coords.long()
        idx[r.randint(0, n - 1), 1 + r.randint(0, dims - 1)] += 2**32
        names = ("indices", "coords", "int32")
    elif what == "feature_rows":
        f = r.data((n + 1, c_in), torch.float64)
        names = ("features",)
    elif what == "indices_float":
        idx = coords.double()
        names = ("indices",)
    elif what == "indice_key":
        x = spconv.SparseConvTensor(f, idx, spatial, 2)

        def call():
            try:
                return inv(subm(x))
            except KeyError as e:  # spconv's own type for an unknown key: accepted here
                raise ValueError(str(e)) from e
        return Case("invalid", call, None, "inverse conv without its key", dict(what=what),
                    names=("indice_key",))
    return Case("invalid", lambda: subm(spconv.SparseConvTensor(f, idx, spatial, 2)), None,
                f"spconv with a bad {what}", dict(what=what, dims=dims), names=names)


POINTCLOUD_CASES = [sparse_tensor_and_voxelize, spconv_modules]
