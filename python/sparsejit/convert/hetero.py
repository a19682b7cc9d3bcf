"""Edge types grouped into one RGMS call: in a ``to_hetero`` model (a ``torch.fx``
GraphModule) or a ``HeteroConv`` (aggr="sum"), the per-edge-type convolutions of one layer
whose outputs are summed into one node type become one ``sparsejit.rgms`` call, as R-GCN runs
its relations.

For a target type d reached by relations r = 1..R (each from a source type s_r):

* SAGEConv (mean aggregation, no projection or normalisation):
  ``sum_r lin_l_r(mean_{j in N_r(i)} x_j) + lin_r_r(x_i)``;
* GraphConv (sum or mean aggregation, no edge weights):
  ``sum_r lin_rel_r(aggr_{j in N_r(i)} x_j) + lin_root_r(x_i)``;

is ``rgms(A, X, W, reduce, root, bias, x_root)`` with ``X`` the source types' features
stacked, ``A`` every relation's edges (sources offset into ``X``) typed by relation, ``W[r]``
the relation's neighbour weight, ``root = sum_r`` the root weights and ``bias = sum_r`` the
biases: one pass over every edge into d, one root product instead of R. ``mean`` is per
(target, relation), as each layer's own mean. Relations whose layers differ in kind,
configuration or source width are not grouped (each runs its own layer), and that is said in
the report. The layers keep their parameters (the grouped module holds none of its own, so
``state_dict`` keys do not change); a GraphModule's code is rewritten, a HeteroConv gets a
per-instance ``forward`` (for calls ``conv(x_dict, edge_index_dict)``; any other call runs
HeteroConv's own), and :func:`ungroup` puts the originals back.

Measured on SPR (2 threads, F = 64, to_hetero of a 2-layer SAGE model; grouped / one call per
edge type, medians of 11-15 alternated steps): 50k + 50k nodes, R relations of 150k edges
into one type: R = 2 forward 37 / 48 ms, forward + backward 106 / 150 ms; R = 8 73 / 158 and
195 / 368 ms. The bench_accelerate hetero model (100k papers, 50k authors, writes + cites of
1M edges each into papers): forward within noise (122-134 / 122-166 ms), forward + backward
0.83-1.01x (rgms' weight gradient aggregates each relation again, where the layer keeps its
aggregation). ``group_edge_types=True`` (accelerate's default) groups every pass,
``"inference"`` only passes that record no gradient (training runs each relation's layer).
"""

from __future__ import annotations

import copy
import operator
import sys
from typing import List, Optional, Tuple

import torch
from torch import nn

from sparsejit.runtime.caches import LruCache, content_key

_SAVED = "_sparsejit_hetero_graph"  # the GraphModule's graph before grouping, and the names
_PREFIX = "_sparsejit_hetero_group_"
_ADDS = (torch.add, operator.add)
_CACHE = LruCache("convert.hetero_groups", max_entries=32)


def _kind(m: nn.Module) -> Tuple[Optional[str], str]:
    """('sage' / 'graph', "") when `m` (sparsejit's layer or PyG's) is of a groupable kind
    and configuration, else (None, why not)."""
    name = type(m).__name__
    if name == "SAGEConv":
        for attr, want in (("aggr", "mean"), ("normalize", False), ("project", False),
                           ("root_weight", True)):
            if getattr(m, attr, None) != want:
                return None, f"SAGEConv {attr}={getattr(m, attr, None)!r} (grouped: {want!r})"
        return "sage", ""
    if name == "GraphConv":
        aggr = getattr(m, "aggr", None)
        if aggr not in ("add", "sum", "mean"):
            return None, (f"GraphConv aggr={aggr!r} (grouped: sum or mean, which add up over "
                          "relations in one pass)")
        return "graph", ""
    return None, f"{name} (grouped: SAGEConv, GraphConv)"


def _linears(m: nn.Module) -> Tuple[nn.Module, nn.Module]:
    return (m.lin_l, m.lin_r) if type(m).__name__ == "SAGEConv" else (m.lin_rel, m.lin_root)


