"""The adjacency a PyG-signature layer is given, turned into sparsejit structures once.

Accepted forms (PyG's ``Adj``): an ``edge_index`` ``[2, E]`` tensor (row 0 sources, row 1
targets), PyG's ``EdgeIndex`` (its cached CSC is reused when it is sorted by target), a
``torch.sparse`` CSR / COO adjacency with rows = targets (PyG's ``adj_t``), or a
``sparsejit.SparseMatrix`` (rows = targets).

Everything a layer derives from the structure (the CSR, self-loops, GCN's normalisation, the
transpose) is computed by :func:`prepared` once per graph content and kept in a small LRU keyed
by a hash of the index (and weight) data, so a training loop that passes the same
``edge_index`` every step pays for it once. Under ``torch.compile`` the same code is traced
(static shapes throughout: removed self-loops are masked, not dropped), so a model taking
``(x, edge_index)`` compiles with no graph break.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch

from sparsejit.families.spmm.matrix import SparseMatrix, _Structure
from sparsejit.families.spmm.plans import fingerprint
from sparsejit.runtime.caches import LruCache, content_key

# Prepared adjacencies (self-loops, normalisation, transposes) keyed by graph content and
# what was prepared: the layers' per-graph work done once.
_CACHE = LruCache("spmm.prepared_adjacencies", max_entries=16)


@dataclass
class Edges:
    """An adjacency as an edge list: ``src``/``dst`` ``[E]`` int64, optional ``weight``
    ``[E]``, sizes, and (when the input already was one) its CSR with rows = targets, whose
    entry order is the edge order."""

    src: torch.Tensor
    dst: torch.Tensor
    weight: Optional[torch.Tensor]
    num_src: int
    num_dst: int
    csr: Optional[SparseMatrix] = None
    key: Optional[tuple] = None  # content key, None under torch.compile
    stacked: Optional[torch.Tensor] = None  # [src; dst] as one int64 [2, E] tensor, if at hand

    def edge_index(self) -> torch.Tensor:
        """``[src; dst]`` as a ``[2, E]`` int64 tensor (the input's own when it was one)."""
        return self.stacked if self.stacked is not None else torch.stack([self.src, self.dst])


def edges_of(edge_index, size: Optional[Tuple[int, int]] = None,
             edge_weight: Optional[torch.Tensor] = None) -> Edges:
    """The edge list of any accepted adjacency form. `size` is ``(num_src, num_dst)``."""
    if isinstance(edge_index, SparseMatrix):
        return _from_csr(edge_index, edge_weight if edge_weight is not None
                         else edge_index.values, size)
    if not isinstance(edge_index, torch.Tensor):
        raise TypeError("edge_index must be a [2, E] tensor, an EdgeIndex, a torch.sparse "
                        f"adjacency or a sparsejit.SparseMatrix; got {type(edge_index).__name__}")
    if edge_index.layout == torch.sparse_csr:
        n_dst, n_src = edge_index.shape
        A = SparseMatrix.from_csr(edge_index.crow_indices(), edge_index.col_indices(),
                                  shape=(n_dst, n_src))
        return _from_csr(A, edge_weight if edge_weight is not None else edge_index.values(),
                         size)
    if edge_index.layout == torch.sparse_coo:
        adj = edge_index.coalesce()
        idx = adj.indices()
        w = edge_weight if edge_weight is not None else adj.values()
        n_dst, n_src = adj.shape
        return _edge_list(idx[1], idx[0], w, size or (n_src, n_dst))
    if edge_index.layout != torch.strided:
        raise ValueError(f"edge_index layout {edge_index.layout} is not supported (use CSR "
                         "or COO)")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, E]; got {tuple(edge_index.shape)}")
    if edge_index.dtype.is_floating_point or edge_index.dtype == torch.bool:
        raise TypeError(f"edge_index must hold integers; got {edge_index.dtype}")
    edges = _from_edge_index_tensor(edge_index, size, edge_weight)
    return edges


def _pyg_edge_index_type():
    """PyG's ``EdgeIndex`` class when torch_geometric is already imported, else None. Read
    from ``sys.modules``, never imported: whoever holds an EdgeIndex has imported PyG, and an
    import inside code that torch.compile traces fails where PyG is not installed."""
    pyg = sys.modules.get("torch_geometric")
    return None if pyg is None else getattr(pyg, "EdgeIndex", None)


