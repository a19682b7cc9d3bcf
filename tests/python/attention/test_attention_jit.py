"""The JIT-specialized fused attention (codegen/cpu_attention_spec: score form, H, D and Dv
fixed at compile time) against the generic kernel (bit for bit: the summation order does not
depend on what is fixed) and against the float64 per-edge reference, forward and backward,
on fresh random inputs with the op's outputs poisoned beforehand; the op really takes the JIT
path; bfloat16 has its own forward (bfloat16 storage, float32 accumulation) and a float32
backward."""

import math

import pytest
import torch

import sparsejit as sj
from sparsejit import _core
from conftest import generic_only, poison_heap, random_graph
from test_attention import reference

pytestmark = pytest.mark.skipif(not _core.jit_enabled(), reason="JIT off in this environment")

MODES = {"dot": 0, "additive": 1, "gatv2": 2}  # the score form (not in kernels/common/enums.h)
ENUMS = _core.enums()  # scalar and index kinds, numbered in kernels/common/enums.h


@pytest.fixture(scope="module")
def graph():
    # Big enough (nnz * H * (D + Dv) >= 2^15) for the op to pick the JIT; skewed, with empty
    # rows and one long row.
    return random_graph(700, 500, 6, power_law=True, seed=41, empty_frac=0.15)




