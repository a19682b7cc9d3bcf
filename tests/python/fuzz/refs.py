"""Helpers of the fuzz test (test_fuzz.py): seeded random inputs, non-contiguous views
poisoned with NaN, float64 references of every op, tolerant comparison, and raw-op calls
by keyword that adapt to the op's current schema."""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
NON_FLOATS = (torch.int32, torch.int64, torch.bool, torch.complex64)
INDEX = (torch.int32, torch.int64)
# Devices other than the CPU on which a mixed-device call must be refused.
OTHER_DEVICES = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])


@dataclass
class Case:
    """One call and what must come of it (see fuzz_worker / test_fuzz docstring)."""

    expect: str  # "valid" | "invalid" | "either"
    call: Callable[[], Any]
    check: Optional[Callable[[Any], Optional[str]]] = None
    why: str = ""  # what is wrong with the arguments, or what the valid case exercises
    params: dict = field(default_factory=dict)
    f16: bool = False  # a float16 input: the result must be correct (float32 accumulation)
    # When it raises: words of which the message must contain one (case-insensitive), i.e.
    # the offending argument's name(s). Empty: not checked.
    names: tuple = ()


def under_env(name: str, value: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    """fn run with the environment variable set (read by the C++ ops on every call), then
    restored."""
    def call():
        old = os.environ.get(name)
        os.environ[name] = value
        try:
            return fn()
        finally:
            if old is None:
                del os.environ[name]
            else:
                os.environ[name] = old
    return call


class Rand:
    """Python and Torch generators seeded together."""

    def __init__(self, seed: int):
        self.py = random.Random(seed)
        self.g = torch.Generator().manual_seed(seed)

    def choice(self, xs):
        return xs[self.py.randrange(len(xs))]

    def randint(self, a: int, b: int) -> int:
        return self.py.randint(a, b)

    def coin(self, p: float = 0.5) -> bool:
        return self.py.random() < p

    def data(self, shape, dtype) -> torch.Tensor:
        shape = tuple(shape)
        if dtype.is_floating_point:
            return torch.randn(shape, generator=self.g, dtype=torch.float64).to(dtype)
        if dtype.is_complex:
            re = torch.randn(shape, generator=self.g)
            return torch.complex(re, torch.randn(shape, generator=self.g)).to(dtype)
        if dtype == torch.bool:
            return torch.rand(shape, generator=self.g) > 0.5
        return torch.randint(-3, 4, shape, generator=self.g, dtype=dtype)

    def edge_index(self, n: int, e: int) -> torch.Tensor:
        return torch.randint(0, n, (2, e), generator=self.g)

    def csr(self, rows=None, cols=None, max_deg=5, index_dtype=None, empty_frac=0.3):
        rows = self.randint(0, 24) if rows is None else rows
        cols = self.randint(1, 20) if cols is None else cols
        deg = [0 if (cols == 0 or self.coin(empty_frac)) else self.randint(0, max_deg)
               for _ in range(rows)]
        indptr = [0]
        for d in deg:
            indptr.append(indptr[-1] + d)
        indices = [self.py.randrange(cols) for _ in range(indptr[-1])]
        idt = index_dtype or self.choice(INDEX)
        return Csr(torch.tensor(indptr, dtype=idt), torch.tensor(indices, dtype=idt), rows, cols)


@dataclass
class Csr:
    indptr: torch.Tensor
    indices: torch.Tensor
    rows: int
    cols: int

    @property
    def nnz(self) -> int:
        return self.indices.numel()

    def matrix(self, values=None):
        import sparsejit as sj

        return sj.SparseMatrix.from_csr(self.indptr, self.indices, values, (self.rows, self.cols))


# ---- non-contiguous views with the same values; the memory between them holds NaN --------

VIEWS = ("contiguous", "transposed", "strided_last", "strided_rows", "offset", "expanded")


def view_as(t: torch.Tensor, kind: str) -> torch.Tensor:
    """A view of a copy of `t` laid out as `kind`; the storage around it is NaN (or a
    sentinel for integers), so a kernel that ignores strides reads poison."""
    poison = float("nan") if (t.is_floating_point() or t.is_complex()) else 7777
    if kind == "contiguous" or t.dim() == 0:
        return t.clone()
    if kind == "transposed" and t.dim() >= 2:
        return t.transpose(0, -1).contiguous().transpose(0, -1)
    if kind == "strided_last" or (kind == "transposed" and t.dim() < 2):
        big = torch.full(t.shape[:-1] + (2 * t.shape[-1] + 1,), poison, dtype=t.dtype)
        big[..., 1::2] = t
        return big[..., 1::2]
    if kind == "strided_rows":
        big = torch.full((2 * t.shape[0] + 1,) + t.shape[1:], poison, dtype=t.dtype)
        big[1::2] = t
        return big[1::2]
    if kind == "offset":
        big = torch.full((t.shape[0] + 3,) + t.shape[1:], poison, dtype=t.dtype)
        big[3:] = t
        return big[3:]
    if kind == "expanded" and t.shape[0] > 0:
        # Every row equal to row 0 with stride 0 along dim 0 (the reference sees the same).
        return t[:1].expand(t.shape)
    return t.clone()


# ---- float64 references ------------------------------------------------------------------


def entry_rows(indptr: torch.Tensor) -> torch.Tensor:
    ip = indptr.long()
    return torch.repeat_interleave(torch.arange(ip.numel() - 1), ip[1:] - ip[:-1])


def _act(z, act, p):
    if act in (None, "none", ""):
        return z
    if act == "relu":
        return z.clamp(min=0)
    if act == "leaky_relu":
        return torch.where(z > 0, z, z * p)
    if act == "elu":
        return torch.where(z > 0, z, p * torch.expm1(z))
    if act == "gelu":
        return 0.5 * z * (1 + torch.erf(z / math.sqrt(2)))
    raise AssertionError(act)


def ref_spmm(indptr, indices, values, X, reduce, bias=None, act="none", act_param=0.01,
             scale=1.0, absolute=False):
    """float64 spmm over entries indptr[0]..indptr[-1] (literally, as the arrays say).
    absolute=True: the same with |values| and |X| (an accumulated-error scale)."""
    ip = indptr.long()
    lo, hi = int(ip[0]), int(ip[-1])
    rows = ip.numel() - 1
    row = entry_rows(ip)
    Xd = X.double().abs() if absolute else X.double()
    msg = Xd[indices.long()[lo:hi]]
    if values is not None:
        v = values.double()[lo:hi]
        v = v.abs() if absolute else v
        msg = msg * v.reshape(v.shape + (1,) * (msg.dim() - v.dim()))
    out = torch.zeros((rows,) + tuple(X.shape[1:]), dtype=torch.float64)
    if reduce in ("sum", "mean") or absolute:
        out = out.index_add(0, row, msg)
        if reduce == "mean":
            cnt = (ip[1:] - ip[:-1]).clamp(min=1).double()
            out = out / cnt.reshape((rows,) + (1,) * (out.dim() - 1))
    else:
        idx = row.reshape((-1,) + (1,) * (msg.dim() - 1)).expand_as(msg)
        out = out.scatter_reduce(0, idx, msg, "amax" if reduce == "max" else "amin",
                                 include_self=False)
    if absolute:
        return out * abs(scale) + (0 if bias is None else bias.double().abs().reshape(X.shape[1:]))
    z = out * scale
    if bias is not None:
        z = z + bias.to(X.dtype).double().reshape(X.shape[1:])
    return _act(z, act, act_param), z


def ref_sddmm(indptr, indices, Q, K, absolute=False):
    row = entry_rows(indptr)
    q, k = Q.double()[row], K.double()[indices.long()]
    return (q.abs() * k.abs()).sum(-1) if absolute else (q * k).sum(-1)


def ref_edge_softmax(indptr, S):
    s = S.double()
    row = entry_rows(indptr)
    rows = indptr.numel() - 1
    idx = row.reshape((-1,) + (1,) * (s.dim() - 1)).expand_as(s)
    mx = torch.full((rows,) + tuple(s.shape[1:]), -math.inf, dtype=torch.float64)
    mx = mx.scatter_reduce(0, idx, s, "amax", include_self=True)
    e = torch.exp(s - mx[row])
    den = torch.zeros_like(mx).index_add(0, row, e)
    return e / den[row]


def ref_edge_softmax_backward(indptr, y, g):
    row = entry_rows(indptr)
    yd, gd = y.double(), g.double()
    rows = indptr.numel() - 1
    dot = torch.zeros((rows,) + tuple(yd.shape[1:]), dtype=torch.float64).index_add(0, row, yd * gd)
    mag_dot = torch.zeros_like(dot).index_add(0, row, (yd * gd).abs())
    return yd * (gd - dot[row]), yd.abs() * (gd.abs() + mag_dot[row])


# ---- comparison ----------------------------------------------------------------------------

# Output rounding (a few units in the last place of the output dtype) ...
RTOL = {torch.float64: 1e-7, torch.float32: 4e-6, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
# ... plus accumulation error relative to the sum of |terms|: float32 accumulation for every
# dtype but float64. A float16 accumulator misses this by far on long rows (2048 + 1 == 2048).
EPS_ACC = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-5, torch.float16: 1e-5}
# Gradients: autograd formulas may round per-term intermediates (grad / degree) to the dtype.
GRAD_EPS = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def close(out, ref, mag, dtype, what="output", lip=1.0, pre=None, eps=None) -> Optional[str]:
    """None when `out` matches the float64 `ref` within the dtype's tolerance; `mag` is the
    scale of the accumulated terms, `pre` the pre-activation values (for rounding before an
    activation with Lipschitz constant `lip`), `eps` overrides EPS_ACC (for results whose
    terms are rounded to the dtype before they are summed, as in gradients)."""
    if not isinstance(out, torch.Tensor):
        return f"{what} is {type(out).__name__}, not a tensor"
    if tuple(out.shape) != tuple(ref.shape):
        return f"{what} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    if out.dtype != dtype:
        return f"{what} has dtype {out.dtype}, expected {dtype}"
    if out.device.type != "cpu":
        return f"{what} is on {out.device}, expected cpu"
    o = out.detach().double()
    rtol = RTOL[dtype]
    fi = torch.finfo(dtype)
    eps = EPS_ACC[dtype] if eps is None else eps
    tol = rtol * ref.abs() + lip * eps * mag + fi.tiny * fi.eps  # + a subnormal step
    if pre is not None:
        tol = tol + lip * rtol * pre.abs()
    bad = ~((o - ref).abs() <= tol)
    if bad.any():
        first = tuple(int(i) for i in bad.nonzero()[0])
        return (f"{what}: {int(bad.sum())} of {o.numel()} elements wrong "
                f"(nan: {int(o.isnan().sum())}); first at {list(first)}: got {float(o[first])!r}, "
                f"expected {float(ref[first])!r} (tolerance {float(tol[first]):.3g})")
    return None


def expect_meta(shape, dtype=None, what="output"):
    def check(out):
        if isinstance(out, (tuple, list)):
            out = out[0]
        if not isinstance(out, torch.Tensor):
            return f"{what} is {type(out).__name__}, not a meta tensor"
        if out.device.type != "meta":
            return (f"{what} is a {out.device} tensor {tuple(out.shape)}, not meta: a result from "
                    "inputs on several devices (uninitialized memory if from the fake kernel)")
        if tuple(out.shape) != tuple(shape):
            return f"{what} has shape {tuple(out.shape)}, expected {tuple(shape)}"
        if dtype is not None and out.dtype != dtype:
            return f"{what} has dtype {out.dtype}, expected {dtype}"
        return None

    return check


# ---- raw ops by keyword, adapted to the current schema --------------------------------------

# Our name for an argument -> names it may have in the schema, in order of preference.
ALIASES = {"rowptr": ("rowptr", "indptr", "crow_indices"), "col": ("col", "indices", "col_indices"),
           "x": ("x", "X"), "q": ("q", "Q"), "k": ("k", "K"), "s": ("s", "scores", "S")}
# Arguments that older or newer schemas may not have: dropped when the schema lacks them.
OPTIONAL = ("num_cols", "plan", "col")


class SchemaDrift(Exception):
    """The op's schema changed so that a case cannot be expressed: update the fuzz test."""


def schema_args(op: str):
    return [a.name for a in getattr(torch.ops.sparsejit, op).default._schema.arguments]


def has_arg(op: str, name: str) -> bool:
    return name in schema_args(op)


def call_raw(op: str, **kw):
    names = schema_args(op)
    args = {}
    for key, val in kw.items():
        match = next((n for n in ALIASES.get(key, (key,)) if n in names), None)
        if match is None:
            if key in OPTIONAL:
                continue
            raise SchemaDrift(f"sparsejit.{op} has no argument {key!r}; schema: "
                              f"{getattr(torch.ops.sparsejit, op).default._schema}")
        args[match] = val
    return getattr(torch.ops.sparsejit, op)(**args)


def plan_layout() -> dict:
    """Word positions of the plan header: from sparsejit._core.plan_layout() when the build
    exports it, else the version-2 layout (before the header carried a structure stamp)."""
    try:
        from sparsejit import _core

        d = _core.plan_layout()
        return dict(d["words"], header=int(d["header_words"]), version_value=int(d["version"]))
    except (ImportError, AttributeError):
        return dict(magic=0, version=1, kernel=2, prefetch=3, param=4, rows=5, nnz=6, header=8,
                    version_value=2)
