"""One on-disk store for measured results, and one fingerprint to key them.

A store is a family of JSON files ``<cache dir>/<folder>/<prefix><fingerprint>.json`` (the
JIT's cache directory, ``SPARSEJIT_CACHE_DIR``), each a dict of result key -> entry. Writes
go to a temporary file in the same directory and are renamed over the old file, so a
concurrent reader sees the old or the new table, never half of one; a write that fails warns
once and the process runs on without storing. A damaged file reads as empty and is rewritten
by the next tune.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Dict, Optional

import numpy as np

from sparsejit import _core


def read_json(path: Path) -> dict:
    """The dict stored at `path`, or {} when missing or damaged (measured again, rewritten)."""
    try:
        data = json.loads(Path(path).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_json_atomic(path: Path, data: dict, what: str = "results") -> bool:
    """Writes `data` to a temporary file beside `path` and renames it over `path`: a
    concurrent reader sees the old or the new table, never half of one. False (with a warning)
    when the directory is not writable; the caller runs on without storing."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as e:
        warnings.warn(f"sparsejit: could not store {what} in {path}: {e}")
        return False
    return True


def fingerprint(a, b=None, num_cols: int = 0) -> str:
    """64-bit hash of one or two integer arrays (numpy or CPU tensors) as 16 hex digits: the
    core's fingerprint of a (indptr, indices) pair, used for every stored result's key."""
    def arr(x):
        if x is None:
            return np.zeros(0, dtype=np.int64)
        x = x.cpu().numpy() if hasattr(x, "cpu") else np.asarray(x)
        return np.ascontiguousarray(x if x.dtype in (np.int32, np.int64) else x.astype(np.int64))
    a, b = arr(a), arr(b)
    if a.dtype != b.dtype:
        a, b = a.astype(np.int64), b.astype(np.int64)
    if a.size == 0:  # the core reads rows = len(a) - 1
        a = np.zeros(1, dtype=a.dtype)
    return "%016x" % _core.fingerprint(a, b, int(num_cols))


class JsonStore:
    """The stored results of one kind (``prefix``) under ``<cache dir>/<folder>``, or under
    `root` when given (a caller's own directory, e.g. ``sparsify(cache_dir=...)``)."""

    def __init__(self, prefix: str, folder: str = "tuned", what: str = "tuned results",
                 root: Optional[Path] = None):
        self.prefix, self.folder, self.what = prefix, folder, what
        self._root = None if root is None else Path(root)
        self._any: Dict[str, bool] = {}  # directory -> holds any file of this kind

    def root(self) -> Path:
        return self._root if self._root is not None else Path(_core.cache_dir()) / self.folder

    def path(self, fp: str) -> Path:
        return self.root() / f"{self.prefix}{fp}.json"

    def load(self, fp: str) -> dict:
        return read_json(self.path(fp))

    def get(self, fp: str, key: str) -> Optional[object]:
        return self.load(fp).get(key)

    def put(self, fp: str, key: str, entry) -> bool:
        """Adds (or replaces) one entry, atomically; False (with a warning) if unwritable."""
        return self.update(fp, {key: entry})

    def update(self, fp: str, entries: dict) -> bool:
        """Adds (or replaces) `entries` in one write: the file as it is now, plus these."""
        data = self.load(fp)
        data.update(entries)
        if not write_json_atomic(self.path(fp), data, self.what):
            return False
        self._any.clear()
        return True

    def any(self) -> bool:
        """Whether any result of this kind is stored (looked up once per cache directory):
        lets lookups skip fingerprinting when nothing was ever tuned."""
        key = str(self.root())
        hit = self._any.get(key)
        if hit is None:
            try:
                hit = any(p.name.startswith(self.prefix) and p.suffix == ".json"
                          for p in self.root().iterdir())
            except OSError:
                hit = False
            self._any[key] = hit
        return hit

    def forget(self) -> None:
        """Drops what is remembered in memory (the files stay)."""
        self._any.clear()
