"""Every ``sj.nn`` layer and every ``sparsejit.spconv`` module of the installed wheel under
``torch.compile(fullgraph=True)`` (matching eager) and ``torch.export`` with dynamic sizes
(the exported program run on inputs of another size, matching eager), with only torch and
numpy installed (issue 50: the graph layers imported torch_geometric inside traced code)."""

from __future__ import annotations

import pytest
import torch

from cases import ALL_CASES, NOT_TRACEABLE


def _case(name, request):
    if name in NOT_TRACEABLE:
        request.applymarker(pytest.mark.xfail(strict=True, reason=NOT_TRACEABLE[name]))
    torch.manual_seed(0)
    case = ALL_CASES[name]
    return case, case.make().eval()


@pytest.mark.parametrize("name", list(ALL_CASES))
def test_compiles_with_fullgraph_and_matches_eager(name, request):
    case, model = _case(name, request)
    torch._dynamo.reset()  # every case starts with dynamo's recompile budget untouched
    compiled = torch.compile(model, fullgraph=True)
    for size, seed in [(60, 1), (60, 2)]:  # the second call reuses the compiled graph
        args = case.inputs(size, seed)
        with torch.no_grad():
            torch.testing.assert_close(compiled(*args), model(*args), rtol=case.tol,
                                       atol=case.tol)


@pytest.mark.parametrize("name", list(ALL_CASES))
def test_exports_with_dynamic_sizes(name, request):
    case, model = _case(name, request)
    ep = torch.export.export(model, case.inputs(60, 1), dynamic_shapes=case.dynamic_shapes())
    run = ep.module()
    for size, seed in [(23, 3), (150, 4)]:
        args = case.inputs(size, seed)
        with torch.no_grad():
            torch.testing.assert_close(run(*args), model(*args), rtol=case.tol, atol=case.tol)


def test_compiled_layer_trains_like_eager():
    """Gradients through a compiled graph layer match eager's."""
    case = ALL_CASES["GATConv"]
    torch.manual_seed(0)
    model = case.make()
    x, edge_index = case.inputs(60, 5)
    torch._dynamo.reset()
    grads = []
    for m in (model, torch.compile(model, fullgraph=True)):
        model.zero_grad()
        xg = x.clone().requires_grad_()
        m(xg, edge_index).square().sum().backward()
        grads.append([xg.grad] + [p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
