"""CUDA ops against CPU / float64 references: every output element is compared, max / min
positions exactly. Outputs the ops allocate cannot be poisoned from here; the kernel-level
guard-band and poison checks are in tests/cpp/test_cuda_kernels.cpp (CudaGpu).

Everything here is skipped without a CUDA device (run by scripts/gpu_check.sh).
"""

import pytest
import torch

import sparsejit as sj
from conftest import GRAPHS, dense_reference_spmm, random_graph

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DEV = "cuda"
TOL = {torch.float32: 1e-4, torch.float64: 1e-10, torch.bfloat16: 3e-2, torch.float16: 4e-3}
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
REDUCES = ["sum", "mean", "max", "min"]


def _close(got, ref, dtype):
    ref = ref.double().cpu()
    scale = max(1.0, float(ref.abs().max())) if ref.numel() else 1.0
    torch.testing.assert_close(got.double().cpu(), ref, atol=TOL[dtype] * scale, rtol=TOL[dtype])


def _on_cpu(t):
    """CPU copy the CPU kernels accept (they have no float16: float32 holds it exactly)."""
    if t is None:
        return None
    t = t.cpu()
    return t.float() if t.dtype == torch.float16 else t


def _cpu_spmm(rowptr, col, values, x, reduce, **kw):
    return sj.ops.spmm(_on_cpu(rowptr), _on_cpu(col), _on_cpu(values), _on_cpu(x), reduce,
                       bias=_on_cpu(kw.pop("bias", None)), **kw)


def _cuda_graph(name, index_dtype=torch.int64):
    return GRAPHS[name]().to(device=DEV, index_dtype=index_dtype)


def _skewed_graph(seed=0):
    """Mostly short rows plus a few very long ones: the planner picks the chunked schedules."""
    g = torch.Generator().manual_seed(seed)
    deg = torch.randint(0, 6, (4000,), generator=g)
    deg[7] = 30000
    deg[100] = 5000
    deg[3999] = 2000
    indptr = torch.zeros(4001, dtype=torch.long)
    indptr[1:] = deg.cumsum(0)
    indices = torch.randint(0, 500, (int(indptr[-1]),), generator=g)
    return sj.SparseMatrix.from_csr(indptr, indices, shape=(4000, 500))


# ---- spmm ----------------------------------------------------------------------------------


@pytest.mark.parametrize("graph_name", sorted(GRAPHS))
@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("value_mode", [0, 1, 2])
def test_cuda_spmm_matches_reference(graph_name, reduce, dtype, index_dtype, value_mode):
    A = _cuda_graph(graph_name, index_dtype)
    H, F = (4, 8) if value_mode == 2 else (1, 16)
    x_shape = (A.shape[1], H, F) if value_mode == 2 else (A.shape[1], F)
    X = torch.randn(x_shape, device=DEV).to(dtype)
    values = None
    if value_mode == 1:
        values = (torch.rand(A.nnz, device=DEV) + 0.5).to(dtype)
    elif value_mode == 2:
        values = (torch.rand(A.nnz, H, device=DEV) + 0.5).to(dtype)
    out, arg = sj.ops.spmm(A.indptr, A.indices, values, X, reduce)
    assert out.device == X.device and out.dtype == dtype and out.shape == (A.shape[0],) + x_shape[1:]
    Aref = A.to("cpu").with_values(None if values is None else values.cpu().double())
    _close(out, dense_reference_spmm(Aref, X.cpu(), reduce), dtype)
    if reduce in ("max", "min"):
        _, cpu_arg = _cpu_spmm(A.indptr, A.indices, values, X, reduce)
        assert torch.equal(arg.cpu(), cpu_arg), "max / min positions differ from the CPU kernel"
    else:
        assert arg.numel() == 0


