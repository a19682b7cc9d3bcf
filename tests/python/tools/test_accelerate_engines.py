"""sparsejit.accelerate on MinkowskiEngine and TorchSparse networks, against the engines' own
CPU results (forward, input-feature and weight gradients; float64, but float32 for
TorchSparse, whose CPU build runs nothing else): the same parameter objects and state_dict
keys, the engines' functions in the forward (ME.cat, MinkowskiFunctional, ME.SparseTensor
rewrapping a layer's output, torchsparse.cat), the engine's own tensor at the input, restore,
idempotence, and all-or-nothing when one module has no counterpart. Skipped where the engine
is not installed (benchmarks/peers builds both)."""

import copy

import pytest
import torch

import sparsejit as sj


def _cloud(n, extent, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    flat = torch.randperm(batch * extent ** 3, generator=g)[:n]
    xyz = torch.stack([(flat // extent ** 2) % extent, (flat // extent) % extent,
                       flat % extent], 1)
    return flat // extent ** 3, xyz


def _sorted(coords, feats):
    key = coords.long()
    order = torch.arange(len(key))
    for j in reversed(range(key.shape[1])):
        order = order[torch.sort(key[order, j], stable=True).indices]
    return coords[order], feats[order]


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _check_same(ref_out, out, ref_model, model, ref_x, x, tol=1e-9):
    """Same sites and features (in any row order), same gradients of every parameter and
    of the input features."""
    ca, fa = _sorted(ref_out.C, ref_out.F)
    cb, fb = _sorted(out.C, out.F)
    assert torch.equal(ca.long(), cb.long())
    torch.testing.assert_close(fb, fa, rtol=tol, atol=tol)
    ga, gb = _grads(ref_model), _grads(model)
    assert ga.keys() == gb.keys() and ga
    for k in ga:
        torch.testing.assert_close(gb[k], ga[k], rtol=10 * tol, atol=tol, msg=k)
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=10 * tol, atol=tol)


# ---- MinkowskiEngine --------------------------------------------------------------------------

def _me_net(ME):
    import MinkowskiEngine.MinkowskiFunctional as MF

    class Net(ME.MinkowskiNetwork):
        def __init__(self):
            super().__init__(3)
            self.stem = torch.nn.Sequential(
                ME.MinkowskiConvolution(4, 8, kernel_size=3, dimension=3),
                ME.MinkowskiBatchNorm(8), ME.MinkowskiReLU())
            self.down = ME.MinkowskiConvolution(8, 16, kernel_size=2, stride=2, bias=True,
                                                dimension=3)
            self.mid = ME.MinkowskiConvolution(16, 16, kernel_size=3, dimension=3)
            self.up = ME.MinkowskiConvolutionTranspose(16, 8, kernel_size=2, stride=2,
                                                       dimension=3)
            self.head = ME.MinkowskiConvolution(16, 5, kernel_size=1, bias=True, dimension=3)
            self.lin = ME.MinkowskiLinear(5, 3)
            self.act = ME.MinkowskiLeakyReLU(0.1)
            self.pool = ME.MinkowskiGlobalMaxPooling()

        def forward(self, x):
            a = self.stem(x)
            b = MF.relu(self.down(a))
            b = self.mid(b) + b
            b = ME.SparseTensor(torch.tanh(b.F), coordinate_map_key=b.coordinate_map_key,
                                coordinate_manager=b.coordinate_manager)  # a rewrap
            u = self.up(b)
            y = self.act(self.lin(self.head(ME.cat(u, a))))
            return y, self.pool(y)

    return Net()


def _me_input(ME, seed=0, n=300, extent=9):
    b, xyz = _cloud(n, extent, seed=seed)
    coords = torch.cat([b[:, None], xyz], 1).int()
    feats = torch.randn(len(coords), 4, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(seed + 1))
    return coords, feats


def test_minkowski_network_matches_minkowski_engine():
    ME = pytest.importorskip("MinkowskiEngine")
    torch.manual_seed(0)
    net = _me_net(ME).double().train()
    ref = _me_net(ME).double().train()  # ME's modules do not deep-copy
    ref.load_state_dict(net.state_dict())
    keys, params = list(net.state_dict()), list(net.parameters())
    new, rep = sj.accelerate(net, return_report=True)
    assert new is net
    assert len(rep.converted) == 10 and not rep.left, str(rep)
    assert type(net.stem[0]).__module__.startswith("sparsejit.minkowski")
    assert list(net.state_dict()) == keys
    assert all(p is q for p, q in zip(net.parameters(), params))
    for seed in (0, 1):  # a second cloud: new coordinate managers, new maps
        coords, feats = _me_input(ME, seed)
        xr = feats.clone().requires_grad_()
        xs = feats.clone().requires_grad_()
        ref.zero_grad(), net.zero_grad()
        yr, pr = ref(ME.SparseTensor(xr, coordinates=coords))
        ys, ps = net(ME.SparseTensor(xs, coordinates=coords))
        assert isinstance(ys, sj.minkowski.SparseTensor)
        ((yr.F ** 2).sum() + pr.F.sum()).backward()
        ((ys.F ** 2).sum() + ps.F.sum()).backward()
        torch.testing.assert_close(ps.F[ps.C[:, 0].argsort()], pr.F[pr.C[:, 0].argsort()],
                                   rtol=1e-9, atol=1e-9)
        _check_same(yr, ys, ref, net, xr, xs)
    # Idempotent; restore gives ME's modules back, with the same parameter objects.
    again, rep2 = sj.accelerate(net, return_report=True)
    assert again is net and len(rep2) == 10
    assert all(e.reason == "already accelerated" for e in rep2), str(rep2)
    sj.restore(net)
    assert type(net.stem[0]) is ME.MinkowskiConvolution and type(net.lin) is ME.MinkowskiLinear
    assert all(p is q for p, q in zip(net.parameters(), params))
    coords, feats = _me_input(ME, 2)
    yr, _ = ref(ME.SparseTensor(feats, coordinates=coords))
    yb, _ = net(ME.SparseTensor(feats, coordinates=coords))  # ME.cat's dispatcher: ME's own
    assert type(yb) is ME.SparseTensor
    torch.testing.assert_close(_sorted(yb.C, yb.F)[1], _sorted(yr.C, yr.F)[1])


def test_minkowski_all_or_nothing():
    ME = pytest.importorskip("MinkowskiEngine")
    net = torch.nn.Sequential(ME.MinkowskiConvolution(4, 8, 3, dimension=3),
                              ME.MinkowskiInstanceNorm(8),
                              ME.MinkowskiConvolution(8, 8, 3, dimension=3))
    before = [type(m) for m in net]
    rep = sj.accelerate(net, return_report=True)[1]
    assert [type(m) for m in net] == before and not rep.converted
    assert any("MinkowskiInstanceNorm" in e.reason for e in rep.left), str(rep)
    # A region ME has and sparsejit does not: reported, nothing converted.
    cross = ME.MinkowskiConvolution(
        4, 8, kernel_generator=ME.KernelGenerator(3, region_type=ME.RegionType.HYPER_CROSS,
                                                  dimension=3), dimension=3)
    rep = sj.accelerate(torch.nn.Sequential(cross), return_report=True)[1]
    assert not rep.converted and "HYPER_CROSS" in str(rep), str(rep)


# ---- TorchSparse --------------------------------------------------------------------------------

def _ts_net(ts, spnn):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Sequential(spnn.Conv3d(4, 8, 3), spnn.BatchNorm(8),
                                            spnn.ReLU(True))
            self.down = spnn.Conv3d(8, 16, 2, stride=2)
            self.mid = torch.nn.Sequential(spnn.Conv3d(16, 16, 3, bias=True),
                                           spnn.LeakyReLU(0.2))
            self.up = spnn.Conv3d(16, 8, 2, stride=2, transposed=True)
            self.head = spnn.Conv3d(16, 5, 1, bias=True)
            self.pool = spnn.GlobalAvgPool()

        def forward(self, x):
            a = self.stem(x)
            b = self.down(a)
            b = self.mid(b) + b
            y = self.head(ts.cat([self.up(b), a]))
            return y, self.pool(y)

    return Net()


def test_torchsparse_network_matches_torchsparse():
    ts = pytest.importorskip("torchsparse")
    spnn = pytest.importorskip("torchsparse.nn")
    torch.manual_seed(0)
    net = _ts_net(ts, spnn).train()  # TorchSparse's CPU kernels take float32 only
    ref = copy.deepcopy(net)
    keys, params = list(net.state_dict()), list(net.parameters())
    new, rep = sj.accelerate(net, return_report=True)
    assert len(rep.converted) == 9 and not rep.left, str(rep)
    assert list(net.state_dict()) == keys
    assert all(p is q for p, q in zip(net.parameters(), params))
    for seed in (0, 1):
        b, xyz = _cloud(300, 9, seed=seed)
        coords = torch.cat([xyz, b[:, None]], 1).int()
        feats = torch.randn(len(coords), 4)
        xr, xs = feats.clone().requires_grad_(), feats.clone().requires_grad_()
        ref.zero_grad(), net.zero_grad()
        yr, pr = ref(ts.SparseTensor(xr, coords))
        ys, ps = net(ts.SparseTensor(xs, coords))
        assert isinstance(ys, sj.torchsparse.SparseTensor)
        ((yr.F ** 2).sum() + pr.sum()).backward()
        ((ys.F ** 2).sum() + ps.sum()).backward()
        torch.testing.assert_close(ps, pr, rtol=1e-4, atol=1e-5)
        _check_same(yr, ys, ref, net, xr, xs, tol=1e-4)
    # BatchNorm's running statistics are the same buffers, updated in place.
    bn = net.stem[1]
    assert bn.running_mean is bn.__dict__["_sparsejit_original"].running_mean
    torch.testing.assert_close(net.stem[1].running_mean, ref.stem[1].running_mean)
    sj.restore(net)
    assert type(net.down) is spnn.Conv3d and type(net.stem[1]) is spnn.BatchNorm
    assert all(p is q for p, q in zip(net.parameters(), params))