class HeteroGroup(nn.Module):
    """One target type's relations of one layer as one ``sparsejit.rgms`` call. Holds the
    layers without registering them (their parameters stay where they were)."""

    def __init__(self, layers: List[nn.Module], names: List[str], when: str = "always"):
        super().__init__()
        self.__dict__["layers"] = list(layers)
        self.names = list(names)
        self.when = when  # "inference": the rgms call only where no gradient is recorded
        first = layers[0]
        aggr = getattr(first, "aggr", "mean")
        self.reduce = "sum" if aggr in ("add", "sum") else "mean"

    def extra_repr(self) -> str:
        return f"{', '.join(self.names)}: one rgms (reduce={self.reduce!r}, {self.when})"

    def _structure(self, edge_indices, offsets, n_dst: int, n_src: int):
        from sparsejit.families.rgms.ops import TypedSparseMatrix

        def build():
            ei = torch.cat([e + torch.tensor([[o], [0]], dtype=e.dtype, device=e.device)
                            for e, o in zip(edge_indices, offsets)], 1)
            et = torch.cat([torch.full((e.shape[1],), r, dtype=torch.long, device=e.device)
                            for r, e in enumerate(edge_indices)])
            return TypedSparseMatrix.from_edge_index(ei, (n_src, n_dst), edge_type=et,
                                                     num_relations=len(edge_indices))
        key = content_key(*edge_indices, extra=(tuple(offsets), n_dst, n_src))
        if key is None:
            return build()
        A = _CACHE.get(key)
        if A is None:
            A = build()
            _CACHE.put(key, A)
        return A

    def forward(self, x_src: Tuple[torch.Tensor, ...], x_dst: torch.Tensor,
                edge_indices: Tuple[torch.Tensor, ...]) -> torch.Tensor:
        from sparsejit.families.rgms import ops
        if self.when == "inference" and torch.is_grad_enabled() and (
                any(t.requires_grad for t in (*x_src, x_dst)) or
                any(p.requires_grad for m in self.layers for p in m.parameters())):
            # "inference" and a pass that records a gradient: each relation's own layer,
            # summed as the model did.
            out = None
            for m, xs, ei in zip(self.layers, x_src, edge_indices):
                y = m(xs if xs is x_dst else (xs, x_dst), ei)
                out = y if out is None else out + y
            return out
        # Each distinct source tensor once, in first-seen order.
        distinct: List[torch.Tensor] = []
        offsets = []
        for x in x_src:
            for k, d in enumerate(distinct):
                if d is x:
                    offsets.append(sum(t.shape[0] for t in distinct[:k]))
                    break
            else:
                offsets.append(sum(t.shape[0] for t in distinct))
                distinct.append(x)
        X = distinct[0] if len(distinct) == 1 else torch.cat(distinct, 0)
        A = self._structure(list(edge_indices), offsets, x_dst.shape[0], X.shape[0])
        lins = [_linears(m) for m in self.layers]
        W = torch.stack([nb.weight.t() for nb, _ in lins])
        root = sum(r.weight.t() for _, r in lins)
        biases = [nb.bias for nb, _ in lins if nb.bias is not None]
        bias = sum(biases) if biases else None
        return ops.rgms(A, X, W, reduce=self.reduce, root=root, bias=bias, x_root=x_dst)


def _leaves(node, gm) -> Optional[list]:
    """The call_module nodes a chain of two-argument adds sums, each used only by the chain;
    None when `node` is not such a chain."""
    if node.op == "call_module":
        return [node] if len(node.users) == 1 else None
    if node.op != "call_function" or node.target not in _ADDS or node.kwargs or \
            len(node.args) != 2:
        return None
    out = []
    for a in node.args:
        if not isinstance(a, torch.fx.Node) or (a.op == "call_function" and len(a.users) != 1):
            return None
        sub = _leaves(a, gm)
        if sub is None:
            return None
        out += sub
    return out


def _call(node, gm):
    """(layer, x_src node, x_dst node, edge_index node) of a layer call ``conv(x, ei)``."""
    if node.kwargs or len(node.args) != 2:
        return None
    layer = gm.get_submodule(node.target)
    x, ei = node.args
    if isinstance(x, (tuple, list)):
        if len(x) != 2 or not all(isinstance(t, torch.fx.Node) for t in x):
            return None
        xs, xd = x
    elif isinstance(x, torch.fx.Node):
        xs = xd = x
    else:
        return None
    return layer, xs, xd, ei


def _why_not(calls) -> Optional[str]:
    kinds = [_kind(c[0]) for c in calls]
    for k, why in kinds:
        if k is None:
            return why
    if len({k for k, _ in kinds}) != 1:
        return "layers of different kinds"
    if len({c[2] for c in calls}) != 1:
        return "different target inputs"
    ins = {_linears(c[0])[0].weight.shape[1] for c in calls}
    outs = {_linears(c[0])[0].weight.shape[0] for c in calls}
    if len(ins) != 1 or len(outs) != 1:
        return f"source widths {sorted(ins)} / output widths {sorted(outs)} differ"
    if len({_linears(c[0])[0].weight.dtype for c in calls}) != 1:
        return "different dtypes"
    if len({getattr(c[0], "aggr", None) in ("add", "sum") for c in calls}) != 1:
        return "sum and mean aggregations mixed"
    return None


