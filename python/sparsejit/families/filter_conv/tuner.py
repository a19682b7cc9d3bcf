"""``sparsify`` (``sj.sparsify``, and ``sj.tune`` / ``sj.explain`` on a model with a dense
example input): converts a model's Conv2d and Linear layers to the filter-sparse modules of
sparsejit.families.filter_conv.layers where the sparse kernel measures faster than the dense
one, and (with ``fold_bn``) rewrites the traced graph where a fusion measures faster.

Each decision is measured once (dense and sparse interleaved, ``runtime.timing``) and kept in
the shared store (``runtime.store``: one table, ``<sparsejit cache>/filter_conv/decisions.json``
or ``<cache_dir>/decisions.json``), keyed by the weight pattern's fingerprint, the layer's
geometry, the input shape and dtype, and the machine (GPU model, or CPU model and threads), so
the next process converts without measuring.
"""

from __future__ import annotations

import copy
import hashlib
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import torch
from torch import nn

from sparsejit import _core
from sparsejit.families.filter_conv import fold as _fold
from sparsejit.families.filter_conv import fused as _fused
from sparsejit.families.filter_conv.fold import (ChannelsLastPool, ConvPool, ConvReLU,
                                                 fold_batchnorm, functional_pools_as_modules,
                                                 set_module)
from sparsejit.families.filter_conv.layers import (ResidualPrunedConv2d, PrunedConv2d,
                                                   SparseLinear)
from sparsejit.families.filter_conv.ops import JIT_VARIANTS, VARIANTS
from sparsejit.runtime import tuners
from sparsejit.runtime.cpu import cpu_model as _cpu_model
from sparsejit.runtime.store import JsonStore, fingerprint
from sparsejit.runtime.timing import CLOCKS, Progress, paired_median_ms

LAST_REPORT: List[dict] = []  # the per-layer rows of the last sparsify() call




# The decisions: one table (file "decisions.json") of the shared store, under the JIT's cache
# directory or the caller's `cache_dir`.
STORE = JsonStore("", folder="filter_conv", what="the sparsify decisions")
_TABLE = "decisions"


def _store(cache_dir: Union[str, Path, None]) -> JsonStore:
    if cache_dir is None:
        return STORE
    return JsonStore("", what="the sparsify decisions", root=Path(cache_dir))


def _machine(device: torch.device) -> str:
    """What a measurement depends on besides the layer: the GPU model, or the CPU model and
    the thread count."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"{_cpu_model()}|t{torch.get_num_threads()}"


def _input_key(shape, dtype, device: torch.device) -> str:
    """The part of a cached decision's key past the unit: input shape, dtype, machine."""
    return f"{tuple(shape)}|{str(dtype).replace('torch.', '')}|{_machine(device)}"


def _decision_key(module: nn.Module, sparse: nn.Module, shape, dtype,
                  device: torch.device = torch.device("cpu")) -> str:
    conv = sparse.conv if isinstance(sparse, SparseLinear) else sparse
    fp = fingerprint(conv.rowptr, conv.taps)
    geo = (type(module).__name__, conv.kernel_size, conv.stride, conv.padding, conv.dilation,
           conv.groups, conv.in_channels, conv.out_channels)
    return f"{fp}|{geo}|{_input_key(shape, dtype, device)}"


def measure(dense: nn.Module, sparse: nn.Module, shape, dtype, repeat: int = 7,
            clock: str = "wall", variants=(), device=None):
    """Median milliseconds of the dense and the sparse module on a random input of `shape`,
    alternated run by run so that both see the same machine load (``runtime.timing.
    paired_median_ms``, the order rotated: who runs second finds x in cache). ``clock="cpu"``
    counts this process's CPU time instead of elapsed time (robust to other jobs; use with one
    thread). With `variants` (names in ops.filter_conv.VARIANTS), each is run too (``sparse(x,
    variant=...)``, in the same alternation) and a third result maps name -> median ms.
    On a CUDA `device` (default: the CPU) both modules run on the GPU (cuDNN against the
    CUDA filter-conv kernel) and are timed with CUDA events whatever `clock` says."""
    device = torch.device("cpu") if device is None else torch.device(device)
    x = torch.randn(shape, dtype=dtype, device=device)
    runs = [dense, sparse] + [lambda x, k=VARIANTS[v]: sparse(x, variant=k) for v in variants]
    with torch.no_grad():
        # one warm-up call each (first-touch allocations, oneDNN primitives, JIT compiles)
        med = paired_median_ms([lambda f=f: f(x) for f in runs], repeat, warmup=1,
                               clock=clock, rotate=True, device=str(device))
    if not variants:
        return med[0], med[1]
    return med[0], med[1], dict(zip(variants, med[2:]))


