"""Attention recognised inside a PyG layer's ``message``: scores that are a function of both
endpoints, a softmax over each target's incoming edges, and the softmax-weighted gather, run
as one fused sparsejit attention call (SDDMM + edge softmax + SpMM in one pass over the CSR,
no ``[E, H, C]`` tensor in the forward or the backward).

Mechanism: the layer's ``message`` is traced once by ``torch.fx`` (PyG's ``softmax`` a leaf);
the graph must have this shape, up to head-dimension reshapes:

* the message returns ``V_j * w`` (either order): ``V_j`` computed from source-gathered
  arguments (``*_j``) only, ``w`` the output of ``softmax(s, index, ptr, size_i)``;
* the score ``s`` is either **additive**, ``leaky_relu(t, slope)`` (or ``t``) where ``t`` is a
  sum of terms each computed from target-gathered (``*_i``) or source-gathered arguments only,
  or ``(cat([A_i, B_j], -1) * P).sum(-1)`` with ``P`` a parameter (GAT's form, written as one
  concatenation); terms (or concatenated parts) computed from the message's per-edge inputs
  alone (``edge_attr``) are computed per edge, as in PyG, and passed as the fused call's
  edge logits -> :func:`sparsejit.gat_attention`; **GATv2's** ``(leaky_relu(X_i + Y_j)
  * P).sum(-1)`` -> :func:`sparsejit.gatv2_attention` (no ``[E, H, C]`` tensor either); or
  a **dot product**
  ``c * (Q_i * K_j).sum(-1)`` (``c`` a number, a parameter, or a division by a number;
  AGNN's and transformer-style scores) -> :func:`sparsejit.sparse_attention`.

Everything computed from one side only is *hoisted*: evaluated once per node instead of once
per edge (a copy of that part of the traced graph, with the layer's own parameters and
submodules, so gradients reach them). Only row-local operations may be hoisted (elementwise
arithmetic and activations, ``Linear``, reshapes that keep the node dimension, reductions
and concatenations over other dimensions); anything else leaves the layer on the per-edge
path. The first eager call checks the fused result against the per-edge path (PyG's message
with sparsejit's softmax and aggregation) on the same inputs; a mismatch, or a call the fused
form cannot take (a sparse adjacency, ``ptr``, hooks, explain, node_dim other than 0), keeps
the per-edge path, with a warning for the mismatch. Under ``torch.compile`` a layer that has
not had its eager check yet runs the per-edge path.

Dropout on the weights (``F.dropout(softmax(...), p, self.training)``) becomes the fused
call's dropout in training: sparsejit draws its own mask, so a training step's result equals
PyG's in distribution, not bit for bit (the first call's check runs both without dropout).
Not recognised (left on the per-edge path, reported): edge inputs mixed with node features
in a score term, dropout anywhere else, a message that otherwise branches on ``self.training``, aggregations other
than ``add``.
"""

from __future__ import annotations

import math
import operator
import sys
import types
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import fx, nn

from sparsejit.convert import edge_path as ep
from sparsejit.convert import message_passing as mp

FORM = "_sparsejit_attention"  # instance attribute: the recognised AttentionForm
_HOOKS = mp._HOOKS  # PyG hooks: a layer with any keeps PyG's own calls
_META = mp.SPECIAL  # message arguments that are neither node features nor per-edge inputs

# row-local operations a hoisted (one-side) expression may use
_ELEMENTWISE_FN = {operator.add, operator.sub, operator.mul, operator.truediv, operator.neg,
                   torch.add, torch.sub, torch.mul, torch.div, torch.tanh, torch.sigmoid,
                   torch.exp, torch.relu, torch.abs, F.relu, F.leaky_relu, F.elu, F.gelu,
                   F.silu, F.softplus, torch.sqrt, torch.rsqrt, torch.square}
_ELEMENTWISE_METHOD = {"add", "sub", "mul", "div", "tanh", "sigmoid", "exp", "relu", "abs",
                       "neg", "sqrt", "rsqrt", "square", "contiguous", "float", "double",
                       "to", "type_as"}
