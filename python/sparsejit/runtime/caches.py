"""Process-wide caches: one LRU class for every cache of built structures and plans, one byte
budget for all of them, the one key of every edge_index -> structure cache, the registry that
``sj.clear_caches()`` walks (every process-wide cache registers itself), and the ownership of
index arrays that lets the op library's once-per-tensor tables forget a structure as soon as
its object dies (:func:`own`)."""

from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from typing import Callable, Dict, Hashable, List, Optional, Tuple

import torch

_CLEARERS: Dict[str, Callable[[], None]] = {}
_STATS: Dict[str, Callable[[], Tuple[int, int]]] = {}


def register_cache(name: str, clear: Callable[[], None],
                   stats: Optional[Callable[[], Tuple[int, int]]] = None) -> None:
    """Registers a cache's clear function under a unique name (re-registering replaces), and
    optionally a function returning its (entries, bytes) for :func:`cache_stats`."""
    _CLEARERS[name] = clear
    if stats is not None:
        _STATS[name] = stats


def registered() -> list:
    return sorted(_CLEARERS)


def clear_all() -> None:
    for clear in list(_CLEARERS.values()):
        clear()
    _WINDOW.clear()
    _MAIN.clear()
    _GHOSTS.clear()
    _core().clear_op_tables()


def _core():
    from sparsejit import _core as core
    return core


# ---- one byte budget ---------------------------------------------------------------------
# SPARSEJIT_CACHE_BYTES (default an eighth of the physical memory, at least 512 MiB), read once
# by the core library; set_cache_budget changes it for the Python caches below and for the op
# library's tables alike.

def cache_budget() -> int:
    """The byte budget of every cache of built structures and plans (bytes)."""
    return int(_core().cache_budget())


def set_cache_budget(nbytes: Optional[int]) -> None:
    """Sets the byte budget of every structure / plan cache (None: back to
    ``SPARSEJIT_CACHE_BYTES`` or the default, an eighth of the physical memory and at least
    512 MiB), evicting at once what no longer fits.
    A structure larger than the budget still works; it is just not kept."""
    if nbytes is not None and (not isinstance(nbytes, int) or isinstance(nbytes, bool) or
                               nbytes < 0):
        raise ValueError(f"set_cache_budget: nbytes must be an int >= 0 or None; got {nbytes!r}")
    _core().set_cache_budget(-1 if nbytes is None else nbytes)
    _evict_to(cache_budget())


def nbytes_of(value, _seen=None) -> int:
    """Bytes of the tensors reachable from `value` through tuples, lists, dicts and the
    attributes of sparsejit's own objects (each storage counted once)."""
    seen = set() if _seen is None else _seen
    if isinstance(value, torch.Tensor):
        if value.is_meta or value.layout != torch.strided:
            return 0
        try:
            key = value.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):  # pragma: no cover - storage-less tensors
            return 0
        if key in seen:
            return 0
        seen.add(key)
        return value.untyped_storage().nbytes()
    if id(value) in seen:
        return 0
    seen.add(id(value))
    if isinstance(value, (tuple, list)):
        return sum(nbytes_of(v, seen) for v in value)
    if isinstance(value, dict):
        return sum(nbytes_of(v, seen) for v in value.values())
    if type(value).__module__.startswith("sparsejit"):
        slots = getattr(type(value), "__slots__", ())
        attrs = [getattr(value, n, None) for n in slots] + list(getattr(value, "__dict__", {})
                                                                 .values())
        return sum(nbytes_of(v, seen) for v in attrs)
    return 0


# Admission, like a segmented LRU with a small window: a value seen for the first time enters a
# window of at most window_bytes() (a loop over graphs seen once, a mini-batch loop, churns only
# the window); a value found again, or put again after it left (its key is remembered, without
# data), moves to the main area, which holds the rest of the budget. In each area the least
# recently used entry of any cache leaves first.
_WINDOW: "OrderedDict[Tuple[int, Hashable], Tuple[LruCache, int]]" = OrderedDict()
_MAIN: "OrderedDict[Tuple[int, Hashable], Tuple[LruCache, int]]" = OrderedDict()
_GHOSTS: "OrderedDict[Tuple[int, Hashable], None]" = OrderedDict()
_MAX_GHOSTS = 4096
_CACHE_IDS = itertools.count()


