"""MinkowskiEngine and TorchSparse modules swapped for ``sparsejit.minkowski`` /
``sparsejit.torchsparse``'s (the same names, arguments and parameter layouts): the new module
holds the original's own parameter, buffer and child-module objects, so optimizers, hooks and
``state_dict`` keys keep working.

Sparse tensors pass between an engine's modules, so a model's modules of one engine are
converted all together or not at all. The engine's own sparse tensor is still accepted at
every converted module (turned into sparsejit's on the way in; tensors that share an ME
coordinate manager, or a TorchSparse tensor's map dictionaries, share one sparsejit
coordinate manager / map cache, so kernel maps are built once). What flows between converted
modules and out of the model is sparsejit's tensor, which has the engine's attributes
(``.F``, ``.C``, ``.tensor_stride`` / ``.s``, ...). The engine's functions a forward calls on
those tensors (``ME.cat``, ``MinkowskiFunctional``'s activations, ``torchsparse.cat``) are
pointed at a dispatcher the first time a model of that engine is accelerated: sparsejit's
tensors go to sparsejit's function, the engine's own to the original. The engines are
recognised via ``sys.modules`` and never imported here.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Callable, Dict, Optional

import torch
from torch import nn

from sparsejit.convert.pyg import ORIGINAL, Unsupported, _tensors

ENGINES = ("minkowski", "torchsparse")
_PATCHED = "__sparsejit_original__"
_MAPS = "__sparsejit__"  # the key under which an engine object keeps sparsejit's maps


# ---- recognising the engines' modules ---------------------------------------------------------

def _me():
    return sys.modules.get("MinkowskiEngine")


def _ts_nn():
    return sys.modules.get("torchsparse.nn")


# ME module classes sparsejit.minkowski has, by name (exact classes only: a subclass such as
# MinkowskiSyncBatchNorm may change the maths).
_ME_CONV = ("MinkowskiConvolution", "MinkowskiConvolutionTranspose")
_ME_POOL = ("MinkowskiAvgPooling", "MinkowskiSumPooling", "MinkowskiMaxPooling")
_ME_GLOBAL = ("MinkowskiGlobalPooling", "MinkowskiGlobalSumPooling",
              "MinkowskiGlobalAvgPooling", "MinkowskiGlobalMaxPooling")
_TS = ("Conv3d", "BatchNorm", "ReLU", "LeakyReLU", "GlobalAvgPool", "GlobalMaxPool")


def engine_of(module: nn.Module) -> Optional[str]:
    """'minkowski' or 'torchsparse' when `module` is one of that engine's sparse modules or
    a subclass of one (it takes the engine's sparse tensor), else None. Containers, such as
    ME's own residual blocks, are not: they are walked into."""
    me = _me()
    if me is not None:
        bases = tuple(c for c in (getattr(me, n, None) for n in (
            "MinkowskiModuleBase", "MinkowskiBatchNorm", "MinkowskiLinear", "MinkowskiUnion",
            "MinkowskiBroadcast")) if isinstance(c, type))
        if bases and isinstance(module, bases):
            return "minkowski"
    if _ts_nn() is not None and any(c.__module__.startswith("torchsparse.nn.modules")
                                    for c in type(module).__mro__):
        return "torchsparse"
    return None


def _sj_class(engine: str, module: nn.Module) -> Optional[type]:
    """sparsejit's class for `module` when its class is exactly the engine's class of that
    name and sparsejit has it."""
    name = type(module).__name__
    if engine == "minkowski":
        src = _me()
        import sparsejit.minkowski as target
        known = _ME_CONV + _ME_POOL + _ME_GLOBAL + ("MinkowskiBatchNorm", "MinkowskiLinear") + \
            tuple(target.NONLINEARITIES)
    else:
        src = _ts_nn()
        import sparsejit.torchsparse.nn as target
        known = _TS
    if name not in known or src is None or type(module) is not getattr(src, name, None):
        return None
    return getattr(target, name, None)


def blocker(model: nn.Module, engine: str) -> Optional[str]:
    """Why `engine`'s modules of `model` cannot all be converted, or None."""
    for path, m in model.named_modules():
        if engine_of(m) != engine or ORIGINAL in m.__dict__:
            continue
        if _sj_class(engine, m) is None:
            return (f"{path or '(model)'} ({type(m).__name__}) has no sparsejit."
                    f"{engine} counterpart")
        try:
            convert(m, engine)
        except Unsupported as e:
            return f"{path or '(model)'}: {e}"
    return None


# ---- the engines' tensors on the way in --------------------------------------------------------

def _me_key_map(x):
    """(sparsejit manager, {ME key -> sparsejit key}) of ME tensor `x`'s coordinate
    manager, kept on that manager (so it lives exactly as long)."""
    mgr = x.coordinate_manager
    maps = getattr(mgr, _MAPS, None)
    if maps is None:
        from sparsejit.minkowski import CoordinateManager
        maps = (CoordinateManager(D=x.D), {})
        setattr(mgr, _MAPS, maps)
    return maps


def _me_key(maps, key, coordinates: Callable[[], torch.Tensor], stride):
    sj_mgr, keys = maps
    k = (tuple(key.get_tensor_stride()), key.get_key()[1]) if hasattr(key, "get_key") else key
    if k not in keys:
        keys[k] = sj_mgr.insert(coordinates().int(), list(stride))
    return keys[k]


def _from_me(x):
    """sparsejit.minkowski's tensor for ME SparseTensor `x` (same features, coordinates,
    stride; the coordinate set inserted once per ME key)."""
    from sparsejit.minkowski import SparseTensor
    maps = _me_key_map(x)
    key = _me_key(maps, x.coordinate_map_key, lambda: x.C, x.tensor_stride)
    return SparseTensor(x.F, coordinate_map_key=key, coordinate_manager=maps[0])


def _from_ts(x):
    """sparsejit.torchsparse's tensor for TorchSparse tensor `x`; tensors sharing x's map
    dictionary share one sparsejit map cache (kept in that dictionary)."""
    from sparsejit.torchsparse import SparseTensor
    out = SparseTensor(x.feats, x.coords, x.stride)
    kmaps = getattr(x, "kmaps", None)
    if isinstance(kmaps, dict):
        shared = kmaps.setdefault(_MAPS, {})
        caches = shared.setdefault(tuple(x.stride), None)
        if caches is not None and caches[0] is x.coords:
            out.cmaps, out.kmaps = caches[1], caches[2]
        else:
            shared[tuple(x.stride)] = (x.coords, out.cmaps, out.kmaps)
    return out


def _is_engine_tensor(x, engine: str) -> bool:
    mod = type(x).__module__
    if engine == "minkowski":
        return type(x).__name__ == "SparseTensor" and mod.startswith(
            ("MinkowskiSparseTensor", "MinkowskiEngine"))
    return type(x).__name__ == "SparseTensor" and mod.startswith("torchsparse")


def _to_sparsejit(engine: str, x):
    if not _is_engine_tensor(x, engine):
        return x
    return _from_me(x) if engine == "minkowski" else _from_ts(x)


def _me_pre_hook(module, args, kwargs):
    if not args or not _is_engine_tensor(args[0], "minkowski"):
        coords = kwargs.get("coordinates", args[1] if len(args) > 1 else None)
        if not _is_engine_tensor(coords, "minkowski"):
            return None
    args = tuple(_to_sparsejit("minkowski", a) for a in args)
    kwargs = {k: _to_sparsejit("minkowski", v) for k, v in kwargs.items()}
    return args, kwargs


def _ts_pre_hook(module, args):
    if args and _is_engine_tensor(args[0], "torchsparse"):
        return (_from_ts(args[0]),) + tuple(args[1:])
    return None


# ---- the engines' functions, dispatched by tensor type -----------------------------------------

def _dispatching(original: Callable, is_ours: Callable, ours: Callable) -> Callable:
    @functools.wraps(original)
    def dispatch(*args, **kwargs):
        if is_ours(args, kwargs):
            return ours(*args, **kwargs)
        return original(*args, **kwargs)
    setattr(dispatch, _PATCHED, original)
    return dispatch


def _patch(module, name: str, is_ours: Callable, ours: Callable) -> None:
    fn = getattr(module, name, None)
    if fn is None or not callable(fn) or hasattr(fn, _PATCHED):
        return
    setattr(module, name, _dispatching(fn, is_ours, ours))


def _redirect_me_constructor(sjm) -> None:
    """``ME.SparseTensor(feats, coordinate_map_key=k, coordinate_manager=m)`` with sparsejit's
    key or manager (a forward rewrapping a converted layer's output) makes sparsejit's
    tensor: ME's class gets a ``__new__`` that returns one (so ME's ``__init__`` is skipped);
    any other call constructs ME's own tensor as before."""
    cls = getattr(_me(), "SparseTensor", None)
    if not isinstance(cls, type) or hasattr(cls.__dict__.get("__new__"), _PATCHED):
        return
    original = cls.__new__

    def new(klass, *args, **kwargs):
        if klass is cls and any(isinstance(a, (sjm.CoordinateManager, sjm.CoordinateMapKey))
                                for a in (*args, *kwargs.values())):
            mode = kwargs.get("quantization_mode")
            if mode is not None:
                kwargs["quantization_mode"] = getattr(sjm.SparseTensorQuantizationMode,
                                                      mode.name)
            return sjm.SparseTensor(*args, **kwargs)
        return original(klass) if original is object.__new__ else \
            original(klass, *args, **kwargs)
    setattr(new, _PATCHED, original)
    cls.__new__ = new


def install(engine: str) -> None:
    """What converting a model of `engine` sets up once (idempotent): the engine's tensor
    functions point at a type dispatcher that sends sparsejit's tensors to sparsejit."""
    if engine == "minkowski":
        import sparsejit.minkowski as sjm

        def ours(args, kwargs):
            return any(isinstance(a, sjm.SparseTensor) for a in args)

        def cat(*tensors):
            return sjm.cat(*(_to_sparsejit("minkowski", t) for t in tensors))

        for name in ("MinkowskiEngine", "MinkowskiOps", "MinkowskiEngine.MinkowskiOps"):
            if sys.modules.get(name) is not None:
                _patch(sys.modules[name], "cat", ours, cat)
        _redirect_me_constructor(sjm)
        try:  # ME is imported (its modules are in the model): so can its functional be
            importlib.import_module("MinkowskiEngine.MinkowskiFunctional")
        except ImportError:
            pass
        # ME's path trick can load it twice: as MinkowskiFunctional and under the package.
        for mf in {sys.modules.get(n) for n in ("MinkowskiFunctional",
                                                "MinkowskiEngine.MinkowskiFunctional")}:
            if mf is None:
                continue
            for name in dir(mf):
                fn = getattr(torch.nn.functional, name, None)
                if name.startswith("_") or fn is None or not callable(getattr(mf, name)):
                    continue
                _patch(mf, name, ours,
                       lambda x, *a, _fn=fn, **k: x._like(_fn(x.F, *a, **k)))
    else:
        import sparsejit.torchsparse as sjt

        def ours(args, kwargs):
            seq = args[0] if args else kwargs.get("inputs", ())
            return any(isinstance(t, sjt.SparseTensor) for t in seq)

        def cat(inputs):
            return sjt.cat([_to_sparsejit("torchsparse", t) for t in inputs])

        for name in ("torchsparse", "torchsparse.operators"):
            if sys.modules.get(name) is not None:
                _patch(sys.modules[name], "cat", ours, cat)


# ---- conversion --------------------------------------------------------------------------------

def _same_tensors(new: nn.Module, m: nn.Module) -> None:
    have = {k: tuple(v[1].shape) for k, v in _tensors(new).items() if v[1] is not None}
    want = {k: tuple(v[1].shape) for k, v in _tensors(m).items() if v[1] is not None}
    if have != want:
        raise Unsupported(f"its tensors {want} are not sparsejit's ({have})")
    for key, (kind, t) in _tensors(m).items():
        owner = new
        *path, leaf = key.split(".")
        for p in path:
            owner = getattr(owner, p)
        getattr(owner, kind)[leaf] = t


def _me_convert(m: nn.Module, cls: type) -> nn.Module:
    name = type(m).__name__
    if name in _ME_CONV + _ME_POOL:
        kg = m.kernel_generator
        region = getattr(kg, "region_type", None)
        if region is not None and getattr(region, "name", str(region)) != "HYPER_CUBE":
            raise Unsupported(f"kernel region {region} (sparsejit.minkowski has hyper-cubes)")
        if len(getattr(kg, "region_offsets", ())) or getattr(kg, "expand_coordinates", False):
            raise Unsupported("custom region offsets or expand_coordinates=True")
        geometry = dict(kernel_size=list(kg.kernel_size), stride=list(kg.kernel_stride),
                        dilation=list(kg.kernel_dilation), dimension=m.dimension)
        try:
            with torch.device("meta"):
                if name in _ME_CONV:
                    new = cls(m.in_channels, m.out_channels, bias=m.bias is not None,
                              **geometry)
                else:
                    new = cls(**geometry)
        except (ValueError, NotImplementedError, TypeError) as e:
            raise Unsupported(str(e)) from None
        if name in _ME_CONV:
            _same_tensors(new, m)
    elif name in _ME_GLOBAL:
        from sparsejit.minkowski import PoolingMode
        mode = getattr(PoolingMode, m.pooling_mode.name, None)
        if mode is None:
            raise Unsupported(f"pooling mode {m.pooling_mode}")
        new = cls(mode)
    else:  # batch norm, linear, nonlinearities: the same torch module inside
        child = {"MinkowskiBatchNorm": "bn", "MinkowskiLinear": "linear"}.get(name, "module")
        new = nn.Module.__new__(cls)
        nn.Module.__init__(new)
        new._modules[child] = getattr(m, child)
    return new


def _ts_convert(m: nn.Module, cls: type) -> nn.Module:
    if type(m).__name__ == "Conv3d":
        if m.dilation != 1:
            raise Unsupported(f"dilation={m.dilation}")
        try:
            with torch.device("meta"):
                new = cls(m.in_channels, m.out_channels, m.kernel_size, m.stride,
                          bias=m.bias is not None, transposed=m.transposed, config=m.config)
        except (ValueError, NotImplementedError, TypeError) as e:
            raise Unsupported(str(e)) from None
        _same_tensors(new, m)
        return new
    try:
        with torch.device("meta"):
            if isinstance(m, nn.BatchNorm1d):
                new = cls(m.num_features, m.eps, m.momentum, m.affine, m.track_running_stats)
            elif isinstance(m, nn.LeakyReLU):
                new = cls(m.negative_slope, m.inplace)
            elif isinstance(m, nn.ReLU):
                new = cls(m.inplace)
            else:
                new = cls()
    except (ValueError, TypeError) as e:
        raise Unsupported(str(e)) from None
    _same_tensors(new, m)
    return new


def convert(m: nn.Module, engine: str) -> nn.Module:
    """sparsejit's module for engine module `m`. Raises Unsupported with the reason."""
    cls = _sj_class(engine, m)
    if cls is None:
        raise Unsupported(f"no sparsejit.{engine} counterpart")
    new = _me_convert(m, cls) if engine == "minkowski" else _ts_convert(m, cls)
    new.train(m.training)
    if engine == "minkowski":
        new.register_forward_pre_hook(_me_pre_hook, with_kwargs=True)
    else:
        new.register_forward_pre_hook(_ts_pre_hook)
    new.__dict__[ORIGINAL] = m
    return new


def original_of(new: nn.Module) -> nn.Module:
    """The engine module `new` replaced, holding the tensors and child modules `new` holds
    now."""
    m = new.__dict__[ORIGINAL]
    for key, (kind, t) in _tensors(new).items():
        if "." not in key and key in getattr(m, kind):
            getattr(m, kind)[key] = t
    for name, child in new._modules.items():
        if name in m._modules:
            m._modules[name] = child
    m.train(new.training)
    return m


def engines_in(model: nn.Module) -> Dict[str, Optional[str]]:
    """{engine: blocker or None} for each engine with modules in `model`."""
    found = {engine_of(m) for m in model.modules()} - {None}
    return {e: blocker(model, e) for e in ENGINES if e in found}