_ROW_MODULES = (nn.Linear, nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh,
                nn.Sigmoid, nn.Identity)


class Unsupported(Exception):
    """The layer's message is not a recognised attention; says why."""


@dataclass
class _Piece:
    """One term of an additive score: ``value`` summed over its last dimension against the
    slice ``[lo, lo + width)`` of parameter ``weight`` (``weight`` None: the value itself)."""

    side: str                      # "i" (targets), "j" (sources) or "e" (per-edge inputs)
    node: str                      # output name in that side's module
    weight: Optional[str] = None   # output name in the constants' module
    order: int = 0                 # position in its concatenation (for the slice offset)
    group: int = -1                # which concatenation (-1: none)


@dataclass
class AttentionForm:
    kind: str                       # "additive", "v2" or "dot"
    side_i: fx.GraphModule          # target side: outputs by name
    side_j: fx.GraphModule          # source side
    consts: fx.GraphModule          # parameters and constants the score uses
    args_i: Tuple[str, ...]         # message arguments the target side reads (x_i, ...)
    args_j: Tuple[str, ...]
    value: str                      # output name of V in side_j
    pieces: List[_Piece] = field(default_factory=list)   # additive
    slope: float = 1.0                                     # additive, v2
    query: str = ""                 # dot, v2: output of side_i
    key: str = ""                   # dot, v2: output of side_j
    coeff: List[Tuple[str, object]] = field(default_factory=list)  # dot: ("mul"|"div", x)
    update_args: Tuple[str, ...] = ()
    dropout: float = 0.0            # on the weights, in training (sparsejit's own mask)
    side_e: Optional[fx.GraphModule] = None  # additive: score terms of the per-edge inputs
    args_e: Tuple[str, ...] = ()
    verified: bool = False
    failed: str = ""

    def describe(self) -> str:
        if self.kind == "v2":
            return f"GATv2 scores, leaky_relu({self.slope:g}) -> sj.gatv2_attention"
        if self.kind == "dot":
            return "dot-product scores -> sj.sparse_attention"
        return "additive scores" + (f", leaky_relu({self.slope:g})" if self.slope != 1.0
                                    else "") + " -> sj.gat_attention"


# ---- recognition ---------------------------------------------------------------------------

def _message_params(m) -> List[str]:
    return list(m.inspector.get_param_names("message"))


def _trace(m: nn.Module, params: List[str]) -> Tuple[nn.Module, fx.Graph]:
    """The message as an fx graph over a wrapper whose submodule ``layer`` is `m`."""
    fn = getattr(type(m).message, "__func__", type(m).message)
    leaves = tuple(f for f in {ep.softmax, ep._pyg_softmax()} if f is not None)
    names = ep._softmax_names(fn)
    if not names:
        raise Unsupported("its message calls no softmax by a module-level name")
    if not all(p.isidentifier() for p in params):
        raise Unsupported(f"message parameters {params}")
    body = f"def forward(self, {', '.join(params)}):\n" \
           f"    return self.layer.message({', '.join(f'{p}={p}' for p in params)})\n"
    ns: Dict[str, object] = {}
    exec(body, ns)  # noqa: S102 - a signature built from the inspector's parameter names
    wrapper_cls = type("_Message", (nn.Module,), {"forward": ns["forward"]})
    root = wrapper_cls()
    root.layer = m
    codes = []
    graph = None
    was = m.training
    try:
        for mode in (True, False):
            m.training = mode
            tracer = fx.Tracer(autowrap_modules=(math, sys.modules[fn.__module__]),
                               autowrap_functions=leaves)
            try:
                graph = tracer.trace(root, concrete_args={"ptr": None} if "ptr" in params
                                     else None)
            except Exception as e:  # noqa: BLE001 - anything fx cannot trace
                raise Unsupported(f"torch.fx cannot trace its message ({type(e).__name__}: "
                                  f"{str(e).splitlines()[0][:120] if str(e) else ''})")
            codes.append(_code_without_dropout_mode(root, graph))
    finally:
        m.training = was
    if codes[0] != codes[1]:
        raise Unsupported("its message depends on self.training other than by dropout")
    return root, graph


