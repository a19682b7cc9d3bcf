"""Fused sparse attention on CUDA tensors (kernels/cuda/attention.cuh) against the CPU op:
forward and backward, each score mode, bias on / off, dtypes, index widths, empty and skewed
patterns, the dropout mask (shared with the CPU), determinism and the layers. Skipped without
a CUDA device."""
import copy

import pytest
import torch

import sparsejit as sj
from conftest import GRAPHS, random_graph

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DEV = "cuda"
# (Written with the alternative attention kernels of branch cuda-att; black-box tests of the
# CUDA op against the CPU op, so they apply to the kernels merged here.)
TOL = {torch.float32: 2e-4, torch.float64: 1e-10, torch.bfloat16: 5e-2, torch.float16: 8e-3}
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _close(got, ref, dtype):
    ref = ref.double().cpu()
    scale = max(1.0, float(ref.abs().max())) if ref.numel() else 1.0
    torch.testing.assert_close(got.double().cpu(), ref, atol=TOL[dtype] * scale, rtol=TOL[dtype])


def _inputs(A, mode, heads, d, dv, dtype, with_bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows, cols = A.shape
    if mode == "gat":
        q, k = torch.randn(rows, heads, generator=g), torch.randn(cols, heads, generator=g)
    else:
        q, k = torch.randn(rows, heads, d, generator=g), torch.randn(cols, heads, d, generator=g)
    v = torch.randn(cols, heads, dv, generator=g)
    bias = torch.randn(A.nnz, heads, generator=g) if with_bias else None
    att = torch.randn(heads, d, generator=g) if mode == "gatv2" else None
    # Rounded once to the dtype, so both devices see the same values.
    cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
    return cast(q), cast(k), cast(v), cast(bias), cast(att)


def _call(A, mode, q, k, v, bias, att, dropout=0.0):
    if mode == "dot":
        return sj.sparse_attention(A, q, k, v, values=bias, dropout=dropout)
    if mode == "gat":
        return sj.gat_attention(A, q, k, v, 0.2, bias, dropout=dropout)
    return sj.gatv2_attention(A, q, k, att, v, 0.2, bias, dropout=dropout)


def _run(A, mode, tensors, dev, dtype, dropout=0.0, seed=0):
    """Output and gradients of every input on `dev` (CPU: float64 on the same values)."""
    ct = dtype if dev == DEV else torch.float64
    leaves = [None if t is None else t.to(device=dev, dtype=ct).requires_grad_() for t in tensors]
    Ad = A.to(device=dev)
    torch.manual_seed(seed)  # the dropout seed is drawn from torch's generator
    out = _call(Ad, mode, *leaves, dropout=dropout)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(dev, out.dtype)
    (out * w).sum().backward()
    return [out.detach()] + [None if t is None else t.grad for t in leaves]


def _compare(A, mode, tensors, dtype, dropout=0.0):
    got = _run(A, mode, tensors, DEV, dtype, dropout)
    ref = _run(A, mode, tensors, "cpu", dtype, dropout)
    assert got[0].device.type == "cuda"
    for g, r in zip(got, ref):
        if r is None:
            assert g is None
            continue
        _close(g, r, dtype)


@pytest.mark.parametrize("graph_name", sorted(GRAPHS))
@pytest.mark.parametrize("mode", ["dot", "gat", "gatv2"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_cuda_attention_matches_cpu(graph_name, mode, with_bias):
    A = GRAPHS[graph_name]()
    _compare(A, mode, _inputs(A, mode, 2, 8, 6, torch.float32, with_bias), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["dot", "gat", "gatv2"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_cuda_attention_dtypes_and_index_widths(dtype, mode, index_dtype):
    A = random_graph(90, 70, 6, power_law=True, seed=3).to(index_dtype=index_dtype)
    _compare(A, mode, _inputs(A, mode, 3, 16, 16, dtype, True, seed=1), dtype)


@pytest.mark.parametrize("shape", [(1, 1, 1), (4, 64, 64), (2, 7, 33), (1, 300, 40)])
def test_cuda_attention_head_widths(shape):
    heads, d, dv = shape
    A = random_graph(60, 50, 5, seed=4)
    for mode in ("dot", "gatv2"):
        _compare(A, mode, _inputs(A, mode, heads, d, dv, torch.float64, True), torch.float64)


def test_cuda_attention_skewed_rows():
    g = torch.Generator().manual_seed(0)
    deg = torch.randint(0, 4, (500,), generator=g)
    deg[3], deg[499] = 5000, 1
    indptr = torch.zeros(501, dtype=torch.long)
    indptr[1:] = deg.cumsum(0)
    indices = torch.randint(0, 80, (int(indptr[-1]),), generator=g)
    A = sj.SparseMatrix.from_csr(indptr, indices, shape=(500, 80))
    for mode in ("dot", "gat"):
        _compare(A, mode, _inputs(A, mode, 2, 16, 8, torch.float32, True), torch.float32)


@pytest.mark.parametrize("mode", ["dot", "gat", "gatv2"])
def test_cuda_attention_dropout_mask_matches_cpu(mode):
    # The mask is a counter-based hash of (seed, entry, head) on both devices.
    A = random_graph(80, 60, 6, seed=5)
    _compare(A, mode, _inputs(A, mode, 2, 8, 8, torch.float64, True), torch.float64, dropout=0.3)


def test_cuda_attention_backward_is_deterministic():
    A = random_graph(400, 100, 20, power_law=True, seed=6)
    tensors = _inputs(A, "gatv2", 4, 32, 32, torch.float32, True)
    a = _run(A, "gatv2", tensors, DEV, torch.float32)
    b = _run(A, "gatv2", tensors, DEV, torch.float32)
    for x, y in zip(a, b):
        if x is not None:
            assert torch.equal(x, y)


@pytest.mark.parametrize("layer", ["GATConv", "GATv2Conv", "TransformerConv"])
def test_cuda_attention_layers_match_cpu(layer):
    torch.manual_seed(0)
    m = getattr(sj.nn, layer)(12, 8, heads=2)
    x = torch.randn(70, 12)
    edge_index = torch.randint(0, 70, (2, 400))
    outs, grads = [], []
    for dev in ("cpu", DEV):
        md = copy.deepcopy(m).to(dev)
        xd = x.to(dev).requires_grad_()
        y = md(xd, edge_index.to(dev))
        y.square().sum().backward()
        outs.append(y.detach().cpu())
        grads.append([xd.grad.cpu()] + [p.grad.cpu() for p in md.parameters()])
    torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-4)
    for g, c in zip(grads[1], grads[0]):
        torch.testing.assert_close(g, c, atol=1e-3, rtol=1e-3)