def _format_table(rows: List[dict]) -> str:
    head = f"{'layer':<28} {'input shape':<20} {'weight':<18} {'sparsity':>8} " \
           f"{'dense ms':>9} {'sparse ms':>9} {'speedup':>8}  choice"
    lines = [head, "-" * len(head)]
    for r in rows:
        d, s = r["dense_ms"], r["sparse_ms"]
        ratio = f"{d / s:.2f}x" if d and s else "-"
        lines.append(f"{r['name'][:28]:<28} {str(tuple(r['input_shape'])):<20} "
                     f"{str(tuple(r['weight_shape'])):<18} {r['sparsity']:>8.3f} "
                     f"{d if d is not None else float('nan'):>9.3f} "
                     f"{s if s is not None else float('nan'):>9.3f} {ratio:>8}  "
                     f"{r['choice']}{' ' + r['kernel'] if r.get('kernel') else ''}"
                     f"{' ' + r['fused'] if r.get('fused') else ''}"
                     f"{' (cached)' if r['cached'] else ''}")
    return "\n".join(lines)


# sparsify tries the baked JIT variant on layers up to this many stored taps (its
# `baked_max_nnz`). 0: never. Baked code grows with nnz (~60 bytes and 5-10 ms of compile per
# tap on the loaded 2-core machine) and measured no faster than "jit" on any layer tried
# (benchmarks/archive/bench_filter_conv_baked.py: 0.84-1.03x of generic where jit gave 1.01-1.11x;
# docs/FILTER_SPARSE_CONV.md), so by default it is not tried.
BAKED_MAX_NNZ = 0

LAST_JIT_WARMUP_S = 0.0  # wall seconds the last sparsify spent compiling JIT kernels


def _jit_candidates(sparse: "PrunedConv2d", jit: bool, baked_max_nnz: int) -> Tuple[str, ...]:
    if not jit or not _core.jit_enabled() or sparse.values.device.type != "cpu":
        return ()
    return JIT_VARIANTS if sparse.nnz <= baked_max_nnz else ("jit",)


def _warm_jit(work: List[tuple]) -> float:
    """Compiles every layer's JIT kernels in parallel (one host-compiler process each; the op
    releases the GIL) on a one-image zero input of its shape; returns the wall seconds."""
    from concurrent.futures import ThreadPoolExecutor
    jobs = [(sparse, shape, dtype, v) for sparse, shape, dtype, kinds in work for v in kinds]
    if not jobs:
        return 0.0

    def run(job):
        sparse, shape, dtype, v = job
        with torch.no_grad():
            sparse(torch.zeros((1,) + tuple(shape[1:]), dtype=dtype, device=sparse.values.device),
                   variant=VARIANTS[v])

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        list(pool.map(run, jobs))
    return time.perf_counter() - t0


def _conv_of(mod: nn.Module) -> nn.Module:
    return mod.conv if isinstance(mod, ConvReLU) else mod


def _residual_unit(mod: nn.Module) -> Optional[nn.Module]:
    return ResidualPrunedConv2d(mod) if isinstance(mod, PrunedConv2d) and not mod.relu else None


