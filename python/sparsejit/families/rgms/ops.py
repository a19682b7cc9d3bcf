"""RGMS (relational gather-matmul-scatter): wrappers, fakes and autograd of the ops in
torch_ext/ops/rgms.cpp (segment_matmul and the Linear: the dense family,
sparsejit.families.dense).

    A = sj.TypedSparseMatrix.from_edge_index(edge_index, num_nodes, edge_type=etype,
                                              num_relations=R)
    Y = sj.rgms(A, X, W, reduce="mean")      # Y[i] = sum_r c_{i,r} sum_{j in N_r(i)} X[j] W[r]

A typed structure's plan (entries grouped by relation, then by target) is built once, by the
``rgms_plan`` op, and held as one int64 tensor (the common plan header, then the arrays;
``_core.plan_layout()["rgms"]``), so it crosses torch.compile, torch.save and ``.to()``.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple, Union

import torch

from sparsejit._library import FLOAT_DTYPES, ops, restores_type_errors

from sparsejit import _core
from sparsejit.families.rgms import schedules
from sparsejit.runtime.autograd import call_op
from sparsejit.runtime.caches import LruCache, content_key, own

_REDUCES = ("sum", "mean")
_STRATEGIES = schedules.STRATEGIES  # the ops' `strategy` argument by name
_LAYOUT = _core.plan_layout()
_WORDS = _LAYOUT["words"]


def _plan_affine(num_relations: int) -> Tuple[int, int]:
    """(words of a plan with no entries, words per entry) for R relations: a plan's length is
    affine in E (csrc/rgms/plan_layout.h)."""
    base = _core.rgms_plan_view(num_relations, 0)["total_words"]
    return base, _core.rgms_plan_view(num_relations, 1)["total_words"] - base


def plan_words(num_relations, entries):
    """Length of an RGMS plan for R relations and E entries (E may be symbolic)."""
    base, per_entry = _plan_affine(num_relations)
    return base + per_entry * entries


def plan_entries(plan: torch.Tensor, num_relations: int) -> int:
    """E, the stored entries, of an RGMS plan for `num_relations` relations."""
    base, per_entry = _plan_affine(num_relations)
    return (plan.shape[0] - base) // per_entry


def plan_arrays(plan: torch.Tensor, num_relations: Optional[int] = None) -> Dict[str, torch.Tensor]:
    """Views of an RGMS plan's arrays (``rel_ptr``, ``grp_ptr``, ``grp_dst``, ``src``, ``perm``;
    csrc/rgms/rgms_plan.h). Writing through a view changes the plan (and bumps its version, so
    the ops validate it again)."""
    if num_relations is None:
        num_relations = int(plan[_WORDS["param"]])
    view = _core.rgms_plan_view(num_relations, plan_entries(plan, num_relations))
    return {name: plan.narrow(0, view[name][0], view[name][1])
            for name in _LAYOUT["rgms"]["arrays"]}


class TypedSparseMatrix:
    """A sparse matrix whose stored entries each carry a relation id in ``[0, R)``.

    Rows are targets (``edge_index[1]``) and columns sources (``edge_index[0]``), as in
    ``SparseMatrix.from_edge_index``. `values` (``[E]``, optional) are per-edge
    coefficients in the order of `edge_index`.
    """

    def __init__(self, plan: torch.Tensor, shape: Tuple[int, int],
                 values: Optional[torch.Tensor] = None, num_relations: Optional[int] = None):
        if not isinstance(plan, torch.Tensor):
            raise TypeError("TypedSparseMatrix: plan must be the int64 tensor rgms_plan returns "
                            f"(one tensor since the plans carry the common header); got "
                            f"{type(plan).__name__}")
        self.plan = plan
        own(self, plan)  # validated once while this object lives (runtime.caches.own)
        self.shape = (shape[0], shape[1])
        self.values = values
        # R is known where the plan is built; otherwise read once from the header.
        self._num_relations = num_relations

    @classmethod
    def from_edge_index(
        cls,
        edge_index: torch.Tensor,
        num_nodes: Union[int, Tuple[int, int], None] = None,
        *,
        edge_type: torch.Tensor,
        num_relations: Optional[int] = None,
        values: Optional[torch.Tensor] = None,
    ) -> "TypedSparseMatrix":
        """`num_nodes`: an int (square), or PyG's ``(num_sources, num_targets)``; None takes
        the largest index + 1. `num_relations` None takes ``edge_type.max() + 1`` (a data-
        dependent read: pass it under torch.compile). Validated once, here (relation ids in
        range and one per edge; endpoints in range), with errors naming position and value."""
        if not isinstance(edge_index, torch.Tensor):
            edge_index = torch.as_tensor(edge_index)
        if not isinstance(edge_type, torch.Tensor):
            raise TypeError(f"edge_type must be a tensor; got {type(edge_type).__name__}")
        if edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise ValueError(f"edge_index must have shape [2, E]; got {tuple(edge_index.shape)}")
        if edge_type.dtype.is_floating_point or edge_type.dtype in (torch.bool,) or \
                edge_type.dtype.is_complex:
            raise TypeError(f"edge_type must hold integers; got {edge_type.dtype}")
        if num_nodes is None:
            num_nodes = int(edge_index.max()) + 1 if edge_index.numel() else 0
        if isinstance(num_nodes, int):
            num_src = num_dst = num_nodes
        else:
            num_src, num_dst = num_nodes
        if num_relations is None:
            num_relations = int(edge_type.max()) + 1 if edge_type.numel() else 1
        if values is not None and (values.dim() != 1 or values.shape[0] != edge_index.shape[1]):
            raise ValueError(f"values must have shape [E] = [{edge_index.shape[1]}]; got "
                             f"{tuple(values.shape)}")
        plan = torch.ops.sparsejit.rgms_plan(edge_index, edge_type, num_src, num_dst,
                                             num_relations)
        return cls(plan, (num_dst, num_src), values, num_relations)

    @property
    def num_relations(self) -> int:
        if self._num_relations is None:
            self._num_relations = int(self.plan[_WORDS["param"]])
        return self._num_relations

    @property
    def nnz(self) -> int:
        return plan_entries(self.plan, self.num_relations)

    @property
    def device(self) -> torch.device:
        return self.plan.device

    def arrays(self) -> Dict[str, torch.Tensor]:
        """Views of the plan's arrays by name (see ``plan_arrays``)."""
        return plan_arrays(self.plan, self.num_relations)

    def with_values(self, values: Optional[torch.Tensor]) -> "TypedSparseMatrix":
        return TypedSparseMatrix(self.plan, self.shape, values, self._num_relations)

    def to(self, device) -> "TypedSparseMatrix":
        values = self.values.to(device) if self.values is not None else None
        return TypedSparseMatrix(self.plan.to(device), self.shape, values, self._num_relations)

    def relation_stats(self) -> dict:
        """Per relation: stored entries and distinct targets (the planner's inputs)."""
        arrays = self.arrays()
        rel_ptr, grp_ptr = arrays["rel_ptr"], arrays["grp_ptr"]
        groups = rel_ptr[1:] - rel_ptr[:-1]
        entries = grp_ptr[rel_ptr[1:]] - grp_ptr[rel_ptr[:-1]]
        return {"entries": entries.tolist(), "targets": groups.tolist()}

    def explain(self, f_in: int, f_out: int) -> str:
        """Per relation: stored entries, distinct targets and sources, and the strategy the
        forward's cost model picks for these widths (aggregate-then-transform or transform-
        then-aggregate; csrc/rgms/rgms_run.h). The backward always aggregates first."""
        t = torch.ops.sparsejit.rgms_explain(self.plan.cpu(), self.shape[0], self.shape[1],
                                             f_in, f_out)
        names = {1: "aggregate-then-transform", 2: "transform-then-aggregate"}
        lines = [f"{self!r}, F_in={f_in}, F_out={f_out}, tile="
                 f"{_core.rgms_default_tile(f_in, f_out)} groups per GEMM",
                 "relation  entries  targets  sources  strategy"]
        counts = {1: 0, 2: 0}
        for r, (e, g, s, c) in enumerate(t.tolist()):
            counts[c] += 1
            if e:
                lines.append(f"{r:8d} {e:8d} {g:8d} {s:8d}  {names[c]}")
        lines.append(f"{counts[2]} of {len(t)} relations transform first; empty relations "
                     "are not listed")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"TypedSparseMatrix(shape={self.shape}, nnz={self.nnz}, "
                f"num_relations={self.num_relations})")


