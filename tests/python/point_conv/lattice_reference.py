"""Dense references for the MinkowskiEngine / TorchSparse APIs' tests: sites in world units
(batch first, non-negative, multiples of the tensor stride) scattered into a dense grid and
run through ``torch.nn.functional.conv3d`` / ``conv_transpose3d`` / pooling."""

import io

import torch
import torch.nn.functional as F


def lower_of(k):
    return 0 if k % 2 == 0 else -(k // 2)


def to_dense(coords, feats, ts, extent):
    """[N, 1 + 3] world coords at stride ts -> dense [B, C, *extent] (differentiable)."""
    c = coords.long()
    b = int(c[:, 0].max()) + 1 if c.shape[0] else 1
    g = c[:, 1:] // ts
    out = feats.new_zeros(b, *extent, feats.shape[1])
    out = out.index_put((c[:, 0], g[:, 0], g[:, 1], g[:, 2]), feats)
    return out.movedim(-1, 1)


def sample(dense, coords, ts):
    c = coords.long()
    g = c[:, 1:] // ts
    return dense.movedim(1, -1)[c[:, 0], g[:, 0], g[:, 1], g[:, 2]]


def dense_weight(kernel, k, x_fastest=True):
    """Engine kernel [K, Cin, Cout] -> conv3d weight [Cout, Cin, kx, ky, kz]; offsets numbered
    x fastest (ME, TorchSparse odd volumes) or z fastest (TorchSparse even volumes)."""
    cin, cout = kernel.shape[-2:]
    w = kernel.reshape(k, k, k, cin, cout)
    return w.permute(4, 3, 2, 1, 0) if x_fastest else w.permute(4, 3, 0, 1, 2)


def conv_reference(in_coords, feats, kernel, k, stride, dil, ts, out_coords, bias=None,
                   lower=None, x_fastest=True):
    """Sparse conv from sites at stride ts to out_coords at stride ts * stride: output o sums
    the inputs at o + (lower + e) * dil * ts (lower: ME's default unless given)."""
    lo = lower_of(k) if lower is None else lower
    top = torch.cat([in_coords, out_coords])[:, 1:].long().max(0).values
    extent = [int(m) // ts + 1 + stride * k * dil for m in top]
    x = F.pad(to_dense(in_coords, feats, ts, extent), [-lo * dil, 0] * 3)
    y = F.conv3d(x, dense_weight(kernel, k, x_fastest), None, stride, 0, dil)
    out = sample(y, out_coords, ts * stride)
    return out if bias is None else out + bias.reshape(-1)


def transposed_reference(in_coords, feats, kernel, k, stride, dil, ts, out_coords, bias=None,
                         x_fastest=True):
    """Transposed conv from sites at stride ts to out_coords at stride ts // stride (centred
    odd or lower-0 even kernels)."""
    lo = lower_of(k)
    fine = ts // stride
    extent = [int(m) // ts + 2 + k * dil for m in out_coords[:, 1:].long().max(0).values]
    x = to_dense(in_coords, feats, ts, extent)
    w = dense_weight(kernel, k, x_fastest).transpose(0, 1)  # [Cin, Cout, x, y, z]
    y = F.conv_transpose3d(x, w, None, stride, -lo * dil, 0, 1, dil)
    out = sample(y, out_coords, fine)
    return out if bias is None else out + bias.reshape(-1)


def pool_reference(kind, in_coords, feats, k, stride, dil, ts, out_coords, lower):
    extent = [int(m) // ts + 1 + stride * k * dil for m in in_coords[:, 1:].long().max(0).values]
    c = feats.shape[1]
    x = to_dense(in_coords, feats, ts, extent)
    if kind == "max":
        occ = to_dense(in_coords, torch.ones_like(feats[:, :1]), ts, extent)
        x = torch.where(occ > 0, x, torch.full_like(x, float("-inf")))
        x = F.pad(x, [-lower * dil, 0] * 3, value=float("-inf"))
        y = F.max_pool3d(x, k, stride, 0, dil)
    else:
        ones = feats.new_ones(c, 1, k, k, k)
        occ = to_dense(in_coords, torch.ones_like(feats[:, :1]), ts, extent)
        xp = F.pad(x, [-lower * dil, 0] * 3)
        y = F.conv3d(xp, ones, None, stride, 0, dil, groups=c)
        if kind == "avg":
            n = F.conv3d(F.pad(occ, [-lower * dil, 0] * 3), feats.new_ones(1, 1, k, k, k),
                         None, stride, 0, dil)
            y = y / n.clamp(min=1)
    return sample(y, out_coords, ts * stride)


def sort_rows(coords, feats):
    """Rows ordered by their coordinates (to compare outputs whose row orders differ)."""
    c = coords.long()
    key = c[:, 0]
    for d in range(1, c.shape[1]):
        key = key * 100003 + (c[:, d] + 50000)
    order = torch.argsort(key)
    return coords[order], feats[order]


def leaf(n, c):
    return torch.randn(n, c, dtype=torch.float64, requires_grad=True)


def grads_close(out, ref, tensors):
    g = torch.randn_like(ref)
    got = torch.autograd.grad(out, tensors, g, retain_graph=True)
    want = torch.autograd.grad(ref, tensors, g, retain_graph=True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def saved_and_loaded(state_dict):
    """`state_dict` through torch.save / torch.load (in memory)."""
    buf = io.BytesIO()
    torch.save(state_dict, buf)
    buf.seek(0)
    return torch.load(buf)