def _dropout_parts(n: fx.Node) -> Optional[Tuple[object, object]]:
    """(p, training) of a ``F.dropout(x, p, training)`` node, else None."""
    if n.op != "call_function" or n.target is not F.dropout:
        return None
    args = dict(zip(("input", "p", "training", "inplace"), n.args))
    args.update(n.kwargs)
    return args.get("p", 0.5), args.get("training", True)


def _code_without_dropout_mode(root: nn.Module, graph: fx.Graph) -> str:
    """The graph's code with every ``F.dropout``'s training flag left out (the one part of a
    message that may follow ``self.training``; :func:`_match` allows it on the weights)."""
    g = fx.Graph()
    env: Dict[fx.Node, fx.Node] = {}
    for n in graph.nodes:
        env[n] = g.node_copy(n, lambda a: env[a])
        if _dropout_parts(n) is not None:
            env[n].args = env[n].args[:2]
            env[n].kwargs = {k: v for k, v in env[n].kwargs.items() if k != "training"}
    return fx.GraphModule(root, g).code


def _classes(graph: fx.Graph) -> Dict[fx.Node, str]:
    """Each node's dependence: "c" (constants, parameters), "i" / "j" (one side's gathered
    arguments only), "x" (the message's other, per-edge inputs only), "m" (index, ptr,
    sizes), "e" (per edge: more than one of those, or a softmax)."""
    cls: Dict[fx.Node, str] = {}
    for n in graph.nodes:
        if n.op == "placeholder":
            name = str(n.target)
            base = name.rstrip("0123456789").rstrip("_") if name[-1:].isdigit() else name
            cls[n] = "m" if base in _META else name[-1] if name.endswith(("_i", "_j")) \
                else "x"
        elif n.op == "get_attr":
            cls[n] = "c"
        elif n.op == "output":
            continue
        else:
            deps = {cls[a] for a in n.all_input_nodes}
            sides = deps & {"i", "j", "x"}
            if n.op == "call_function" and _is_softmax(n) or "e" in deps or len(sides) > 1:
                cls[n] = "e"
            elif "m" in deps:
                cls[n] = "m"
            else:
                cls[n] = next(iter(sides)) if sides else "c"
    return cls


def _is_softmax(n: fx.Node) -> bool:
    return n.op == "call_function" and n.target in (ep.softmax, ep._pyg_softmax())


def _dim_arg(n: fx.Node, pos: int, default=None):
    if len(n.args) > pos:
        return n.args[pos]
    return n.kwargs.get("dim", default)


def _row_local(n: fx.Node, root: nn.Module) -> bool:
    """Whether `n` acts on each node's row alone (so it may run per node)."""
    if n.op in ("placeholder", "get_attr"):
        return True
    if n.op == "call_module":
        return isinstance(root.get_submodule(n.target), _ROW_MODULES)
    if n.op == "call_function":
        if n.target in _ELEMENTWISE_FN:
            return True
        if n.target is torch.cat:
            d = _dim_arg(n, 1, 0)
            return isinstance(d, int) and d != 0
        if n.target is operator.getitem:
            idx = n.args[1]
            idx = idx if isinstance(idx, tuple) else (idx,)
            return len(idx) > 0 and (idx[0] is Ellipsis and len(idx) > 1 or
                                     idx[0] == slice(None))
        return False
    if n.op == "call_method":
        if n.target in _ELEMENTWISE_METHOD:
            return True
        if n.target in ("view", "reshape"):
            shape = n.args[1:] if not isinstance(n.args[1], (tuple, list)) else n.args[1]
            return len(shape) > 0 and shape[0] == -1 and all(isinstance(s, int) for s in shape)
        if n.target in ("sum", "mean", "unsqueeze", "squeeze", "softmax", "log_softmax"):
            d = _dim_arg(n, 1)
            return isinstance(d, int) and d != 0 and (n.target != "unsqueeze" or d != 0)
        if n.target in ("narrow", "select"):
            d = _dim_arg(n, 1)
            return isinstance(d, int) and d != 0
        return False
    return False