def _fuse_graph(gm: torch.fx.GraphModule, shapes, table: Dict[str, dict], rows: List[dict],
                min_speedup: float, repeat: int, clock: str,
                devices: Dict[str, torch.device], dry: bool = False,
                groups: bool = True) -> bool:
    """sparsify's fusion pass over a traced model (after the per-layer decisions): residual
    add + ReLU into the sparse convolutions' output write, with `groups` each bottleneck of
    three sparse layers as one fused op (fused.py), and each dense conv + max pool (the stem)
    on channels_last, the last two where they measure faster (`dry`: where the table says so,
    nothing measured). Returns whether `table` (the decision cache) gained entries."""
    changed = False
    by_name = {r["name"]: r for r in rows}
    for name in _fold.fuse_residual(gm, _residual_unit):
        if name in by_name:
            by_name[name]["fused"] = "+ residual, ReLU"
    if groups:
        changed |= _fuse_groups(gm, shapes, table, rows, min_speedup, repeat, clock, dry)
    for conv_node, pool_node in _fold.conv_pool_candidates(gm):
        name = conv_node.target
        modules = dict(gm.named_modules())
        unit, pool = modules[name], modules[pool_node.target]
        conv = _conv_of(unit)
        if name not in shapes or conv.weight.device.type != "cpu" or len(shapes[name][0]) != 4:
            continue  # not reached by the example input, on a GPU (cuDNN, not measured), or
            # an unbatched [C, H, W] input (channels_last needs 4 dimensions)
        shape, dtype = shapes[name]
        geo = (type(unit).__name__, tuple(conv.weight.shape), conv.stride, conv.padding,
               conv.dilation, conv.groups, pool.kernel_size, pool.stride, pool.padding,
               pool.dilation, pool.ceil_mode)
        row = dict(name=f"{name} + {pool_node.target}", input_shape=list(shape),
                   weight_shape=list(conv.weight.shape),
                   sparsity=float((conv.weight == 0).float().mean()))
        key = f"convpool|{geo}|{_input_key(shape, dtype, conv.weight.device)}"
        won, new = _measured_rewrite(table, key, nn.Sequential(unit, pool),
                                     ConvPool(conv, isinstance(unit, ConvReLU), pool), shape,
                                     dtype, repeat, clock, min_speedup, row, rows,
                                     "+ pool, channels_last", dry)
        changed |= new
        if won:
            _fold.apply_conv_pool(gm, conv_node, pool_node)
    changed |= _channels_last_pools(gm, shapes, table, rows, min_speedup, repeat, clock,
                                    devices, dry)
    _fold.finish(gm)
    return changed


def _fuse_groups(gm: torch.fx.GraphModule, shapes, table: Dict[str, dict], rows: List[dict],
                 min_speedup: float, repeat: int, clock: str, dry: bool) -> bool:
    """Each chain of three sparse layers that makes a bottleneck (fused.bottleneck_candidates)
    becomes one FusedBottleneck where that measures faster than the three layer calls by
    `min_speedup` (a row "<block> bottleneck": its two times are the layers' and the fused
    block's; cached like the layers, by the three weight patterns and kernels and the input)."""
    changed = False

    def rewrite(label, before, after, shape, dtype):
        nonlocal changed
        convs = (after.conv1, after.conv2, after.conv3.conv) + \
            (() if after.shortcut is None else (after.shortcut,))
        fps = "".join(fingerprint(c.rowptr, c.taps) for c in convs)
        kernels = tuple(int(c.plan[3]) for c in convs)  # plan_header.h: kWordKernel
        key = f"bottleneck|{fps}|{kernels}|{_input_key(shape, dtype, torch.device('cpu'))}"
        nnz = sum(c.nnz for c in convs)
        dense = sum(c.out_channels * c.in_channels * c.kernel_size[0] * c.kernel_size[1]
                    for c in convs)
        row = dict(name=label, input_shape=list(shape), weight_shape=[],
                   sparsity=1.0 - nnz / max(dense, 1))
        won, new = _measured_rewrite(table, key, before, after, shape, dtype, repeat, clock,
                                     min_speedup, row, rows, "fused bottleneck", dry)
        changed |= new
        return won
    _fused.fuse_bottlenecks(gm, shapes, rewrite)
    return changed


def _channels_last_pools(gm: torch.fx.GraphModule, shapes, table: Dict[str, dict],
                         rows: List[dict], min_speedup: float, repeat: int, clock: str,
                         devices: Dict[str, torch.device], dry: bool = False) -> bool:
    """Every other MaxPool2d module of the graph (after a sparse convolution, say) on a CPU
    NCHW input: measured as is against ChannelsLastPool on the shape it saw, replaced where
    the latter wins by `min_speedup`; cached like the layers. A pool whose input was on
    another device (or is not known to be on the CPU) is left as it is: the measurement runs
    on the CPU and would say nothing about it."""
    changed = False
    modules = dict(gm.named_modules())
    calls = Counter(n.target for n in gm.graph.nodes if n.op == "call_module")
    for name in [t for t in calls if type(modules.get(t)) is nn.MaxPool2d]:
        pool = modules[name]
        if pool.return_indices or calls[name] != 1 or name not in shapes or \
                getattr(devices.get(name), "type", None) != "cpu":
            continue
        shape, dtype = shapes[name]
        if len(shape) != 4 or shape[1] < 2:
            continue
        geo = (pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.ceil_mode)
        key = f"clpool|{geo}|{_input_key(shape, dtype, torch.device('cpu'))}"
        fused = ChannelsLastPool(pool)
        row = dict(name=name, input_shape=list(shape), weight_shape=[], sparsity=0.0)
        won, new = _measured_rewrite(table, key, pool, fused, shape, dtype, repeat, clock,
                                     min_speedup, row, rows, "pool on channels_last", dry)
        changed |= new
        if won:
            set_module(gm, name, fused)
    return changed