def _from_edge_index_tensor(edge_index, size, edge_weight) -> Edges:
    # PyG's EdgeIndex sorted by target: its cached CSC is our CSR, in edge order.
    EdgeIndex = _pyg_edge_index_type()
    if EdgeIndex is not None and isinstance(edge_index, EdgeIndex):
        sizes = edge_index.sparse_size()
        if size is None and None not in sizes:
            size = (int(sizes[0]), int(sizes[1]))
        if edge_index.is_sorted_by_col and size is not None:
            A = getattr(edge_index, "_sparsejit_csr", None)
            if A is None:
                (colptr, row), _ = edge_index.get_csc()
                A = SparseMatrix.from_csr(colptr.as_subclass(torch.Tensor),
                                          row.as_subclass(torch.Tensor),
                                          shape=(size[1], size[0]))
                edge_index._sparsejit_csr = A  # lives as long as the EdgeIndex
            return _from_csr(A, edge_weight, size)
        edge_index = edge_index.as_tensor()
    ei = edge_index.to(torch.long)
    return _edge_list(ei[0], ei[1], edge_weight, size, ei)


def _edge_list(src, dst, weight, size, stacked=None) -> Edges:
    if size is None:
        if torch.compiler.is_compiling():
            raise ValueError("sparsejit.nn: under torch.compile the layers need the node "
                             "count (taken from x); pass size")
        n = int(torch.maximum(src.max(), dst.max())) + 1 if src.numel() else 0
        size = (n, n)
    _check_weight(weight, src.shape[0])
    stacked = torch.stack([src, dst]) if stacked is None else stacked
    k = content_key(stacked, weight)
    return Edges(src, dst, weight, _size(size[0]), _size(size[1]), None,
                 None if k is None else (k, tuple(size)), stacked)


def _size(n):
    """A node count as given: a Python int, or a SymInt under torch.export / torch.compile
    with dynamic shapes (int() would specialize it to the example's size)."""
    return n if isinstance(n, torch.SymInt) else int(n)


def _from_csr(A: SparseMatrix, weight, size) -> Edges:
    if size is not None and (size[1], size[0]) != tuple(A.shape):
        raise ValueError(f"the adjacency has shape {tuple(A.shape)} (targets x sources) but the "
                         f"node features give (sources, targets) = {tuple(size)}")
    _check_weight(weight, A.nnz)
    if weight is not None and weight.dim() != 1:
        raise ValueError(f"edge weights must be [nnz]; got shape {tuple(weight.shape)}")
    key = None
    if not torch.compiler.is_compiling():
        key = (fingerprint(A), A.shape, content_key(weight))
    return Edges(A.indices.to(torch.long), A.row_indices(), weight, A.shape[1], A.shape[0],
                 A.with_values(None), key)


def _check_weight(weight, n):
    if weight is not None and (not isinstance(weight, torch.Tensor) or weight.shape[0] != n):
        raise ValueError(f"edge weights must be a tensor with {n} entries (one per edge); got "
                         f"{tuple(weight.shape) if isinstance(weight, torch.Tensor) else weight}")


def csr_of(src, dst, num_src, num_dst):
    """CSR (rows = targets) of an edge list, via the traceable csr_from_edge_index op.
    Returns (A, perm: CSR position -> edge, row and col of every CSR entry)."""
    n = torch.sym_max(num_src, num_dst)
    indptr, indices, perm = torch.ops.sparsejit.csr_from_edge_index(torch.stack([src, dst]), n)
    A = SparseMatrix(_Structure(indptr[: num_dst + 1], indices, (num_dst, num_src)))
    return A, perm, dst[perm], indices.to(torch.long)


def prepared(edges: Edges, what: str, build: Callable[[Edges], object], *params):
    """``build(edges)`` once per (graph content, `what`, params); the result is cached (with
    the transposes of the SparseMatrix objects in it) unless under torch.compile or when the
    edge weights require grad."""
    if edges.key is None or (edges.weight is not None and edges.weight.requires_grad):
        return build(edges)
    key = (what, params, edges.key)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    out = build(edges)
    for item in (out if isinstance(out, tuple) else (out,)):
        if isinstance(item, SparseMatrix):
            item.transpose_arrays()
    _CACHE.put(key, out)
    return out


def clear_cache() -> None:
    _CACHE.clear()