def _strip_shape(n: fx.Node) -> fx.Node:
    while n.op == "call_method" and n.target in ("unsqueeze", "squeeze", "view", "reshape",
                                                 "contiguous") and \
            isinstance(n.args[0], fx.Node):
        n = n.args[0]
    return n


def _is_mul(n) -> bool:
    return isinstance(n, fx.Node) and (n.op == "call_function" and n.target in (
        operator.mul, torch.mul) or n.op == "call_method" and n.target == "mul")


def _is_add(n) -> bool:
    return isinstance(n, fx.Node) and (n.op == "call_function" and n.target in (
        operator.add, torch.add) and not n.kwargs or n.op == "call_method" and
        n.target == "add" and not n.kwargs)


def _last_dim_sum(n: fx.Node) -> Optional[fx.Node]:
    """The summed operand of ``x.sum(-1)`` / ``torch.sum(x, -1)`` (dim -1 or dim=-1)."""
    if n.op == "call_method" and n.target == "sum" or \
            n.op == "call_function" and n.target is torch.sum:
        d = _dim_arg(n, 1)
        if d == -1 and not n.kwargs.get("keepdim", False) and isinstance(n.args[0], fx.Node):
            return n.args[0]
    return None


def _match(graph: fx.Graph, root: nn.Module) -> dict:
    cls = _classes(graph)
    out = next(n for n in graph.nodes if n.op == "output")
    msg = out.args[0]
    if not _is_mul(msg):
        raise Unsupported("its message does not return a product of a gathered value and "
                          "attention weights")
    a, b = msg.args[:2]
    value, weights = (a, b) if cls.get(a) == "j" else (b, a)
    if cls.get(value) != "j" or not isinstance(weights, fx.Node):
        raise Unsupported("the weighted value is not computed from source rows alone")
    sm = _strip_shape(weights)
    drop = _dropout_parts(sm)
    found: dict = dict(value=value, dropout=0.0)
    if drop is not None:
        if not isinstance(drop[0], (int, float)) or not 0.0 <= drop[0] < 1.0:
            raise Unsupported(f"dropout p={drop[0]!r} on the weights is not a number in [0, 1)")
        found["dropout"] = float(drop[0])
        sm = _strip_shape(sm.args[0])
    if not _is_softmax(sm):
        raise Unsupported("the weights are not softmax(score, index, ...)")
    sm_args = dict(zip(("src", "index", "ptr", "num_nodes", "dim"), sm.args))
    sm_args.update(sm.kwargs)
    idx = sm_args.get("index")
    if not (isinstance(idx, fx.Node) and idx.op == "placeholder" and idx.target == "index") \
            or sm_args.get("ptr") is not None and not (
                isinstance(sm_args["ptr"], fx.Node) and sm_args["ptr"].target == "ptr") \
            or sm_args.get("dim", 0) != 0:
        raise Unsupported("its softmax is not over the message's index")
    score = _strip_shape(sm_args["src"])
    slope = 1.0
    if score.op == "call_function" and score.target is F.leaky_relu:
        slope = score.args[1] if len(score.args) > 1 else score.kwargs.get("negative_slope",
                                                                            0.01)
        score = _strip_shape(score.args[0])
        if not isinstance(slope, (int, float)):
            raise Unsupported("leaky_relu's slope is not a number")
    v2 = _match_v2(score, cls) if slope == 1.0 else None
    dot = _match_dot(score, cls) if v2 is None else None
    if v2 is not None:
        found.update(kind="v2", **v2)
    elif dot is not None:
        if slope != 1.0:
            raise Unsupported("an activation on a dot-product score")
        found.update(kind="dot", **dot)
    else:
        found.update(kind="additive", slope=float(slope), pieces=_match_additive(score, cls))
    # every hoisted node must be row-local
    hoisted = [n for n in graph.nodes if cls.get(n) in ("i", "j")]
    bad = [n for n in hoisted if not _row_local(n, root)]
    if bad:
        raise Unsupported(f"{bad[0].format_node()} may not run per node")
    return found


