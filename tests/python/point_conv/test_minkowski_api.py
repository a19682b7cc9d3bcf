"""sparsejit.minkowski (MinkowskiEngine 0.5's API) against dense conv3d references (float64),
against sparsejit.spconv with converted weights, and against MinkowskiEngine itself where it
is importable."""


import pytest
import torch

import sparsejit.minkowski as ME
import sparsejit.spconv as spconv
from lattice_reference import (conv_reference, grads_close, leaf, pool_reference,
                               saved_and_loaded, sort_rows,
                               transposed_reference)


def cloud(n, extent, batch=2, seed=0, ts=1):
    """n distinct sites (batch first) in [0, extent)^3, multiples of ts."""
    g = torch.Generator().manual_seed(seed)
    total = batch * extent ** 3
    flat = torch.randperm(total, generator=g)[:n]
    z = flat % extent
    y = (flat // extent) % extent
    x = (flat // extent ** 2) % extent
    b = flat // extent ** 3
    return torch.stack([b, x * ts, y * ts, z * ts], 1).int()


def skewed_cloud(seed=0):
    """One dense blob in batch 0, a single site in batch 2, a thin line in batch 1."""
    g = torch.Generator().manual_seed(seed)
    blob = cloud(120, 6, batch=1, seed=seed)
    line = torch.stack([torch.ones(9, dtype=torch.int32),
                        torch.arange(0, 18, 2, dtype=torch.int32),
                        torch.full((9,), 3, dtype=torch.int32),
                        torch.zeros(9, dtype=torch.int32)], 1)
    single = torch.tensor([[2, 11, 0, 7]], dtype=torch.int32)
    c = torch.cat([blob, line, single])
    return c[torch.randperm(c.shape[0], generator=g)]


CLOUDS = {
    "random": lambda: cloud(300, 10, seed=1),
    "skewed": lambda: skewed_cloud(2),
    "one": lambda: torch.tensor([[0, 3, 1, 4]], dtype=torch.int32),
}


@pytest.mark.parametrize("name", sorted(CLOUDS))
@pytest.mark.parametrize("k,dil", [(3, 1), (3, 2), (1, 1), (5, 1), (2, 1)])
def test_conv_stride1_matches_dense(name, k, dil, poison_empty):
    coords = CLOUDS[name]()
    f = leaf(coords.shape[0], 3)
    x = ME.SparseTensor(f, coordinates=coords)
    conv = ME.MinkowskiConvolution(3, 5, kernel_size=k, dilation=dil, bias=True,
                                   dimension=3).double()
    y = conv(x)
    assert y.coordinate_map_key == x.coordinate_map_key and torch.equal(y.C, coords)
    kernel = conv.kernel if k > 1 else conv.kernel[None]
    ref = conv_reference(coords, f, kernel, k, 1, dil, 1, coords, conv.bias)
    torch.testing.assert_close(y.F, ref)
    grads_close(y.F, ref, [f, conv.kernel, conv.bias])


@pytest.mark.parametrize("name", sorted(CLOUDS))
@pytest.mark.parametrize("k,s", [(2, 2), (3, 2), (1, 2), (3, 3)])
def test_strided_then_transposed(name, k, s, poison_empty):
    coords = CLOUDS[name]()
    f = leaf(coords.shape[0], 4)
    x = ME.SparseTensor(f, coordinates=coords)
    down = ME.MinkowskiConvolution(4, 6, kernel_size=k, stride=s, dimension=3).double()
    up = ME.MinkowskiConvolutionTranspose(6, 3, kernel_size=k, stride=s, bias=True,
                                          dimension=3).double()
    y = down(x)
    assert y.tensor_stride == [s] * 3
    # Output sites: floor(c / s) * s, each once.
    c = coords.long()
    want = torch.unique(torch.cat([c[:, :1], torch.div(c[:, 1:], s, rounding_mode="floor") * s],
                                  1), dim=0)
    got = torch.unique(y.C.long(), dim=0)
    assert got.shape[0] == y.C.shape[0] and torch.equal(got, want)
    ref = conv_reference(coords, f, down.kernel.reshape(-1, 4, 6), k, s, 1, 1, y.C)
    torch.testing.assert_close(y.F, ref)
    plans = len(x.coordinate_manager._plans)
    z = up(y)
    # Back on the original sites, through the strided map read backwards (no new map).
    assert z.coordinate_map_key == x.coordinate_map_key and torch.equal(z.C, coords)
    assert len(x.coordinate_manager._plans) == plans
    ref_up = transposed_reference(y.C, y.F, up.kernel.reshape(-1, 6, 3), k, s, 1, s, coords,
                                  up.bias)
    torch.testing.assert_close(z.F, ref_up)
    grads_close(z.F, ref_up, [f, down.kernel, up.kernel, up.bias])


def test_conv_onto_given_coordinates():
    coords = CLOUDS["random"]()
    f = leaf(coords.shape[0], 3)
    x = ME.SparseTensor(f, coordinates=coords)
    # Outputs at a subset of the sites plus new ones (ME's `coordinates` argument).
    extra = torch.tensor([[0, 12, 12, 12], [1, 0, 11, 3]], dtype=torch.int32)
    target = torch.cat([coords[::3], extra])
    conv = ME.MinkowskiConvolution(3, 4, 3, dimension=3).double()
    y = conv(x, coordinates=target)
    assert torch.equal(y.C, target) and y.coordinate_map_key != x.coordinate_map_key
    ref = conv_reference(coords, f, conv.kernel, 3, 1, 1, 1, target)
    torch.testing.assert_close(y.F, ref)
    assert torch.equal(conv(x, coordinates=y).C, target)


def test_minkunet_example_trains():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[3] / "examples" / "minkunet_minkowski.py"
    spec = importlib.util.spec_from_file_location("minkunet_minkowski", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model = example.make_model(ME, 2, 4)
    coords = cloud(400, 14, seed=9)
    x = ME.SparseTensor(torch.randn(coords.shape[0], 2), coordinates=coords)
    labels = torch.randint(0, 4, (coords.shape[0],))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(3):
        y = model(x)
        assert torch.equal(y.C, coords) and y.F.shape == (coords.shape[0], 4)
        loss = torch.nn.functional.cross_entropy(y.F, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("k,s,dil", [(3, 2, 2), (2, 2, 3), (3, 3, 2)])
def test_strided_dilated_then_transposed(k, s, dil):
    coords = CLOUDS["random"]()
    f = leaf(coords.shape[0], 3)
    x = ME.SparseTensor(f, coordinates=coords)
    down = ME.MinkowskiConvolution(3, 4, k, stride=s, dilation=dil, dimension=3).double()
    up = ME.MinkowskiConvolutionTranspose(4, 2, k, stride=s, dilation=dil,
                                          dimension=3).double()
    y = down(x)
    torch.testing.assert_close(y.F, conv_reference(coords, f, down.kernel, k, s, dil, 1, y.C))
    z = up(y)
    assert torch.equal(z.C, coords)
    ref = transposed_reference(y.C, y.F, up.kernel, k, s, dil, s, coords)
    torch.testing.assert_close(z.F, ref)
    grads_close(z.F, ref, [f, down.kernel, up.kernel])


@pytest.mark.parametrize("k", [2, 3])
def test_transposed_without_a_finer_key_makes_sites(k):
    coarse = cloud(80, 6, seed=15, ts=2)
    f = leaf(coarse.shape[0], 3)
    x = ME.SparseTensor(f, coordinates=coarse, tensor_stride=2)
    up = ME.MinkowskiConvolutionTranspose(3, 2, k, stride=2, dimension=3).double()
    y = up(x)
    assert y.tensor_stride == [1, 1, 1]
    lo = 0 if k % 2 == 0 else -(k // 2)
    r = torch.arange(lo, lo + k)
    offs = torch.cartesian_prod(r, r, r)
    cand = coarse[:, None, 1:].long() + offs[None]
    want = torch.unique(torch.cat([coarse[:, :1].long().repeat_interleave(offs.shape[0], 0),
                                   cand.reshape(-1, 3)], 1), dim=0)
    assert torch.equal(torch.unique(y.C.long(), dim=0), want) and y.C.shape[0] == want.shape[0]
    shift = torch.tensor([0, 2, 2, 2], dtype=torch.int32)   # keep the reference non-negative
    ref = transposed_reference(coarse + shift, f, up.kernel, k, 2, 1, 2, y.C + shift)
    torch.testing.assert_close(y.F, ref)


def test_two_dimensional():
    g = torch.Generator().manual_seed(14)
    flat = torch.randperm(2 * 12 * 12, generator=g)[:150]
    coords = torch.stack([flat // 144, (flat // 12) % 12, flat % 12], 1).int()
    f = leaf(150, 3)
    x = ME.SparseTensor(f, coordinates=coords)
    conv = ME.MinkowskiConvolution(3, 4, 3, dimension=2).double()
    down = ME.MinkowskiConvolution(4, 2, 2, stride=2, dimension=2).double()
    y = conv(x)
    z = down(y)
    c = coords.long()
    sites = (c[:, 0], c[:, 1], c[:, 2])
    dense = f.new_zeros(2, 14, 14, 3).index_put(sites, f).movedim(-1, 1)
    occupied = f.new_zeros(2, 14, 14, 1).index_put(sites, f.new_ones(150, 1)).movedim(-1, 1)
    w = conv.kernel.reshape(3, 3, 3, 4).permute(3, 2, 1, 0)  # x fastest -> [out, in, x, y]
    yd = torch.nn.functional.conv2d(dense, w, padding=1)
    torch.testing.assert_close(y.F, yd.movedim(1, -1)[c[:, 0], c[:, 1], c[:, 2]])
    wd = down.kernel.reshape(2, 2, 4, 2).permute(3, 2, 1, 0)
    zd = torch.nn.functional.conv2d(yd * occupied, wd, stride=2)
    zc = z.C.long()
    torch.testing.assert_close(z.F, zd.movedim(1, -1)[zc[:, 0], zc[:, 1] // 2, zc[:, 2] // 2])


def test_two_levels_and_negative_coordinates():
    c = cloud(250, 9, seed=3)
    c[:, 1:] -= 4  # negative coordinates: floor, not truncation
    c = c.int()
    f = leaf(c.shape[0], 2)
    x = ME.SparseTensor(f, coordinates=c)
    d1 = ME.MinkowskiConvolution(2, 3, 2, stride=2, dimension=3).double()
    d2 = ME.MinkowskiConvolution(3, 4, 3, stride=2, dimension=3).double()
    u2 = ME.MinkowskiConvolutionTranspose(4, 3, 3, stride=2, dimension=3).double()
    y1 = d1(x)
    y2 = d2(y1)
    assert y2.tensor_stride == [4, 4, 4]
    floor4 = torch.div(c[:, 1:].long(), 4, rounding_mode="floor") * 4
    assert torch.equal(torch.unique(y2.C.long(), dim=0),
                       torch.unique(torch.cat([c[:, :1].long(), floor4], 1), dim=0))
    z = u2(y2)
    assert z.coordinate_map_key == y1.coordinate_map_key
    # Shift onto non-negative coordinates (a multiple of 4) for the dense reference.
    shift = torch.tensor([0, 4, 4, 4], dtype=torch.int32)
    r1 = conv_reference(c + shift, f, d1.kernel, 2, 2, 1, 1, y1.C + shift)
    torch.testing.assert_close(y1.F, r1)
    r2 = conv_reference(y1.C + shift, y1.F, d2.kernel, 3, 2, 1, 2, y2.C + shift)
    torch.testing.assert_close(y2.F, r2)
    r3 = transposed_reference(y2.C + shift, y2.F, u2.kernel, 3, 2, 1, 4, y1.C + shift)
    torch.testing.assert_close(z.F, r3)


@pytest.mark.parametrize("kind,cls", [("max", ME.MinkowskiMaxPooling),
                                      ("avg", ME.MinkowskiAvgPooling),
                                      ("sum", ME.MinkowskiSumPooling)])
@pytest.mark.parametrize("k,s", [(2, 2), (3, 2), (3, 1)])
def test_pooling_matches_dense(kind, cls, k, s):
    coords = CLOUDS["random"]()
    f = leaf(coords.shape[0], 3)
    x = ME.SparseTensor(f, coordinates=coords)
    y = cls(kernel_size=k, stride=s, dimension=3)(x)
    lower = 0 if k == s else -(k // 2)
    ref = pool_reference(kind, coords, f, k, s, 1, 1, y.C, lower)
    torch.testing.assert_close(y.F, ref)
    grads_close(y.F, ref, [f])


def test_global_pooling_and_linear():
    coords = skewed_cloud(5)
    f = leaf(coords.shape[0], 4)
    x = ME.SparseTensor(f, coordinates=coords)
    for cls, red in [(ME.MinkowskiGlobalPooling, lambda t: t.mean(0)),
                     (ME.MinkowskiGlobalAvgPooling, lambda t: t.mean(0)),
                     (ME.MinkowskiGlobalSumPooling, lambda t: t.sum(0)),
                     (ME.MinkowskiGlobalMaxPooling, lambda t: t.max(0).values)]:
        y = cls()(x)
        assert y.C.tolist() == [[0, 0, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0]]
        assert y.tensor_stride == [0, 0, 0]
        ref = torch.stack([red(f[coords[:, 0] == b]) for b in range(3)])
        torch.testing.assert_close(y.F, ref)
        grads_close(y.F, ref, [f])
    lin = ME.MinkowskiLinear(4, 2).double()
    torch.testing.assert_close(lin(x).F, torch.nn.functional.linear(f, lin.linear.weight,
                                                                     lin.linear.bias))


def test_activations_bn_dropout_cat_and_arithmetic():
    coords = CLOUDS["random"]()
    f = leaf(coords.shape[0], 4)
    x = ME.SparseTensor(f, coordinates=coords)
    for name, ref in [("MinkowskiReLU", torch.relu), ("MinkowskiSigmoid", torch.sigmoid),
                      ("MinkowskiTanh", torch.tanh), ("MinkowskiGELU", torch.nn.functional.gelu),
                      ("MinkowskiSiLU", torch.nn.functional.silu),
                      ("MinkowskiELU", torch.nn.functional.elu)]:
        torch.testing.assert_close(getattr(ME, name)()(x).F, ref(f))
    torch.testing.assert_close(ME.MinkowskiLeakyReLU(0.2)(x).F,
                               torch.nn.functional.leaky_relu(f, 0.2))
    bn = ME.MinkowskiBatchNorm(4).double()
    torch.testing.assert_close(bn(x).F, torch.nn.functional.batch_norm(
        f, None, None, bn.bn.weight, bn.bn.bias, training=True))
    drop = ME.MinkowskiDropout(0.5).eval()
    assert torch.equal(drop(x).F, f)
    y = ME.cat(x, ME.MinkowskiReLU()(x))
    torch.testing.assert_close(y.F, torch.cat([f, torch.relu(f)], 1))
    torch.testing.assert_close((x + x * 2 - x / 2).F, f * 2.5)
    d, mn, ts = x.dense()
    assert d.shape[1] == 4 and mn.tolist() == [coords[:, 1:].min(0).values.tolist()]
    assert ts.tolist() == [1, 1, 1]
    c = coords.long() - torch.cat([torch.zeros(1, dtype=torch.long), mn[0].long()])
    torch.testing.assert_close(d[c[:, 0], :, c[:, 1], c[:, 2], c[:, 3]], f)


def test_dense_of_a_strided_tensor():
    coords = CLOUDS["random"]()
    x = ME.SparseTensor(torch.randn(coords.shape[0], 2, dtype=torch.float64),
                        coordinates=coords)
    y = ME.MinkowskiConvolution(2, 3, 2, stride=2, dimension=3).double()(x)
    d, mn, ts = y.dense(min_coordinate=torch.IntTensor([0, 0, 0]))
    assert ts.tolist() == [2, 2, 2] and mn.tolist() == [[0, 0, 0]]
    c = y.C.long()
    torch.testing.assert_close(d[c[:, 0], :, c[:, 1] // 2, c[:, 2] // 2, c[:, 3] // 2], y.F)
    assert int((d != 0).sum()) == int((y.F != 0).sum())   # nothing else written
    full, _, _ = y.dense(min_coordinate=torch.IntTensor([0, 0, 0]), contract_stride=False)
    torch.testing.assert_close(full[c[:, 0], :, c[:, 1], c[:, 2], c[:, 3]], y.F)
    with pytest.raises(ValueError, match="multiple of the tensor stride"):
        y.dense(min_coordinate=torch.IntTensor([1, 0, 0]))


def test_kernel_maps_shared_per_key():
    coords = CLOUDS["random"]()
    x = ME.SparseTensor(torch.randn(coords.shape[0], 4), coordinates=coords)
    mgr = x.coordinate_manager
    c1 = ME.MinkowskiConvolution(4, 4, 3, dimension=3)
    c2 = ME.MinkowskiConvolution(4, 4, 3, dimension=3)
    y = c2(c1(x))
    assert len(mgr._plans) == 1
    c2(ME.MinkowskiReLU()(y))
    assert len(mgr._plans) == 1
    d = ME.MinkowskiConvolution(4, 4, 2, stride=2, dimension=3)
    p = ME.MinkowskiMaxPooling(2, 2, dimension=3)
    y2 = d(y)
    y3 = p(y)  # same key at stride 2, same geometry: the same map
    assert y3.coordinate_map_key == y2.coordinate_map_key and len(mgr._plans) == 2


def test_coordinate_manager_api():
    c = torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2], [0, 1, 1, 1], [1, -3, 0, 5]],
                     dtype=torch.int32)
    mgr = ME.CoordinateManager(D=3)
    key, (first, inverse) = mgr.insert_and_map(c, 1)
    got = mgr.get_coordinates(key)
    assert torch.equal(c[first], got) and torch.equal(got[inverse], c)
    coords = CLOUDS["random"]()
    x = ME.SparseTensor(torch.zeros(coords.shape[0], 1), coordinates=coords)
    m = x.coordinate_manager
    k2 = m.stride(x.coordinate_map_key, 2)
    assert k2.get_tensor_stride() == [2, 2, 2]
    fine, coarse = m.get_coordinates(x.coordinate_map_key), m.get_coordinates(k2)
    for in_key, out_key, k, tr in [(x.coordinate_map_key, x.coordinate_map_key, 3, False),
                                   (x.coordinate_map_key, k2, 2, False),
                                   (k2, x.coordinate_map_key, 2, True)]:
        maps = m.kernel_map(in_key, out_key, stride=1 if in_key == out_key else 2,
                            kernel_size=k, is_transpose=tr)
        cin, cout = m.get_coordinates(in_key).long(), m.get_coordinates(out_key).long()
        lo = 0 if k % 2 == 0 else -(k // 2)
        total = 0
        for idx, pairs in maps.items():
            ex, ey, ez = idx % k, (idx // k) % k, idx // (k * k)  # x fastest, as ME
            off = torch.tensor([0, ex + lo, ey + lo, ez + lo])
            a, b = cin[pairs[0].long()], cout[pairs[1].long()]
            fine_rows, coarse_rows = (b, a) if tr else (a, b)
            assert torch.equal(fine_rows, coarse_rows + off)
            total += pairs.shape[1]
        # every fine site pairs with its own coarse cell (k = 2) / every neighbour (k = 3)
        if k == 2:
            assert total == fine.shape[0]
    assert coarse.shape[0] == torch.unique(torch.cat([fine[:, :1], fine[:, 1:] // 2 * 2], 1),
                                           dim=0).shape[0]


def test_sj_tune_sees_every_layer():
    import sparsejit as sj
    coords = cloud(600, 12, seed=13)
    x = ME.SparseTensor(torch.randn(coords.shape[0], 8), coordinates=coords)
    net = torch.nn.Sequential(ME.MinkowskiConvolution(8, 16, 3, dimension=3),
                              ME.MinkowskiConvolution(16, 16, 2, stride=2, dimension=3),
                              ME.MinkowskiConvolutionTranspose(16, 8, 2, stride=2, dimension=3))
    r = sj.tune(net, x, repeat=1, progress=False, store=False)
    assert [(l["module"], l["c_in"], l["c_out"], l["swap"]) for l in r["layers"]] == \
        [("0", 8, 16, False), ("1", 16, 16, False), ("2", 16, 8, True)]


def test_compare_with_sparsejit_spconv():
    coords = cloud(400, 12, seed=7)
    f = torch.randn(coords.shape[0], 4, dtype=torch.float64)
    x = ME.SparseTensor(f, coordinates=coords)
    me_sub = ME.MinkowskiConvolution(4, 8, 3, bias=True, dimension=3).double()
    me_down = ME.MinkowskiConvolution(8, 16, 2, stride=2, dimension=3).double()
    me_up = ME.MinkowskiConvolutionTranspose(16, 8, 2, stride=2, dimension=3).double()
    sp_sub = spconv.SubMConv3d(4, 8, 3, bias=True, indice_key="s").double()
    sp_down = spconv.SparseConv3d(8, 16, 2, stride=2, bias=False, indice_key="d").double()
    sp_up = spconv.SparseInverseConv3d(16, 8, 2, indice_key="d", bias=False).double()
    with torch.no_grad():  # ME [K, Cin, Cout], x fastest -> spconv [Cout, x, y, z, Cin]
        for me, sp, k in [(me_sub, sp_sub, 3), (me_down, sp_down, 2), (me_up, sp_up, 2)]:
            sp.weight.copy_(me.kernel.reshape(k, k, k, *me.kernel.shape[1:])
                            .permute(4, 2, 1, 0, 3))
        sp_sub.bias.copy_(me_sub.bias.reshape(-1))
    st = spconv.SparseConvTensor(f, coords, [12, 12, 12], 2)
    a1, s1 = me_sub(x), sp_sub(st)
    torch.testing.assert_close(a1.F, s1.features)
    a2, s2 = me_down(a1), sp_down(s1)
    ca, fa = sort_rows(a2.C // torch.tensor([1, 2, 2, 2], dtype=torch.int32), a2.F)
    cs, fs = sort_rows(s2.indices, s2.features)
    assert torch.equal(ca, cs)
    torch.testing.assert_close(fa, fs)
    a3, s3 = me_up(a2), sp_up(s2)
    torch.testing.assert_close(a3.F, s3.features)


def test_state_dict_round_trip_in_me_layout():
    def net():
        return torch.nn.Sequential(
            ME.MinkowskiConvolution(3, 8, 3, bias=True, dimension=3), ME.MinkowskiBatchNorm(8),
            ME.MinkowskiReLU(), ME.MinkowskiConvolution(8, 8, 2, stride=2, dimension=3),
            ME.MinkowskiConvolution(8, 4, 1, dimension=3), ME.MinkowskiLinear(4, 2))
    a = net()
    sd = a.state_dict()
    # ME's names and shapes: kernel [K, Cin, Cout] ([Cin, Cout] for one offset), bias [1, C].
    assert sd["0.kernel"].shape == (27, 3, 8) and sd["0.bias"].shape == (1, 8)
    assert sd["3.kernel"].shape == (8, 8, 8) and sd["4.kernel"].shape == (8, 4)
    assert {"1.bn.weight", "1.bn.running_mean", "5.linear.weight"} <= set(sd)
    b = net()
    b.load_state_dict(saved_and_loaded(sd))
    a.eval(), b.eval()
    coords = CLOUDS["random"]()
    f = torch.randn(coords.shape[0], 3)
    ya = a(ME.SparseTensor(f, coordinates=coords))
    yb = b(ME.SparseTensor(f, coordinates=coords))
    torch.testing.assert_close(ya.F, yb.F)


def test_tensor_field_sparse_and_slice():
    g = torch.Generator().manual_seed(12)
    p = 600
    xyz = torch.rand(p, 3, generator=g, dtype=torch.float64) * 10 - 5
    batch = torch.randint(0, 2, (p, 1), generator=g).double()
    f = leaf(p, 3)
    field = ME.TensorField(f, torch.cat([batch, xyz], 1))
    x = field.sparse()
    cells = torch.cat([batch, torch.floor(xyz)], 1).long()
    first = {}
    for i, r in enumerate(cells.tolist()):
        first.setdefault(tuple(r), []).append(i)
    assert sorted(map(tuple, x.C.tolist())) == sorted(first)
    for r, c in enumerate(x.C.tolist()):  # UNWEIGHTED_AVERAGE, the field's default
        torch.testing.assert_close(x.F[r], f[first[tuple(c)]].mean(0))
    y = ME.MinkowskiConvolution(3, 4, 2, stride=2, dimension=3).double()(x)
    out = y.slice(field)
    cells2 = torch.cat([batch, torch.floor(xyz / 2) * 2], 1).long()
    rows = {tuple(c): r for r, c in enumerate(y.C.tolist())}
    want = torch.stack([y.F[rows[tuple(c)]] for c in cells2.tolist()])
    torch.testing.assert_close(out.F, want)
    assert out.F.shape == (p, 4) and torch.equal(out.C, field.C)
    out.F.sum().backward()
    assert f.grad is not None
    other = ME.SparseTensor(torch.zeros(1, 1, dtype=torch.float64),
                            coordinates=torch.tensor([[0, 100, 100, 100]], dtype=torch.int32))
    with pytest.raises(ValueError, match="lies in no site"):
        other.slice(field)
    with pytest.raises(ValueError, match="NaN"):
        ME.TensorField(f[:1], torch.full((1, 4), float("nan")))


def test_empty_and_duplicates():
    e = ME.SparseTensor(torch.zeros(0, 3), coordinates=torch.zeros(0, 4, dtype=torch.int32))
    conv = ME.MinkowskiConvolution(3, 4, 3, bias=True, dimension=3)
    assert conv(e).F.shape == (0, 4)
    down = ME.MinkowskiConvolution(3, 4, 2, stride=2, dimension=3)
    y = down(e)
    assert y.F.shape == (0, 4) and y.tensor_stride == [2, 2, 2]
    assert ME.MinkowskiGlobalPooling()(e).F.shape == (0, 3)
    # Duplicate coordinates: ME's quantization modes.
    c = torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2], [0, 1, 1, 1]], dtype=torch.int32)
    f = torch.tensor([[1.0], [5.0], [3.0]])
    Q = ME.SparseTensorQuantizationMode
    assert ME.SparseTensor(f, coordinates=c).F.tolist() == [[1.0], [5.0]]
    assert ME.SparseTensor(f, c, quantization_mode=Q.UNWEIGHTED_AVERAGE).F.tolist() == \
        [[2.0], [5.0]]
    assert ME.SparseTensor(f, c, quantization_mode=Q.UNWEIGHTED_SUM).F.tolist() == \
        [[4.0], [5.0]]
    assert ME.SparseTensor(f, c).C.tolist() == [[0, 1, 1, 1], [0, 2, 2, 2]]


def test_bad_inputs_name_the_argument():
    c = cloud(20, 5)
    f = torch.randn(20, 3)
    with pytest.raises(ValueError, match="coordinates"):
        ME.SparseTensor(f, coordinates=c[:, :1])
    with pytest.raises(ValueError, match="coordinates has 19 rows"):
        ME.SparseTensor(f, coordinates=c[:19])
    with pytest.raises(ValueError, match="features"):
        ME.SparseTensor(f[0], coordinates=c)
    bad = c.clone()
    bad[4, 0] = -1
    with pytest.raises(ValueError, match=r"coordinates\[4, 0\] = -1"):
        ME.SparseTensor(f, coordinates=bad)
    with pytest.raises(ValueError, match="NaN"):
        ME.SparseTensor(f, coordinates=torch.full((20, 4), float("nan")))
    with pytest.raises(ValueError, match="multiple of tensor_stride"):
        ME.SparseTensor(f, coordinates=c, tensor_stride=2)
    with pytest.raises(ValueError, match="tensor_stride"):
        ME.SparseTensor(f, coordinates=c, tensor_stride=[1, 2])
    with pytest.raises(ValueError, match="D = 1 to 4"):
        ME.SparseTensor(torch.randn(2, 1), coordinates=torch.zeros(2, 6, dtype=torch.int32))
    with pytest.raises(ValueError, match="coordinate_map_key"):
        ME.SparseTensor(f)
    with pytest.raises(ValueError, match="dimension"):
        ME.MinkowskiConvolution(3, 4, 3)
    with pytest.raises(ValueError, match="kernel_size"):
        ME.MinkowskiConvolution(3, 4, 0, dimension=3)
    with pytest.raises(ValueError, match="stride"):
        ME.MinkowskiConvolution(3, 4, 3, stride=[2, 2], dimension=3)
    with pytest.raises(NotImplementedError, match="kernel_generator"):
        ME.MinkowskiConvolution(3, 4, 3, kernel_generator=object(), dimension=3)
    x = ME.SparseTensor(f, coordinates=c)
    with pytest.raises(ValueError, match="in_channels = 4"):
        ME.MinkowskiConvolution(4, 4, 3, dimension=3)(x)
    with pytest.raises(ValueError, match="2-D"):
        ME.MinkowskiConvolution(3, 4, 3, dimension=2)(x)
    with pytest.raises(TypeError, match="SparseTensor"):
        ME.MinkowskiConvolution(3, 4, 3, dimension=3)(f)
    with pytest.raises(TypeError, match="float64"):
        ME.MinkowskiConvolution(3, 4, 3, dimension=3)(x.double())
    other = ME.SparseTensor(f, coordinates=c)
    with pytest.raises(ValueError, match="same coordinate_map_key"):
        x + other
    with pytest.raises(ValueError, match="share one coordinate key"):
        ME.cat(x, ME.MinkowskiConvolution(3, 3, 2, stride=2, dimension=3)(x))
    with pytest.raises(ValueError, match="stride"):
        ME.MinkowskiConvolutionTranspose(3, 3, 2, stride=2, dimension=3)(x)
    neg = c.clone()
    neg[:, 1] -= 10
    with pytest.raises(ValueError, match="min_coordinate"):
        ME.SparseTensor(f, coordinates=neg).dense()
    with pytest.raises(ValueError, match="global PoolingMode"):
        ME.MinkowskiGlobalPooling(ME.PoolingMode.LOCAL_MAX_POOLING)


def test_against_minkowski_engine():
    me = pytest.importorskip("MinkowskiEngine")
    coords = cloud(300, 10, seed=11)
    f = torch.randn(coords.shape[0], 4)
    ours = [ME.MinkowskiConvolution(4, 8, 3, dimension=3),
            ME.MinkowskiConvolution(8, 8, 2, stride=2, dimension=3),
            ME.MinkowskiConvolutionTranspose(8, 4, 2, stride=2, dimension=3)]
    theirs = [me.MinkowskiConvolution(4, 8, 3, dimension=3),
              me.MinkowskiConvolution(8, 8, 2, stride=2, dimension=3),
              me.MinkowskiConvolutionTranspose(8, 4, 2, stride=2, dimension=3)]
    for a, b in zip(ours, theirs):
        b.load_state_dict(a.state_dict())
    x, y = ME.SparseTensor(f, coordinates=coords), me.SparseTensor(f, coordinates=coords)
    for a, b in zip(ours, theirs):
        x, y = a(x), b(y)
        ca, fa = sort_rows(x.C, x.F)
        cb, fb = sort_rows(y.C, y.F)
        assert torch.equal(ca, cb)
        torch.testing.assert_close(fa, fb, rtol=1e-4, atol=1e-5)
