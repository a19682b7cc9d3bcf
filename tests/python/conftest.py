"""Shared helpers: random graphs and dense float64 references."""

import hashlib
import os
import tempfile
from pathlib import Path

# Inductor's on-disk caches key compiled graphs without the custom ops' schemas: after an op
# gains an argument, a graph compiled against the old library could be reused and call it
# with the old arguments. One cache directory per build of the op library (its size and
# modification time) keeps reuse between runs and drops it when the library changes.
_lib = Path(__file__).resolve().parents[2] / "python" / "sparsejit" / "libsparsejit_ops.so"
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ and _lib.exists():
    _st = _lib.stat()
    _tag = hashlib.sha1(f"{_st.st_size}:{_st.st_mtime_ns}".encode()).hexdigest()[:12]
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(),
                                                         f"sparsejit-inductor-{_tag}")

import pytest  # noqa: E402
import torch  # noqa: E402

import sparsejit as sj  # noqa: E402


def generic_only(fn):
    """fn() with the JIT switched off in this process (then back on): the generic kernels."""
    from sparsejit import _core

    old = os.environ.get("SPARSEJIT_JIT")
    os.environ["SPARSEJIT_JIT"] = "0"
    _core.jit_refresh_env()
    try:
        return fn()
    finally:
        if old is None:
            del os.environ["SPARSEJIT_JIT"]
        else:
            os.environ["SPARSEJIT_JIT"] = old
        _core.jit_refresh_env()


def random_graph(n_rows, n_cols, avg_deg, power_law=False, seed=0, empty_frac=0.0):
    """Random CSR as a SparseMatrix (int64 indices); power_law gives a few huge rows."""
    g = torch.Generator().manual_seed(seed)
    if power_law:
        u = torch.rand(n_rows, generator=g).clamp(min=1e-4)
        deg = (avg_deg * 0.3 / u.pow(0.9)).long()
    else:
        deg = (torch.rand(n_rows, generator=g) * 2 * avg_deg).long()
    if empty_frac:
        deg[torch.rand(n_rows, generator=g) < empty_frac] = 0
    if n_cols == 0:
        deg.zero_()
    indptr = torch.zeros(n_rows + 1, dtype=torch.long)
    indptr[1:] = deg.cumsum(0)
    nnz = int(indptr[-1])
    indices = torch.randint(0, max(n_cols, 1), (nnz,), generator=g)
    return sj.SparseMatrix.from_csr(indptr, indices, shape=(n_rows, n_cols))


def edge_index_cases(n):
    """Edge lists for message-passing layers: {name: (num_nodes, edge_index)}: random (the
    last 4 nodes without in-edges), skewed (180 of 260 edges into one node), one node with a
    self-loop, and no edges."""
    g = torch.Generator().manual_seed(5)
    src = torch.randint(0, n, (260,), generator=g)
    dst = torch.randint(0, n - 4, (260,), generator=g)
    skew = dst.clone()
    skew[:180] = 1
    return {"random": (n, torch.stack([src, dst])), "skewed": (n, torch.stack([src, skew])),
            "one_node": (1, torch.tensor([[0], [0]])),
            "no_edges": (n, torch.zeros(2, 0, dtype=torch.long))}


def dense_reference_spmm(A, X, reduce):
    """float64 reference of spmm, row by row over the stored entries."""
    rows = A.shape[0]
    Xd = X.double()
    vals = None if A.values is None else A.values.double()
    out = torch.zeros((rows,) + tuple(X.shape[1:]), dtype=torch.float64)
    indptr, col = A.indptr.tolist(), A.indices.long()
    for i in range(rows):
        lo, hi = indptr[i], indptr[i + 1]
        if lo == hi:
            continue
        msg = Xd[col[lo:hi]]
        if vals is not None:
            v = vals[lo:hi]
            v = v.view(v.shape + (1,) * (msg.dim() - v.dim()))
            msg = msg * v
        if reduce == "sum":
            out[i] = msg.sum(0)
        elif reduce == "mean":
            out[i] = msg.mean(0)
        elif reduce == "max":
            out[i] = msg.max(0).values
        else:
            out[i] = msg.min(0).values
    return out


def same_outputs_and_input_grads(fn, ref, x, atol=1e-5, rtol=1e-5):
    """fn(x) against ref(x): outputs, and the gradients of their sums with respect to x (each
    on its own leaf copy of x)."""
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    got, want = fn(xa), ref(xb)
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, atol=atol, rtol=rtol)


def poison_heap(*shapes):
    """Best effort to make an op's fresh allocations start as NaN: the CPU allocator tends
    to hand back blocks of the same size just freed."""
    for s in shapes:
        t = torch.full(s, float("nan"))
        del t


def random_sites(n, shape, batch_size=2, seed=0):
    """n distinct random point-cloud sites (batch first) in `shape` (fewer if the grid is
    smaller), as int32 [n, 1 + len(shape)]."""
    g = torch.Generator().manual_seed(seed)
    total = batch_size * torch.Size(shape).numel()
    flat = torch.randperm(total, generator=g)[:n]
    cols = []
    for s in reversed(shape):
        cols.append(flat % s)
        flat = flat // s
    cols.append(flat)
    return torch.stack(cols[::-1], 1).int()


GRAPHS = {
    "uniform": lambda: random_graph(120, 90, 5, seed=1),
    "powerlaw": lambda: random_graph(300, 250, 6, power_law=True, seed=2),
    "mostly_empty": lambda: random_graph(80, 60, 2, seed=3, empty_frac=0.8),
    "single_row": lambda: random_graph(1, 40, 20, seed=4),
    "single_col": lambda: random_graph(50, 1, 1, seed=5),
    "empty": lambda: random_graph(0, 0, 0, seed=6),
    "no_entries": lambda: random_graph(7, 5, 0, seed=7),
}


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: the heavy tier (the fuzz test's full seeds, the ISA-cap tiers, the "
        "full cross product of JIT variants, benchmarks/archive's scripts); `make test` "
        "deselects it, `make test-slow` (run by .ci/run after `make test`) runs it, so every "
        "test still runs in CI")


@pytest.fixture(params=sorted(GRAPHS))
def graph(request):
    return GRAPHS[request.param]()


@pytest.fixture(autouse=True)
def _fresh_seed():
    torch.manual_seed(torch.seed() % 2**31)
    yield


@pytest.fixture
def poison_empty():
    """Every at::empty inside the ops is filled with NaN (or the int max), so an element the
    kernels leave unwritten shows up in the result."""
    old = (torch.are_deterministic_algorithms_enabled(),
           torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(old[0])
    torch.utils.deterministic.fill_uninitialized_memory = old[1]


def raises_type_error(match=None):
    """pytest.raises for a dtype error raised by a raw op's C++ checks (called directly, not
    through the public functions, which re-raise TypeError): TypeError, except when the op
    library is built on torch's stable ABI, which has no way to raise TypeError: there the same
    check raises ValueError whose message starts with "TypeError: " (tensor_api_stable.h)."""
    from sparsejit import _library
    if not _library.STABLE_ABI:
        return pytest.raises(TypeError, match=match)
    return pytest.raises(ValueError, match=r"^TypeError: [\s\S]*" + (match or ""))