def _match_v2(score: fx.Node, cls) -> Optional[dict]:
    """GATv2's ``(leaky_relu(X_i + Y_j, slope) * P).sum(-1)`` (P a parameter)."""
    inner = _last_dim_sum(score)
    if inner is None or not _is_mul(inner) or len(inner.args) != 2:
        return None
    x, y = inner.args
    act, w = (x, y) if cls.get(y) == "c" else (y, x)
    if cls.get(w) != "c" or not isinstance(act, fx.Node) or act.op != "call_function" or \
            act.target is not F.leaky_relu:
        return None
    slope = act.args[1] if len(act.args) > 1 else act.kwargs.get("negative_slope", 0.01)
    s = act.args[0]
    if not isinstance(slope, (int, float)) or not _is_add(s) or len(s.args) != 2:
        return None
    sides = {cls.get(a): a for a in s.args}
    if set(sides) != {"i", "j"}:
        return None
    return dict(query=sides["i"], key=sides["j"], att=w, slope=float(slope))


def _match_dot(score: fx.Node, cls) -> Optional[dict]:
    coeff = []
    n = score
    while True:  # peel  c * t,  t * c,  t / c
        if _is_mul(n) and len(n.args) == 2:
            x, y = n.args
            if cls.get(x, "c") == "c" and isinstance(y, fx.Node) and cls.get(y) == "e":
                coeff.append(("mul", x))
                n = y
                continue
            if cls.get(y, "c") == "c" and isinstance(x, fx.Node) and cls.get(x) == "e":
                coeff.append(("mul", y))
                n = x
                continue
        if isinstance(n, fx.Node) and n.op == "call_function" and \
                n.target in (operator.truediv, torch.div) and isinstance(n.args[0], fx.Node) \
                and isinstance(n.args[1], (int, float)) and not n.kwargs:
            coeff.append(("div", n.args[1]))
            n = n.args[0]
            continue
        break
    inner = _last_dim_sum(_strip_shape(n)) if isinstance(n, fx.Node) else None
    if inner is None or not _is_mul(inner) or len(inner.args) != 2:
        return None
    x, y = inner.args
    sides = {cls.get(x): x, cls.get(y): y}
    if set(sides) != {"i", "j"}:
        return None
    return dict(query=sides["i"], key=sides["j"], coeff=coeff)


def _match_additive(score: fx.Node, cls) -> List[tuple]:
    """Terms (side, node, weight node, order, group) whose sum is the score."""
    terms, todo = [], [score]
    while todo:
        n = _strip_shape(todo.pop())
        if _is_add(n) and len(n.args) == 2 and all(isinstance(a, fx.Node) for a in n.args):
            todo.extend(n.args)
            continue
        if cls.get(n) in ("i", "j", "x"):
            terms.append(("e" if cls[n] == "x" else cls[n], n, None, 0, -1))
            continue
        inner = _last_dim_sum(n)
        if inner is not None and _is_mul(inner) and len(inner.args) == 2:
            x, y = inner.args
            cat, w = (x, y) if cls.get(y) == "c" else (y, x)
            if cls.get(w) == "c" and isinstance(cat, fx.Node) and cat.op == "call_function" \
                    and cat.target is torch.cat and _dim_arg(cat, 1, 0) == -1 and \
                    all(cls.get(p) in ("i", "j", "x") for p in cat.args[0]):
                group = id(cat)
                terms.extend(("e" if cls[p] == "x" else cls[p], p, w, k, group)
                             for k, p in enumerate(cat.args[0]))
                continue
        raise Unsupported(f"score term {n.format_node() if isinstance(n, fx.Node) else n} "
                          "is neither one side's (or the edge inputs') nor (cat(..) * P).sum(-1)")
    return terms


