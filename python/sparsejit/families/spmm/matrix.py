"""SparseMatrix: a validated CSR structure with optional values, kept apart.

The structure (indptr, indices) is validated once, when built. Values live beside it and
can be swapped (`with_values`) without touching the structure or anything derived from it:
the transpose used by backward is cached on the structure and shared by every matrix that
shares the structure.
"""

from __future__ import annotations

import operator

from dataclasses import dataclass, field
from typing import Optional, Sequence, Tuple

import torch

from sparsejit import _library as _ops
from sparsejit.runtime.caches import LruCache, content_key, nbytes_of, own

_INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(eq=False)
class _Structure:
    """Index arrays plus what is derived from them (cached lazily, outside compiled code)."""

    indptr: torch.Tensor
    indices: torch.Tensor
    shape: Tuple[int, int]
    transpose: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None
    stats: Optional[dict] = None
    extra: dict = field(default_factory=dict)

    # The op library validates these arrays once while this object lives and forgets them
    # when it dies (runtime.caches.own): the index arrays now, transposes and plans as they
    # are cached on it.
    def __post_init__(self):
        own(self, self.indptr, self.indices)

    def __setstate__(self, state):  # torch.load / pickle: owned like a new structure
        self.__dict__.update(state)
        own(self, self.indptr, self.indices, *(self.transpose or ()))


