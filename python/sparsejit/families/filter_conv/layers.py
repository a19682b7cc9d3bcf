"""Pruned Conv2d / Linear inference with filter-sparse kernels, and ``sparsify``, which
converts a model's layers where the sparse kernel measures faster than the dense one.

``SparseConv2d.from_dense(conv, bn=None, threshold=0.0, relu=False)`` keeps the nonzeros of
``conv.weight`` (BatchNorm folded in first), and runs ``sparsejit::filter_conv``. Inference only:
the modules hold buffers, not parameters, and no gradient flows to the weight or the input.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import torch

from sparsejit._library import restores_type_errors
from torch import nn

from sparsejit import _core
from sparsejit.families.filter_conv import fold as _fold
from sparsejit.families.filter_conv.fold import (ChannelsLastPool, ConvPool, ConvReLU,
                                                 fold_batchnorm, fold_bn as _fold_bn,
                                                 functional_pools_as_modules, set_module)
from sparsejit.families.filter_conv.ops import JIT_VARIANTS, VARIANTS, output_size
from sparsejit.runtime.caches import own
from sparsejit.runtime.cpu import cpu_model as _cpu_model
from sparsejit.runtime.store import fingerprint, read_json, write_json_atomic
from sparsejit.runtime.timing import Progress


def _pair(v) -> Tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


class SparseConv2d(nn.Module):
    """A Conv2d whose weight's zeros are skipped: the weight compressed per output channel
    (``sparsejit::filter_conv_plan``), bias and an optional ReLU fused into the output write.
    Accepts NCHW or channels_last input of any float dtype (computed in float32; bfloat16
    read and written by the kernel itself, float16 and float64 results converted back);
    returns NCHW. The compressed weight is built
    on the host and its buffers placed on `weight`'s device; on a GPU the op runs the CUDA
    kernel (kernels/cuda/filter_conv.cuh; float32 accumulation, results in x's dtype)."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, stride=1,
                 padding=0, dilation=1, groups: int = 1, relu: bool = False,
                 threshold: float = 0.0, kernel: str = "auto"):
        super().__init__()
        if not isinstance(weight, torch.Tensor) or weight.dim() != 4:
            raise ValueError("sparsejit.SparseConv2d: weight must be a 4-D tensor [C_out, "
                             "C_in/groups, R, S]")
        if kernel not in VARIANTS:
            raise ValueError(f"sparsejit.SparseConv2d: kernel must be one of {list(VARIANTS)}; "
                             f"got {kernel!r}")
        if groups < 1 or weight.shape[0] % groups:
            raise ValueError(f"sparsejit.SparseConv2d: groups ({groups}) must divide "
                             f"out_channels ({weight.shape[0]})")
        w = weight.detach().cpu()
        plan, rowptr, taps, values = torch.ops.sparsejit.filter_conv_plan(
            w, float(threshold), VARIANTS[kernel])
        dev = weight.device
        self.register_buffer("plan", plan.to(dev))
        self.register_buffer("rowptr", rowptr.to(dev))
        self.register_buffer("taps", taps.to(dev))
        self.register_buffer("values", values.to(dev))
        # Validated once while this layer lives (runtime.caches.own).
        own(self, self.plan, self.rowptr, self.taps, self.values)
        self.register_buffer("bias", None if bias is None else bias.detach().to(dev).float())
        self.out_channels = int(weight.shape[0])
        self.in_channels = int(weight.shape[1]) * groups
        self.kernel_size = _pair(tuple(weight.shape[2:]))
        self.stride, self.padding, self.dilation = _pair(stride), _pair(padding), _pair(dilation)
        self.groups = int(groups)
        self.relu = bool(relu)
        self.kernel = kernel

    @classmethod
    def from_dense(cls, conv: nn.Conv2d, bn: Optional[nn.BatchNorm2d] = None,
                   threshold: float = 0.0, relu: bool = False,
                   kernel: str = "auto") -> "SparseConv2d":
        """The sparse twin of `conv` (followed by `bn`, folded in, and ReLU when `relu`);
        entries with magnitude <= `threshold` are dropped as well as zeros."""
        if not isinstance(conv, nn.Conv2d):
            raise TypeError(f"sparsejit.SparseConv2d.from_dense: conv must be an nn.Conv2d; "
                            f"got {type(conv).__name__}")
        if conv.padding_mode != "zeros":
            raise ValueError("sparsejit.SparseConv2d.from_dense: only padding_mode='zeros' is "
                             f"supported; got {conv.padding_mode!r}")
        padding = conv.padding
        if isinstance(padding, str):
            if padding == "valid":
                padding = (0, 0)
            else:  # 'same' (stride 1): symmetric only
                tot = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size)]
                if any(t % 2 for t in tot):
                    raise ValueError("sparsejit.SparseConv2d.from_dense: padding='same' needs "
                                     "asymmetric padding for this kernel; not supported")
                padding = tuple(t // 2 for t in tot)
        weight, bias = conv.weight.detach(), conv.bias
        if bn is not None:
            weight, bias = _fold_bn(weight, None if bias is None else bias.detach(), bn)
        return cls(weight, bias, conv.stride, padding, conv.dilation, conv.groups, relu,
                   threshold, kernel)

    @property
    def nnz(self) -> int:
        return int(self.taps.shape[0])

    @property
    def sparsity(self) -> float:
        total = self.out_channels * (self.in_channels // self.groups) * \
            self.kernel_size[0] * self.kernel_size[1]
        return 1.0 - self.nnz / max(total, 1)

    def set_kernel(self, kernel: str) -> "SparseConv2d":
        """Makes `kernel` (a name in ops.filter_conv.VARIANTS) the plan's variant (the plan's
        kernel word; saved with the state dict). sparsify sets the measured winner."""
        if kernel not in VARIANTS:
            raise ValueError(f"sparsejit.SparseConv2d: kernel must be one of {list(VARIANTS)}; "
                             f"got {kernel!r}")
        self.plan[3] = VARIANTS[kernel]  # plan_header.h: kWordKernel
        self.kernel = kernel
        return self

    @restores_type_errors
    def forward(self, x: torch.Tensor, variant: int = -1,
                residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        """`variant` >= 0 forces a variant (ops.filter_conv.VARIANTS; tests, measurement).
        `residual` (the output's shape, e.g. a ResNet block's identity) is added in the
        output write, after the bias and before the ReLU: ``relu(conv(x) + bias +
        residual)`` in one pass (what ``sparsify(..., fold_bn=True)`` fuses)."""
        return self._op(x, self.relu, variant, residual)

    def _op(self, x: torch.Tensor, relu: bool, variant: int,
            residual: Optional[torch.Tensor]) -> torch.Tensor:
        return torch.ops.sparsejit.filter_conv(
            self.plan, self.rowptr, self.taps, self.values, x, self.bias, list(self.kernel_size),
            list(self.stride), list(self.padding), list(self.dilation), self.groups, relu,
            variant, residual)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"groups={self.groups}, relu={self.relu}, sparsity={self.sparsity:.3f}")


class ResidualSparseConv2d(nn.Module):
    """``relu(conv(x) + residual)`` (ReLU optional) with the add and the ReLU in the sparse
    kernel's output write: no separate pass over the output, no extra tensor. What
    ``sparsify(..., fold_bn=True)`` makes of a ResNet block's last convolution, its residual
    add and ReLU. A residual that is not of the output's shape, dtype and device (a
    broadcasting add) takes the unfused path, with the same result."""

    def __init__(self, conv: "SparseConv2d", relu: bool = True):
        super().__init__()
        if not isinstance(conv, SparseConv2d) or conv.relu:
            raise ValueError("sparsejit.ResidualSparseConv2d: conv must be a SparseConv2d "
                             "without its own ReLU (the ReLU follows the residual)")
        self.conv, self.relu = conv, bool(relu)

    @restores_type_errors
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        c = self.conv
        if isinstance(x, torch.Tensor) and x.dim() == 4 and \
                isinstance(residual, torch.Tensor) and residual.dtype == x.dtype and \
                residual.device == x.device:
            oh, ow = output_size(x.shape[2], x.shape[3], c.kernel_size, c.stride, c.padding,
                                 c.dilation)
            if tuple(residual.shape) == (x.shape[0], c.out_channels, oh, ow):
                return c._op(x, self.relu, -1, residual)
        y = c(x) + residual
        return torch.relu(y) if self.relu else y

    def extra_repr(self) -> str:
        return f"relu={self.relu}"


class SparseLinear(nn.Module):
    """A Linear layer run as a 1x1 filter-sparse convolution: the rows of the input are the
    pixels of one image, ``Y^T [out, M] = W_sparse [out, in] . X^T [in, M]``."""

    def __init__(self, linear: nn.Linear, threshold: float = 0.0):
        super().__init__()
        w = linear.weight.detach()
        self.conv = SparseConv2d(w.view(w.shape[0], w.shape[1], 1, 1), linear.bias,
                                 threshold=threshold)
        self.in_features, self.out_features = int(w.shape[1]), int(w.shape[0])

    @property
    def sparsity(self) -> float:
        return self.conv.sparsity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"sparsejit.SparseLinear: input has {x.shape[-1]} features; "
                             f"expected {self.in_features}")
        lead = x.shape[:-1]
        if x.numel() == 0:  # no rows: nothing to convolve (an empty image is an error there)
            return x.new_empty(*lead, self.out_features)
        xt = x.reshape(-1, self.in_features).t().reshape(1, self.in_features, -1, 1)
        y = self.conv(xt).reshape(self.out_features, -1).t()
        return y.reshape(*lead, self.out_features)


# ---- sparsify -------------------------------------------------------------------------------

LAST_REPORT: List[dict] = []  # the per-layer rows of the last sparsify() call




def _default_cache_dir() -> Path:
    return Path(_core.cache_dir()) / "filter_conv"


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


def _load_decisions(path: Path) -> Dict[str, dict]:
    return read_json(path)  # missing or damaged: measured again and rewritten


def _save_decisions(path: Path, table: Dict[str, dict]) -> None:
    write_json_atomic(path, table, "the sparsify decision cache")


_CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def _time_cuda(runs, x, repeat: int) -> List[List[float]]:
    """Per-run device milliseconds (CUDA events on the current stream), the runs alternated as
    on the CPU; one synchronization at the end, not per run."""
    events = [[] for _ in runs]
    for rep in range(repeat):
        for j in range(len(runs)):
            i = (rep + j) % len(runs)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            runs[i](x)
            end.record()
            events[i].append((start, end))
    torch.cuda.synchronize(x.device)
    return [[a.elapsed_time(b) for a, b in ev] for ev in events]


def measure(dense: nn.Module, sparse: nn.Module, shape, dtype, repeat: int = 7,
            clock: str = "wall", variants=(), device=None):
    """Median milliseconds of the dense and the sparse module on a random input of `shape`,
    alternated run by run so that both see the same machine load. ``clock="cpu"`` counts this
    process's CPU time instead of elapsed time (robust to other jobs; use with one thread).
    With `variants` (names in ops.filter_conv.VARIANTS), each is run too (``sparse(x,
    variant=...)``, in the same alternation) and a third result maps name -> median ms.
    On a CUDA `device` (default: the CPU) both modules run on the GPU (cuDNN against the
    CUDA filter-conv kernel) and are timed with CUDA events whatever `clock` says."""
    device = torch.device("cpu") if device is None else torch.device(device)
    x = torch.randn(shape, dtype=dtype, device=device)
    runs = [dense, sparse] + [lambda x, k=VARIANTS[v]: sparse(x, variant=k) for v in variants]
    times: List[List[float]] = [[] for _ in runs]
    with torch.no_grad():
        for f in runs:  # warm-up (first-touch allocations, oneDNN primitives, JIT compiles)
            f(x)
        if device.type == "cuda":
            times = _time_cuda(runs, x, repeat)
        else:
            tick = _CLOCKS[clock]
            for rep in range(repeat):  # order rotated: who runs second finds x in cache
                for j in range(len(runs)):
                    i = (rep + j) % len(runs)
                    t0 = tick()
                    runs[i](x)
                    times[i].append((tick() - t0) * 1e3)
    med = [sorted(t)[len(t) // 2] for t in times]
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


def _jit_candidates(sparse: "SparseConv2d", jit: bool, baked_max_nnz: int) -> Tuple[str, ...]:
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
    return ResidualSparseConv2d(mod) if isinstance(mod, SparseConv2d) and not mod.relu else None


def _fuse_graph(gm: torch.fx.GraphModule, shapes, table: Dict[str, dict], rows: List[dict],
                min_speedup: float, repeat: int, clock: str,
                devices: Dict[str, torch.device]) -> bool:
    """sparsify's fusion pass over a traced model (after the per-layer decisions): residual
    add + ReLU into the sparse convolutions' output write, and each dense conv + max pool
    (the stem) on channels_last where that measures faster. Returns whether `table` (the
    decision cache) gained entries."""
    changed = False
    by_name = {r["name"]: r for r in rows}
    for name in _fold.fuse_residual(gm, _residual_unit):
        if name in by_name:
            by_name[name]["fused"] = "+ residual, ReLU"
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
                                     "+ pool, channels_last")
        changed |= new
        if won:
            _fold.apply_conv_pool(gm, conv_node, pool_node)
    changed |= _channels_last_pools(gm, shapes, table, rows, min_speedup, repeat, clock,
                                    devices)
    _fold.finish(gm)
    return changed


def _channels_last_pools(gm: torch.fx.GraphModule, shapes, table: Dict[str, dict],
                         rows: List[dict], min_speedup: float, repeat: int, clock: str,
                         devices: Dict[str, torch.device]) -> bool:
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
                                     min_speedup, row, rows, "pool on channels_last")
        changed |= new
        if won:
            set_module(gm, name, fused)
    return changed


def _measured_rewrite(table: Dict[str, dict], key: str, before: nn.Module, after: nn.Module,
                      shape, dtype, repeat: int, clock: str, min_speedup: float, row: dict,
                      rows: List[dict], label: str) -> Tuple[bool, bool]:
    """A rewrite the fusion pass applies where it measures faster: `before` and `after`
    timed on `shape` (or their times taken from `table` under `key`), the report row
    completed and appended (the two times in its dense / sparse columns, `label` when the
    rewrite wins). Returns (apply it, `table` gained the entry)."""
    hit = table.get(key)
    row.update(dense_ms=None, sparse_ms=None, choice="dense", kernel=None,
               cached=hit is not None)
    new = hit is None
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
             fuse: Optional[bool] = None) -> nn.Module:
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
    are also kept in ``sparsejit.families.filter_conv.layers.LAST_REPORT``. `clock` is
    measure()'s.

    Layers on a GPU are measured there: the CUDA filter-conv kernel against the dense module
    (cuDNN), both timed with CUDA events on the example input's shape and dtype, and the
    decision cached under the GPU model (JIT variants are a CPU matter and not tried); the
    sparse module is created on the layer's device. Layers on other devices stay dense.

    `fuse` (default: `fold_bn`; it needs the model traced by fold_bn's torch.fx pass) then
    rewrites the traced graph: a residual add followed by a ReLU whose other operand is a
    sparse convolution's output runs in that convolution's output write
    (``ResidualSparseConv2d``), and a dense convolution (ReLU fused or not) followed by a
    ``MaxPool2d`` (the CNN stem) runs on channels_last with the ReLU after the pool
    (``ConvPool``) where that measures faster by `min_speedup` (a row "conv + pool" in the
    table: its two times are NCHW and channels_last; cached like the layers); any other
    ``MaxPool2d`` on a CPU NCHW input is measured the same way against running it on
    channels_last (``ChannelsLastPool``; PyTorch's NCHW max pool is the slow one).
    ``F.max_pool2d`` / ``torch.max_pool2d`` calls with constant arguments take part as
    ``MaxPool2d`` modules (``max_pool2d_fn``, ...; the same computation)."""
    global LAST_JIT_WARMUP_S
    baked_max = BAKED_MAX_NNZ if baked_max_nnz is None else int(baked_max_nnz)
    if clock not in _CLOCKS:
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

    path = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    path = path / "decisions.json"
    table = _load_decisions(path)
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
            sparse = SparseConv2d.from_dense(conv, threshold=threshold,
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
            and isinstance(s, SparseConv2d)]
    LAST_JIT_WARMUP_S = _warm_jit(work)
    for i, (name, mod, sparse, row, key) in enumerate(layers):
        shape, dtype = shapes[name]
        if key is not None:
            hit = table.get(key)
            if hit is None:
                conv = sparse if isinstance(sparse, SparseConv2d) else sparse.conv
                kinds = (_jit_candidates(conv, jit, baked_max)
                         if isinstance(sparse, SparseConv2d) else ())
                device = _conv_of(mod).weight.device
                on_gpu = device.type == "cuda"
                if isinstance(sparse, SparseConv2d) and not on_gpu:
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
            else:
                row["cached"] = True
            row.update(dense_ms=hit["dense_ms"], sparse_ms=hit["sparse_ms"],
                       kernel=hit.get("kernel", "auto"))
            if hit["dense_ms"] >= hit["sparse_ms"] * min_speedup:
                row["choice"] = "sparse"
                if isinstance(sparse, SparseConv2d) and row["kernel"] in VARIANTS:
                    sparse.set_kernel(row["kernel"])
                set_module(model, name, sparse)
        rows.append(row)
        bar.step(name)
    if do_fuse:
        changed |= _fuse_graph(model, shapes, table, rows, min_speedup, repeat, clock, devices)
    if changed:
        _save_decisions(path, table)
    LAST_REPORT[:] = rows
    if verbose:
        print(_format_table(rows))
    return model


def format_report(rows: Optional[List[dict]] = None) -> str:
    """The per-layer table of `rows` (default: the last sparsify call)."""
    return _format_table(LAST_REPORT if rows is None else rows)


__all__ = ["SparseConv2d", "SparseLinear", "ResidualSparseConv2d", "sparsify", "measure",
           "format_report", "LAST_REPORT"]