def _extract(root: nn.Module, graph: fx.Graph, outputs: Dict[str, fx.Node]
             ) -> Tuple[fx.GraphModule, Tuple[str, ...]]:
    """A GraphModule computing `outputs` (name -> node) from their placeholder ancestors; it
    shares the layer's parameters and submodules. Returns it and its argument names."""
    need = set()
    todo = [n for n in outputs.values() if isinstance(n, fx.Node)]
    while todo:
        n = todo.pop()
        if n not in need:
            need.add(n)
            todo.extend(n.all_input_nodes)
    g = fx.Graph()
    env: Dict[fx.Node, fx.Node] = {}
    args = []
    for n in graph.nodes:
        if n in need:
            env[n] = g.node_copy(n, lambda a: env[a])
            if n.op == "placeholder":
                args.append(n.target)
    g.output({k: env[v] if isinstance(v, fx.Node) else v for k, v in outputs.items()})
    return fx.GraphModule(root, g), tuple(args)


def probe(m: nn.Module) -> AttentionForm:
    """The AttentionForm of layer `m`'s message, or Unsupported with the reason."""
    MP = ep._pyg_class("torch_geometric.nn.conv.message_passing", "MessagePassing")
    cls = type(m)
    if MP is None or not isinstance(m, MP):
        raise Unsupported("not a MessagePassing layer")
    if not isinstance(m.aggr, str) or m.aggr not in ("add", "sum"):
        raise Unsupported(f"aggr={m.aggr!r} (softmax-weighted sums only)")
    if cls.aggregate is not MP.aggregate or \
            "propagate" in cls.__dict__ and cls.__dict__["propagate"] is not \
            getattr(cls, "_jinja_propagate", None):
        raise Unsupported("it overrides aggregate() or propagate()")
    if m.flow != "source_to_target":
        raise Unsupported(f"flow={m.flow!r}")
    params = _message_params(m)
    insp = m.inspector
    update_args = tuple(insp.get_param_names("update"))
    if any(a in _META or a.endswith(("_i", "_j")) for a in update_args):
        raise Unsupported(f"update() takes {update_args}")
    root, graph = _trace(m, params)
    found = _match(graph, root)
    side = {"i": {}, "j": {"value": found["value"]}, "e": {}}
    consts: Dict[str, fx.Node] = {}
    pieces = []
    if found["kind"] == "v2":
        side["i"]["query"] = found["query"]
        side["j"]["key"] = found["key"]
        consts["att"] = found["att"]
    elif found["kind"] == "dot":
        side["i"]["query"] = found["query"]
        side["j"]["key"] = found["key"]
        coeff = []
        for k, (op, c) in enumerate(found["coeff"]):
            if isinstance(c, fx.Node):
                consts[f"c{k}"] = c
                coeff.append((op, f"c{k}"))
            else:
                coeff.append((op, float(c)))
    else:
        groups: Dict[int, int] = {}
        for k, (s, node, w, order, group) in enumerate(found["pieces"]):
            side[s][f"p{k}"] = node
            wname = None
            if w is not None:
                wname = f"w{k}"
                consts[wname] = w
            pieces.append(_Piece(s, f"p{k}", wname, order, groups.setdefault(group,
                                                                            len(groups))))
    gi, args_i = _extract(root, graph, side["i"])
    gj, args_j = _extract(root, graph, side["j"])
    ge, args_e = _extract(root, graph, side["e"])
    gc, args_c = _extract(root, graph, consts)
    if args_c:
        raise Unsupported("the score's constants read message arguments")
    form = AttentionForm(found["kind"], gi, gj, gc, args_i, args_j, "value", pieces,
                         found.get("slope", 1.0), "query", "key",
                         coeff if found["kind"] == "dot" else [],
                         update_args if cls.update is not MP.update else (),
                         found["dropout"], ge, args_e)
    return form


def install(m: nn.Module) -> AttentionForm:
    """Recognises `m`'s attention and puts the per-edge path under it (its fallback)."""
    form = probe(m)
    ep.install(m)
    m.__dict__[FORM] = form
    m.__dict__["propagate"] = types.MethodType(propagate, m)
    return form


def uninstall(m: nn.Module) -> None:
    if m.__dict__.pop(FORM, None) is not None:
        m.__dict__.pop("propagate", None)


def installed(m: nn.Module) -> bool:
    return FORM in m.__dict__


