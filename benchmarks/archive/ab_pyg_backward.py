"""Two backward changes of the PyG-signature layers, each switched on and off inside one
process, steps alternated (the machine is too noisy for separate runs): forward + backward of
one layer, ``out.sum().backward()`` as in bench_pyg_layers.py, medians.

- ``contiguous``: SAGEConv / GraphConv. ``_LinearAdd`` hands `out`'s producer (the
  aggregation) the contiguous gradient it made; before, it handed on the broadcast one, which
  the aggregation's backward copied a second time.
- ``relu_linear``: GINConv. The MLP's ReLU followed by a Linear as one autograd node that
  masks the product's input gradient in place; before, ``relu_`` then ``linear`` (autograd's
  ReLU allocates the masked gradient).

    python3 benchmarks/archive/ab_pyg_backward.py --change relu_linear [--graphs pubmed ...]
        [--features 64 128] [--rounds 30]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
import bench_pyg_layers as B  # noqa: E402
from sparsejit.families.dense import ops as R  # noqa: E402
from sparsejit.families.spmm import layers as L  # noqa: E402
from sparsejit.info import cpu_line  # noqa: E402


def _previous_linear_add_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, dw = R._product_grads(grad, x, weight, need[1], need[2])
    return grad, dx, dw


def _previous_relu_linear(h, weight, bias=None):
    return R.linear(torch.relu_(h), weight, bias)


def switches(change: str):
    """(layers, {"before": apply, "after": apply}): each apply() installs one version."""
    if change == "contiguous":
        now = R._LinearAdd.backward

        def put(fn):
            return lambda: setattr(R._LinearAdd, "backward", staticmethod(fn))
        return ("SAGEConv", "GraphConv"), {"before": put(_previous_linear_add_backward),
                                           "after": put(now)}
    now = L.relu_linear
    return ("GINConv",), {"before": lambda: setattr(L, "relu_linear", _previous_relu_linear),
                          "after": lambda: setattr(L, "relu_linear", now)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--change", choices=("contiguous", "relu_linear"), required=True)
    ap.add_argument("--graphs", nargs="+",
                    default=["pubmed", "powerlaw:n=60000,avg=10,alpha=2.1,seed=1"])
    ap.add_argument("--features", nargs="+", type=int, default=[64, 128])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    names, put = switches(args.change)
    print(f"# {cpu_line()}, {args.threads} threads; change {args.change!r}, {args.rounds} "
          "rounds alternated (the first two dropped), medians")
    try:
        for spec in args.graphs:
            g = B.load_graph(spec)
            for f in args.features:
                x = torch.randn(g.num_nodes, f, requires_grad=True)
                for name, make in B.layers(f):
                    if name not in names:
                        continue
                    torch.manual_seed(0)
                    layer = make(B.sj.nn)
                    ts = {"before": [], "after": []}
                    for r in range(args.rounds):
                        for k in (("before", "after") if r % 2 else ("after", "before")):
                            put[k]()
                            layer.zero_grad(set_to_none=True)
                            x.grad = None
                            t0 = time.perf_counter()
                            B.step(layer, x, g.edge_index)
                            ts[k].append(time.perf_counter() - t0)
                    a, b = (statistics.median(ts[k][2:]) * 1e3 for k in ("before", "after"))
                    print(f"{g.name} F={f} {name}: before {a:.2f} ms, after {b:.2f} ms, "
                          f"after / before {b / a:.3f}", flush=True)
    finally:
        put["after"]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