@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("shape", [(1,), (3,), (7,), (33,), (64,), (300,), (1024,), (3, 5), (2, 96)])
def test_cuda_spmm_widths(reduce, shape):
    A = random_graph(300, 200, 9, power_law=True, seed=4).to(device=DEV)
    X = torch.randn((A.shape[1],) + shape, device=DEV)
    out, arg = sj.ops.spmm(A.indptr, A.indices, None, X, reduce)
    ref, ref_arg = _cpu_spmm(A.indptr, A.indices, None, X, reduce)
    _close(out, ref, torch.float32)
    if reduce in ("max", "min"):
        assert torch.equal(arg.cpu(), ref_arg)


@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_cuda_spmm_skewed_rows(reduce, dtype, monkeypatch):
    """Chunked schedules (atomic for sum / mean, ordered segments for max / min)."""
    A = _skewed_graph().to(device=DEV)
    vals = (torch.rand(A.nnz, device=DEV) + 0.5).to(dtype)
    X = torch.randn(A.shape[1], 32, device=DEV).to(dtype)
    out, arg = sj.ops.spmm(A.indptr, A.indices, vals, X, reduce)
    ref, ref_arg = _cpu_spmm(A.indptr, A.indices, vals.double(), X.double(), reduce)
    _close(out, ref, dtype)
    if reduce in ("max", "min") and dtype != torch.float64:
        _, ref_arg = _cpu_spmm(A.indptr, A.indices, vals, X, reduce)
    if reduce in ("max", "min"):
        assert torch.equal(arg.cpu(), ref_arg)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_cuda_spmm_deterministic_mode_is_bitwise_repeatable(reduce, monkeypatch):
    A = _skewed_graph(1).to(device=DEV)
    X = torch.randn(A.shape[1], 64, device=DEV)
    monkeypatch.setenv("SPARSEJIT_DETERMINISTIC", "1")
    first, _ = sj.ops.spmm(A.indptr, A.indices, None, X, reduce)
    for _ in range(3):
        again, _ = sj.ops.spmm(A.indptr, A.indices, None, X, reduce)
        assert torch.equal(first, again)
    ref, _ = _cpu_spmm(A.indptr, A.indices, None, X.double(), reduce)
    _close(first, ref, torch.float32)
    # torch's own switch turns the deterministic schedules on too.
    monkeypatch.delenv("SPARSEJIT_DETERMINISTIC")
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        det, _ = sj.ops.spmm(A.indptr, A.indices, None, X, reduce)
    finally:
        torch.use_deterministic_algorithms(prev)
    assert torch.equal(first, det)


@pytest.mark.parametrize("activation", ["none", "relu", "leaky_relu", "elu", "gelu"])
@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_spmm_epilogue(activation, reduce, dtype):
    A = random_graph(120, 90, 5, seed=1, empty_frac=0.2).to(device=DEV)
    X = torch.randn(A.shape[1], 2, 8, device=DEV).to(dtype)
    bias = torch.randn(2, 8, device=DEV).to(dtype)
    kw = dict(activation=activation, act_param=0.2, scale=0.5)
    out, _ = sj.ops.spmm(A.indptr, A.indices, None, X, reduce, bias=bias, **kw)
    ref, _ = _cpu_spmm(A.indptr, A.indices, None, X, reduce, bias=bias, **kw)
    _close(out, ref, dtype)


def test_cuda_spmm_misaligned_operands_use_narrow_loads():
    A = random_graph(100, 80, 6, seed=3).to(device=DEV)
    storage = torch.randn(80 * 64 + 1, device=DEV)
    X = storage[1:].view(80, 64)  # contiguous, but 4 bytes past a 16-byte boundary
    assert X.is_contiguous() and X.data_ptr() % 16 != 0
    out, _ = sj.ops.spmm(A.indptr, A.indices, None, X, "sum")
    ref, _ = _cpu_spmm(A.indptr, A.indices, None, X, "sum")
    _close(out, ref, torch.float32)


