"""Fuzz case kinds (see worker.py): building SparseMatrix objects (from_csr, from_edge_index,
with_values) from malformed arrays, and the sj.nn layers against float64 dense references."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import sparsejit as sj
from .cases_spmm_api import REDUCES, describe, spmm_check
from .refs import OTHER_DEVICES, VIEWS, Case, Csr, Rand, close, entry_rows, ref_edge_softmax, \
    ref_spmm, view_as


def _spmm_of(build, X, reduce="sum"):
    """Calls build() (a SparseMatrix) and multiplies: errors in building surface here."""
    return lambda: sj.spmm(build(), X, reduce)


def from_csr_malformed(r: Rand) -> Case:
    s = r.csr(rows=r.randint(2, 12), max_deg=4, empty_frac=0.1)
    ip, ix = s.indptr.clone(), s.indices.clone()
    shape = (s.rows, s.cols)
    bad = ["decreasing", "negative_index", "index_beyond_shape", "end_too_large", "end_too_small",
           "start_nonzero", "float_indptr", "bool_indices", "complex_indices", "indptr_2d",
           "empty_indptr", "rows_mismatch", "device_mix", "negative_cols"]
    good = ["noncontiguous", "int16", "lists", "mixed_index_dtypes", "more_cols", "no_shape"]
    kind = r.choice(bad + good)
    nnz = s.nnz
    if kind in ("decreasing", "negative_index", "index_beyond_shape", "start_nonzero") and nnz == 0:
        kind = "end_too_large"
    if kind == "decreasing":  # indptr[2] < indptr[1], or indptr[1] > indptr[2] = nnz
        ip[1:3] = torch.tensor([nnz, 0]) if s.rows >= 3 else torch.tensor([nnz + 1, nnz])
    elif kind == "negative_index":
        ix[r.randint(0, nnz - 1)] = -r.randint(1, 5)
    elif kind == "index_beyond_shape":
        ix[r.randint(0, nnz - 1)] = s.cols + r.randint(0, 3)
    elif kind == "end_too_large":
        ip[-1] = nnz + r.randint(1, 3)
    elif kind == "end_too_small":
        ix = torch.cat([ix, ix.new_zeros(2)])
    elif kind == "start_nonzero":
        ip[0] = 1
    elif kind == "float_indptr":
        ip = ip.float()
    elif kind == "bool_indices":
        ix = ix > 0
    elif kind == "complex_indices":
        ix = ix.to(torch.complex64)
    elif kind == "indptr_2d":
        ip = ip.reshape(1, -1)
    elif kind == "empty_indptr":
        ip = ip[:0]
    elif kind == "rows_mismatch":
        shape = (s.rows + 1, s.cols)
    elif kind == "device_mix":
        ip = ip.to(r.choice(OTHER_DEVICES))
    elif kind == "negative_cols":
        shape = (s.rows, -2)
    elif kind == "noncontiguous":
        ip, ix = view_as(ip, "strided_last"), view_as(ix, r.choice(["strided_rows", "offset"]))
    elif kind == "int16":
        ip, ix = ip.to(torch.int16), ix.to(torch.int16)
    elif kind == "lists":
        ip, ix = ip.tolist(), ix.tolist()
    elif kind == "mixed_index_dtypes":
        ip, ix = ip.int(), ix.long()
    elif kind == "more_cols":
        shape = (s.rows, s.cols + 3)
    X = r.data((max(shape[1], 0), 3), torch.float32)
    if kind == "no_shape":
        shape = None
        X = X[: int(s.indices.max()) + 1 if nnz else 0]
    call = _spmm_of(lambda: sj.SparseMatrix.from_csr(ip, ix, shape=shape), X)
    params = dict(kind=kind, rows=s.rows, cols=s.cols, nnz=nnz)
    if kind in bad:
        return Case("invalid", call, why=f"from_csr: {kind}", params=params)
    ref_csr = Csr(s.indptr, s.indices, s.rows, X.shape[0])
    p = dict(csr=ref_csr, X=X, reduce="sum", values=None, bias=None, act=None, p=0.0, scale=1.0)
    return Case("valid", call, spmm_check(p), f"from_csr: {kind}", params)


def from_edge_index_malformed(r: Rand) -> Case:
    n, e = r.randint(1, 12), r.randint(1, 25)
    ei = r.edge_index(n, e)
    heads = r.choice([None, 1, 2])
    values = None if heads is None else r.data((e,) if heads == 1 else (e, heads), torch.float32)
    num_nodes = n
    bad = ["float", "bool", "shape", "negative", "beyond_num_nodes", "values_length",
           "values_3d", "negative_num_nodes", "values_device"]
    good = ["plain", "int32", "int16", "transposed_view", "no_edges", "num_nodes_larger"]
    kind = r.choice(bad + good)
    if kind == "float":
        ei = ei.double()
    elif kind == "bool":
        ei = ei > 0
    elif kind == "shape":
        ei = ei.t()[: r.choice([1, 3])] if e > 3 else ei[:1]
    elif kind == "negative":
        ei[r.randint(0, 1), r.randint(0, e - 1)] = -1
    elif kind == "beyond_num_nodes":
        ei[r.randint(0, 1), r.randint(0, e - 1)] = n + r.randint(0, 2)
    elif kind == "values_length":
        values = torch.ones(e + r.choice([-1, 1]))
    elif kind == "values_3d":
        values = torch.ones(e, 1, 1)
    elif kind == "negative_num_nodes":
        num_nodes = -1
    elif kind == "values_device":
        values = torch.ones(e, device=r.choice(OTHER_DEVICES))
    elif kind == "int32":
        ei = ei.int()
    elif kind == "int16":
        ei = ei.to(torch.int16)
    elif kind == "transposed_view":
        ei = ei.t().contiguous().t()
    elif kind == "no_edges":
        ei, values = ei[:, :0], None if values is None else values[:0]
    elif kind == "num_nodes_larger":
        num_nodes = n + 3
    Xn = max(num_nodes, 0)
    X = r.data((Xn, heads or 1, 4) if heads == 2 else (Xn, 4), torch.float32)
    build = lambda: sj.SparseMatrix.from_edge_index(ei, num_nodes, values)  # noqa: E731
    params = dict(kind=kind, n=n, edges=e, values=None if values is None else list(values.shape))
    if kind in bad:
        return Case("invalid", _spmm_of(build, X), why=f"from_edge_index: {kind}", params=params)
    src, dst = ei[0].long(), ei[1].long()
    msg = X.double()[src]
    vals = None if values is None else values.double()
    if vals is not None:
        msg = msg * vals.reshape(vals.shape + (1,) * (msg.dim() - vals.dim()))
    ref = torch.zeros_like(X, dtype=torch.float64).index_add(0, dst, msg)
    mag = torch.zeros_like(ref).index_add(0, dst, msg.abs())
    return Case("valid", _spmm_of(build, X), lambda out: close(out, ref, mag, X.dtype),
                f"from_edge_index: {kind}", params)


def with_values_malformed(r: Rand) -> Case:
    s = r.csr(max_deg=4)
    kind = r.choice(["length", "3d", "list", "device", "int_values", "strided", "two_heads"])
    X = r.data((s.cols, 3), torch.float32)
    V = r.data((s.nnz,), torch.float32)
    if kind == "length":
        V = torch.ones(s.nnz + r.choice([1, 2]))
    elif kind == "3d":
        V = V.reshape(s.nnz, 1, 1)
    elif kind == "list":
        V = V.tolist()
    elif kind == "device":
        V = V.to(r.choice(OTHER_DEVICES))
    elif kind == "int_values":
        V = V.long()
    elif kind == "strided":
        V = view_as(V, r.choice(VIEWS))
    elif kind == "two_heads":
        V = r.data((s.nnz, 2), torch.float32)
    call = lambda: sj.spmm(s.matrix().with_values(V), X)  # noqa: E731
    if kind != "strided":
        return Case("invalid", call, why=f"with_values: {kind}", params=dict(kind=kind, nnz=s.nnz))
    p = dict(csr=s, X=X, reduce="sum", values=V, bias=None, act=None, p=0.0, scale=1.0)
    return Case("valid", call, spmm_check(p), "with_values: strided", describe(p))


# ---- nn layers ---------------------------------------------------------------------------------

# Layers round their dense intermediates (x W) to the layer dtype: looser than the ops.
_LAYER_SLACK = {torch.float64: 10.0, torch.float32: 10.0, torch.float16: 200.0,
                torch.bfloat16: 1000.0}


def _graph(r: Rand, n=None):
    n = n or r.randint(1, 14)
    e = r.randint(0, 3 * n)
    ei = r.edge_index(n, e)
    return n, ei, sj.SparseMatrix.from_edge_index(ei, n)


def _layer_case(r: Rand, name, build_layer, forward, reference):
    dtype = r.choice([torch.float32, torch.float64, torch.float16])
    n, ei, A = _graph(r)
    cin = r.randint(1, 6)
    torch.manual_seed(r.randint(0, 2**31))
    layer = build_layer(cin).to(dtype)
    x = r.data((n, cin), dtype)
    kind = r.choice(["valid", "valid", "in_channels", "rows", "x_dtype"])
    params = dict(layer=name, kind=kind, n=n, edges=ei.shape[1], dtype=str(dtype))
    if kind == "in_channels":
        x = r.data((n, cin + 1), dtype)
    elif kind == "rows":
        x = r.data((n + 2, cin), dtype)
    elif kind == "x_dtype":
        x = x.to(torch.float64 if dtype != torch.float64 else torch.float32)
    call = lambda: forward(layer, x, A)  # noqa: E731
    if kind != "valid":
        return Case("invalid", call, why=f"{name}: {kind}", params=params)
    ref, mag = reference(layer, x, A)
    mag = mag * _LAYER_SLACK[dtype]
    return Case("valid", call, lambda out: close(out, ref, mag, dtype), f"{name} forward", params,
                f16=dtype == torch.float16)


def _lin(lin, x, absolute=False):
    w = lin.weight.double()
    xd = x.double()
    out = xd.abs() @ w.abs().t() if absolute else xd @ w.t()
    if lin.bias is not None:
        out = out + (lin.bias.double().abs() if absolute else lin.bias.double())
    return out


def gcn_layer(r: Rand) -> Case:
    def reference(layer, x, A):
        n = A.shape[0]
        dense = torch.zeros(n, n, dtype=torch.float64)
        ones = torch.ones(A.nnz, dtype=torch.float64)
        dense.index_put_((A.row_indices(), A.indices.long()), ones, accumulate=True)
        # PyG's gcn_norm without edge weights: add_remaining_self_loops drops the existing
        # self-loops (duplicates included) and adds one of weight 1 per node.
        torch.diagonal(dense).fill_(1.0)
        dinv = dense.sum(1).pow(-0.5)
        a_hat = dinv[:, None] * dense * dinv[None, :]
        b = layer.bias.double() if layer.bias is not None else 0
        babs = layer.bias.double().abs() if layer.bias is not None else 0
        return a_hat @ _lin(layer.lin, x) + b, a_hat.abs() @ _lin(layer.lin, x, True) + babs

    def forward(layer, x, A):
        return layer(x, A)

    return _layer_case(r, "GCNConv", lambda c: sj.nn.GCNConv(c, r.randint(1, 5)), forward,
                       reference)


def sage_layer(r: Rand) -> Case:
    aggr = r.choice(REDUCES + ("prod",))

    def reference(layer, x, A):
        red = ref_spmm(A.indptr, A.indices, None, x, aggr)[0]
        red_abs = ref_spmm(A.indptr, A.indices, None, x, aggr, absolute=True)
        ref = _lin(layer.lin_l, red) + _lin(layer.lin_r, x)
        return ref, _lin(layer.lin_l, red_abs, True) + _lin(layer.lin_r, x, True)

    if aggr == "prod":  # rejected by the constructor, as PyG's unknown aggregations are
        cin = r.randint(1, 5)
        return Case("invalid", lambda: sj.nn.SAGEConv(cin, 2, aggr=aggr),
                    why="SAGEConv(aggr='prod')", params=dict(layer="SAGEConv", aggr=aggr))
    case = _layer_case(r, "SAGEConv", lambda c: sj.nn.SAGEConv(c, r.randint(1, 5), aggr=aggr),
                       lambda layer, x, A: layer(x, A), reference)
    case.params["aggr"] = aggr
    return case


def gat_layer(r: Rand) -> Case:
    heads, cout = r.randint(1, 3), r.randint(1, 4)

    def reference(layer, x, A):
        n = A.shape[0]
        h = _lin(layer.lin, x).view(n, heads, cout)
        a_src = (h * layer.att_src.double()).sum(-1)
        a_dst = (h * layer.att_dst.double()).sum(-1)
        row, col = entry_rows(A.indptr), A.indices.long()
        logits = F.leaky_relu(a_dst[row] + a_src[col], layer.negative_slope)
        alpha = ref_edge_softmax(A.indptr, logits)
        out = torch.zeros(n, heads, cout, dtype=torch.float64)
        out = out.index_add(0, row, alpha[..., None] * h[col])
        mag = torch.zeros_like(out).index_add(0, row, alpha[..., None] * h[col].abs())
        b = layer.bias.double()
        return out.reshape(n, -1) + b, mag.reshape(n, -1) + b.abs() + 1e-3

    return _layer_case(r, "GATConv", lambda c: sj.nn.GATConv(c, cout, heads=heads, add_self_loops=False),
                       lambda layer, x, A: layer(x, A), reference)


BUILD_CASES = [from_csr_malformed, from_edge_index_malformed, with_values_malformed, gcn_layer,
               sage_layer, gat_layer]
