"""torch.compile(fullgraph=True) of the drop-in form: a model whose forward takes
(x, edge_index) and calls sparsejit ops on the raw edge_index."""

import torch

import sparsejit as sj


class DropInGNN(torch.nn.Module):
    """Two mean-aggregation layers written the way a PyG user writes them."""

    def __init__(self, fin, hidden, fout):
        super().__init__()
        self.lin1 = torch.nn.Linear(fin, hidden)
        self.lin2 = torch.nn.Linear(hidden, fout)

    def forward(self, x, edge_index):
        h = torch.relu(sj.spmm(edge_index, self.lin1(x), "mean"))
        return sj.spmm(edge_index, self.lin2(h), "sum")


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def test_compiled_edge_index_model_matches_eager():
    torch.manual_seed(0)
    model = DropInGNN(8, 16, 4)
    x = torch.randn(70, 8, requires_grad=True)
    edge_index = torch.randint(0, 70, (2, 400))
    eager = model(x, edge_index)
    eager.square().sum().backward()
    g_eager, gx_eager = _grads(model), x.grad.clone()
    model.zero_grad()
    x.grad = None
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x, edge_index)
    out.square().sum().backward()
    torch.testing.assert_close(out, eager, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x.grad, gx_eager, atol=1e-5, rtol=1e-5)
    for g, ge in zip(_grads(model), g_eager):
        torch.testing.assert_close(g, ge, atol=1e-5, rtol=1e-5)
    # A second graph through the same compiled model (same sizes: no recompile needed).
    other = torch.randint(0, 70, (2, 400))
    torch.testing.assert_close(compiled(x, other), model(x, other), atol=1e-5, rtol=1e-5)


def test_compiled_sddmm_on_edge_index():
    torch.manual_seed(1)
    q, k = torch.randn(30, 2, 4), torch.randn(30, 2, 4)
    edge_index = torch.randint(0, 30, (2, 120))

    def attn(q, k, ei):
        return torch.tanh(sj.sddmm(ei, q, k))

    torch._dynamo.reset()
    got = torch.compile(attn, fullgraph=True)(q, k, edge_index)
    torch.testing.assert_close(got, attn(q, k, edge_index), atol=1e-6, rtol=1e-6)