class SparseMatrix:
    """A sparse matrix in CSR form: rows x cols, `nnz` stored entries.

    Build it with :meth:`from_edge_index`, :meth:`from_csr` or :meth:`from_scipy`. For a
    graph, rows are targets and columns are sources, so ``spmm(A, X)`` aggregates each
    node's in-neighbours exactly like PyG's message passing (``flow="source_to_target"``).
    """

    __slots__ = ("_s", "values")

    def __init__(self, structure: _Structure, values: Optional[torch.Tensor] = None):
        self._s = structure
        self.values = values
        if values is not None:
            _check_values(values, structure)

    # ---- construction ------------------------------------------------------------------

    @classmethod
    def from_csr(
        cls,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        values: Optional[torch.Tensor] = None,
        shape: Optional[Sequence[int]] = None,
    ) -> "SparseMatrix":
        """Wraps CSR arrays (indptr ``[m+1]``, indices ``[nnz]``, int32 or int64).

        `shape` defaults to ``(len(indptr) - 1, max(indices) + 1)``. Raises ``ValueError``
        naming the bad argument, position and value when the arrays are not a valid CSR.
        """
        indptr = _as_index(indptr, "indptr")
        indices = _as_index(indices, "indices")
        if indices.dtype != indptr.dtype:
            indices = indices.to(indptr.dtype)
        if indptr.device != indices.device:
            raise ValueError(
                f"indptr is on {indptr.device} but indices is on {indices.device}"
            )
        rows = indptr.numel() - 1
        if rows < 0:
            raise ValueError("indptr must have at least one entry (rows + 1); got size 0")
        if shape is None:
            cols = int(indices.max()) + 1 if indices.numel() else 0
            shape = (rows, cols)
        shape = (int(shape[0]), int(shape[1]))
        if shape[0] != rows:
            raise ValueError(
                f"shape[0] = {shape[0]} but indptr has {indptr.numel()} entries "
                f"(expected shape[0] + 1 = {shape[0] + 1})"
            )
        indptr, indices = indptr.contiguous(), indices.contiguous()
        _ops.ops.validate_csr(indptr.cpu(), indices.cpu(), shape[1])
        return cls(_Structure(indptr, indices, shape), values)

    @classmethod
    def from_edge_index(
        cls,
        edge_index: torch.Tensor,
        num_nodes: Optional[int] = None,
        values: Optional[torch.Tensor] = None,
    ) -> "SparseMatrix":
        """From a PyG-style ``edge_index`` ``[2, E]`` (row 0 sources, row 1 targets).

        The result is ``num_nodes x num_nodes`` CSR sorted by (target, source); duplicate
        edges are kept (they add up under ``reduce="sum"``). `values` (``[E]`` or
        ``[E, H]``) are permuted along with the edges.
        """
        if not isinstance(edge_index, torch.Tensor):
            edge_index = torch.as_tensor(edge_index)
        if edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise ValueError(f"edge_index must have shape [2, E]; got {tuple(edge_index.shape)}")
        if edge_index.dtype not in _INDEX_DTYPES and edge_index.dtype != torch.int16:
            raise TypeError(f"edge_index must hold integers; got {edge_index.dtype}")
        num_edges = edge_index.shape[1]
        if num_nodes is None:
            num_nodes = max(int(edge_index.max()) + 1, 0) if num_edges else 0
        elif isinstance(num_nodes, bool) or not isinstance(num_nodes, torch.SymInt) and \
                not hasattr(num_nodes, "__index__"):
            raise TypeError(f"num_nodes must be an int (the matrix is num_nodes x num_nodes); "
                            f"got {type(num_nodes).__name__} {num_nodes!r}")
        elif not isinstance(num_nodes, torch.SymInt):
            num_nodes = operator.index(num_nodes)
        if values is not None and values.shape[0] != num_edges:
            raise ValueError(
                f"values has {values.shape[0]} entries but edge_index has {num_edges} edges"
            )
        # The csr_from_edge_index op (also traced under torch.compile) checks the range and
        # sorts by (target, source), stably.
        indptr, indices, perm = _ops.ops.csr_from_edge_index(edge_index, num_nodes)
        if values is not None:
            values = values[perm]
        # Indices are in range by construction: skip the full validation pass.
        return cls(_Structure(indptr, indices, (num_nodes, num_nodes)), values)

    @classmethod
    def from_scipy(cls, mat) -> "SparseMatrix":
        """From any scipy.sparse matrix or array (converted to CSR)."""
        csr = mat.tocsr()
        indptr = torch.from_numpy(csr.indptr.astype("int64"))
        indices = torch.from_numpy(csr.indices.astype("int64"))
        values = torch.from_numpy(csr.data.copy()) if csr.data is not None else None
        if values is not None and values.dtype not in (
            torch.float32,
            torch.float64,
            torch.bfloat16,
        ):
            values = values.to(torch.float32)
        return cls.from_csr(indptr, indices, values, shape=csr.shape)

    # ---- properties --------------------------------------------------------------------

    @property
    def indptr(self) -> torch.Tensor:
        return self._s.indptr

    @property
    def indices(self) -> torch.Tensor:
        return self._s.indices

    @property
    def shape(self) -> Tuple[int, int]:
        return self._s.shape

    @property
    def nnz(self) -> int:
        return self._s.indices.shape[0]

    @property
    def device(self) -> torch.device:
        return self._s.indptr.device

    @property
    def index_dtype(self) -> torch.dtype:
        return self._s.indptr.dtype

    def __repr__(self) -> str:
        vals = "None" if self.values is None else f"{tuple(self.values.shape)} {self.values.dtype}"
        return (
            f"SparseMatrix(shape={self.shape}, nnz={self.nnz}, index_dtype={self.index_dtype}, "
            f"values={vals}, device={self.device})"
        )

    def row_indices(self) -> torch.Tensor:
        """Row of every stored entry, in CSR order (``[nnz]``, int64)."""
        deg = (self.indptr[1:] - self.indptr[:-1]).to(torch.long)
        return torch.repeat_interleave(torch.arange(self.shape[0], device=self.device), deg)

    def degree(self) -> torch.Tensor:
        """Stored entries per row (``[rows]``, int64)."""
        return (self.indptr[1:] - self.indptr[:-1]).to(torch.long)

    # ---- derived matrices --------------------------------------------------------------

    def with_values(self, values: Optional[torch.Tensor]) -> "SparseMatrix":
        """Same structure (and cached transpose), new values ``[nnz]`` or ``[nnz, H]``."""
        return SparseMatrix(self._s, values)

    def transpose_arrays(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(indptr, indices, perm) of the transpose; perm maps its entries to ours.

        Computed once per structure and cached (not while torch.compile traces)."""
        t = self._s.transpose
        if t is None:
            t = _ops.ops.csr_transpose(self.indptr, self.indices, self.shape[1])
            if not torch.compiler.is_compiling():
                self._s.transpose = t
                own(self._s, *t)
        return t

    def occupied_rows(self) -> int:
        """The number of leading rows that can hold entries: every row from here on is empty.

        A sampled mini-batch relabelled seeds first (PyG's NeighborLoader layout) has its
        last hop's nodes at the end with no in-edges, so this is often a small share of the
        rows. Cached on the structure (not while torch.compile traces: it reads a value)."""
        m = self._s.extra.get("occupied_rows")
        if m is None:
            nnz = self.indices.numel()
            # indptr is non-decreasing: the first row whose start is nnz begins the empty tail.
            m = int(torch.searchsorted(self.indptr, torch.tensor(
                [nnz], dtype=self.indptr.dtype, device=self.indptr.device)).item())
            if not torch.compiler.is_compiling():
                self._s.extra["occupied_rows"] = m
        return m

    def leading_rows(self, m: int) -> "SparseMatrix":
        """The first `m` rows as a ``[m, cols]`` matrix (`m` at least :meth:`occupied_rows`,
        so no entry is dropped). Shares indices, values and the transpose's arrays (the
        entries are the same); cached per m on the structure with its own plans."""
        if not self.occupied_rows() <= m <= self.shape[0]:
            raise ValueError(f"leading_rows: m must lie in [{self.occupied_rows()}, "
                             f"{self.shape[0]}] (rows holding entries, rows); got {m}")
        if m == self.shape[0]:
            return self
        subs = self._s.extra.setdefault("leading_rows", {})
        st = subs.get(m)
        if st is None:
            st = _Structure(self.indptr[: m + 1], self.indices, (m, self.shape[1]))
            st.extra["occupied_rows"] = self.occupied_rows()
            st.extra["has_tuned"] = self._s.extra.get("has_tuned", True)
            subs[m] = st
        st.transpose = st.transpose or self._s.transpose  # computed on either, shared
        return SparseMatrix(st, self.values)

    def t(self) -> "SparseMatrix":
        """The transpose, with values permuted to match."""
        trp, tcol, tperm = self.transpose_arrays()
        vals = None if self.values is None else self.values.index_select(0, tperm.to(torch.long))
        st = _Structure(trp, tcol, (self.shape[1], self.shape[0]))
        st.transpose = (self.indptr, self.indices, _inverse_perm(tperm))
        return SparseMatrix(st, vals)

    def to(self, device=None, index_dtype: Optional[torch.dtype] = None) -> "SparseMatrix":
        """Moves structure and values to `device`, and/or converts the index dtype."""
        idx_dtype = index_dtype or self.index_dtype
        if index_dtype is not None and index_dtype not in _INDEX_DTYPES:
            raise TypeError(f"index_dtype must be torch.int32 or torch.int64; got {index_dtype}")
        if idx_dtype == torch.int32 and max(self.nnz, *self.shape) >= 2**31:
            raise ValueError("this matrix is too large for int32 indices")
        s = self._s
        conv = lambda t: t.to(device=device, dtype=idx_dtype)  # noqa: E731
        st = _Structure(conv(s.indptr), conv(s.indices), s.shape, stats=s.stats)
        if s.transpose is not None:
            st.transpose = tuple(conv(t) for t in s.transpose)
        # Plans (CPU header tensors) and the fingerprint do not depend on device or index
        # width: they move with the structure.
        st.extra = {k: (v.copy() if isinstance(v, (dict, set)) else v) for k, v in s.extra.items()}
        vals = None if self.values is None else self.values.to(device)
        return SparseMatrix(st, vals)

    def to_dense(self) -> torch.Tensor:
        """Dense ``[rows, cols]`` (or ``[rows, cols, H]`` for multi-head values)."""
        rows, cols = self.shape
        vals = self.values
        if vals is None:
            vals = torch.ones(self.nnz, dtype=torch.float32, device=self.device)
        out = torch.zeros((rows, cols) + tuple(vals.shape[1:]), dtype=vals.dtype, device=self.device)
        r = self.row_indices()
        out.index_put_((r, self.indices.to(torch.long)), vals, accumulate=True)
        return out

    def to_scipy(self):
        """scipy.sparse.csr_matrix (single-head values only)."""
        import scipy.sparse as sp

        if self.values is not None and self.values.dim() != 1:
            raise ValueError("to_scipy needs values of shape [nnz]; this matrix is multi-head")
        data = (
            torch.ones(self.nnz) if self.values is None else self.values.detach().float()
        ).cpu().numpy()
        return sp.csr_matrix(
            (data, self.indices.cpu().numpy(), self.indptr.cpu().numpy()), shape=self.shape
        )

    def to_torch_csr(self) -> torch.Tensor:
        """A ``torch.sparse_csr_tensor`` with the same entries (single-head values)."""
        vals = self.values if self.values is not None else torch.ones(self.nnz, device=self.device)
        return torch.sparse_csr_tensor(self.indptr, self.indices, vals, size=self.shape)

    def row_stats(self) -> dict:
        """Inspector statistics: row-length histogram (log2 buckets), skew, mean, max."""
        if self._s.stats is None:
            from sparsejit import _core

            self._s.stats = _core.row_stats(self.indptr.cpu().numpy(), self.shape[1])
        return dict(self._s.stats)


# ---- drop-in calls with a raw edge_index ------------------------------------------------
# Building CSR from an edge_index sorts it (O(E log E)); hashing it is ~1 ns per index. A
# call that passes the same edge_index again therefore reuses the structure, its transpose,
# statistics and plans from this LRU, keyed by content (runtime.caches.content_key).

def _structure_bytes(A: "SparseMatrix") -> int:
    """What a cached structure holds, counting the transpose a backward will add to it."""
    s = A._s
    n = s.indptr.numel() * s.indptr.element_size() + s.indices.numel() * s.indices.element_size()
    return max(nbytes_of(A), 3 * n)


# Bounded by the one cache budget (SPARSEJIT_CACHE_BYTES; runtime.caches).
_GRAPH_CACHE = LruCache("spmm.edge_index_structures", size_of=_structure_bytes)


def cached_from_edge_index(edge_index: torch.Tensor, num_nodes: Optional[int] = None) -> "SparseMatrix":
    """SparseMatrix.from_edge_index through a process-wide LRU keyed by the content of
    `edge_index` (bounded by the cache budget, SPARSEJIT_CACHE_BYTES, default 512 MiB)."""
    if not isinstance(edge_index, torch.Tensor):
        raise TypeError(f"edge_index must be a tensor; got {type(edge_index).__name__}")
    if edge_index.dtype.is_floating_point or edge_index.dtype.is_complex or \
            edge_index.dtype == torch.bool:
        raise TypeError(f"edge_index must hold integers; got {edge_index.dtype}")
    ei = edge_index if edge_index.dtype in _INDEX_DTYPES else edge_index.to(torch.long)
    if ei.dim() != 2 or ei.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, E]; got {tuple(ei.shape)}")
    key = content_key(ei, extra=(num_nodes,))
    if key is None:  # under torch.compile: no cache
        return SparseMatrix.from_edge_index(ei, num_nodes)
    A = _GRAPH_CACHE.get(key)
    if A is not None:
        return A
    A = SparseMatrix.from_edge_index(ei, num_nodes)
    _GRAPH_CACHE.put(key, A)
    return A


def clear_graph_cache() -> None:
    _GRAPH_CACHE.clear()


def traced_from_edge_index(edge_index: torch.Tensor, num_nodes: int) -> "SparseMatrix":
    """The structure of an ``edge_index`` built by a registered op (``csr_from_edge_index``,
    with a fake), so torch.compile traces it into the graph with no break. The content-keyed
    cache is a Python dict keyed by a hash of the data: it is consulted only outside compiled
    code (inside, the build is part of the graph and reruns with it)."""
    return SparseMatrix.from_edge_index(edge_index, num_nodes)


def as_matrix(A, num_nodes: Optional[int] = None) -> "SparseMatrix":
    """A itself, or the (cached) SparseMatrix of a raw ``edge_index`` tensor."""
    if isinstance(A, SparseMatrix):
        return A
    if isinstance(A, torch.Tensor):
        if torch.compiler.is_compiling():
            if num_nodes is None:
                raise ValueError(
                    "sparsejit: under torch.compile an edge_index needs num_nodes (the "
                    "wrappers take it from X's rows)"
                )
            return traced_from_edge_index(A, num_nodes)
        return cached_from_edge_index(A, num_nodes)
    raise TypeError(
        f"expected a sparsejit.SparseMatrix or an edge_index tensor [2, E]; got {type(A).__name__}"
    )


def _as_index(t, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        t = torch.as_tensor(t)
    if t.dtype not in _INDEX_DTYPES:
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers (int32 or int64); got {t.dtype}")
        t = t.to(torch.long)
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D; got shape {tuple(t.shape)}")
    return t


def _check_values(values: torch.Tensor, s: _Structure) -> None:
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"values must be a tensor; got {type(values).__name__}")
    if values.dim() not in (1, 2) or values.shape[0] != s.indices.shape[0]:
        raise ValueError(
            f"values must have shape [nnz] or [nnz, H] with nnz = {s.indices.shape[0]}; "
            f"got {tuple(values.shape)}"
        )
    if values.device != s.indptr.device:
        raise ValueError(
            f"values is on {values.device} but the structure is on {s.indptr.device}"
        )


def _inverse_perm(perm: torch.Tensor) -> torch.Tensor:
    inv = torch.empty_like(perm)
    inv[perm.to(torch.long)] = torch.arange(perm.numel(), dtype=perm.dtype, device=perm.device)
    return inv
