"""Regressions found by the fuzz test (tests/python/fuzz/cases_point_conv.py) in point-cloud sparse
convolution: geometry whose int64 arithmetic wrapped around (spurious kernel-map pairs, huge
allocations), plans whose corruption went unnoticed, operands of the wrong dtype or device
accepted, and sj.voxelize's silent wrap-arounds. (test_point_conv.py is at its size limit.)"""

import pytest
import torch

import sparsejit as sj
from sparsejit.families.point_conv.ops import plan_pairs
from conftest import raises_type_error  # noqa: E402

PLAN = torch.ops.sparsejit.point_conv_plan
CONV = torch.ops.sparsejit.point_conv
CONV_BWD = torch.ops.sparsejit.point_conv_backward
COORDS = torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2], [0, 3, 1, 2]], dtype=torch.int32)


def plan_of(kind="subm", kernel=(3, 3, 3), stride=(1, 1, 1), padding=(0, 0, 0),
            dilation=(1, 1, 1), coords=COORDS, out_coords=None):
    if kind == "generalized" and out_coords is None:
        out_coords = coords
    return PLAN(coords, [8, 8, 8], 1, kind, list(kernel), list(stride), list(padding),
                list(dilation), out_coords)


@pytest.mark.parametrize("kind,arg,geometry", [
    # dilation * (kernel - 1) wrapped to a small value: 27 pairs instead of 3
    ("generalized", "dilation", dict(dilation=(2**62,) * 3)),
    ("coarse", "dilation", dict(dilation=(2**62,) * 3, padding=(2**62,) * 3)),
    # stride^D wrapped negative: std::length_error from a vector size
    ("spconv", "stride", dict(stride=(2**62,) * 3)),
    # 8e6 offsets: a plan no op accepts (K < 2^20); 1e9 offsets: std::bad_alloc
    ("generalized", "kernel", dict(kernel=(200, 200, 200))),
    ("subm", "kernel", dict(kernel=(1001, 1001, 1001))),
    # reach 2^62: the error named an internal "margin"
    ("spconv", "padding", dict(padding=(2**62,) * 3)),
])
def test_conv_plan_refuses_geometry_past_the_coordinate_range(kind, arg, geometry):
    with pytest.raises(ValueError, match=arg):
        plan_of(kind, **geometry)


def test_conv_plan_large_dilation_within_range_is_exact():
    # dilation 2^16, padding 0: i = o + e * 2^16 pairs every site only with itself, by e = 0
    plan, oc = plan_of("generalized", dilation=(2**16,) * 3)
    ptr, ins, outs = plan_pairs(plan)
    assert ins.numel() == 3 and torch.equal(ins, outs)
    assert ptr.diff().tolist() == [3] + [0] * 26


def test_conv_plan_out_coords_width_is_named():
    with pytest.raises(ValueError, match="out_coords"):
        plan_of("generalized", out_coords=COORDS[:, :3])


def _subm():
    plan, oc = plan_of("subm")
    x = torch.randn(3, 2, dtype=torch.float64)
    w = torch.randn(int(plan[10]), 2, 4, dtype=torch.float64)
    return plan, x, w


def test_sparse_conv_refuses_identity_group_with_other_pairs():
    plan, x, w = _subm()
    ident = int(plan[5])
    start = int(plan[11 + ident])  # group_ptr[ident]
    p = plan.clone()
    in_idx = p[11 + int(plan[10]) + 1:].view(torch.int32)  # in_idx starts after group_ptr
    in_idx[start] = 2  # pair (2, 0) in the group run as the identity GEMM
    with pytest.raises(ValueError, match="identity group"):
        CONV(x, w, None, p, 3, False, 0)
    p = plan.clone()
    p[5] = -1  # no identity group: the same pairs run through gather-GEMM-scatter
    torch.testing.assert_close(CONV(x, w, None, p, 3, False, 0), CONV(x, w, None, plan, 3,
                                                                        False, 0))


