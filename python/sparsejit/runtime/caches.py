"""Process-wide caches: one LRU class for every cache of built structures and plans, the one
key of every edge_index -> structure cache, and the registry that ``sj.clear_caches()`` walks
(every process-wide cache registers itself)."""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Callable, Dict, Hashable, Optional, Tuple

import torch

_CLEARERS: Dict[str, Callable[[], None]] = {}


def register_cache(name: str, clear: Callable[[], None]) -> None:
    """Registers a cache's clear function under a unique name (re-registering replaces)."""
    _CLEARERS[name] = clear


def registered() -> list:
    return sorted(_CLEARERS)


def clear_all() -> None:
    for clear in list(_CLEARERS.values()):
        clear()


class LruCache:
    """A least-recently-used map bounded by entries and/or by bytes (``size_of(value)``),
    registered for ``sj.clear_caches()`` under `name`. One class for every edge_index ->
    structure cache, all keyed by :func:`content_key`."""

    def __init__(self, name: str, max_entries: Optional[int] = None,
                 max_bytes: Optional[Callable[[], int]] = None,
                 size_of: Optional[Callable[[object], int]] = None):
        self.name, self.max_entries, self.max_bytes, self.size_of = (name, max_entries,
                                                                    max_bytes, size_of)
        self._d: "OrderedDict[Hashable, object]" = OrderedDict()
        register_cache(name, self.clear)

    def get(self, key: Hashable):
        v = self._d.get(key)
        if v is not None:
            self._d.move_to_end(key)
        return v

    def put(self, key: Hashable, value) -> None:
        self._d[key] = value
        self._d.move_to_end(key)
        if self.max_entries is not None:
            while len(self._d) > self.max_entries:
                self._d.popitem(last=False)
        if self.max_bytes is not None and self.size_of is not None:
            budget = self.max_bytes()
            while len(self._d) > 1 and sum(map(self.size_of, self._d.values())) > budget:
                self._d.popitem(last=False)

    def clear(self) -> None:
        self._d.clear()

    def values(self):
        return self._d.values()

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key) -> bool:
        return key in self._d


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


register_cache("runtime.tensor_hashes", _HASHES.clear)