# ---- the call ------------------------------------------------------------------------------

def _per_edge(self, edge_index, size, kwargs):
    return ep._active_propagate(self, edge_index, size=size, **kwargs)


def _sides(form: AttentionForm, kwargs, node_dim: int) -> Optional[Tuple[dict, dict]]:
    """The node-level tensors each side reads: ``x_j`` from ``x`` (or ``x[0]``), ``x_i``
    from ``x`` (or ``x[1]``); None unless PyG gathers each along its first dimension."""
    got = ({}, {})
    for k, (names, pick) in enumerate(((form.args_i, 1), (form.args_j, 0))):
        for a in names:
            data = kwargs.get(a[:-2])
            if isinstance(data, (tuple, list)):
                data = data[pick] if len(data) == 2 else None
            if not isinstance(data, torch.Tensor) or data.dim() < 1 or \
                    node_dim % data.dim() != 0:
                return None
            got[k][a] = data
    return got


def _heads(t: torch.Tensor, n: int) -> Optional[torch.Tensor]:
    """A score term as ``[n, heads]`` (None when its rows are not the n nodes / edges)."""
    if t.dim() == 0 or t.shape[0] != n:
        return None
    return t.unsqueeze(1) if t.dim() == 1 else t.flatten(1)


def _fused(self, form: AttentionForm, edge_index, size, kwargs,
           dropout: float) -> Optional[torch.Tensor]:
    from sparsejit.families.attention.ops import (gat_attention, gatv2_attention,
                                                   sparse_attention)
    from sparsejit.families.spmm import graph as G
    sides = _sides(form, kwargs, self.node_dim)
    if sides is None:
        return None
    in_i, in_j = sides
    x_dst = next(iter(in_i.values()), None)
    if x_dst is None:  # no target-side argument: a pair's second tensor counts the targets
        data = kwargs.get(form.args_j[0][:-2])
        x_dst = data[1] if isinstance(data, (tuple, list)) and \
            isinstance(data[1], torch.Tensor) else None
    n_src, n_dst = mp.node_counts(next(iter(in_j.values())), x_dst, size)
    if any(t.shape[0] != n_dst for t in in_i.values()) or \
            any(t.shape[0] != n_src for t in in_j.values()):
        return None
    vi = form.side_i(**in_i)
    vj = form.side_j(**in_j)
    cs = form.consts()
    V = vj["value"]
    if V.shape[0] != n_src:
        return None
    E = edge_index.shape[1]
    in_e = {a: kwargs.get(a) for a in form.args_e}
    if any(not isinstance(t, torch.Tensor) or t.dim() < 1 or t.shape[0] != E
           for t in in_e.values()):
        return None
    edges = G.edges_of(edge_index, (n_src, n_dst))
    A, perm = G.structure(edges)[:2]
    heads = V.shape[1] if V.dim() == 3 else 1
    if form.kind == "v2":
        q, k = vi["query"], vj["key"]
        if q.shape[1:] != k.shape[1:] or q.dim() not in (2, 3):
            return None
        att = cs["att"].reshape(q.shape[1] if q.dim() == 3 else 1, q.shape[-1])
        out = gatv2_attention(A, q, k, att, V, negative_slope=form.slope, dropout=dropout)
    elif form.kind == "dot":
        q, k = vi["query"], vj["key"]
        for op, c in form.coeff:
            c = cs[c] if isinstance(c, str) else c
            q = q * c if op == "mul" else q / c
        out = sparse_attention(A, q, k, V, scale=1.0, dropout=dropout)
    else:
        a = {"i": None, "j": None, "e": None}
        ve = form.side_e(**in_e) if form.args_e else {}
        offsets: Dict[int, int] = {}
        for p in sorted(form.pieces, key=lambda p: (p.group, p.order)):
            t = {"i": vi, "j": vj, "e": ve}[p.side][p.node]
            n = {"i": n_dst, "j": n_src, "e": E}[p.side]
            if p.weight is not None:
                lo = offsets.get(p.group, 0)
                w = t.shape[-1]
                offsets[p.group] = lo + w
                t = (t * cs[p.weight].narrow(-1, lo, w)).sum(-1)
            t = _heads(t, n)
            if t is None:
                return None
            a[p.side] = t if a[p.side] is None else a[p.side] + t
        a_dst = a["i"] if a["i"] is not None else V.new_zeros(n_dst, 1)
        a_src = a["j"] if a["j"] is not None else V.new_zeros(n_src, 1)
        if a_dst.shape[1] != heads or a_src.shape[1] != heads:
            if {a_dst.shape[1], a_src.shape[1]} - {1, heads}:
                return None
            a_dst, a_src = a_dst.expand(n_dst, heads), a_src.expand(n_src, heads)
        logits = None
        if a["e"] is not None:
            if a["e"].shape[1] not in (1, heads):
                return None
            logits = G.in_csr_order(a["e"].expand(E, heads), perm)
        out = gat_attention(A, a_dst, a_src, V, negative_slope=form.slope,
                            edge_logits=logits, dropout=dropout)
    out = out.reshape((n_dst,) + tuple(V.shape[1:]))
    if form.update_args:
        out = self.update(out, **{a: kwargs.get(a) for a in form.update_args})
    return out