def structure(edges: Edges):
    """(A without values, perm: CSR position -> edge or None when the edge order is the CSR
    order, row and col of every CSR entry), cached per graph."""

    def build(e: Edges):
        if e.csr is not None:
            return e.csr, None, e.dst, e.src
        A = sorted_csr(e)
        if A is not None:  # the edge order is the CSR order
            return A, None, e.dst, e.src
        return csr_of(e.src, e.dst, e.num_src, e.num_dst)

    return prepared(edges, "plain", build)


def sorted_csr(edges: Edges) -> Optional[SparseMatrix]:
    """The CSR of edges that arrive sorted by target (PyG's neighbour samplers, k-NN graphs):
    row pointers from a count per target, the sources as they are; no sort, no permutation
    (about a third of the sorting op's time on a sampled batch of 70k edges). Within a row
    the entries stay in edge order (the sorting op also orders them by source; the kernels
    take either, as for an EdgeIndex's CSC). None (the caller sorts) when they are not
    sorted, an index is out of range (the sorting op then names it), there are none, or
    under torch.compile (the traced op serves)."""
    dst, src = edges.dst, edges.src
    if torch.compiler.is_compiling() or dst.numel() == 0:
        return None
    lo, hi = torch.aminmax(src)
    if not bool((dst[1:] >= dst[:-1]).all()) or int(dst[0]) < 0 or \
            int(dst[-1]) >= edges.num_dst or int(lo) < 0 or int(hi) >= edges.num_src:
        return None
    indptr = torch.zeros(edges.num_dst + 1, dtype=torch.long, device=dst.device)
    torch.cumsum(torch.bincount(dst, minlength=edges.num_dst), 0, out=indptr[1:])
    return SparseMatrix(_Structure(indptr, src.contiguous(), (edges.num_dst, edges.num_src)))


def in_csr_order(t: Optional[torch.Tensor], perm: Optional[torch.Tensor]):
    """Per-edge data (weights, attributes) permuted from edge order to CSR order."""
    if t is None or perm is None:
        return t
    return t.index_select(0, perm)


def with_self_loops(edges: Edges):
    """The edges plus one self-loop per node (``min(num_src, num_dst)`` of them), in PyG's
    order: the input edges then the loops. Existing self-loops stay in the list but are
    flagged in `is_old_loop` (static shapes: layers mask them instead of dropping them).

    Returns (A without values, perm: CSR position -> position in that list, row, col,
    is_old_loop)."""
    n = min(edges.num_src, edges.num_dst)
    loops = torch.arange(n, device=edges.src.device)
    src = torch.cat([edges.src, loops])
    dst = torch.cat([edges.dst, loops])
    A, perm, row, col = csr_of(src, dst, edges.num_src, edges.num_dst)
    is_old_loop = torch.cat([edges.src == edges.dst,
                             torch.zeros(n, dtype=torch.bool, device=loops.device)])
    return A, perm, row, col, is_old_loop


def loop_fill(attr: torch.Tensor, edges: Edges, is_loop: torch.Tensor, fill_value, n: int):
    """The attribute of the added self-loops (PyG's ``add_self_loops`` fill_value): a number,
    a tensor, or 'mean' / 'add' / 'sum' / 'max' / 'min' of each node's incoming non-loop edge
    attributes (0 for a node without any)."""
    tail = attr.shape[1:]
    if isinstance(fill_value, str):
        if fill_value not in ("add", "sum", "mean", "max", "min"):
            raise ValueError(f"fill_value must be a number, a tensor, 'mean', 'add', 'sum', "
                             f"'max' or 'min'; got {fill_value!r}")
        # Edges that do not count (old self-loops, targets beyond n) go to a spare row n.
        slot = torch.where((edges.dst < n) & ~is_loop, edges.dst, n)
        if fill_value in ("add", "sum", "mean"):
            total = attr.new_zeros((n + 1,) + tail).index_add_(0, slot, attr)[:n]
            if fill_value == "mean":
                cnt = attr.new_zeros(n + 1).index_add_(0, slot, torch.ones_like(slot, dtype=attr.dtype))[:n]
                total = total / cnt.clamp(min=1).view(-1, *([1] * len(tail)))
            return total
        red = "amax" if fill_value == "max" else "amin"
        index = slot.view(-1, *([1] * len(tail))).expand_as(attr)
        return attr.new_zeros((n + 1,) + tail).scatter_reduce(
            0, index, attr, red, include_self=False)[:n]
    fill = torch.as_tensor(fill_value, dtype=attr.dtype, device=attr.device)
    return fill.expand((n,) + tail).clone() if fill.dim() <= 1 else fill