def group(gm: nn.Module, path: str, report, when: str = "always") -> None:
    """Groups the summed per-edge-type layer calls of GraphModule `gm` in place."""
    if not isinstance(gm, torch.fx.GraphModule) or _SAVED in gm.__dict__:
        return
    saved = copy.deepcopy(gm.graph)
    graph, names = gm.graph, []
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _ADDS:
            continue
        if any(u.op == "call_function" and u.target in _ADDS for u in node.users):
            continue  # an inner add of a longer chain: its outer add is the one
        leaves = _leaves(node, gm)
        if not leaves or len(leaves) < 2:
            continue
        calls = [_call(n, gm) for n in leaves]
        if any(c is None for c in calls):
            continue
        if len({n.target.rpartition(".")[0] for n in leaves}) != 1:
            continue  # not one layer's edge types
        where = f"{path + '.' if path else ''}{leaves[0].target.rpartition('.')[0]}"
        rels = [n.target.rpartition(".")[2] for n in leaves]
        why = _why_not(calls)
        if why is not None:
            report.add_group(f"{where}[{' + '.join(rels)}]", None, why)
            continue
        name = f"{_PREFIX}{len(names)}"
        gm.add_submodule(name, HeteroGroup([c[0] for c in calls], rels, when))
        names.append(name)
        with graph.inserting_before(node):
            new = graph.call_module(name, (tuple(c[1] for c in calls), calls[0][2],
                                           tuple(c[3] for c in calls)))
        node.replace_all_uses_with(new)
        chain = [node]
        while chain:
            n = chain.pop()
            args = [a for a in n.args if isinstance(a, torch.fx.Node)] \
                if n.op == "call_function" else []
            graph.erase_node(n)
            chain += [a for a in args if not a.users and a.op in ("call_function",
                                                                    "call_module")]
        report.add_group(f"{where}[{' + '.join(rels)}]", "one sparsejit.rgms call",
                         f"{len(rels)} relations summed into one node type ({when})")
    if names:
        gm.__dict__[_SAVED] = (saved, names)
        graph.lint()
        gm.recompile()


def ungroup(gm: nn.Module) -> None:
    """Undoes :func:`group`: the original graph, the group modules gone."""
    saved = gm.__dict__.pop(_SAVED, None)
    if saved is None:
        return
    graph, names = saved
    for name in names:
        delattr(gm, name)
    gm.graph = graph
    gm.recompile()


# ---- HeteroConv ----------------------------------------------------------------------------------

_HC = "_sparsejit_hetero_conv_groups"


def _heteroconv_forward(self, *args_dict, **kwargs_dict):
    """HeteroConv.forward with each group's edge types as one rgms call (the others, and any
    call with extra arguments, as HeteroConv runs them)."""
    groups = self.__dict__[_HC]
    if len(args_dict) != 2 or kwargs_dict:
        return type(self).forward(self, *args_dict, **kwargs_dict)
    x_dict, ei_dict = args_dict
    outs: dict = {}
    done = set()
    for dst, (etypes, grp) in groups.items():
        if dst in x_dict and all(e in ei_dict and e[0] in x_dict for e in etypes):
            outs.setdefault(dst, []).append(grp(tuple(x_dict[e[0]] for e in etypes),
                                                x_dict[dst], tuple(ei_dict[e] for e in etypes)))
            done.update(etypes)
    for edge_type, conv in self.convs.items():
        if edge_type in done or edge_type not in ei_dict:
            continue
        src, _, dst = edge_type
        if src == dst and src in x_dict:
            x = x_dict[src]
        elif src in x_dict or dst in x_dict:
            x = (x_dict.get(src, None), x_dict.get(dst, None))
        else:
            continue
        outs.setdefault(dst, []).append(conv(x, ei_dict[edge_type]))
    return {k: v[0] if len(v) == 1 else torch.stack(v).sum(0) for k, v in outs.items()}


def group_heteroconv(m: nn.Module, path: str, report, when: str = "always") -> None:
    """Groups HeteroConv `m`'s edge types per target type (aggr="sum" only)."""
    if _HC in m.__dict__:
        return
    where = path or "(model)"
    if getattr(m, "aggr", None) != "sum":
        report.add_group(where, None, f"HeteroConv aggr={getattr(m, 'aggr', None)!r} "
                         "(grouped: 'sum')")
        return
    by_dst: dict = {}
    for edge_type, conv in m.convs.items():
        by_dst.setdefault(edge_type[2], []).append((edge_type, conv))
    groups = {}
    for dst, members in by_dst.items():
        if len(members) < 2:
            continue
        rels = ["__".join(e) for e, _ in members]
        name = f"{where}[{' + '.join(rels)}]"
        # Calls as (layer, x_src, x_dst, edge_index): only the layers and widths matter here;
        # the target input is one tensor (x_dict[dst]) by construction.
        why = _why_not([(conv, e[0], dst, None) for e, conv in members])
        if why is not None:
            report.add_group(name, None, why)
            continue
        groups[dst] = (tuple(e for e, _ in members),
                       HeteroGroup([conv for _, conv in members], rels, when))
        report.add_group(name, "one sparsejit.rgms call",
                         f"{len(members)} relations summed into one node type ({when})")
    if groups:
        m.__dict__[_HC] = groups
        m.forward = _heteroconv_forward.__get__(m)


def ungroup_heteroconv(m: nn.Module) -> None:
    if m.__dict__.pop(_HC, None) is not None:
        m.__dict__.pop("forward", None)


def is_heteroconv(m: nn.Module) -> bool:
    mod = sys.modules.get("torch_geometric.nn.conv")
    cls = getattr(mod, "HeteroConv", None) if mod is not None else None
    return cls is not None and type(m) is cls