# Eager calls with an edge_index (RGCNConv's forward, every layer of a model) would rebuild the
# plan on every call: a few entries keyed by the content of edge_index and edge_type
# (runtime.caches.content_key: a tensor changed in place misses, an equal one hits). Not used
# under torch.compile (the rgms_plan op is traced into the graph instead).
_TYPED_CACHE = LruCache("rgms.typed_structures", max_entries=4)


def clear_typed_cache() -> None:
    """Drops the remembered typed structures (sj.clear_caches does it through the registry)."""
    _TYPED_CACHE.clear()


def cached_from_edge_index(edge_index: torch.Tensor, num_nodes, edge_type: torch.Tensor,
                           num_relations: int) -> TypedSparseMatrix:
    """TypedSparseMatrix.from_edge_index, remembered for the last few (edge_index,
    edge_type) contents."""
    build = lambda: TypedSparseMatrix.from_edge_index(  # noqa: E731
        edge_index, num_nodes, edge_type=edge_type, num_relations=num_relations)
    if torch.compiler.is_compiling() or not isinstance(edge_index, torch.Tensor) or \
            not isinstance(edge_type, torch.Tensor):
        return build()
    key = content_key(edge_index, edge_type, extra=(_hashable(num_nodes), num_relations))
    hit = _TYPED_CACHE.get(key)
    if hit is not None:
        return hit
    A = build()
    _TYPED_CACHE.put(key, A)
    return A