def _pools_in_the_model(model: nn.Module, example_input, table: Dict[str, dict],
                        rows: List[dict], min_speedup: float, repeat: int, clock: str,
                        dry: bool = False) -> bool:
    """The channels_last pools the pass chose, checked in the whole model: `model` on the
    example input with them and with the plain pools back, interleaved; kept only where the
    model is faster by `min_speedup` (alone, a pool between two NCHW sparse layers measured
    faster on channels_last, yet VGG-16 at batch 8 ran 1.25x slower with them: the copies'
    fresh buffers). Cached per model (its decisions and input); a row "channels_last pools,
    whole model". Returns whether `table` gained the entry."""
    swapped = [(n, m) for n, m in model.named_modules() if type(m) is ChannelsLastPool]
    args = example_input if isinstance(example_input, tuple) else (example_input,)
    if not swapped:
        return False
    decided = [(r["name"], r.get("choice"), r.get("kernel"), r.get("fused"),
                tuple(r.get("input_shape") or ())) for r in rows]
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if first is None:
        return False
    digest = hashlib.sha1(repr(decided).encode()).hexdigest()[:16]
    key = f"clpool-model|{digest}|{_input_key(first.shape, first.dtype, first.device)}"
    row = dict(name=f"channels_last pools ({len(swapped)}), whole model", input_shape=[],
               weight_shape=[], sparsity=0.0, cached=False)

    def run_with(on: bool):
        def run():
            for name, m in swapped:
                set_module(model, name, m if on else m.pool)
            with torch.no_grad():
                model(*args)
        return run

    hit = table.get(key)
    new = hit is None and not dry
    if new:
        plain_ms, cl_ms = paired_median_ms([run_with(False), run_with(True)], repeat,
                                           clock=clock)
        hit = table[key] = dict(dense_ms=plain_ms, sparse_ms=cl_ms)
    if hit is None:  # dry and not stored: the pools stay as the pass left them
        row.update(dense_ms=None, sparse_ms=None, choice="not measured", kernel=None)
        rows.append(row)
        return False
    keep = hit["dense_ms"] >= hit["sparse_ms"] * min_speedup
    row.update(dense_ms=hit["dense_ms"], sparse_ms=hit["sparse_ms"], kernel=None,
               choice="dense", cached=not new)
    if keep:
        row["fused"] = "pools on channels_last"
    for name, m in swapped:
        set_module(model, name, m if keep else m.pool)
        if not keep:
            for r in rows:
                if r["name"] == name and r.get("fused"):
                    r["fused"] = None
                    r["choice"] = "dense (slower in the model)"
    rows.append(row)
    return new


def _measured_rewrite(table: Dict[str, dict], key: str, before: nn.Module, after: nn.Module,
                      shape, dtype, repeat: int, clock: str, min_speedup: float, row: dict,
                      rows: List[dict], label: str, dry: bool = False) -> Tuple[bool, bool]:
    """A rewrite the fusion pass applies where it measures faster: `before` and `after`
    timed on `shape` (or their times taken from `table` under `key`), the report row
    completed and appended (the two times in its dense / sparse columns, `label` when the
    rewrite wins). Returns (apply it, `table` gained the entry). `dry`: a rewrite not in
    `table` is not measured, and not applied."""
    hit = table.get(key)
    row.update(dense_ms=None, sparse_ms=None, choice="dense", kernel=None,
               cached=hit is not None)
    new = hit is None
    if new and dry:
        row["choice"] = "not measured"
        rows.append(row)
        return False, False
    if new:
        d, a = measure(before, after, shape, dtype, repeat, clock)
        hit = table[key] = dict(dense_ms=d, sparse_ms=a)
    row.update(dense_ms=hit["dense_ms"], sparse_ms=hit["sparse_ms"])
    won = hit["dense_ms"] >= hit["sparse_ms"] * min_speedup
    if won:
        row["fused"] = label
    rows.append(row)
    return won, new