@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_cuda_spmm_empty_shapes(reduce):
    A = random_graph(10, 8, 3, seed=1).to(device=DEV)
    out, _ = sj.ops.spmm(A.indptr, A.indices, None, torch.randn(8, 0, device=DEV), reduce)
    assert out.shape == (10, 0)
    E = random_graph(0, 0, 0).to(device=DEV)
    out, _ = sj.ops.spmm(E.indptr, E.indices, None, torch.randn(0, 4, device=DEV), reduce)
    assert out.shape == (0, 4)
    N = random_graph(7, 5, 0, seed=7).to(device=DEV)  # rows, no entries
    out, arg = sj.ops.spmm(N.indptr, N.indices, None, torch.randn(5, 4, device=DEV), reduce)
    assert (out == 0).all()
    if reduce == "max":
        assert (arg == -1).all()


# ---- sddmm, edge softmax ------------------------------------------------------------------------


@pytest.mark.parametrize("graph_name", sorted(GRAPHS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("shape", [(16,), (3, 16), (5,), (2, 300)])
def test_cuda_sddmm_matches_reference(graph_name, dtype, index_dtype, shape):
    A = _cuda_graph(graph_name, index_dtype)
    Q = torch.randn((A.shape[0],) + shape, device=DEV).to(dtype)
    K = torch.randn((A.shape[1],) + shape, device=DEV).to(dtype)
    S = sj.ops.sddmm(A.indptr, A.indices, Q, K)
    r, c = A.row_indices().cpu(), A.indices.long().cpu()
    ref = (Q.cpu().double()[r] * K.cpu().double()[c]).sum(-1)
    assert S.shape == ref.shape and S.dtype == dtype
    torch.testing.assert_close(S.double().cpu(), ref, atol=TOL[dtype] * shape[-1], rtol=TOL[dtype])


def _softmax_reference(indptr, S):
    ref = torch.zeros(S.shape, dtype=torch.float64)
    ip = indptr.tolist()
    for i in range(len(ip) - 1):
        if ip[i + 1] > ip[i]:
            ref[ip[i]:ip[i + 1]] = torch.softmax(S[ip[i]:ip[i + 1]].double(), dim=0)
    return ref


@pytest.mark.parametrize("graph_name", sorted(GRAPHS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [None, 3, 8, 40])
def test_cuda_edge_softmax_and_backward(graph_name, dtype, heads):
    A = _cuda_graph(graph_name)
    shape = (A.nnz,) if heads is None else (A.nnz, heads)
    S = (torch.randn(shape, device=DEV) * 3).to(dtype)
    if A.nnz > 3:
        S[1] = float("-inf")  # a masked entry
    P = sj.ops.edge_softmax(A.indptr, S)
    ref = _softmax_reference(A.indptr.cpu(), S.cpu())
    both_nan = torch.isnan(P.cpu().double()) & torch.isnan(ref)
    torch.testing.assert_close(torch.where(both_nan, 0, P.double().cpu()),
                               torch.where(both_nan, 0, ref), atol=TOL[dtype], rtol=TOL[dtype])
    Y = torch.rand(shape, device=DEV).to(dtype)
    G = torch.randn(shape, device=DEV).to(dtype)
    grad = sj.ops.edge_softmax_backward(A.indptr, Y, G)
    ref_grad = sj.ops.edge_softmax_backward(A.indptr.cpu(), _on_cpu(Y).double(), _on_cpu(G).double())
    _close(grad, ref_grad, dtype)


# ---- structure ops, autograd, graphs -------------------------------------------------------------


def test_cuda_validate_and_transpose_match_cpu():
    A = random_graph(50, 40, 4, seed=2)
    Ac = A.to(device=DEV)
    sj.ops.validate_csr(Ac.indptr, Ac.indices, 40)
    with pytest.raises(ValueError):
        sj.ops.validate_csr(Ac.indptr, Ac.indices, 3)
    t_gpu = sj.ops.csr_transpose(Ac.indptr, Ac.indices, 40)
    t_cpu = sj.ops.csr_transpose(A.indptr, A.indices, 40)
    for g, c in zip(t_gpu, t_cpu):
        assert g.device == Ac.device and torch.equal(g.cpu(), c)


@pytest.mark.parametrize("n,e", [(0, 0), (1, 1), (300, 2000), (5000, 200_000)])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_cuda_structure_builders_match_cpu(n, e, index_dtype):
    """csr_from_edge_index / gcn_adjacency / csr_transpose on the device equal the CPU's
    counting sorts (the values too: CUDA's double sqrt and division are correctly rounded)."""
    g = torch.Generator().manual_seed(n + e)
    ei = torch.randint(0, max(n, 1), (2, e), generator=g)
    ei[1, : e // 4] = ei[0, : e // 4]  # self-loops
    ei = ei.to(index_dtype)
    for op in (lambda t: sj.ops.csr_from_edge_index(t, n),
               lambda t: sj.ops.gcn_adjacency(t, n, torch.float64)):
        for got, want in zip(op(ei.to(DEV)), op(ei)):
            assert got.device.type == "cuda" and got.dtype == want.dtype
            assert torch.equal(got.cpu(), want)
    rowptr, col, _ = sj.ops.csr_from_edge_index(ei, n)
    for got, want in zip(sj.ops.csr_transpose(rowptr.to(DEV), col.to(DEV), n),
                         sj.ops.csr_transpose(rowptr, col, n)):
        assert torch.equal(got.cpu(), want)
    if n:
        bad = ei.clone()
        bad[0, -1] = n
        with pytest.raises(ValueError, match=rf"edge_index\[:, {e - 1}\] = \[{n}, "):
            sj.ops.csr_from_edge_index(bad.to(DEV), n)


def _attention_inputs(kind, n=300, heads=3, d=16, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    A = random_graph(n, n, 6, seed=seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
    if kind == "dot":
        ins = (r(n, heads, d), r(n, heads, d), r(n, heads, d))
    elif kind == "gat":
        ins = (r(n, heads), r(n, heads), r(n, heads, d))
    else:
        ins = (r(n, heads, d), r(n, heads, d), r(heads, d))
    return A, ins, r(A.nnz, heads)


def _attention_call(kind, A, ins, logits, dropout):
    if kind == "dot":
        return sj.sparse_attention(A, *ins, values=logits, dropout=dropout)
    if kind == "gat":
        return sj.gat_attention(A, *ins, edge_logits=logits, dropout=dropout)
    return sj.gatv2_attention(A, *ins, edge_logits=logits, dropout=dropout)


@pytest.mark.parametrize("kind", ["dot", "gat", "gatv2"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_cuda_attention_forward_backward_match_cpu(kind, dtype, dropout):
    """The fused attention's CUDA kernels (forward, both backward passes) against the CPU
    kernels: outputs and every gradient, the dropout mask included (same counter-based draw)."""
    A, ins, logits = _attention_inputs(kind, dtype=dtype)
    results = []
    for dev in ("cpu", DEV):
        torch.manual_seed(7)  # the same dropout seed on both devices
        xs = [t.to(dev).requires_grad_() for t in (*ins, logits)]
        out = _attention_call(kind, A.to(device=dev), xs[:3], xs[3], dropout)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(3),
                           dtype=torch.float64).to(out)
        out.backward(grad)
        results.append([out.detach().cpu()] + [x.grad.cpu() for x in xs])
    tol = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 4e-2}[dtype]
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got.double(), want.double(), atol=tol, rtol=tol)


def test_cuda_attention_layers_match_cpu():
    """GATConv, GATv2Conv and TransformerConv forward + backward on CUDA equal the CPU's."""
    import sparsejit.nn as snn
    n, f = 400, 32
    g = torch.Generator().manual_seed(1)
    ei = torch.randint(0, n, (2, 3000), generator=g)
    x = torch.randn(n, f, generator=g)
    for make in (lambda: snn.GATConv(f, 8, heads=4), lambda: snn.GATv2Conv(f, 8, heads=4),
                 lambda: snn.TransformerConv(f, 8, heads=4)):
        torch.manual_seed(0)
        layer = make().double()
        outs = []
        for dev in ("cpu", DEV):
            layer = layer.to(dev)
            layer.zero_grad()
            xd = x.double().to(dev).requires_grad_()
            y = layer(xd, ei.to(dev))
            y.square().sum().backward()
            outs.append([y.detach().cpu(), xd.grad.cpu()] +
                        [p.grad.cpu() for p in layer.parameters()])
        for got, want in zip(outs[1], outs[0]):
            torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cuda_rgms_forward_backward_match_cpu(reduce, dtype):
    """RGMS on CUDA (SpMM over the groups, cuBLAS per relation, SpMM over targets; backward
    with an SDDMM for the values) against the CPU kernels, every gradient, empty relations."""
    g = torch.Generator().manual_seed(4)
    n, e, r = 500, 4000, 12
    ei = torch.randint(0, n, (2, e), generator=g)
    et = torch.randint(0, r - 2, (e,), generator=g)  # the last two relations stay empty
    X = torch.randn(n, 16, generator=g, dtype=torch.float64).to(dtype)
    W = torch.randn(r, 16, 8, generator=g, dtype=torch.float64).to(dtype)
    v = (torch.rand(e, generator=g, dtype=torch.float64) + 0.5).to(dtype)
    results = []
    for dev in ("cpu", DEV):
        xs = [t.to(dev).requires_grad_() for t in (X, W, v)]
        y = sj.rgms(ei.to(dev), xs[0], xs[1], edge_type=et.to(dev), reduce=reduce, values=xs[2],
                    num_nodes=n)
        y.square().sum().backward()
        results.append([y.detach().cpu()] + [t.grad.cpu() for t in xs])
    tol = 1e-9 if dtype == torch.float64 else 1e-4
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def test_cuda_rgcn_layer_and_segment_matmul_match_cpu():
    import sparsejit.nn as snn
    g = torch.Generator().manual_seed(8)
    n, e, r = 300, 2500, 6
    ei = torch.randint(0, n, (2, e), generator=g)
    et = torch.randint(0, r, (e,), generator=g)
    x = torch.randn(n, 12, generator=g, dtype=torch.float64)
    torch.manual_seed(0)
    conv = snn.RGCNConv(12, 10, r, aggr="mean").double()
    outs = []
    for dev in ("cpu", DEV):
        conv = conv.to(dev)
        conv.zero_grad()
        xd = x.to(dev).requires_grad_()
        y = conv(xd, ei.to(dev), et.to(dev))
        y.square().sum().backward()
        outs.append([y.detach().cpu(), xd.grad.cpu()] + [p.grad.cpu() for p in conv.parameters()])
    for got, want in zip(outs[1], outs[0]):
        torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)
    ptr = torch.tensor([0, 5, 5, 40, 100])
    xs = torch.randn(100, 7, dtype=torch.float64)
    w = torch.randn(4, 7, 3, dtype=torch.float64)
    want = sj.ops.segment_matmul(xs, ptr, w)
    got = sj.ops.segment_matmul(xs.to(DEV), ptr.to(DEV), w.to(DEV))
    torch.testing.assert_close(got.cpu(), want)
    dy = torch.randn(100, 3, dtype=torch.float64)
    torch.testing.assert_close(
        sj.ops.segment_matmul_backward_w(xs.to(DEV), ptr.to(DEV), dy.to(DEV)).cpu(),
        sj.ops.segment_matmul_backward_w(xs, ptr, dy))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cuda_sparse_conv_modules_match_cpu(dtype):
    """A small sparse UNet (submanifold, strided, inverse) forward + backward on CUDA against
    the CPU kernels: features, input gradient, every weight gradient."""
    import sparsejit.spconv as spconv
    g = torch.Generator().manual_seed(2)
    side, n = 24, 3000
    key = torch.randperm(side ** 3, generator=g)[:n]
    coords = torch.stack([key % 2, key // side ** 2, (key // side) % side, key % side],
                         1).int()
    feats = torch.randn(n, 8, generator=g, dtype=torch.float64).to(dtype)
    torch.manual_seed(0)
    net = torch.nn.ModuleList([spconv.SubMConv3d(8, 16, 3, indice_key="a"),
                               spconv.SparseConv3d(16, 16, 3, 2, 1, indice_key="d"),
                               spconv.SubMConv3d(16, 16, 3),
                               spconv.SparseInverseConv3d(16, 8, 3, indice_key="d")]).to(dtype)
    outs = []
    for dev in ("cpu", DEV):
        net = net.to(dev)
        net.zero_grad()
        f = feats.to(dev).requires_grad_()
        y = spconv.SparseConvTensor(f, coords.to(dev), [side] * 3, 2)
        for m in net:
            y = m(y)
        y.features.square().sum().backward()
        outs.append([y.features.detach().cpu(), f.grad.cpu()] +
                    [m.weight.grad.cpu() for m in net])
    tol = 1e-9 if dtype == torch.float64 else 2e-3
    for got, want in zip(outs[1], outs[0]):
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("reduce", REDUCES)
def test_cuda_autograd_matches_cpu(reduce):
    A = random_graph(60, 50, 4, seed=5)
    vals = torch.rand(A.nnz, dtype=torch.float64) + 0.5
    X = torch.randn(50, 3, 4, dtype=torch.float64)
    grads = []
    for dev in ("cpu", DEV):
        v = vals.to(dev).requires_grad_()
        x = X.to(dev).requires_grad_()
        Y = sj.spmm(A.to(device=dev).with_values(v), x, reduce)
        Y.pow(2).sum().backward()
        grads.append((Y.detach().cpu(), v.grad.cpu(), x.grad.cpu()))
    for c, g in zip(grads[0], grads[1]):
        torch.testing.assert_close(g, c, atol=1e-9, rtol=1e-9)


def test_cuda_attention_pipeline_gradients_match_cpu():
    A = random_graph(70, 70, 5, seed=6)
    Q, K, V = (torch.randn(70, 2, 8, dtype=torch.float64) for _ in range(3))
    results = []
    for dev in ("cpu", DEV):
        q, k, v = (t.to(dev).requires_grad_() for t in (Q, K, V))
        Ad = A.to(device=dev)
        P = sj.edge_softmax(Ad, sj.sddmm(Ad, q, k))
        out = sj.spmm(Ad.with_values(P), v)
        out.sum().backward()
        results.append([out.detach().cpu()] + [t.grad.cpu() for t in (q, k, v)])
    for c, g in zip(*results):
        torch.testing.assert_close(g, c, atol=1e-9, rtol=1e-9)


def test_cuda_ops_on_a_second_stream():
    A = random_graph(200, 150, 6, seed=8).to(device=DEV)
    X = torch.randn(150, 32, device=DEV)
    ref, _ = sj.ops.spmm(A.indptr, A.indices, None, X, "sum")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out, _ = sj.ops.spmm(A.indptr, A.indices, None, X, "sum")
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(out, ref)


def test_cuda_graph_capture_and_replay():
    A = _skewed_graph(2).to(device=DEV)
    X = torch.randn(A.shape[1], 16, device=DEV)
    eager, _ = sj.ops.spmm(A.indptr, A.indices, None, X, "max")
    g = torch.cuda.CUDAGraph()
    # Warm up on a side stream first (kernels compiled and loaded outside the capture).
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        sj.ops.spmm(A.indptr, A.indices, None, X, "max")
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        captured, _ = sj.ops.spmm(A.indptr, A.indices, None, X, "max")
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