def _inputs(A, mode, heads, width, v_width, dtype, seed, masked):
    g = torch.Generator().manual_seed(seed)
    rows, cols = A.shape
    qk = 1 if mode == "additive" else width
    q = torch.randn(rows, heads, qk, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(cols, heads, qk, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(cols, heads, v_width, generator=g, dtype=torch.float64).to(dtype)
    bias = torch.randn(A.nnz, heads, generator=g, dtype=torch.float64).to(dtype)
    if masked:  # some entries out of the softmax (how the layers drop old self-loops)
        bias[torch.rand(A.nnz, generator=g) < 0.1] = float("-inf")
    att = torch.randn(heads, width, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v, bias, att


def _call(A, mode, q, k, v, bias, att, dropout=0.0):
    if mode == "dot":
        return sj.sparse_attention(A, q, k, v, values=bias, dropout=dropout)
    if mode == "additive":
        return sj.gat_attention(A, q[..., 0], k[..., 0], v, 0.2, edge_logits=bias,
                                dropout=dropout)
    return sj.gatv2_attention(A, q, k, att, v, 0.2, edge_logits=bias, dropout=dropout)


def _forward_backward(A, mode, inputs, dropout=0.0, seed=0):
    """(out, grads of q, k, v, bias, att) for a fixed random upstream gradient, poisoned
    allocations first."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    q, k, v, bias, att = leaves
    poison_heap((A.shape[0],) + tuple(v.shape[1:]), tuple(v.shape), tuple(q.shape))
    torch.manual_seed(seed)  # the dropout mask's seed
    out = _call(A, mode, q, k, v, bias, att, dropout)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.dtype)
    out.backward(grad)
    used = [q, k, v, bias] + ([att] if mode == "gatv2" else [])
    return [out.detach()] + [t.grad for t in used]


def _reference(A, mode, inputs, width):
    q, k, v, bias, att = inputs
    if mode == "additive":
        q, k = q[..., 0], k[..., 0]
    out, w = reference(A, q, k, v, bias, mode, 1 / math.sqrt(width), 0.2, att)
    return torch.nan_to_num(out, nan=0.0), w  # rows with every entry masked: 0 / 0 -> 0


CASES = [  # mode, H, D, Dv
    ("dot", 4, 16, 16), ("dot", 1, 64, 64), ("dot", 2, 7, 5), ("dot", 8, 8, 8),
    ("dot", 2, 8, 12),  # Dv not a multiple of 8: dp per head, the accumulator in 4 lanes
    # additive: H fixed to a power of two takes the vector score pass, H * Dv up to 64
    # floats (128 with AVX-512) the register accumulator in 16-, 8- or 4-lane vectors.
    ("additive", 4, 1, 16), ("additive", 1, 1, 64), ("additive", 3, 1, 7),
    ("additive", 2, 1, 8), ("additive", 8, 1, 4), ("additive", 8, 1, 32),
    ("gatv2", 4, 16, 16), ("gatv2", 2, 5, 5),
]


@pytest.mark.parametrize("mode,heads,width,v_width", CASES)
# Every spec is a compile on a cold cache: two (dtype, index) pairs cover both of each.
@pytest.mark.parametrize("dtype,index_dtype", [(torch.float32, torch.int64),
                                               (torch.float64, torch.int32)])
def test_jit_matches_generic_and_reference(graph, mode, heads, width, v_width, dtype,
                                           index_dtype):
    A = graph.to(index_dtype=index_dtype)
    if mode == "gatv2":
        v_width = width  # GATv2's values are the source features
    kinds = {torch.float32: ENUMS["scalar"]["f32"], torch.float64: ENUMS["scalar"]["f64"]}
    qk = 1 if mode == "additive" else width
    # The op looks the kernel up by the same spec: after the call it is a memory hit.
    _core.jit_clear_memory_cache()
    inputs = _inputs(A, mode, heads, width, v_width, dtype, seed=heads * 31 + width,
                     masked=(heads % 2 == 0))
    jit = _forward_backward(A, mode, inputs)
    index = ENUMS["index"]["i64" if index_dtype == torch.int64 else "i32"]
    info = _core.jit_attention(kinds[dtype], index, MODES[mode], heads, qk, v_width)
    assert info["ok"], info["error"]
    assert info["memory_hit"], "the op did not take the JIT path"
    generic = generic_only(lambda: _forward_backward(A, mode, inputs))
    for a, b in zip(jit, generic):
        assert torch.equal(a, b)
    assert all(torch.isfinite(t).all() for t in jit)
    ref, _ = _reference(A, mode, inputs, width)
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(jit[0].double(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("mode", ["dot", "additive", "gatv2"])
def test_jit_gradients_match_reference(graph, mode):
    """Backward of the specialized kernel against autograd through the float64 reference."""
    A = graph
    inputs = _inputs(A, mode, 4, 16, 16, torch.float64, seed=5, masked=False)
    jit = _forward_backward(A, mode, inputs)
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out, _ = _reference(A, mode, leaves, 16)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).double())
    used = leaves[:4] + ([leaves[4]] if mode == "gatv2" else [])
    for got, want in zip(jit[1:], used):
        torch.testing.assert_close(got, want.grad, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("mode", ["dot", "additive"])
def test_jit_dropout_matches_generic(graph, mode):
    """The counter-based dropout mask is the same in both kernels (same seed); additive mode
    also takes the JIT's register-accumulator pass there."""
    inputs = _inputs(graph, mode, 4, 16, 16, torch.float32, seed=9, masked=(mode == "additive"))
    jit = _forward_backward(graph, mode, inputs, dropout=0.3, seed=3)
    generic = generic_only(lambda: _forward_backward(graph, mode, inputs, dropout=0.3, seed=3))
    for a, b in zip(jit, generic):
        assert torch.equal(a, b)
    without = _forward_backward(graph, mode, inputs)
    assert not torch.equal(jit[0], without[0])  # the dropout really applied


@pytest.mark.parametrize("mode", ["dot", "additive", "gatv2"])
@pytest.mark.parametrize("heads,width,v_width", [(4, 16, 16), (1, 8, 24), (2, 32, 8)])
@pytest.mark.parametrize("masked", [False, True])
def test_bfloat16_native_forward(graph, mode, heads, width, v_width, masked):
    """bfloat16 q, k, v run natively in the JIT's bfloat16 forward (read and written in
    bfloat16, float32 accumulation): bit for bit the float32 kernel on the widened inputs,
    rounded once, and the converting path (JIT off) gives the same bits; the backward runs in
    float32 on converted tensors and matches it too."""
    inputs = _inputs(graph, mode, heads, width, v_width, torch.bfloat16, seed=11 + heads,
                     masked=masked)
    _core.jit_clear_memory_cache()
    native = _forward_backward(graph, mode, inputs)
    qk = 1 if mode == "additive" else width
    index = _core.enums()["index"]["i64" if graph.index_dtype == torch.int64 else "i32"]
    got = _core.jit_attention(_core.enums()["scalar"]["bf16"], index, MODES[mode], heads, qk,
                              v_width)
    assert got["ok"] and got["memory_hit"], got["error"]  # the forward loaded it
    out = native[0]
    assert out.dtype == torch.bfloat16
    wide = [t.float() for t in inputs]
    want = _call(graph, mode, *wide).to(torch.bfloat16)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    converted = generic_only(lambda: _forward_backward(graph, mode, inputs))
    for name, a, b in zip(("out", "dq", "dk", "dv", "dbias", "datt"), native, converted):
        assert torch.equal(a, b), name


def test_spec_rejects_what_it_cannot_compile():
    with pytest.raises(ValueError, match="no kernel for H="):
        _core.jit_attention(ENUMS["scalar"]["f32"], ENUMS["index"]["i64"], 0, 65, 16, 16)
    with pytest.raises(ValueError, match="float16"):
        _core.jit_attention(ENUMS["scalar"]["f16"], ENUMS["index"]["i64"], 0, 4, 16, 16)
    names = {_core.jit_attention(ENUMS["scalar"]["f32"], i, m, 4, 1 if m == 1 else 16, 16)["name"]
             for i in ENUMS["index"].values() for m in MODES.values()}
    assert len(names) == 6


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("heads", [2, 3, 8, 9, 17])
@pytest.mark.parametrize("kernel", ["jit", "generic"])
def test_each_head_matches_that_head_alone(graph, mode, heads, kernel):
    """Heads are independent softmaxes: every head of a multi-head call must equal that head
    run alone, bit for bit (a kernel that shares work across heads, on vector lanes say, must
    keep each head's operations), masked entries (-inf), a NaN score and a large one
    included."""
    A = graph
    q, k, v, bias, att = _inputs(A, mode, heads, 8, 5, torch.float32, seed=heads, masked=True)
    bias[3, 0] = float("nan")   # NaN reaches that row's output and lse
    bias[40, heads - 1] = 200.0  # exp overflows relative to the rest: a new running max
    def run():
        with torch.no_grad():
            out = _call(A, mode, q, k, v, bias, att)
            ones = [_call(A, mode, q[:, h:h + 1], k[:, h:h + 1], v[:, h:h + 1],
                          bias[:, h:h + 1].contiguous(), att[h:h + 1]) for h in range(heads)]
        return out, ones

    out, ones = generic_only(run) if kernel == "generic" else run()
    assert torch.isnan(out[:, 0]).any() and torch.isfinite(out[:, heads - 1]).any()
    for h, one in enumerate(ones):
        assert torch.equal(out[:, h:h + 1].view(torch.int32), one.view(torch.int32)), h
