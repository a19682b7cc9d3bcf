"""Process-wide caches: one LRU class for every cache of built structures and plans, and the
registry that ``sj.clear_caches()`` walks (every process-wide cache registers itself)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Dict, Hashable, Optional

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
    structure cache (the families key it differently: by content, or by tensor identity and
    version counter)."""

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
