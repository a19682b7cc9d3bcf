"""sparsejit.torchsparse (TorchSparse 2.0's API, coords x, y, z, batch) against dense conv3d
references (float64), against sparsejit.spconv with converted weights, and against
TorchSparse itself where it is importable."""


import pytest
import torch

import sparsejit.spconv as spconv
import sparsejit.torchsparse as ts
import sparsejit.torchsparse.nn as spnn
import sparsejit.torchsparse.nn.functional as TF
from lattice_reference import (conv_reference, grads_close, leaf, saved_and_loaded, sort_rows,
                               transposed_reference)


def cloud_bf(n, extent, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    flat = torch.randperm(batch * extent ** 3, generator=g)[:n]
    z, y, x = flat % extent, (flat // extent) % extent, (flat // extent ** 2) % extent
    return torch.stack([flat // extent ** 3, x, y, z], 1).int()


def skewed_bf(seed=0):
    g = torch.Generator().manual_seed(seed)
    blob = cloud_bf(120, 6, batch=1, seed=seed)
    line = torch.stack([torch.ones(9, dtype=torch.int32), torch.arange(0, 18, 2).int(),
                        torch.full((9,), 3, dtype=torch.int32),
                        torch.zeros(9, dtype=torch.int32)], 1)
    c = torch.cat([blob, line, torch.tensor([[2, 11, 0, 7]], dtype=torch.int32)])
    return c[torch.randperm(c.shape[0], generator=g)]


CLOUDS = {"random": lambda: cloud_bf(300, 10, seed=1), "skewed": lambda: skewed_bf(2),
          "one": lambda: torch.tensor([[0, 3, 1, 4]], dtype=torch.int32)}


def to_ts(bf):
    """batch-first [N, 4] -> TorchSparse's (x, y, z, batch)."""
    return bf[:, [1, 2, 3, 0]].contiguous()


def to_bf(c):
    return c[:, [3, 0, 1, 2]].contiguous()


def ts_lower(k):
    return (-k) // 2 + 1


@pytest.mark.parametrize("name", sorted(CLOUDS))
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_conv_stride1_matches_dense(name, k, poison_empty):
    bf = CLOUDS[name]()
    f = leaf(bf.shape[0], 3)
    x = ts.SparseTensor(f, to_ts(bf))
    conv = spnn.Conv3d(3, 5, kernel_size=k, bias=True).double()
    y = conv(x)
    assert torch.equal(y.C, x.C) and y.stride == (1, 1, 1)
    kernel = conv.kernel if k > 1 else conv.kernel[None]
    # TorchSparse: offsets -k//2+1 .. k//2, x fastest for odd volumes, z fastest for even.
    ref = conv_reference(bf, f, kernel, k, 1, 1, 1, bf, conv.bias, lower=ts_lower(k),
                         x_fastest=k % 2 == 1)
    torch.testing.assert_close(y.F, ref)
    grads_close(y.F, ref, [f, conv.kernel, conv.bias])


@pytest.mark.parametrize("name", sorted(CLOUDS))
@pytest.mark.parametrize("k", [2, 3])
def test_strided_then_transposed(name, k, poison_empty):
    bf = CLOUDS[name]()
    f = leaf(bf.shape[0], 4)
    x = ts.SparseTensor(f, to_ts(bf))
    down = spnn.Conv3d(4, 6, k, stride=k).double()
    mid = spnn.Conv3d(6, 6, 3, bias=True).double()
    up = spnn.Conv3d(6, 3, k, stride=k, bias=True, transposed=True).double()
    y = down(x)
    assert y.stride == (k, k, k)
    # TorchSparse's sites: trunc(c / k) * k, unique, sorted by (batch, x, y, z).
    cb = bf.long()
    want = torch.unique(torch.cat([cb[:, :1], cb[:, 1:] // k * k], 1), dim=0)
    assert torch.equal(to_bf(y.C).long(), want)
    ref = conv_reference(bf, f, down.kernel, k, k, 1, 1, to_bf(y.C), lower=ts_lower(k),
                         x_fastest=k % 2 == 1)
    torch.testing.assert_close(y.F, ref)
    y2 = mid(y)
    maps = len(x.kmaps)
    z = up(y2)
    # Back on the original coords, row for row, through the strided map (no new map).
    assert torch.equal(z.C, x.C) and z.stride == (1, 1, 1) and len(x.kmaps) == maps
    ref_up = transposed_reference(to_bf(y2.C), y2.F, up.kernel, k, k, 1, k, bf, up.bias,
                                  x_fastest=k % 2 == 1)
    torch.testing.assert_close(z.F, ref_up)
    grads_close(z.F, ref_up, [f, down.kernel, mid.kernel, up.kernel, up.bias])


def test_kernel_maps_shared_and_negative_coordinates():
    bf = cloud_bf(200, 8, seed=4)
    bf[:, 1:] -= 4
    x = ts.SparseTensor(torch.randn(bf.shape[0], 4, dtype=torch.float64), to_ts(bf))
    a, b = spnn.Conv3d(4, 4, 3).double(), spnn.Conv3d(4, 4, 3).double()
    b(a(x))
    assert len(x.kmaps) == 1
    y = spnn.Conv3d(4, 4, 2, stride=2).double()(x)
    # TorchSparse 2.0 truncates towards zero on the CPU (not floor): -3 -> -2, 3 -> 2.
    cb = bf.long()
    want = torch.unique(torch.cat([cb[:, :1], torch.div(cb[:, 1:], 2, rounding_mode="trunc")
                                   * 2], 1), dim=0)
    assert torch.equal(to_bf(y.C).long(), want)
    # Brute force: output o sums the inputs at o + e (e in {0, 1}^3, z fastest).
    conv = spnn.Conv3d(4, 3, 2, stride=2).double()
    out = conv(x)
    rows = {tuple(r): i for i, r in enumerate(x.C.tolist())}
    ref = torch.zeros(out.C.shape[0], 3, dtype=torch.float64)
    for o, (cx, cy, cz, cb_) in enumerate(out.C.tolist()):
        for kk, (ex, ey, ez) in enumerate([(i, j, m) for i in (0, 1) for j in (0, 1)
                                           for m in (0, 1)]):
            r = rows.get((cx + ex, cy + ey, cz + ez, cb_))
            if r is not None:
                ref[o] += x.F[r] @ conv.kernel[kk]
    torch.testing.assert_close(out.F, ref)


def test_compare_with_sparsejit_spconv():
    bf = cloud_bf(400, 12, seed=7)
    f = torch.randn(bf.shape[0], 4, dtype=torch.float64)
    sub, down = spnn.Conv3d(4, 8, 3, bias=True).double(), spnn.Conv3d(8, 16, 2, 2).double()
    up = spnn.Conv3d(16, 8, 2, 2, transposed=True).double()
    sp_sub = spconv.SubMConv3d(4, 8, 3, bias=True).double()
    sp_down = spconv.SparseConv3d(8, 16, 2, 2, bias=False, indice_key="d").double()
    sp_up = spconv.SparseInverseConv3d(16, 8, 2, indice_key="d", bias=False).double()
    with torch.no_grad():
        # odd volume: x fastest -> permute; even volume: z fastest, spconv's own order.
        sp_sub.weight.copy_(sub.kernel.reshape(3, 3, 3, 4, 8).permute(4, 2, 1, 0, 3))
        sp_sub.bias.copy_(sub.bias)
        sp_down.weight.copy_(down.kernel.reshape(2, 2, 2, 8, 16).permute(4, 0, 1, 2, 3))
        sp_up.weight.copy_(up.kernel.reshape(2, 2, 2, 16, 8).permute(4, 0, 1, 2, 3))
    x = ts.SparseTensor(f, to_ts(bf))
    st = spconv.SparseConvTensor(f, bf, [12, 12, 12], 2)
    a1, s1 = sub(x), sp_sub(st)
    torch.testing.assert_close(a1.F, s1.features)
    a2, s2 = down(a1), sp_down(s1)
    ca, fa = sort_rows(to_bf(a2.C) // torch.tensor([1, 2, 2, 2], dtype=torch.int32), a2.F)
    cs, fs = sort_rows(s2.indices, s2.features)
    assert torch.equal(ca, cs)
    torch.testing.assert_close(fa, fs)
    torch.testing.assert_close(up(a2).F, sp_up(s2).features)


def test_norm_activations_pooling_cat():
    bf = skewed_bf(3)
    f = leaf(bf.shape[0], 4)
    x = ts.SparseTensor(f, to_ts(bf))
    bn = spnn.BatchNorm(4).double()
    torch.testing.assert_close(bn(x).F, torch.nn.functional.batch_norm(
        f, None, None, bn.weight, bn.bias, training=True))
    torch.testing.assert_close(spnn.ReLU()(x).F, torch.relu(f))
    torch.testing.assert_close(spnn.LeakyReLU(0.1)(x).F, torch.nn.functional.leaky_relu(f, 0.1))
    avg = torch.stack([f[bf[:, 0] == b].mean(0) for b in range(3)])
    mx = torch.stack([f[bf[:, 0] == b].max(0).values for b in range(3)])
    torch.testing.assert_close(spnn.GlobalAvgPool()(x), avg)
    torch.testing.assert_close(spnn.GlobalMaxPool()(x), mx)
    grads_close(spnn.GlobalAvgPool()(x), avg, [f])
    torch.testing.assert_close(ts.cat([x, x]).F, torch.cat([f, f], 1))
    torch.testing.assert_close((x + x).F, 2 * f)


def test_point_voxel_helpers():
    g = torch.Generator().manual_seed(5)
    p = 400
    xyz = torch.rand(p, 3, generator=g, dtype=torch.float64) * 8
    batch = torch.randint(0, 2, (p, 1), generator=g).double()
    pf = torch.randn(p, 3, dtype=torch.float64, generator=g, requires_grad=True)
    z = ts.PointTensor(pf, torch.cat([xyz, batch], 1))
    v = ts.initial_voxelize(z, 0.5, 1.0)          # cells of xyz * 0.5
    cells = torch.cat([torch.floor(xyz * 0.5), batch], 1).long()
    uniq, inv = torch.unique(cells[:, [3, 0, 1, 2]], dim=0, return_inverse=True)
    assert torch.equal(to_bf(v.C).long(), uniq)
    mean = torch.stack([pf[inv == i].mean(0) for i in range(uniq.shape[0])])
    torch.testing.assert_close(v.F, mean)
    # Down to stride 2, back to the points: the mean of the points in each stride-2 voxel.
    v2 = spnn.Conv3d(3, 3, 2, stride=2).double()(v)
    pv = ts.point_to_voxel(v2, z)
    cell2 = torch.cat([torch.floor(z.C[:, :3] / 2) * 2, z.C[:, 3:]], 1).long()
    for r, key in enumerate(v2.C.long().tolist()):
        inside = (cell2 == torch.tensor(key)).all(1)
        want = pf[inside].mean(0) if bool(inside.any()) else torch.zeros(3, dtype=pf.dtype)
        torch.testing.assert_close(pv.F[r], want)
    # Voxels to points: trilinear over the 8 corners, missing corners renormalised away.
    out = ts.voxel_to_point(v2, z)
    rows = {tuple(r): i for i, r in enumerate(v2.C.long().tolist())}
    ref = torch.zeros(p, 3, dtype=torch.float64)
    for i in range(p):
        q = z.C[i, :3]
        lo = torch.floor(q / 2) * 2
        acc, wsum = torch.zeros(3, dtype=torch.float64), 0.0
        for cx in (0, 1):
            for cy in (0, 1):
                for cz in (0, 1):
                    corner = lo + 2 * torch.tensor([cx, cy, cz], dtype=torch.float64)
                    t = 1 - (q - corner).abs() / 2
                    w = float(t.prod())
                    r = rows.get((*corner.long().tolist(), int(z.C[i, 3])))
                    if r is not None:
                        acc = acc + w * v2.F[r]
                        wsum += w
        ref[i] = acc / (wsum + 1e-8)
    torch.testing.assert_close(out.F, ref)
    out.F.sum().backward()
    assert pf.grad is not None and torch.isfinite(pf.grad).all()
    near = ts.voxel_to_point(v2, ts.PointTensor(pf.detach(), z.C.clone()), nearest=True)
    assert near.F.shape == (p, 3)


class TinySPVCNN(torch.nn.Module):
    """SPVCNN's data flow, shrunk: points -> voxels -> a strided stage -> back to the points,
    point branch added, voxels again from the points, a transposed stage, per-point head."""

    def __init__(self, cin=4, c=8, classes=3):
        super().__init__()
        self.stem = torch.nn.Sequential(spnn.Conv3d(cin, c, 3), spnn.BatchNorm(c),
                                        spnn.ReLU(True))
        self.down = torch.nn.Sequential(spnn.Conv3d(c, 2 * c, 2, stride=2), spnn.BatchNorm(2 * c),
                                        spnn.ReLU(True), spnn.Conv3d(2 * c, 2 * c, 3))
        self.point1 = torch.nn.Linear(c, 2 * c)
        self.up = spnn.Conv3d(2 * c, c, 2, stride=2, transposed=True)
        self.point2 = torch.nn.Linear(2 * c, c)
        self.head = torch.nn.Linear(c, classes)

    def forward(self, z):
        x0 = ts.initial_voxelize(z, 1.0, 1.0)
        z0 = ts.voxel_to_point(x0, z, nearest=False)
        x1 = self.stem(ts.point_to_voxel(x0, z0))
        z1 = ts.voxel_to_point(x1, z0)
        x2 = self.down(x1)
        z2 = ts.voxel_to_point(x2, z1)
        z2.F = z2.F + self.point1(z1.F)
        x3 = self.up(ts.point_to_voxel(x2, z2))
        z3 = ts.voxel_to_point(x3, z2)
        z3.F = z3.F + self.point2(z2.F)
        return self.head(z3.F)


def test_spvcnn_style_network_trains():
    g = torch.Generator().manual_seed(21)
    p = 1500
    xyz = torch.rand(p, 3, generator=g) * 12
    z = ts.PointTensor(torch.randn(p, 4, generator=g),
                       torch.cat([xyz, torch.randint(0, 2, (p, 1), generator=g).float()], 1))
    labels = (xyz[:, 2] > 6).long() + (xyz[:, 0] > 6).long()
    net = TinySPVCNN()
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    losses = []
    for _ in range(4):
        zz = ts.PointTensor(z.F, z.C.clone())
        out = net(zz)
        assert out.shape == (p, 3)
        loss = torch.nn.functional.cross_entropy(out, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


def test_state_dict_round_trip_in_torchsparse_layout():
    def net():
        return torch.nn.Sequential(spnn.Conv3d(3, 8, 3), spnn.BatchNorm(8), spnn.ReLU(True),
                                   spnn.Conv3d(8, 8, 2, stride=2, bias=True),
                                   spnn.Conv3d(8, 4, 1))
    a = net()
    sd = a.state_dict()
    assert sd["0.kernel"].shape == (27, 3, 8) and sd["3.kernel"].shape == (8, 8, 8)
    assert sd["3.bias"].shape == (8,) and sd["4.kernel"].shape == (8, 4)
    assert {"1.weight", "1.running_mean", "1.running_var"} <= set(sd)
    b = net()
    b.load_state_dict(saved_and_loaded(sd))
    a.eval(), b.eval()
    bf = CLOUDS["random"]()
    f = torch.randn(bf.shape[0], 3)
    torch.testing.assert_close(a(ts.SparseTensor(f, to_ts(bf))).F,
                               b(ts.SparseTensor(f, to_ts(bf))).F)


def test_quantize_and_collate():
    from sparsejit.torchsparse.utils.collate import sparse_collate_fn
    from sparsejit.torchsparse.utils.quantize import sparse_quantize
    g = torch.Generator().manual_seed(8)
    pts = (torch.rand(500, 3, generator=g, dtype=torch.float64) * 4 - 2).numpy()
    vox, idx, inv = sparse_quantize(pts, 0.5, return_index=True, return_inverse=True)
    cells = torch.floor(torch.from_numpy(pts) / 0.5).long()
    want, winv = torch.unique(cells, dim=0, return_inverse=True)
    assert torch.equal(torch.from_numpy(vox).long(), want)
    assert torch.equal(torch.from_numpy(inv).long(), winv)
    assert torch.equal(cells[torch.from_numpy(idx)], want)
    first = [int((winv == v).nonzero()[0, 0]) for v in range(want.shape[0])]
    assert idx.tolist() == first
    samples = [{"input": ts.SparseTensor(torch.randn(n, 2), torch.randint(0, 9, (n, 3)).int()),
                "label": torch.tensor(n)} for n in (5, 1, 7)]
    batch = sparse_collate_fn(samples)
    x = batch["input"]
    assert x.C.shape == (13, 4) and x.C[:, 3].tolist() == [0] * 5 + [1] + [2] * 7
    assert torch.equal(x.F, torch.cat([s["input"].F for s in samples]))
    assert batch["label"].tolist() == [5, 1, 7]
    with pytest.raises(ValueError, match="batch"):
        spnn.Conv3d(2, 2, 3)(samples[0]["input"])
    with pytest.raises(ValueError, match="voxel_size"):
        sparse_quantize(pts, 0.0)


def test_empty_input():
    x = ts.SparseTensor(torch.zeros(0, 3), torch.zeros(0, 4, dtype=torch.int32))
    assert spnn.Conv3d(3, 4, 3, bias=True)(x).F.shape == (0, 4)
    y = spnn.Conv3d(3, 4, 2, stride=2)(x)
    assert y.F.shape == (0, 4) and y.stride == (2, 2, 2)
    assert spnn.Conv3d(4, 2, 2, stride=2, transposed=True)(y).F.shape == (0, 2)


def test_bad_inputs_name_the_argument():
    bf = cloud_bf(20, 5)
    f = torch.randn(20, 3)
    with pytest.raises(ValueError, match="coords must be"):
        ts.SparseTensor(f, bf[:, :2])
    with pytest.raises(ValueError, match="feats must be"):
        ts.SparseTensor(f[:19], to_ts(bf))
    with pytest.raises(TypeError, match="integers"):
        ts.SparseTensor(f, to_ts(bf).float())
    with pytest.raises(ValueError, match="stride"):
        ts.SparseTensor(f, to_ts(bf), stride=(1, 2))
    with pytest.raises(ValueError, match="kernel_size"):
        spnn.Conv3d(3, 4, (3, 3))
    with pytest.raises(ValueError, match="in_channels"):
        spnn.Conv3d(0, 4, 3)
    x = ts.SparseTensor(f, to_ts(bf))
    with pytest.raises(ValueError, match="in_channels = 4"):
        spnn.Conv3d(4, 4, 3)(x)
    with pytest.raises(TypeError, match="SparseTensor"):
        spnn.Conv3d(3, 4, 3)(f)
    with pytest.raises(NotImplementedError, match="dilation"):
        spnn.Conv3d(3, 4, 3, dilation=2)(x)
    with pytest.raises(NotImplementedError, match="stride = kernel_size"):
        spnn.Conv3d(3, 4, 3, stride=2)(x)
    with pytest.raises(KeyError, match="no strided convolution"):
        spnn.Conv3d(3, 4, 2, stride=2, transposed=True)(x)
    with pytest.raises(TypeError, match="float64"):
        spnn.Conv3d(3, 4, 3)(ts.SparseTensor(f.double(), to_ts(bf)))
    neg = to_ts(bf)
    neg[7, 3] = -2
    with pytest.raises(ValueError, match=r"coords\[7, 3\] = -2 is a negative batch index"):
        spnn.Conv3d(3, 4, 3)(ts.SparseTensor(f, neg))
    dup = to_ts(bf)
    dup[5] = dup[2]
    with pytest.raises(ValueError, match="rows 2 and 5 are the same site"):
        spnn.Conv3d(3, 4, 3)(ts.SparseTensor(f, dup))
    with pytest.raises(ValueError, match="sphash"):
        TF.sphash(torch.tensor([[1 << 20, 0, 0, 0]], dtype=torch.int32))
    with pytest.raises(TypeError, match="PointTensor"):
        ts.voxel_to_point(x, x)
    with pytest.raises(ValueError, match="cat"):
        ts.cat([x, spnn.Conv3d(3, 3, 2, stride=2)(x)])


def test_against_torchsparse():
    tsp = pytest.importorskip("torchsparse")
    tnn = pytest.importorskip("torchsparse.nn")
    bf = cloud_bf(300, 10, seed=11)
    f = torch.randn(bf.shape[0], 4)
    ours = [spnn.Conv3d(4, 8, 3), spnn.Conv3d(8, 8, 2, stride=2),
            spnn.Conv3d(8, 4, 2, stride=2, transposed=True)]
    theirs = [tnn.Conv3d(4, 8, 3), tnn.Conv3d(8, 8, 2, stride=2),
              tnn.Conv3d(8, 4, 2, stride=2, transposed=True)]
    for a, b in zip(ours, theirs):
        b.load_state_dict(a.state_dict())
    x, y = ts.SparseTensor(f, to_ts(bf)), tsp.SparseTensor(f, to_ts(bf))
    for a, b in zip(ours, theirs):
        x, y = a(x), b(y)
        ca, fa = sort_rows(to_bf(x.C), x.F)
        cb, fb = sort_rows(to_bf(y.C), y.F)
        assert torch.equal(ca, cb)
        torch.testing.assert_close(fa, fb, rtol=1e-4, atol=1e-5)