def sparsify(model: nn.Module, example_input, min_speedup: float = 1.05,
             threshold: float = 0.0, min_sparsity: float = 0.3, repeat: int = 7,
             cache_dir: Union[str, Path, None] = None, progress: Optional[bool] = None,
             verbose: bool = True, clock: str = "wall", fold_bn: bool = False,
             jit: bool = True, baked_max_nnz: Optional[int] = None,
             fuse: Optional[bool] = None, fuse_groups: bool = True) -> nn.Module:
    """Replaces each Conv2d and Linear of `model` whose sparse kernel, measured on the input
    shape it sees in ``model(example_input)``, beats the dense module by `min_speedup`;
    returns the converted model (`model` itself, converted in place, unless `fold_bn` traced
    it: then a torch.fx.GraphModule). Layers sparser than `min_sparsity` are not measured.
    With `jit` (and the JIT on), each layer's JIT variants ("jit"; "jit_baked" up to
    `baked_max_nnz` taps, default BAKED_MAX_NNZ = 0) are compiled in parallel first and
    measured against the precompiled loop ("generic"); the fastest becomes the layer's
    kernel. `fold_bn` (eval mode only) first folds each BatchNorm2d that directly follows a
    Conv2d and fuses a ReLU after it (sparsejit.families.filter_conv.fold).
    Decisions are cached on disk (`cache_dir`, default ``<sparsejit cache>/filter_conv``) by
    (weight pattern, layer geometry, input shape, dtype, CPU model, threads), so the next
    process converts without measuring. Prints the per-layer table when `verbose`; its rows
    are also kept in ``sparsejit.families.filter_conv.tuner.LAST_REPORT``. `clock` is
    measure()'s.

    Layers on a GPU are measured there: the CUDA filter-conv kernel against the dense module
    (cuDNN), both timed with CUDA events on the example input's shape and dtype, and the
    decision cached under the GPU model (JIT variants are a CPU matter and not tried); the
    sparse module is created on the layer's device. Layers on other devices stay dense.

    `fuse` (default: `fold_bn`; it needs the model traced by fold_bn's torch.fx pass) then
    rewrites the traced graph: a residual add followed by a ReLU whose other operand is a
    sparse convolution's output runs in that convolution's output write
    (``ResidualPrunedConv2d``), and a dense convolution (ReLU fused or not) followed by a
    ``MaxPool2d`` (the CNN stem) runs on channels_last with the ReLU after the pool
    (``ConvPool``) where that measures faster by `min_speedup` (a row "conv + pool" in the
    table: its two times are NCHW and channels_last; cached like the layers); any other
    ``MaxPool2d`` on a CPU NCHW input is measured the same way against running it on
    channels_last (``ChannelsLastPool``; PyTorch's NCHW max pool is the slow one).
    ``F.max_pool2d`` / ``torch.max_pool2d`` calls with constant arguments take part as
    ``MaxPool2d`` modules (``max_pool2d_fn``, ...; the same computation). With
    `fuse_groups`, each ResNet bottleneck the pass leaves as three sparse layers (1x1 ->
    odd "same" k x k -> 1x1 + the block's input, each with its ReLU) is timed as one fused
    op (``FusedBottleneck``: the block over bands of output rows, its intermediates kept in
    cache) against the three calls and replaced where faster by `min_speedup` (a row
    "<block> bottleneck"; cached like the layers).

    ``sj.tune(model, example_input, **options)`` measures and stores the same decisions
    without converting `model`; ``sj.explain(model, example_input, **options)`` prints what
    sparsify would do from the stored decisions alone (see :func:`tune`, :func:`explain`)."""
    return _sparsify(dry=False, **locals())  # every argument, by name