def window_bytes() -> int:
    """What first-seen values may hold: a sixteenth of the budget, at most 64 MiB (the op
    library keeps the same bound for tensors no live object owns)."""
    return int(_core().unowned_budget())


def _evict(area: "OrderedDict", budget: int, to_ghosts: bool) -> None:
    total = sum(b for _, b in area.values())
    while total > budget and area:
        (cid, key), (cache, nbytes) = area.popitem(last=False)
        cache._d.pop(key, None)
        total -= nbytes
        if to_ghosts:
            _remember((cid, key))


def _remember(gkey) -> None:
    _GHOSTS[gkey] = None
    _GHOSTS.move_to_end(gkey)
    while len(_GHOSTS) > _MAX_GHOSTS:
        _GHOSTS.popitem(last=False)


def _evict_to(budget: int) -> None:
    window = min(window_bytes(), budget)
    _evict(_WINDOW, window, True)
    _evict(_MAIN, budget - window, False)


class LruCache:
    """A least-recently-used map bounded by entries, registered for ``sj.clear_caches()``
    under `name`, whose values count against the one byte budget (:func:`cache_budget`, shared
    by every LruCache; first-seen values in a small window, values seen again in the rest; a
    value larger than its area is not kept). One class for every edge_index -> structure
    cache, all keyed by :func:`content_key`. `size_of` measures a value when it is put
    (default :func:`nbytes_of`)."""

    def __init__(self, name: str, max_entries: Optional[int] = None,
                 size_of: Optional[Callable[[object], int]] = None):
        self.name, self.max_entries = name, max_entries
        self.size_of = size_of or nbytes_of
        self._id = next(_CACHE_IDS)
        self._d: "OrderedDict[Hashable, object]" = OrderedDict()
        register_cache(name, self.clear, self.stats)

    def get(self, key: Hashable):
        v = self._d.get(key)
        if v is not None:
            self._d.move_to_end(key)
            gkey = (self._id, key)
            if gkey in _MAIN:
                _MAIN.move_to_end(gkey)
            else:  # found again: to the main area
                _MAIN[gkey] = _WINDOW.pop(gkey)
                _evict_to(cache_budget())
        return v

    def put(self, key: Hashable, value) -> None:
        self._drop(key)
        gkey = (self._id, key)
        nbytes = int(self.size_of(value))
        budget = cache_budget()
        window = min(window_bytes(), budget)
        seen = _GHOSTS.pop(gkey, 0) is None
        area, limit = (_MAIN, budget - window) if seen else (_WINDOW, window)
        if nbytes > limit:  # larger than its area: used, not kept
            _remember(gkey)
            return
        self._d[key] = value
        area[gkey] = (self, nbytes)
        if self.max_entries is not None:
            while len(self._d) > self.max_entries:
                self._drop(next(iter(self._d)))
        _evict_to(budget)

    def _drop(self, key: Hashable) -> None:
        if self._d.pop(key, None) is not None:
            _WINDOW.pop((self._id, key), None)
            _MAIN.pop((self._id, key), None)

    def clear(self) -> None:
        for key in list(self._d):
            self._drop(key)
        for gkey in [g for g in _GHOSTS if g[0] == self._id]:
            del _GHOSTS[gkey]

    def stats(self) -> Tuple[int, int]:
        """(entries, bytes as measured when they were put)."""
        area = lambda k: _MAIN.get((self._id, k)) or _WINDOW.get((self._id, k))  # noqa: E731
        return len(self._d), sum(e[1] for e in map(area, self._d) if e is not None)

    def values(self):
        return self._d.values()

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key) -> bool:
        return key in self._d


# ---- ownership of index arrays -------------------------------------------------------------
# The op library validates a structure once per live tensor set; on PyTorch's stable ABI its
# table holds those tensors (no weak references there). An object that owns index arrays
# registers their addresses while it lives (csrc/core/owned.h): the table keeps entries of
# owned arrays for as long as the owner lives and drops them when it dies, so they keep
# nothing alive that the owner does not; entries of other tensors stay within an eighth of the
# budget. One finalizer per owner releases everything it registered.