def test_sparse_conv_refuses_pointers_past_the_pairs():
    plan, x, w = _subm()
    k, m = int(plan[10]), int(plan[7])
    p = plan.clone()
    p[11 + k] = m + 2**31  # group_ptr[K], and both row indexes' last entries to match
    words32 = (m + 1) // 2
    out_row_ptr = 11 + k + 1 + 2 * words32
    p[out_row_ptr + 3] = m + 2**31
    p[out_row_ptr + 4 + words32 + 3] = m + 2**31
    with pytest.raises(ValueError, match="plan"):
        CONV(x, w, None, p, 3, False, 0)


def test_sparse_conv_unknown_op_family_names_the_plan():
    plan, x, w = _subm()
    p = plan.clone()
    p[2] = 99
    with pytest.raises(ValueError, match="plan was built for an unknown op"):
        CONV(x, w, None, p, 3, False, 0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
def test_sparse_conv_bias_and_grad_out_must_be_floating(dtype):
    plan, x, w = _subm()
    with raises_type_error(match="bias"):
        CONV(x, w, torch.ones(4, dtype=dtype), plan, 3, False, 0)
    with raises_type_error(match="grad_out"):
        CONV_BWD(x, w, torch.ones(3, 4, dtype=dtype), plan, False, 0, True, True)


def test_sparse_conv_bias_or_grad_out_on_meta_is_refused():
    plan, x, w = _subm()
    with pytest.raises(ValueError, match="bias on meta"):
        CONV(x, w, torch.ones(4, dtype=x.dtype, device="meta"), plan, 3, False, 0)
    with pytest.raises(ValueError, match="grad_out on meta"):
        CONV_BWD(x, w, torch.ones(3, 4, dtype=x.dtype, device="meta"), plan, False, 0, True,
                 True)


# ---- voxelize ------------------------------------------------------------------------------

@pytest.mark.parametrize("voxel_size", [float("nan"), [1.0, float("nan"), 1.0], [1.0, 1.0]])
def test_voxelize_refuses_nan_or_misshapen_voxel_size(voxel_size):
    with pytest.raises(ValueError, match="voxel_size"):
        sj.voxelize(torch.randn(5, 4), voxel_size)


def test_voxelize_refuses_negative_batch_ids():
    with pytest.raises(ValueError, match="batch"):
        sj.voxelize(torch.randn(5, 4), 0.5, batch=torch.tensor([0, 0, -1, 1, 1]))


def test_voxelize_refuses_voxel_coordinates_past_int32():
    pts = torch.randn(6, 3, dtype=torch.float64)
    pts[0, 1] = 1e12  # 1e12 voxels away: int32 coordinates wrapped around
    with pytest.raises(ValueError, match="voxel"):
        sj.voxelize(pts, 1.0)


def test_voxelize_keeps_distinct_voxels_when_packed_keys_would_wrap():
    # extents 2^21 per axis and 4 clouds: (4 * 2^63) overflowed the packed key, merging voxels
    pts = torch.tensor([[0.0, 0, 0], [2.0**21 - 1, 2.0**21 - 1, 2.0**21 - 1], [5.0, 6, 7],
                        [5.0, 6, 7]], dtype=torch.float64)
    batch = torch.tensor([0, 3, 3, 1])
    coords, feats, p2v = sj.voxelize(pts, 1.0, batch=batch)
    want = torch.cat([batch[:, None], pts.long()], 1)
    assert torch.equal(coords[p2v].long(), want)
    assert coords.shape[0] == 4
    assert torch.equal(coords.long(), want.unique(dim=0))  # sorted by (batch, x, y, z)


def test_sparse_conv_tensor_refuses_int64_indices_past_int32():
    import sparsejit.spconv as spconv

    idx = torch.tensor([[0, 1, 2], [0, 2**32 + 1, 0]])  # .int() made the second site (0, 1, 0)
    with pytest.raises(ValueError, match="indices"):
        spconv.SparseConvTensor(torch.randn(2, 3), idx, [4, 4], 1)


def test_conv_plan_packing_failure_names_the_arguments():
    # the core's "coordinates past the packing range" came from no row: say which arguments
    with pytest.raises(ValueError, match="spatial_shape, batch_size"):
        PLAN(torch.zeros(1, 5, dtype=torch.int32), [2**20] * 4, 1, "subm", [3] * 4, [1] * 4,
             [0] * 4, [1] * 4, None)