def _tolerance(dtype) -> float:
    return {torch.float64: 1e-9, torch.float32: 1e-4}.get(dtype, 3e-2)


def propagate(self, edge_index, size=None, **kwargs):
    """PyG's ``propagate`` for a layer with a recognised attention: the fused call where it
    fits (checked once against the per-edge path), the per-edge path otherwise."""
    form: AttentionForm = self.__dict__[FORM]
    plain = isinstance(edge_index, torch.Tensor) and edge_index.layout == torch.strided and \
        edge_index.dim() == 2 and not edge_index.dtype.is_floating_point
    compiling = torch.compiler.is_compiling()
    if form.failed or not plain or getattr(self, "_explain", None) or \
            any(getattr(self, h, None) for h in _HOOKS) or \
            (compiling and (not form.verified or not isinstance(edge_index.shape[1], int))):
        return _per_edge(self, edge_index, size, kwargs)
    dropout = form.dropout if self.training else 0.0
    if form.verified:
        out = _fused(self, form, edge_index, size, kwargs, dropout)
        return _per_edge(self, edge_index, size, kwargs) if out is None else out
    return _check(self, form, edge_index, size, kwargs, dropout)


def _check(self, form: AttentionForm, edge_index, size, kwargs, dropout: float):
    """The first call the fused form can take: its result without dropout against the
    per-edge path's (the layer's message without dropout: in eval mode), then this call's."""
    try:
        out = _fused(self, form, edge_index, size, kwargs, 0.0)
        why = "the call's inputs do not fit the fused form" if out is None else ""
    except Exception as e:  # noqa: BLE001 - the form did not fit; the per-edge path will
        out, why = None, f"{type(e).__name__}: {e}"
    if out is None:  # this call does not fit; the next may
        return _per_edge(self, edge_index, size, kwargs)
    was = self.training
    try:
        self.training = False  # the message's own dropout off, like the fused call's here
        with torch.no_grad():
            want = _per_edge(self, edge_index, size, kwargs)
    finally:
        self.training = was
    if out.shape != want.shape or out.dtype != want.dtype:
        why = f"shape {tuple(out.shape)} / {out.dtype}, per-edge {tuple(want.shape)}"
    else:
        err = float((out.detach() - want).abs().max()) if out.numel() else 0.0
        scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
        if not math.isfinite(err) or err > _tolerance(out.dtype) * scale:
            why = f"max difference {err:.3g} (scale {scale:.3g})"
    if why:
        form.failed = why
        warnings.warn(f"sparsejit.accelerate: {type(self).__name__}'s attention did not match "
                      f"its per-edge messages ({why}); it keeps the per-edge path",
                      stacklevel=3)
        return _per_edge(self, edge_index, size, kwargs)
    form.verified = True
    return out if dropout == 0.0 else _fused(self, form, edge_index, size, kwargs, dropout)
