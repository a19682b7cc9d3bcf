"""sparsejit.linear and its op ``sparsejit::linear``: x @ weight^T + bias on the dense GEMM
layer (row blocks over every thread, the bias added per block), against float64 on fresh
random inputs (empty, one row, partial and whole 256-row blocks), gradients against
torch's, named errors, the op's registrations (opcheck, compile), the choice between the two
GEMMs, and the PyG-signature layers computing the same with either. The same for the
in-place ``sparsejit::linear_add_`` (out += x @ weight^T, the layers' root terms) and GIN's
user MLP (a plain Sequential's Linears)."""

import pytest
import torch
import torch.nn.functional as F

import sparsejit as sj
from sparsejit.families.dense import ops as dense_ops

OP = torch.ops.sparsejit.linear
ADD = torch.ops.sparsejit.linear_add_


def ref(x, w, b):
    y = x.double() @ w.double().t()
    return y if b is None else y + b.double()


def test_min_rows_follow_the_measured_crossover(monkeypatch):
    """Where the dense layer starts: from the smallest rung it was no slower at, and at every
    larger one; measured once per process; SPARSEJIT_LINEAR keeps the fixed minimum."""
    pick = dense_ops._min_rows_from
    assert pick({2048: 0.9, 4096: 0.9, 8192: 0.8, 16384: 0.8}) == dense_ops._LINEAR_MIN_ROWS
    assert pick({2048: 1.2, 4096: 1.1, 8192: 0.99, 16384: 0.9}) == 8192
    assert pick({2048: 0.9, 4096: 1.1, 8192: 0.99, 16384: 0.9}) == 8192  # not below a loss
    assert pick({2048: 0.9, 4096: 0.9, 8192: 0.9, 16384: 1.05}) == dense_ops._LADDER_TOP
    monkeypatch.delenv("SPARSEJIT_LINEAR", raising=False)
    monkeypatch.setattr(dense_ops, "_linear_choice", {})
    rows = dense_ops._linear_min_rows()
    assert rows in (dense_ops._LINEAR_MIN_ROWS, *dense_ops._LADDER, dense_ops._LADDER_TOP)
    assert set(dense_ops._linear_choice["ratios"]) == set(dense_ops._LADDER)
    assert dense_ops._linear_min_rows() == rows  # kept for the process
    with torch.inference_mode():  # measurable inside inference mode too
        monkeypatch.setattr(dense_ops, "_linear_choice", {})
        assert dense_ops._linear_min_rows() in (dense_ops._LINEAR_MIN_ROWS,
                                                *dense_ops._LADDER, dense_ops._LADDER_TOP)
    monkeypatch.setenv("SPARSEJIT_LINEAR", "1")
    assert dense_ops._linear_min_rows() == dense_ops._LINEAR_MIN_ROWS
    # inputs of _LADDER_TOP rows or more never ask for it (its GEMMs cost BLAS buffers)
    monkeypatch.delenv("SPARSEJIT_LINEAR")
    monkeypatch.setattr(dense_ops, "_linear_choice", {"probe": True})
    big = torch.randn(dense_ops._LADDER_TOP, 4)
    assert dense_ops._takes_dense_layer(big, torch.randn(3, 4), None)
    assert "min_rows" not in dense_ops._linear_choice
    dense_ops._takes_dense_layer(big[:2000], torch.randn(3, 4), None)
    assert "min_rows" in dense_ops._linear_choice


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 1500])
@pytest.mark.parametrize("f_in,f_out", [(0, 3), (1, 1), (7, 33), (128, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_values_and_gradients_against_float64(n, f_in, f_out, bias):
    g = torch.Generator().manual_seed(n * 131 + f_in * 7 + f_out)
    x = torch.randn(n, f_in, generator=g, requires_grad=True)
    w = torch.randn(f_out, f_in, generator=g, requires_grad=True)
    b = torch.randn(f_out, generator=g, requires_grad=True) if bias else None
    y = OP(x, w, b)
    assert y.shape == (n, f_out) and y.dtype == torch.float32
    want = ref(x, w, b)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-4)
    gy = torch.randn(n, f_out, generator=g)
    y.backward(gy)
    got = [x.grad, w.grad] + ([b.grad] if bias else [])
    x.grad = w.grad = None
    if bias:
        b.grad = None
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    bd = b.detach().double().requires_grad_() if bias else None
    F.linear(xd, wd, bd).backward(gy.double())
    for a, e in zip(got, [xd.grad, wd.grad] + ([bd.grad] if bias else [])):
        torch.testing.assert_close(a.double(), e, rtol=1e-5, atol=1e-3)


def test_non_contiguous_inputs():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(600, 40, generator=g)[:, ::2]
    w = torch.randn(20, 30, generator=g).t()  # [30, 20], not contiguous
    b = torch.randn(60, generator=g)[::2]
    torch.testing.assert_close(OP(x, w, b).double(), ref(x, w, b), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("args,err,match", [
    ((torch.randn(5), torch.randn(3, 5), None), ValueError, "x must be"),
    ((torch.randn(4, 5), torch.randn(3, 5, 1), None), ValueError, "weight must be"),
    ((torch.randn(4, 5), torch.randn(3, 6), None), ValueError, "F_in"),
    ((torch.randn(4, 5), torch.randn(3, 5), torch.randn(4)), ValueError, "bias must be"),
    ((torch.randn(4, 5).double(), torch.randn(3, 5), None), TypeError, "x must be float32"),
    ((torch.randn(4, 5), torch.randn(3, 5).half(), None), TypeError, "weight must be float32"),
    ((torch.randn(4, 5), torch.randn(3, 5), torch.randn(3).double()), TypeError, "bias must"),
])
def test_bad_input_names_the_argument(args, err, match):
    with pytest.raises(err, match=match):
        sj._library.restores_type_errors(OP)(*args)


def test_opcheck_and_compile():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(300, 16, generator=g, requires_grad=True)
    w = torch.randn(8, 16, generator=g, requires_grad=True)
    b = torch.randn(8, generator=g, requires_grad=True)
    torch.library.opcheck(OP, (x, w, b))
    torch.library.opcheck(OP, (x, w, None))
    f = torch.compile(lambda a, c, d: OP(a, c, d).relu(), fullgraph=True, dynamic=True)
    torch.testing.assert_close(f(x, w, b), OP(x, w, b).relu())


def test_choice_between_the_two_gemms(monkeypatch):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2000, 24, generator=g, requires_grad=True)
    w = torch.randn(12, 24, generator=g)
    b = torch.randn(12, generator=g)
    monkeypatch.setenv("SPARSEJIT_LINEAR", "0")
    y = sj.linear(x, w, b)
    assert torch.equal(y, F.linear(x, w, b))  # torch's GEMM: the same call, the same bits
    assert "sparsejit" not in type(y.grad_fn).__name__
    monkeypatch.setenv("SPARSEJIT_LINEAR", "1")
    y = sj.linear(x, w, b)
    assert "sparsejit_linear" in type(y.grad_fn).__name__
    torch.testing.assert_close(y.double(), ref(x, w, b), rtol=1e-5, atol=1e-4)
    # below the row threshold, other dtypes and devices: torch's
    small = sj.linear(x[:100], w, b)
    assert "sparsejit" not in type(small.grad_fn).__name__
    y64 = sj.linear(x.double(), w.double(), b.double())
    assert y64.dtype == torch.float64
    # the measurement itself picks one and keeps it for the process
    monkeypatch.delenv("SPARSEJIT_LINEAR")
    monkeypatch.setattr(dense_ops, "_linear_choice", {})
    first = dense_ops._linear_faster()
    assert isinstance(first, bool) and dense_ops._linear_faster() == first
    assert dense_ops._linear_choice == {"probe": first}


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 1500])
@pytest.mark.parametrize("f_in,f_out", [(0, 3), (1, 1), (7, 33), (128, 64)])
def test_linear_add_against_float64(n, f_in, f_out):
    """The op adds onto out (poisoned rows would show: out starts random, not zero); the
    autograd wrapper's gradients (out passes through) against float64."""
    g = torch.Generator().manual_seed(n * 17 + f_in * 5 + f_out)
    x = torch.randn(n, f_in, generator=g)
    w = torch.randn(f_out, f_in, generator=g)
    out0 = torch.randn(n, f_out, generator=g)
    out = out0.clone()
    ADD(out, x, w)
    want = out0.double() + x.double() @ w.double().t()
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-4)
    # autograd: through _linear_add on a fresh, non-leaf out
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    base = out0.clone().requires_grad_()
    y = dense_ops._linear_add(base * 1.0, xr, wr)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-4)
    gy = torch.randn(n, f_out, generator=g)
    y.backward(gy)
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    (xd @ wd.t()).backward(gy.double())
    torch.testing.assert_close(base.grad, gy)
    torch.testing.assert_close(xr.grad.double(), xd.grad, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(wr.grad.double(), wd.grad, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("n", [1, 3, 1200])
def test_linear_add_hands_a_broadcast_gradient_on_contiguous(n):
    """``loss = y.sum()`` sends a broadcast (stride 0) gradient; _linear_add copies it once and
    gives `out`'s producer that copy, with the same values (so the aggregation that made
    `out` does not copy it again). The gradients of x and weight stay those of float64."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, 16, generator=g, requires_grad=True)
    w = torch.randn(8, 16, generator=g, requires_grad=True)
    leaf = torch.randn(n, 8, generator=g, requires_grad=True)
    y = dense_ops._linear_add(leaf.clone(), x, w)  # CloneBackward hands its grad through
    d_out, dx, dw = torch.autograd.grad(y.sum(), [leaf, x, w])
    assert d_out.is_contiguous() and d_out.stride() == (8, 1)
    torch.testing.assert_close(d_out, torch.ones(n, 8))
    torch.testing.assert_close(dx.double(), torch.ones(n, 8).double() @ w.double(),
                               rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(dw.double(), torch.ones(8, n).double() @ x.double(),
                               rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("n", [1, 1023, 1024, 1500])
@pytest.mark.parametrize("bias", [True, False])
def test_relu_linear_against_float64(n, bias, monkeypatch):
    """relu_linear(h, w, b) = relu(h) @ w^T + b with h made ReLU in place; its gradients of h's
    producer, w and b against float64 (rows from 1024 up take the fused backward, fewer rows
    relu_ and linear); about half of h is negative, so a mask that is not applied shows."""
    monkeypatch.setenv("SPARSEJIT_LINEAR", "1")
    g = torch.Generator().manual_seed(n + bias)
    leaf = torch.randn(n, 24, generator=g, requires_grad=True)
    w = torch.randn(16, 24, generator=g, requires_grad=True)
    b = torch.randn(16, generator=g, requires_grad=True) if bias else None
    h = leaf * 1.0  # a fresh tensor autograd has not saved
    y = dense_ops.relu_linear(h, w, b)
    fused = any("ReluLinear" in type(fn).__name__ for fn in _grad_fns(y))
    assert fused == (n >= 1024)
    torch.testing.assert_close(h, leaf.detach().clamp(min=0))  # made ReLU in place
    gy = torch.randn(n, 16, generator=g)
    y.backward(gy)
    ld, wd = leaf.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    bd = b.detach().double().requires_grad_() if bias else None
    want = torch.nn.functional.linear(ld.relu(), wd, bd)
    want.backward(gy.double())
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(leaf.grad.double(), ld.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(w.grad.double(), wd.grad, rtol=1e-5, atol=1e-3)
    if bias:
        torch.testing.assert_close(b.grad.double(), bd.grad, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("uses", ["both", "r only"])
def test_relu_linear_relu_output_used_elsewhere(uses):
    """The Function's second output (h after its ReLU) used by the loss as well, or alone:
    its gradient joins the product's before the mask, as for relu then linear in float64."""
    g = torch.Generator().manual_seed(5)
    leaf = torch.randn(1100, 8, generator=g, requires_grad=True)
    w = torch.randn(12, 8, generator=g, requires_grad=True)
    y, r = dense_ops._relu_linear(leaf * 1.0, w, None)
    both = uses == "both"
    ((y.square().sum() if both else 0.0) + (r * 3.0).sum()).backward()
    ld, wd = leaf.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    rd = ld.relu()
    ((rd @ wd.t()).square().sum() * float(both) + (rd * 3.0).sum()).backward()
    torch.testing.assert_close(leaf.grad.double(), ld.grad, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(w.grad.double(), wd.grad, rtol=1e-5, atol=1e-2)


@pytest.mark.parametrize("args,err,match", [
    ((torch.zeros(4, 3), torch.randn(5), torch.randn(3, 5)), ValueError, "x must be"),
    ((torch.zeros(4, 3), torch.randn(4, 5), torch.randn(3, 6)), ValueError, "F_in"),
    ((torch.zeros(4, 2), torch.randn(4, 5), torch.randn(3, 5)), ValueError, "out must be"),
    ((torch.zeros(5, 3), torch.randn(4, 5), torch.randn(3, 5)), ValueError, "out must be"),
    ((torch.zeros(3, 4).t(), torch.randn(4, 5), torch.randn(3, 5)), ValueError, "contiguous"),
    ((torch.zeros(4, 3).double(), torch.randn(4, 5), torch.randn(3, 5)), TypeError, "out must"),
    ((torch.zeros(4, 3), torch.randn(4, 5).half(), torch.randn(3, 5)), TypeError, "x must"),
])
def test_linear_add_bad_input_names_the_argument(args, err, match):
    with pytest.raises(err, match=match):
        sj._library.restores_type_errors(ADD)(*args)


def test_linear_add_opcheck_and_choice(monkeypatch):
    g = torch.Generator().manual_seed(9)
    x = torch.randn(1200, 16, generator=g)
    w = torch.randn(8, 16, generator=g)
    torch.library.opcheck(ADD, (torch.randn(1200, 8, generator=g), x, w))
    out0 = torch.randn(1200, 8, generator=g)
    for env, ours in (("0", False), ("1", True)):
        monkeypatch.setenv("SPARSEJIT_LINEAR", env)
        xr = x.clone().requires_grad_()
        y = dense_ops.linear_add_(out0.clone() * 1.0, xr, w)
        assert ("LinearAdd" in type(y.grad_fn).__name__) == ours
        torch.testing.assert_close(y, torch.addmm(out0, x, w.t()), rtol=1e-5, atol=1e-4)
    small = dense_ops.linear_add_(out0[:100].clone(), x[:100], w)  # below the row threshold
    torch.testing.assert_close(small, torch.addmm(out0[:100], x[:100], w.t()))


@pytest.mark.parametrize("layer", ["SAGEConv", "GraphConv", "GCNConv", "GATConv",
                                   "TransformerConv", "GINConv", "GINConv-hooked"])
def test_layers_agree_with_either_gemm(layer, monkeypatch):
    """A layer on 1500 nodes (above the row threshold) gives the same outputs and gradients,
    up to rounding, whether its Linears run on torch's GEMM or sparsejit's."""
    g = torch.Generator().manual_seed(11)
    n, f = 1500, 32
    ei = torch.randint(0, n, (2, 9000), generator=g)
    x = torch.randn(n, f, generator=g)
    make = {"SAGEConv": lambda: sj.nn.SAGEConv(f, f), "GraphConv": lambda: sj.nn.GraphConv(f, f),
            "GCNConv": lambda: sj.nn.GCNConv(f, f),
            "GATConv": lambda: sj.nn.GATConv(f, f // 4, heads=4),
            "TransformerConv": lambda: sj.nn.TransformerConv(f, f // 4, heads=4),
            "GINConv": lambda: sj.nn.GINConv(mlp()), "GINConv-hooked": lambda: sj.nn.GINConv(mlp())
            }[layer]

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(f, f), torch.nn.ReLU(), torch.nn.Linear(f, f))

    torch.manual_seed(0)
    mod = make()
    seen = []
    if layer == "GINConv-hooked":  # a hooked MLP is called as it is: the hook sees its input
        mod.nn.register_forward_hook(lambda m, i, o: seen.append(i[0].shape))
    outs = []
    for env in ("0", "1"):
        monkeypatch.setenv("SPARSEJIT_LINEAR", env)
        xi = x.clone().requires_grad_()
        mod.zero_grad(set_to_none=True)
        y = mod(xi, ei)
        y.square().sum().backward()
        outs.append([y.detach(), xi.grad] + [p.grad for p in mod.parameters()])
        names = {type(fn).__name__ for fn in _grad_fns(y)}
        uses_ours = any("sparsejit_linear" in nm or "LinearAdd" in nm for nm in names)
        assert uses_ours == (env == "1" and layer != "GINConv-hooked"), names
    assert seen == ([(n, f)] * 2 if layer == "GINConv-hooked" else [])
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-3)


def _grad_fns(y):
    """Every node of y's autograd graph."""
    todo, seen = [y.grad_fn], set()
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        yield fn
        todo.extend(nxt for nxt, _ in fn.next_functions)


@pytest.mark.parametrize("shape", ["relu-relu", "relu-linear pairs"])
@pytest.mark.parametrize("env", ["0", "1"])
def test_gin_mlp_walk_matches_calling_the_module(env, shape, monkeypatch):
    """GIN's plain Sequential MLP, walked child by child (Linears on the chosen GEMM, a ReLU
    after a Linear in place, a ReLU then a Linear as relu_linear), gives the outputs and
    gradients of calling the module (a no-op hook makes the layer call it as it is); the
    MLP's input is left as it was."""
    monkeypatch.setenv("SPARSEJIT_LINEAR", env)
    g = torch.Generator().manual_seed(13)
    n, f = 1500, 24
    ei = torch.randint(0, n, (2, 8000), generator=g)
    x = torch.randn(n, f, generator=g)
    torch.manual_seed(1)
    nn = torch.nn
    if shape == "relu-relu":
        mlp = nn.Sequential(nn.Linear(f, 32), nn.ReLU(), nn.ReLU(), nn.Linear(32, 16), nn.ReLU())
    else:
        mlp = nn.Sequential(nn.Linear(f, 32), nn.ReLU(), nn.Linear(32, 40), nn.ReLU(inplace=True),
                            nn.Linear(40, 16, bias=False), nn.ReLU())
    walked = sj.nn.GINConv(mlp)
    called = sj.nn.GINConv(torch.nn.Sequential(*[type(m)() if isinstance(m, torch.nn.ReLU)
                                                 else m for m in mlp]))
    called.nn.register_forward_hook(lambda m, i, o: None)
    runs = []
    for layer in (walked, called):
        xi = x.clone().requires_grad_()
        layer.zero_grad(set_to_none=True)
        y = layer(xi, ei)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        runs.append([y.detach(), xi.grad] + [p.grad.clone() for p in layer.parameters()])
        if layer is walked:
            fused = sum("ReluLinear" in type(fn).__name__ for fn in _grad_fns(y))
            assert fused == (2 if env == "1" and shape != "relu-relu" else 0)
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)  # env 1: two GEMMs
