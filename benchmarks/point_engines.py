"""Point-cloud engines behind one interface, for benchmarks/bench_point_engines.py: sparsejit's
spconv API, spconv 2.3.8, MinkowskiEngine 0.5.4 and TorchSparse 2.0 (each when importable;
the peers are built by benchmarks/peers/build_*.sh into their own venvs).

Every engine gets the same weights: a convolution's canonical weight is ``[kx, ky, kz, C_in,
C_out]``, where index ``a`` along an axis is the offset ``a - k // 2`` for an odd kernel
(submanifold) and ``a`` for a kernel equal to its stride (the input ``s * o + a`` feeds the
coarse site ``o``; the transposed convolution is its mirror). Each engine converts it into
its own layout (``to_engine``) and its weight gradient back (``from_engine``).

Coordinates are ``[N, 4]`` int32, batch first, in the units of the finest grid. ``coords()``
returns an engine's output sites in the units of the output's own grid (fine units divided by
the tensor stride), so that rows can be matched across engines by sorting.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Dict, List, Optional

import torch
from torch import nn


def _import(name: str):
    try:
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001  (absent, or built for another torch)
        return None


# ---- layouts ---------------------------------------------------------------------------------

def _x_fastest(w: torch.Tensor) -> torch.Tensor:
    """[kx, ky, kz, Ci, Co] -> [K, Ci, Co] with offset index x + k * y + k * k * z."""
    return w.permute(2, 1, 0, 3, 4).reshape(-1, w.shape[3], w.shape[4])


def _from_x_fastest(w: torch.Tensor, k: int) -> torch.Tensor:
    return w.reshape(k, k, k, w.shape[-2], w.shape[-1]).permute(2, 1, 0, 3, 4)


class Engine:
    """One engine: layers, tensors, the features-only ops and the weight layouts."""

    name = "?"
    version: Optional[str] = None

    def tensor(self, coords: torch.Tensor, feats: torch.Tensor):
        raise NotImplementedError

    def feats(self, t) -> torch.Tensor:
        return t.F

    def coords(self, t) -> torch.Tensor:
        raise NotImplementedError

    def fmap(self, t, fn: Callable[[torch.Tensor], torch.Tensor]):
        """t with features fn(t's features), on the same sites (and sharing its maps)."""
        raise NotImplementedError

    def combine(self, a, b, fn):
        """fn(a's features, b's features) on a's sites (a and b on the same sites)."""
        raise NotImplementedError

    def conv(self, kind: str, cin: int, cout: int, k: int, key: str) -> nn.Module:
        """kind: "subm" (stride 1, the input sites), "down" (stride k) or "up" (the transposed
        conv back to the sites the "down" with the same key came from)."""
        raise NotImplementedError

    def to_engine(self, mod: nn.Module, w: torch.Tensor) -> None:
        raise NotImplementedError

    def from_engine(self, mod: nn.Module, g: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def weight(self, mod: nn.Module) -> torch.Tensor:
        raise NotImplementedError

    def kmap(self, coords: torch.Tensor, kind: str, k: int) -> None:
        """Builds one kernel map from scratch (for the map-building time)."""
        raise NotImplementedError


class SpconvLike(Engine):
    """sparsejit.spconv or spconv.pytorch: the same API and weight layout [Co, kx, ky, kz, Ci]."""

    def __init__(self, name: str, module):
        self.name, self.sp = name, module
        self.version = getattr(sys.modules.get(module.__name__.split(".")[0]), "__version__",
                               None)
        self.shape: List[int] = [1, 1, 1]

    def tensor(self, coords, feats):
        return self.sp.SparseConvTensor(feats, coords, self.shape, int(coords[:, 0].max()) + 1
                                        if coords.shape[0] else 1)

    def feats(self, t):
        return t.features

    def coords(self, t):
        return t.indices

    def fmap(self, t, fn):
        return t.replace_feature(fn(t.features))

    def combine(self, a, b, fn):
        return a.replace_feature(fn(a.features, b.features))

    def conv(self, kind, cin, cout, k, key):
        if kind == "subm":
            return self.sp.SubMConv3d(cin, cout, k, bias=False, indice_key=key)
        if kind == "down":
            return self.sp.SparseConv3d(cin, cout, k, k, bias=False, indice_key=key)
        return self.sp.SparseInverseConv3d(cin, cout, k, indice_key=key, bias=False)

    def weight(self, mod):
        return mod.weight

    def _raw_1x1(self, mod) -> bool:
        # spconv 2.3.8 runs a 1x1x1 convolution as mm(features, weight.view(C_in, C_out)):
        # its [C_out, 1, 1, 1, C_in] parameter holds a [C_in, C_out] matrix's memory.
        return self.name == "spconv" and mod.weight[0].numel() == mod.weight.shape[-1]

    def to_engine(self, mod, w):
        with torch.no_grad():
            if self._raw_1x1(mod):
                mod.weight.copy_(w.reshape(w.shape[3], w.shape[4]).contiguous()
                                 .view(mod.weight.shape))
            else:
                mod.weight.copy_(w.permute(4, 0, 1, 2, 3))

    def from_engine(self, mod, g):
        if self._raw_1x1(mod):
            return g.reshape(1, 1, 1, mod.weight.shape[-1], mod.weight.shape[0])
        return g.permute(1, 2, 3, 4, 0)

    def kmap(self, coords, kind, k):
        if self.name == "sparsejit":
            from sparsejit.families.point_conv.ops import point_conv_plan
            if kind == "subm":
                point_conv_plan(coords, self.shape, 1, "subm", k)
            else:
                point_conv_plan(coords, self.shape, 1, "spconv", k, k, 0)
            return
        import spconv.pytorch.ops as spops
        from spconv.core import ConvAlgo
        s = 1 if kind == "subm" else k
        spops.get_indice_pairs(coords, 1, self.shape, ConvAlgo.Native, [k] * 3, [s] * 3,
                               [0 if s > 1 else k // 2] * 3, [1] * 3, [0] * 3, kind == "subm")


class Minkowski(Engine):
    """MinkowskiEngine 0.5.4: kernel [K, Ci, Co], offsets x fastest; output sites in fine
    units (floor(c / s) * s) with a tensor stride."""

    def __init__(self, me, name="minkowski"):
        self.ME, self.name = me, name
        self.version = getattr(me, "__version__", None)

    def tensor(self, coords, feats):
        return self.ME.SparseTensor(feats, coordinates=coords)

    def coords(self, t):
        c = t.C.clone()
        c[:, 1:] = torch.div(c[:, 1:], torch.tensor(t.tensor_stride, dtype=c.dtype),
                             rounding_mode="floor")
        return c

    def fmap(self, t, fn):
        return self.ME.SparseTensor(fn(t.F), coordinate_map_key=t.coordinate_map_key,
                                    coordinate_manager=t.coordinate_manager)

    def combine(self, a, b, fn):
        return self.ME.SparseTensor(fn(a.F, b.F), coordinate_map_key=a.coordinate_map_key,
                                    coordinate_manager=a.coordinate_manager)

    def conv(self, kind, cin, cout, k, key):
        if kind == "up":
            m = self.ME.MinkowskiConvolutionTranspose(cin, cout, kernel_size=k, stride=k,
                                                      bias=False, dimension=3)
        else:
            m = self.ME.MinkowskiConvolution(cin, cout, kernel_size=k,
                                             stride=1 if kind == "subm" else k, bias=False,
                                             dimension=3)
        m.bench_k = k
        return m

    def weight(self, mod):
        return mod.kernel

    def to_engine(self, mod, w):
        with torch.no_grad():
            mod.kernel.copy_(_x_fastest(w).reshape(mod.kernel.shape))

    def from_engine(self, mod, g):
        return _from_x_fastest(g, mod.bench_k)

    def kmap(self, coords, kind, k):
        x = self.ME.SparseTensor(torch.zeros(coords.shape[0], 1), coordinates=coords)
        m = x.coordinate_manager
        s = 1 if kind == "subm" else k
        out_key = x.coordinate_map_key if s == 1 else m.stride(x.coordinate_map_key, [s] * 3)
        m.kernel_map(x.coordinate_map_key, out_key, stride=s, kernel_size=k)


class TorchSparse(Engine):
    """TorchSparse 2.0: coordinates [x, y, z, batch]; kernel [K, Ci, Co] (x fastest for odd
    kernels, z fastest for even ones; [Ci, Co] for a 1x1x1 kernel); output sites in fine units
    with a tensor stride. Its CPU build has no kernel-3 stride-2 convolution."""

    def __init__(self, ts, name="torchsparse"):
        self.ts, self.spnn, self.name = ts, importlib.import_module(ts.__name__ + ".nn"), name
        self.version = getattr(ts, "__version__", None)

    def tensor(self, coords, feats):
        t = self.ts.SparseTensor(feats, coords[:, [1, 2, 3, 0]].contiguous())
        # TorchSparse registers a stride's sites when a conv outputs them; a transposed conv
        # back to the input's sites needs them registered (in its models a stem conv does it)
        t.cmaps.setdefault(t.stride, t.coords)
        return t

    def coords(self, t):
        c = t.C[:, [3, 0, 1, 2]].clone()
        c[:, 1:] = torch.div(c[:, 1:], torch.tensor(t.s, dtype=c.dtype), rounding_mode="floor")
        return c

    def _wrap(self, like, feats):
        out = self.ts.SparseTensor(feats, like.C, like.s)
        out.cmaps, out.kmaps = like.cmaps, like.kmaps
        return out

    def fmap(self, t, fn):
        return self._wrap(t, fn(t.F))

    def combine(self, a, b, fn):
        return self._wrap(a, fn(a.F, b.F))

    def conv(self, kind, cin, cout, k, key):
        s = 1 if kind == "subm" else k
        m = self.spnn.Conv3d(cin, cout, k, s, bias=False, transposed=kind == "up")
        m.bench_k = k
        return m

    def weight(self, mod):
        return mod.kernel

    def to_engine(self, mod, w):
        k = w.shape[0]
        kern = _x_fastest(w) if k % 2 == 1 else w.reshape(-1, w.shape[3], w.shape[4])
        with torch.no_grad():
            mod.kernel.copy_(kern.reshape(mod.kernel.shape))

    def from_engine(self, mod, g):
        k = mod.bench_k
        if k % 2 == 1:
            return _from_x_fastest(g, k)
        return g.reshape(k, k, k, g.shape[-2], g.shape[-1])

    def kmap(self, coords, kind, k):
        build_kernel_map = importlib.import_module(self.ts.__name__ + ".nn.functional") \
            .build_kernel_map
        s = 1 if kind == "subm" else k
        build_kernel_map(coords[:, [1, 2, 3, 0]].contiguous(), k, s, 1)


def engines(want: Optional[List[str]] = None) -> Dict[str, Engine]:
    """The engines that import here, sparsejit first; `want` restricts them by name."""
    out: Dict[str, Engine] = {}
    sj = _import("sparsejit.spconv")
    if sj is not None:
        out["sparsejit"] = SpconvLike("sparsejit", sj)
    sp = _import("spconv.pytorch")
    if sp is not None:
        import spconv.pytorch.ops as spops
        spops.get_current_stream = lambda: 0  # spconv's CPU backward needs this
        out["spconv"] = SpconvLike("spconv", sp)
    me = _import("MinkowskiEngine")
    if me is not None:
        out["minkowski"] = Minkowski(me)
    ts = _import("torchsparse")
    if ts is not None and _import("torchsparse.nn") is not None:
        out["torchsparse"] = TorchSparse(ts)
    # sparsejit's drop-in APIs for those engines (the same network code as on the engine)
    sjme = _import("sparsejit.minkowski")
    if sjme is not None:
        out["sparsejit.minkowski"] = Minkowski(sjme, "sparsejit.minkowski")
    sjts = _import("sparsejit.torchsparse")
    if sjts is not None and _import("sparsejit.torchsparse.nn") is not None:
        out["sparsejit.torchsparse"] = TorchSparse(sjts, "sparsejit.torchsparse")
    return {k: v for k, v in out.items() if want is None or k in want}


# ---- MinkUNet14A (MinkowskiEngine's examples/minkunet.py) on any engine ----------------------

class BasicBlock(nn.Module):
    def __init__(self, e: Engine, cin: int, cout: int, key: str):
        super().__init__()
        self.e = e
        self.conv1 = e.conv("subm", cin, cout, 3, key)
        self.conv2 = e.conv("subm", cout, cout, 3, key)
        self.bn1, self.bn2 = nn.BatchNorm1d(cout), nn.BatchNorm1d(cout)
        self.down = None
        if cin != cout:
            self.down = e.conv("subm", cin, cout, 1, key + "k1")
            self.bn_down = nn.BatchNorm1d(cout)

    def forward(self, x):
        e = self.e
        out = e.fmap(self.conv1(x), lambda f: torch.relu(self.bn1(f)))
        out = e.fmap(self.conv2(out), self.bn2)
        res = x if self.down is None else e.fmap(self.down(x), self.bn_down)
        return e.combine(out, res, lambda a, b: torch.relu(a + b))


class MinkUNet14A(nn.Module):
    """MinkUNet14A as MinkowskiEngine's examples/minkunet.py defines it (BasicBlock, one block
    per stage, planes 32-64-128-256 down and 128-128-96-96 up, a kernel-5 stem, kernel-2
    stride-2 downs and transposed ups, skip concatenation, a 1x1x1 head with bias), on engine
    `e`. (That file's MinkUNet14 itself sets no planes; 14A is its smallest complete one.)
    `width` scales every plane count (1.0 = the original)."""

    PLANES = (32, 64, 128, 256, 128, 128, 96, 96)

    def __init__(self, e: Engine, cin: int = 4, classes: int = 20, width: float = 1.0):
        super().__init__()
        self.e = e
        p = [max(1, int(round(c * width))) for c in self.PLANES]
        init = max(1, int(round(32 * width)))
        self.conv0 = e.conv("subm", cin, init, 5, "s1k5")
        self.bn0 = nn.BatchNorm1d(init)
        downs, blocks, ch = [], [], init
        for lvl in range(4):
            downs.append(e.conv("down", ch, ch, 2, f"d{lvl}"))
            blocks.append(BasicBlock(e, ch, p[lvl], f"s{2 ** (lvl + 1)}"))
            ch = p[lvl]
        self.downs, self.bn_downs = nn.ModuleList(downs), nn.ModuleList(
            nn.BatchNorm1d(m) for m in [init] + p[:3])
        self.enc = nn.ModuleList(blocks)
        skips = [p[2], p[1], p[0], init]
        ups, up_bns, dec = [], [], []
        for j in range(4):
            ups.append(e.conv("up", ch, p[4 + j], 2, f"d{3 - j}"))
            up_bns.append(nn.BatchNorm1d(p[4 + j]))
            dec.append(BasicBlock(e, p[4 + j] + skips[j], p[4 + j],
                                  f"s{2 ** (3 - j)}" if j < 3 else "s1"))
            ch = p[4 + j]
        self.ups, self.bn_ups, self.dec = nn.ModuleList(ups), nn.ModuleList(up_bns), \
            nn.ModuleList(dec)
        self.final = e.conv("subm", ch, classes, 1, "s1k1")
        self.final_bias = nn.Parameter(torch.linspace(-0.1, 0.1, classes))

    def forward(self, x):
        e = self.e
        out = e.fmap(self.conv0(x), lambda f: torch.relu(self.bn0(f)))
        skips = [out]
        for lvl in range(4):
            out = e.fmap(self.downs[lvl](out), lambda f, b=self.bn_downs[lvl]: torch.relu(b(f)))
            out = self.enc[lvl](out)
            skips.append(out)
        for j in range(4):
            out = e.fmap(self.ups[j](out), lambda f, b=self.bn_ups[j]: torch.relu(b(f)))
            out = e.combine(out, skips[3 - j], lambda a, b: torch.cat([a, b], 1))
            out = self.dec[j](out)
        return e.fmap(self.final(out), lambda f: f + self.final_bias)

    def convs(self) -> List[nn.Module]:
        """The convolutions in a fixed order (the same on every engine)."""
        return [self.conv0, *self.downs,
                *[m for b in self.enc for m in (b.conv1, b.conv2, b.down) if m is not None],
                *self.ups,
                *[m for b in self.dec for m in (b.conv1, b.conv2, b.down) if m is not None],
                self.final]


def canonical_weights(net: MinkUNet14A, seed: int = 0) -> List[torch.Tensor]:
    """Random canonical weights [k, k, k, Ci, Co] for every convolution of `net`."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for m in net.convs():
        w = net.e.weight(m)
        ci, co = (w.shape[-1], w.shape[0]) if isinstance(net.e, SpconvLike) else \
            (w.shape[-2], w.shape[-1])
        k = {1: 1, 8: 2, 27: 3, 125: 5}[w.numel() // (ci * co)]
        out.append(torch.randn(k, k, k, ci, co, generator=g) / (k ** 1.5 * ci) ** 0.5)
    return out


def load_weights(net: MinkUNet14A, ws: List[torch.Tensor]) -> None:
    for m, w in zip(net.convs(), ws):
        net.e.to_engine(m, w)