def _hashable(n):
    return tuple(n) if isinstance(n, list) else n


@restores_type_errors
def rgms(
    A: Union[TypedSparseMatrix, torch.Tensor],
    X: torch.Tensor,
    W: torch.Tensor,
    *,
    edge_type: Optional[torch.Tensor] = None,
    reduce: str = "sum",
    values: Optional[torch.Tensor] = None,
    num_nodes: Union[int, Tuple[int, int], None] = None,
    strategy: str = "auto",
    root: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    x_root: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``Y[i] = sum_{stored p = (i, j)} a_p * X[j] @ W[type_p]``; `W` is ``[R, F_in, F_out]``.

    `root` ``[F, F_out]`` and `bias` ``[F_out]`` fuse R-GCN's self-connection and bias:
    ``Y += x_root @ root + bias``, where `x_root` (the targets' features, ``[num_rows, F]``)
    defaults to `X` (then the graph must be square). The product runs inside the same
    parallel pass, into the rows each thread owns; its gradients come with the op's.

    `strategy` (forward): "auto" lets the cost model pick per relation (``A.explain(F_in,
    F_out)`` shows its choices), "aggregate_first" / "transform_first" force one for every
    relation.

    `A` is a TypedSparseMatrix, or an ``edge_index`` with `edge_type` (the structure is then
    built on this call, or taken from a small cache of recent ones; `num_nodes` defaults to
    ``X.shape[0]``). ``reduce="mean"`` divides by the number of entries of each (target,
    relation), R-GCN's ``c_{i,r}``; for a per-target normalization pass ``reduce="sum"`` with ``values = 1 / in_degree[target]``.
    Differentiable in X, W and `values`.
    """
    if reduce not in _REDUCES:
        raise ValueError(f"sparsejit.rgms: reduce must be 'sum' or 'mean'; got {reduce!r}")
    if strategy not in _STRATEGIES:
        raise ValueError(f"sparsejit.rgms: strategy must be one of {tuple(_STRATEGIES)}; got "
                         f"{strategy!r}")
    if not isinstance(X, torch.Tensor) or X.dim() != 2:
        raise ValueError(f"sparsejit.rgms: X must be a [num_nodes, F_in] tensor; got "
                         f"{tuple(X.shape) if isinstance(X, torch.Tensor) else type(X).__name__}")
    if not isinstance(W, torch.Tensor) or W.dim() != 3:
        raise ValueError("sparsejit.rgms: W must be a [num_relations, F_in, F_out] tensor; got "
                         f"{tuple(W.shape) if isinstance(W, torch.Tensor) else type(W).__name__}")
    if not isinstance(A, TypedSparseMatrix):
        if edge_type is None:
            raise ValueError("sparsejit.rgms: pass edge_type with an edge_index (or a "
                             "TypedSparseMatrix)")
        A = cached_from_edge_index(A, X.shape[0] if num_nodes is None else num_nodes,
                                   edge_type, W.shape[0])
    elif edge_type is not None:
        raise ValueError("sparsejit.rgms: edge_type is given by the TypedSparseMatrix; do not "
                         "pass it again")
    if values is None:
        values = A.values
    if X.dtype not in FLOAT_DTYPES:
        raise TypeError(f"sparsejit.rgms: X must be a floating tensor; got {X.dtype}")
    if X.shape[0] != A.shape[1]:
        raise ValueError(f"sparsejit.rgms: X has {X.shape[0]} rows but the typed structure has "
                         f"{A.shape[1]} source nodes (shape {A.shape})")
    if W.shape[0] != A.num_relations:
        raise ValueError(f"sparsejit.rgms: W has {W.shape[0]} relations but the typed "
                         f"structure has {A.num_relations}")
    if W.shape[1] != X.shape[1]:
        raise ValueError(f"sparsejit.rgms: W has F_in = {W.shape[1]} but X has {X.shape[1]} "
                         "features")
    if x_root is not None and root is None:
        raise ValueError("sparsejit.rgms: x_root given without root")
    if root is not None and x_root is None and X.shape[0] != A.shape[0]:
        raise ValueError(f"sparsejit.rgms: root with x_root=None uses X as the targets' "
                         f"features, but X has {X.shape[0]} rows and the structure "
                         f"{A.shape[0]} targets; pass x_root")
    sid, tile, gemm = _STRATEGIES[strategy], 0, 0
    if strategy == "auto" and not torch.compiler.is_compiling():
        # a schedule stored by sj.tune, if any
        sched = schedules.schedule_for(A, X.shape[1], W.shape[2], X.dtype, reduce)
        if sched is not None:
            sid, tile, gemm = sched
    # Every schema argument, positionally (runtime.autograd.call_op).
    args = (A.plan, X, W, values, reduce, A.shape[0], gemm, tile, sid, root, bias, x_root)
    return call_op(ops.rgms.default, _rgms_setup, _rgms_backward, args,
                   (X, W, values, root, bias, x_root))


def _rgms_grads(plan, x, w, values, root, x_root, grad, reduce, gemm, tile, strategy, need):
    """Gradients of rgms for ``need = (x, w, values, root, bias, x_root)``: the op's backward
    (dX includes dY @ root^T when x_root is X), and the root term's own products."""
    grad = grad.contiguous()
    need_x, need_w, need_v, need_root, need_bias, need_xr = need
    need_v = bool(need_v) and values is not None
    fused_root = root if (root is not None and x_root is None and need_x) else None
    dx, dw, dv = torch.ops.sparsejit.rgms_backward(
        plan, x, w, values, grad, reduce, bool(need_x), bool(need_w), need_v, gemm, tile,
        strategy, fused_root)
    d_root = (x if x_root is None else x_root).t() @ grad if need_root else None
    d_bias = grad.sum(0) if need_bias else None
    d_xr = grad @ root.t() if need_xr and x_root is not None else None
    return (dx if need_x else None, dw if need_w else None, dv if need_v else None, d_root,
            d_bias, d_xr)


# ---- fakes --------------------------------------------------------------------------------

@torch.library.register_fake("sparsejit::rgms_plan")
def _rgms_plan_fake(edge_index, edge_type, num_src, num_dst, num_relations):
    return edge_index.new_empty(plan_words(num_relations, edge_index.shape[1]),
                                dtype=torch.long)


def _check_fake(op, x, w, values, plan):
    devices = {t.device for t in (x, w, plan) if t is not None}
    if values is not None:
        devices.add(values.device)
    if len(devices) > 1:
        raise ValueError(f"sparsejit.{op}: all tensor arguments must be on one device")
    if plan.dim() != 1 or plan.dtype != torch.long:
        raise TypeError(f"sparsejit.{op}: plan must be a 1-D int64 tensor from rgms_plan")
    if x.dim() != 2 or w.dim() != 3 or w.shape[1] != x.shape[1]:
        raise ValueError(f"sparsejit.{op}: X [N, F_in] and W [R, F_in, F_out] do not agree "
                         f"with each other or the structure: {tuple(x.shape)}, {tuple(w.shape)}")
    if w.dtype != x.dtype or (values is not None and values.dtype != x.dtype):
        raise TypeError(f"sparsejit.{op}: X, W and values must share one dtype")


@torch.library.register_fake("sparsejit::rgms")
def _rgms_fake(plan, x, w, values, reduce, num_rows, gemm=0, tile=0, strategy=0, root=None,
               bias=None, x_root=None):
    _check_fake("rgms", x, w, values, plan)
    if root is not None:
        xr = x if x_root is None else x_root
        if root.dim() != 2 or xr.dim() != 2 or xr.shape[0] != num_rows or \
                root.shape[0] != xr.shape[1] or root.shape[1] != w.shape[2]:
            raise ValueError("sparsejit.rgms: root [F, F_out] and x_root [num_rows, F] do not "
                             "agree")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != w.shape[2]):
        raise ValueError("sparsejit.rgms: bias must be [F_out]")
    return x.new_empty(num_rows, w.shape[2])


@torch.library.register_fake("sparsejit::rgms_explain")
def _rgms_explain_fake(plan, num_rows, num_src, f_in, f_out):
    # One row per relation: R is in the plan's header, a data-dependent size here.
    return plan.new_empty(torch.library.get_ctx().new_dynamic_size(), 4)


@torch.library.register_fake("sparsejit::rgms_backward")
def _rgms_backward_fake(plan, x, w, values, grad_y, reduce, need_x, need_w, need_values, gemm=0,
                        tile=0, strategy=0, root=None):
    _check_fake("rgms_backward", x, w, values, plan)
    dx = x.new_empty(x.shape) if need_x else x.new_empty(0)
    dw = w.new_empty(w.shape) if need_w else x.new_empty(0)
    dv = x.new_empty(values.shape[0]) if need_values and values is not None else x.new_empty(0)
    return dx, dw, dv


# ---- autograd -----------------------------------------------------------------------------

def _rgms_setup(ctx, inputs, output):
    plan, x, w, values, reduce, num_rows = inputs[:6]
    extra = list(inputs[6:]) + [None] * (6 - len(inputs[6:]))
    gemm, tile, strategy, root, _bias, x_root = extra
    ctx.save_for_backward(plan, x, w, values, root, x_root)
    ctx.reduce = reduce
    ctx.gemm, ctx.tile, ctx.strategy = gemm or 0, tile or 0, strategy or 0


def _rgms_backward(ctx, grad):
    plan, x, w, values, root, x_root = ctx.saved_tensors
    need = tuple(ctx.needs_input_grad) + (False,) * 12
    grads = _rgms_grads(plan, x, w, values, root, x_root, grad, ctx.reduce, ctx.gemm, ctx.tile,
                        ctx.strategy, (need[1], need[2], need[3], need[9], need[10], need[11]))
    dx, dw, dv, d_root, d_bias, d_xr = grads
    return (None, dx, dw, dv, None, None, None, None, None, d_root, d_bias, d_xr)


torch.library.register_autograd("sparsejit::rgms", _rgms_backward, setup_context=_rgms_setup)