_OWNED: Dict[int, List[int]] = {}  # id(owner) -> addresses it registered (while it lives)


def own(owner, *tensors: Optional[torch.Tensor]) -> None:
    """Registers the data addresses of `tensors` as owned by `owner` until it dies (not while
    torch.compile traces: the tensors are fakes there)."""
    if torch.compiler.is_compiling():
        return
    ptrs = [t.data_ptr() for t in tensors
            if isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_meta and
            t.numel() > 0]
    if not ptrs:
        return
    held = _OWNED.get(id(owner))
    if held is None:
        held = []
        try:
            weakref.finalize(owner, _release, id(owner), held)
        except TypeError:  # pragma: no cover - an owner without weak references
            return
        _OWNED[id(owner)] = held
    held.extend(ptrs)
    _core().own(ptrs)


def _release(owner_id: int, ptrs: List[int]) -> None:
    _OWNED.pop(owner_id, None)
    core = _core_if_loaded()
    if core is not None and ptrs:
        core.disown(ptrs)


def _core_if_loaded():
    import sys
    return sys.modules.get("sparsejit._core")


def cache_stats() -> List[dict]:
    """What every cache holds: name, entries, bytes (and, for the op library's tables, the
    entries whose tensors a live sparsejit object owns)."""
    rows = [dict(name=name, entries=int(e), bytes=int(b))
            for name, (e, b) in ((n, f()) for n, f in sorted(_STATS.items()))]
    for name, entries, owned, nbytes in _core().op_table_stats():
        rows.append(dict(name=name, entries=int(entries), owned=int(owned), bytes=int(nbytes)))
    return rows


# ---- the one key of every edge_index -> structure cache ------------------------------------
# By content: a structure is reused for any tensor holding the same indices (a fresh
# `data.edge_index.to(device)` every step, a clone), never for one changed in place. Hashing
# reads every index once (~1 ns each, plus a copy to the host for a device tensor); a tensor
# seen before, not modified since (same version counter, storage and shape), reuses its hash
# from a memo that forgets it when the tensor dies.

_HASHES: Dict[int, Tuple[weakref.ref, int, int, tuple, int]] = {}


def _hash_bytes(t: torch.Tensor) -> int:
    from sparsejit import _core
    flat = t.detach().cpu().contiguous().reshape(-1)
    if flat.dtype.is_floating_point:
        flat = flat.float() if flat.element_size() < 4 else flat
        flat = flat.view(torch.int32 if flat.element_size() == 4 else torch.int64)
    elif flat.dtype not in (torch.int32, torch.int64):
        flat = flat.to(torch.int64)
    empty = torch.zeros(1, dtype=flat.dtype)
    return _core.fingerprint(empty.numpy(), flat.numpy(), -1)


def tensor_hash(t: torch.Tensor) -> int:
    """64-bit hash of a tensor's values (the core's fingerprint), memoised per live tensor."""
    try:
        version = t._version
    except RuntimeError:  # inference tensors have no version counter: hashed every time
        return _hash_bytes(t)
    tid, ptr, shape = id(t), t.data_ptr(), tuple(t.shape)
    hit = _HASHES.get(tid)
    if hit is not None and hit[0]() is t and hit[1] == version and hit[3] == shape and \
            hit[4] == ptr:
        return hit[2]
    h = _hash_bytes(t)
    try:
        ref = weakref.ref(t, lambda _r, tid=tid: _HASHES.pop(tid, None))
    except TypeError:  # pragma: no cover - a tensor type without weak references
        return h
    _HASHES[tid] = (ref, version, h, shape, ptr)
    return h


def content_key(*tensors: Optional[torch.Tensor], extra: tuple = ()) -> Optional[tuple]:
    """The key of every edge_index -> structure cache: per tensor (None stays None) its
    content hash, shape, dtype and device, then `extra` (node counts, relation counts...).
    None under torch.compile, where no cache is consulted (the build is traced instead)."""
    if torch.compiler.is_compiling():
        return None
    return tuple(None if t is None else (tensor_hash(t), tuple(t.shape), str(t.dtype),
                                         str(t.device)) for t in tensors) + tuple(extra)


register_cache("runtime.tensor_hashes", _HASHES.clear, lambda: (len(_HASHES), 0))
