"""Graphs for tests, benchmarks and the demo: loaders for the real inputs in
``$SPARSEJIT_DATA`` (layout of ``../shared/data``) and seeded generators.

Every loader returns a :class:`Graph` with a PyG-style ``edge_index`` ``[2, E]``.
"""

from __future__ import annotations

import gzip
import os
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import torch


@dataclass
class Graph:
    name: str
    edge_index: torch.Tensor  # [2, E] int64, row 0 sources, row 1 targets
    num_nodes: int
    x: Optional[torch.Tensor] = None
    y: Optional[torch.Tensor] = None

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])


def data_dir() -> Optional[Path]:
    """``$SPARSEJIT_DATA`` if set, else ``<repo>/../shared/data`` if it exists, else None."""
    env = os.environ.get("SPARSEJIT_DATA")
    if env:
        p = Path(env)
        return p if p.is_dir() else None
    p = Path(__file__).resolve().parents[3].parent / "shared" / "data"  # <repo>/python/sparsejit/tools
    return p if p.is_dir() else None


# ---- helpers ----------------------------------------------------------------------------


def _symmetric(src: np.ndarray, dst: np.ndarray, n: int) -> torch.Tensor:
    """Both directions, no self loops, no duplicates, sorted by (source, target)."""
    s = np.concatenate([src, dst]).astype(np.int64)
    d = np.concatenate([dst, src]).astype(np.int64)
    keep = s != d
    key = np.unique(s[keep] * n + d[keep])
    return torch.from_numpy(np.stack([key // n, key % n]))


def _open_text(path: Path):
    return gzip.open(path, "rt") if path.suffix == ".gz" else open(path, "rt")


# ---- loaders ----------------------------------------------------------------------------


def load_snap(path: Path, undirected: bool = False) -> Graph:
    """SNAP edge list: ``#`` comments, whitespace-separated 0-based ``u v`` per line."""
    with _open_text(path) as f:
        arr = np.loadtxt(f, comments="#", dtype=np.int64, ndmin=2)
    arr = arr[:, :2] if arr.size else np.zeros((0, 2), dtype=np.int64)
    n = int(arr.max()) + 1 if arr.size else 0
    if undirected:
        ei = _symmetric(arr[:, 0], arr[:, 1], n)
    else:
        ei = torch.from_numpy(np.ascontiguousarray(arr.T))
    return Graph(path.name.split(".")[0], ei, n)


def load_snap_nm(path: Path) -> Graph:
    """First line ``n m``, then ``m`` lines of 1-based ``u v``; undirected."""
    with _open_text(path) as f:
        n, _m = map(int, f.readline().split()[:2])
        arr = np.loadtxt(f, dtype=np.int64, ndmin=2)
    arr = arr[:, :2] - 1 if arr.size else np.zeros((0, 2), dtype=np.int64)
    return Graph(path.name.split(".")[0], _symmetric(arr[:, 0], arr[:, 1], n), n)


def load_mtx(path: Path) -> Graph:
    """Matrix Market: the pattern as directed edges column -> row (A[i, j] = edge j -> i)."""
    import scipy.io

    m = scipy.io.mmread(str(path)).tocoo()
    n = max(m.shape)
    ei = torch.from_numpy(np.stack([m.col.astype(np.int64), m.row.astype(np.int64)]))
    return Graph(path.stem, ei, n)


def load_npz(path: Path) -> Graph:
    """gnn-benchmark ``.npz``: CSR adjacency (``adj_*``), CSR features (``attr_*``), labels."""
    import scipy.sparse as sp

    z = np.load(path, allow_pickle=True)
    adj = sp.csr_matrix((z["adj_data"], z["adj_indices"], z["adj_indptr"]),
                        shape=tuple(z["adj_shape"])).tocoo()
    n = adj.shape[0]
    x = None
    if "attr_data" in z:
        feats = sp.csr_matrix((z["attr_data"], z["attr_indices"], z["attr_indptr"]),
                              shape=tuple(z["attr_shape"]))
        x = torch.from_numpy(feats.toarray().astype(np.float32))
    y = torch.from_numpy(z["labels"].astype(np.int64)) if "labels" in z else None
    return Graph(path.stem, _symmetric(adj.row, adj.col, n), n, x, y)


class _Py2Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module.startswith("scipy.sparse"):  # old private module paths
            import scipy.sparse

            return getattr(scipy.sparse, name)
        if module == "numpy.core.multiarray":
            module = "numpy.core.multiarray" if hasattr(np, "core") else module
        return super().find_class(module, name)


def _load_pickle(path: Path):
    with open(path, "rb") as f:
        return _Py2Unpickler(f, encoding="latin1").load()


def load_planetoid(name: str, root: Path) -> Graph:
    """Planetoid ``ind.<name>.*``: the citation graph (undirected, no self loops) with
    features and labels in PyG's node order. PubMed's ``allx`` is not in the data folder, so
    PubMed gets the graph and labels only (``x = None``)."""
    base = root / "graphs" / "planetoid"
    graph: Dict[int, list] = _load_pickle(base / f"ind.{name}.graph")
    n = max(max(graph), max((v for vs in graph.values() for v in vs), default=0)) + 1
    src = np.fromiter((u for u, vs in graph.items() for _ in vs), dtype=np.int64)
    dst = np.fromiter((v for vs in graph.values() for v in vs), dtype=np.int64)
    ei = _symmetric(src, dst, n)
    x = y = None
    try:
        test_idx = np.loadtxt(base / f"ind.{name}.test.index", dtype=np.int64)
        ally = _load_pickle(base / f"ind.{name}.ally")
        ty = _load_pickle(base / f"ind.{name}.ty")
        labels = np.full(n, -1, dtype=np.int64)
        labels[: ally.shape[0]] = ally.argmax(1)
        labels[test_idx[: ty.shape[0]]] = ty.argmax(1)
        y = torch.from_numpy(labels)
        allx_path = base / f"ind.{name}.allx"
        if allx_path.exists():
            allx = _load_pickle(allx_path).toarray()
            tx = _load_pickle(base / f"ind.{name}.tx").toarray()
            feats = np.zeros((n, allx.shape[1]), dtype=np.float32)
            feats[: allx.shape[0]] = allx
            feats[test_idx[: tx.shape[0]]] = tx
            x = torch.from_numpy(feats)
    except (OSError, ValueError, IndexError) as e:  # graph only
        print(f"sparsejit.data: {name}: features/labels not loaded ({e})", file=sys.stderr)
    return Graph(name, ei, n, x, y)


# ---- generators ---------------------------------------------------------------------------


def _params(spec: str) -> Dict[str, float]:
    out = {}
    for part in filter(None, spec.split(",")):
        k, _, v = part.partition("=")
        out[k.strip()] = float(v)
    return out


def rmat(scale: int, edge_factor: int = 16, seed: int = 0, a=0.57, b=0.19, c=0.19) -> Graph:
    """R-MAT (Chakrabarti et al.): 2^scale nodes, edge_factor * 2^scale directed edges."""
    rng = np.random.default_rng(seed)
    n, m = 1 << scale, edge_factor << scale
    src = np.zeros(m, dtype=np.int64)
    dst = np.zeros(m, dtype=np.int64)
    for bit in range(scale):
        r = rng.random(m)
        down = r >= a + b  # quadrants c, d: source bit set
        right = ((r >= a) & (r < a + b)) | (r >= a + b + c)  # quadrants b, d
        src |= down.astype(np.int64) << bit
        dst |= right.astype(np.int64) << bit
    perm = rng.permutation(n)  # hide the id-degree correlation
    return Graph(f"rmat{scale}", torch.from_numpy(np.stack([perm[src], perm[dst]])), n)


def powerlaw(n: int, avg: float, alpha: float = 2.1, seed: int = 0) -> Graph:
    """Chung-Lu style: targets drawn with probability proportional to Zipf weights
    (exponent 1 / (alpha - 1)), sources uniform: power-law in-degrees, avg * n edges."""
    rng = np.random.default_rng(seed)
    m = int(avg * n)
    w = (np.arange(1, n + 1, dtype=np.float64)) ** (-1.0 / (alpha - 1.0))
    cdf = np.cumsum(w)
    dst = np.searchsorted(cdf, rng.random(m) * cdf[-1])
    src = rng.integers(0, n, m)
    perm = rng.permutation(n)
    return Graph(f"powerlaw{n}", torch.from_numpy(np.stack([perm[src], perm[dst]]).astype(np.int64)), n)


def uniform(n: int, avg: float, seed: int = 0) -> Graph:
    """Erdos-Renyi-like: avg * n edges with uniform endpoints."""
    rng = np.random.default_rng(seed)
    m = int(avg * n)
    return Graph(f"uniform{n}", torch.from_numpy(rng.integers(0, n, (2, m)).astype(np.int64)), n)


# ---- by name ------------------------------------------------------------------------------

_NAMED = {
    "facebook": ("graphs/snap/facebook_combined.txt", lambda p: load_snap(p, undirected=True)),
    "email-eu": ("graphs/snap/email-Eu-core.txt.gz", load_snap),
    "blogcatalog": ("graphs/snap_nm/blogcatalog.txt", load_snap_nm),
    "ca-astroph": ("graphs/snap_nm/ca-AstroPh.txt", load_snap_nm),
    "ca-grqc": ("graphs/snap_nm/ca-GrQc.txt", load_snap_nm),
    "polblogs": ("graphs/snap_nm/polblogs.txt", load_snap_nm),
}
_PLANETOID = ("cora", "citeseer", "pubmed")

DEFAULT_SUITE = [
    "cora", "citeseer", "pubmed", "facebook", "blogcatalog", "ca-astroph",
    "powerlaw:n=200000,avg=12,alpha=2.1,seed=1",
    "rmat:scale=18,ef=10,seed=2",
]


def is_generated(spec: str) -> bool:
    return spec.split(":", 1)[0] in ("rmat", "powerlaw", "uniform")


def load_graph(spec: str) -> Graph:
    """A graph by file path, short name (see ``DEFAULT_SUITE``, ``_NAMED``) or generator
    spec (``rmat:scale=16,ef=16,seed=0``, ``powerlaw:n=..,avg=..,alpha=..,seed=..``,
    ``uniform:n=..,avg=..,seed=..``)."""
    kind, _, rest = spec.partition(":")
    if kind == "rmat":
        p = _params(rest)
        g = rmat(int(p.get("scale", 16)), int(p.get("ef", 16)), int(p.get("seed", 0)))
    elif kind == "powerlaw":
        p = _params(rest)
        g = powerlaw(int(p.get("n", 100000)), p.get("avg", 16), p.get("alpha", 2.1),
                     int(p.get("seed", 0)))
    elif kind == "uniform":
        p = _params(rest)
        g = uniform(int(p.get("n", 100000)), p.get("avg", 16), int(p.get("seed", 0)))
    else:
        g = _load_named_or_file(spec)
        return g
    g.name = spec
    return g


def _load_named_or_file(spec: str) -> Graph:
    path = Path(spec)
    if path.exists():
        name = path.name
        if name.endswith(".mtx"):
            return load_mtx(path)
        if name.endswith(".npz"):
            return load_npz(path)
        with _open_text(path) as f:
            first = f.readline().split()
        if len(first) == 2 and not spec.endswith(".gz") and path.parent.name == "snap_nm":
            return load_snap_nm(path)
        return load_snap(path)
    root = data_dir()
    key = spec.lower()
    if key not in _PLANETOID and key not in _NAMED:
        raise ValueError(
            f"unknown graph {spec!r}: not a file, not one of "
            f"{sorted(_PLANETOID + tuple(_NAMED))}, and not a generator spec (rmat:, powerlaw:, uniform:)"
        )
    if root is None:
        raise FileNotFoundError(
            f"graph {spec!r} needs the data folder: set SPARSEJIT_DATA to the folder holding "
            "graphs/ (the layout of ../shared/data), or use a generated graph"
        )
    if key in _PLANETOID:
        return load_planetoid(key, root)
    rel, loader = _NAMED[key]
    g = loader(root / rel)
    g.name = key
    return g