def _sparsify(model, example_input, min_speedup, threshold, min_sparsity, repeat, cache_dir,
              progress, verbose, clock, fold_bn, jit, baked_max_nnz, fuse, fuse_groups, dry):
    """sparsify's work; `dry`: nothing is measured or stored, a decision missing from the
    store keeps the layer dense (its row says "not measured")."""
    global LAST_JIT_WARMUP_S
    baked_max = BAKED_MAX_NNZ if baked_max_nnz is None else int(baked_max_nnz)
    if clock not in CLOCKS:
        raise ValueError(f"sparsejit.sparsify: clock must be 'wall' or 'cpu'; got {clock!r}")
    if fold_bn:
        model, _, _ = fold_batchnorm(model)
    units = (nn.Conv2d, nn.Linear, ConvReLU)
    targets: List[Tuple[str, nn.Module]] = [
        (n, m) for n, m in model.named_modules()
        if n and type(m) in units and _conv_of(m).weight.device.type in ("cpu", "cuda")]
    targets = [(n, m) for n, m in targets  # a ConvReLU's conv is measured as part of it
               if not any(n.startswith(u + ".") and type(um) is ConvReLU for u, um in targets)]
    shapes: Dict[str, Tuple[Tuple[int, ...], torch.dtype]] = {}
    devices: Dict[str, torch.device] = {}  # each module's input device (the pools' check)
    hooks = []
    do_fuse = (fold_bn if fuse is None else fuse) and isinstance(model, torch.fx.GraphModule)
    if do_fuse:  # functional max pools become modules the pass can measure and rewrite
        functional_pools_as_modules(model)
    pools = [(n, m) for n, m in model.named_modules() if type(m) is nn.MaxPool2d] \
        if do_fuse else []
    for name, mod in targets + pools:
        def hook(m, args, name=name):
            if name not in shapes and args and isinstance(args[0], torch.Tensor):
                shapes[name] = (tuple(args[0].shape), args[0].dtype)
                devices[name] = args[0].device
        hooks.append(mod.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            model(*example_input) if isinstance(example_input, tuple) else model(example_input)
    finally:
        for h in hooks:
            h.remove()

    store = _store(cache_dir)
    table = store.load(_TABLE)
    rows: List[dict] = []
    changed = False
    seen = [(n, m) for n, m in targets if n in shapes]
    bar = Progress(len(seen), "sparsify", progress)
    layers = []  # (name, module, sparse or None, row, key or None)
    for name, mod in seen:
        shape, dtype = shapes[name]
        conv = _conv_of(mod)
        if isinstance(conv, nn.Conv2d):
            ok = conv.padding_mode == "zeros" and len(shape) == 4
            sparse = PrunedConv2d.from_dense(conv, threshold=threshold,
                                             relu=mod is not conv) if ok else None
        else:
            sparse = SparseLinear(mod, threshold=threshold)
        row = dict(name=name, input_shape=list(shape), weight_shape=list(conv.weight.shape),
                   sparsity=sparse.sparsity if sparse is not None else 0.0, dense_ms=None,
                   sparse_ms=None, choice="dense", kernel=None, cached=False)
        key = None
        if sparse is not None and row["sparsity"] >= min_sparsity:
            key = _decision_key(mod, sparse, shape, dtype, conv.weight.device)
        layers.append((name, mod, sparse, row, key))
    # Compile the JIT kernels of the layers to be measured, all at once.
    work = [(s, shapes[n][0], shapes[n][1], _jit_candidates(s, jit, baked_max))
            for n, _, s, _, k in layers if k is not None and k not in table
            and isinstance(s, PrunedConv2d)]
    LAST_JIT_WARMUP_S = 0.0 if dry else _warm_jit(work)
    for i, (name, mod, sparse, row, key) in enumerate(layers):
        shape, dtype = shapes[name]
        if key is not None:
            hit = table.get(key)
            if hit is None and not dry:
                conv = sparse if isinstance(sparse, PrunedConv2d) else sparse.conv
                kinds = (_jit_candidates(conv, jit, baked_max)
                         if isinstance(sparse, PrunedConv2d) else ())
                device = _conv_of(mod).weight.device
                on_gpu = device.type == "cuda"
                if isinstance(sparse, PrunedConv2d) and not on_gpu:
                    sparse.set_kernel("generic")  # the precompiled loop, against the JIT's
                res = measure(mod, sparse, shape, dtype, repeat, clock, variants=kinds,
                              **({"device": device} if on_gpu else {}))
                d, s = res[0], res[1]
                kernel_ms = {"cuda" if on_gpu else "generic": s, **(res[2] if kinds else {})}
                kernel = min(kernel_ms, key=kernel_ms.get)
                hit = dict(dense_ms=d, sparse_ms=kernel_ms[kernel], kernel=kernel,
                           kernel_ms=kernel_ms, sparse=d >= kernel_ms[kernel] * min_speedup)
                table[key] = hit
                changed = True
            elif hit is not None:
                row["cached"] = True
            if hit is None:  # dry, and not in the store
                row["choice"] = "not measured"
            else:
                row.update(dense_ms=hit["dense_ms"], sparse_ms=hit["sparse_ms"],
                           kernel=hit.get("kernel", "auto"))
            if hit is not None and hit["dense_ms"] >= hit["sparse_ms"] * min_speedup:
                row["choice"] = "sparse"
                if isinstance(sparse, PrunedConv2d) and row["kernel"] in VARIANTS:
                    sparse.set_kernel(row["kernel"])
                set_module(model, name, sparse)
        rows.append(row)
        bar.step(name)
    if do_fuse:
        changed |= _fuse_graph(model, shapes, table, rows, min_speedup, repeat, clock, devices,
                               dry, fuse_groups)
        changed |= _pools_in_the_model(model, example_input, table, rows, min_speedup,
                                       repeat, clock, dry)
    if changed:
        store.update(_TABLE, table)
    LAST_REPORT[:] = rows
    if verbose:
        print(_format_table(rows))
    return model


def format_report(rows: Optional[List[dict]] = None) -> str:
    """The per-layer table of `rows` (default: the last sparsify, tune or explain call)."""
    return _format_table(LAST_REPORT if rows is None else rows)


# ---- sj.tune / sj.explain -------------------------------------------------------------------

def _options(kwargs: dict, verbose: bool) -> dict:
    """sparsify's keyword arguments out of a tune / explain call's (sj.tune's own `progress`
    and `repeat` included); anything else is an error naming it."""
    names = sparsify.__code__.co_varnames[2:sparsify.__code__.co_argcount]
    bad = sorted(set(kwargs) - set(names))
    if bad:
        raise TypeError(f"sparsejit.tune / explain of a model: unknown option(s) {bad}; "
                        f"sparsify's options are {list(names)}")
    return dict({"verbose": verbose}, **kwargs)


def tune(model: nn.Module, example_input, **options) -> dict:
    """``sj.tune(model, example_input, **options)``: sparsify's measurements (`options` are
    sparsify's) on a copy of `model`, stored so that a later ``sparsify`` converts without
    measuring; `model` is left as it is. Returns ``{"layers": rows, "model": the converted
    copy}`` (the rows of :func:`format_report`)."""
    converted = _sparsify(copy.deepcopy(model), example_input, dry=False,
                          **_defaults(_options(options, verbose=False)))
    return {"layers": list(LAST_REPORT), "model": converted}


def explain(model: nn.Module, example_input, file=None, **options) -> dict:
    """``sj.explain(model, example_input, **options)``: prints (and returns) what sparsify
    would do from the stored decisions alone, measuring nothing: per layer its sparsity, the
    stored dense and sparse times and the choice ("not measured" where nothing is stored:
    ``sj.tune`` or ``sj.sparsify`` measures it)."""
    _sparsify(copy.deepcopy(model), example_input, dry=True,
              **_defaults(_options(options, verbose=False)))
    rows = list(LAST_REPORT)
    missing = sum(r["choice"] == "not measured" for r in rows)
    text = _format_table(rows) + (f"\n{missing} of {len(rows)} rows not measured yet "
                                  "(sj.tune(model, example_input) measures them)"
                                  if missing else "")
    print(text, file=file or sys.stdout)
    return {"text": text, "layers": rows}


def _defaults(options: dict) -> dict:
    """sparsify's defaults, overridden by `options` (every parameter past the first two)."""
    code = sparsify.__code__
    names = code.co_varnames[2:code.co_argcount]
    return dict(dict(zip(names, sparsify.__defaults__)), **options)


def _accepts(obj, args, kwargs) -> bool:
    """A model with a dense example input: a tensor, or a tuple of them (point_conv's tuner
    takes models with a sparse-tensor input)."""
    example = args[0] if args else kwargs.get("example_input")
    dense = isinstance(example, torch.Tensor) or (
        isinstance(example, tuple) and example and
        all(isinstance(t, torch.Tensor) for t in example))
    return isinstance(obj, nn.Module) and dense


tuners.register_tuner("filter_conv", _accepts, tune, explain)

__all__ = ["sparsify", "measure", "format_report", "LAST_REPORT", "tune", "explain"]
