"""``sparsejit.accelerate(model)``: an existing PyG / spconv / MinkowskiEngine / TorchSparse /
pruned-CNN model onto sparsejit's kernels in one line, in place; ``sparsejit.restore(model)``
undoes it."""

from __future__ import annotations

from typing import Dict, Optional, Tuple, Union

from torch import fx, nn

from sparsejit.convert import attention_message as am
from sparsejit.convert import edge_path as ep
from sparsejit.convert import engines, hetero
from sparsejit.convert import message_passing as mp
from sparsejit.convert import pyg, spconv
from sparsejit.convert.report import Report

LAST_REPORT: Optional[Report] = None  # the report of the latest accelerate() call


def _type(m) -> str:
    root = type(m).__module__.split('.')[0]
    if root.startswith("Minkowski"):  # ME puts its own modules on sys.path as top-level ones
        root = "MinkowskiEngine"
    return f"{root}.{type(m).__name__}"


def _sj_type(m) -> str:
    return f"sparsejit.{type(m).__name__}"


def _is_converted(m: nn.Module) -> bool:
    return pyg.ORIGINAL in m.__dict__


def _convert_one(m: nn.Module, path: str, report: Report,
                 blocked: Dict[str, Optional[str]]) -> Tuple[Optional[nn.Module], bool]:
    """(replacement or None, whether to walk into m's children)."""
    if _is_converted(m):
        report.add(path, _type(m.__dict__[pyg.ORIGINAL]), _sj_type(m), "already accelerated")
        return None, type(m).__name__ == "SparseSequential"
    if mp.installed(m):
        report.add(path, _type(m), f"{type(m).__name__} + SpMM propagate", "already accelerated")
        return None, False
    if am.installed(m):
        report.add(path, _type(m), f"{type(m).__name__} + fused attention", "already accelerated")
        return None, False
    if ep.installed(m):
        report.add(path, _type(m), f"{type(m).__name__} + SpMM aggregate", "already accelerated")
        return None, False
    engine = engines.engine_of(m)
    if engine is not None:
        return _convert_engine(m, path, report, engine, blocked), False
    name = pyg.pyg_conv_name(m)
    native_reason = ""
    if name is not None:
        try:
            new = pyg.convert(m, name)
            note = ""
            if getattr(m, "_cached_edge_index", None) is not None or \
                    getattr(m, "_cached_adj_t", None) is not None:
                note = "PyG's cached normalised graph is not carried over: built from the next call"
            report.add(path, _type(m), _sj_type(new), note)
            return new, False
        except pyg.Unsupported as e:
            native_reason = f"sparsejit.nn.{name}: {e}; "
    MP = mp.message_passing_class()
    if MP is not None and isinstance(m, MP):
        try:
            form = mp.install(m)
            how = f"alpha*w*{form.src}_j" + (f" + beta*w*{form.dst}_i" if form.dst else "")
            report.add(path, _type(m), f"{type(m).__name__} + SpMM propagate",
                       native_reason + f"message {how}, reduce {form.reduce}")
        except mp.Unsupported as e:
            try:
                form = am.install(m)
                report.add(path, _type(m), f"{type(m).__name__} + fused attention",
                           native_reason + f"attention in message: {form.describe()}")
                return None, False
            except am.Unsupported as e1:
                e = f"{e}; attention: {e1}"
            try:
                what = ep.install(m)
                report.add(path, _type(m), f"{type(m).__name__} + SpMM aggregate",
                           native_reason + f"per-edge messages ({e}); aggregation {what}")
            except ep.Unsupported as e2:
                report.add(path, _type(m), None, native_reason + f"generic path: {e}; "
                           f"per-edge path: {e2}")
        return None, False
    return None, True  # spconv modules are converted after their children


def _convert_spconv(m: nn.Module, path: str, report: Report,
                    blocked: Optional[str]) -> Optional[nn.Module]:
    if not spconv.is_spconv_module(m) or _is_converted(m):
        return None
    kind = spconv.spconv_kind(m)
    if blocked is not None or kind is None:
        report.add(path, _type(m), None, "sparsejit.spconv: " + (
            blocked if blocked is not None else "no counterpart") +
            " (spconv modules are converted all together or not at all)")
        return None
    try:
        new = spconv.convert(m, kind)
        report.add(path, _type(m), _sj_type(new))
        return new
    except pyg.Unsupported as e:
        report.add(path, _type(m), None, f"sparsejit.spconv: {e}")
        return None


def _convert_engine(m: nn.Module, path: str, report: Report, engine: str,
                    blocked: Dict[str, Optional[str]]) -> Optional[nn.Module]:
    why = blocked.get(engine)
    if why is not None:
        report.add(path, _type(m), None, f"sparsejit.{engine}: {why} ({engine} modules are "
                   "converted all together or not at all)")
        return None
    try:
        new = engines.convert(m, engine)
    except pyg.Unsupported as e:  # the blocker found none: only a new kind of failure
        report.add(path, _type(m), None, f"sparsejit.{engine}: {e}")
        return None
    engines.install(engine)
    report.add(path, _type(m), f"sparsejit.{engine}.{type(new).__name__}")
    return new


def _walk(m: nn.Module, path: str, report: Report, done: Dict[int, nn.Module],
          blocked: Dict[str, Optional[str]]) -> nn.Module:
    """m, or what replaces it; m's children replaced in place."""
    if id(m) in done:
        return done[id(m)]
    new, descend = _convert_one(m, path, report, blocked)
    if new is None and descend:
        for name, child in list(m._modules.items()):
            if child is None:
                continue
            replaced = _walk(child, f"{path}.{name}" if path else name, report, done, blocked)
            if replaced is not child:
                m._modules[name] = replaced
        new = _convert_spconv(m, path, report, blocked.get("spconv"))
    done[id(m)] = m if new is None else new
    return done[id(m)]


def _pruned_convs(model: nn.Module, min_sparsity: float):
    for path, sub in model.named_modules():
        if type(sub) is nn.Conv2d:
            zeros = float((sub.weight == 0).float().mean()) if sub.weight.numel() else 0.0
            if zeros >= min_sparsity:
                yield path, sub, zeros


def _sparsify(model: nn.Module, example_input, report: Report, verbose: bool,
              min_sparsity: float) -> nn.Module:
    pruned = list(_pruned_convs(model, min_sparsity))
    if not pruned:
        return model
    if example_input is None:
        for path, _, zeros in pruned:
            report.add(path, "torch.Conv2d", None, f"{zeros:.0%} zeros: pass example_input= to "
                       "have sparsify measure it against the dense convolution")
        return model
    from sparsejit.families.filter_conv import sparsify
    before = {path: sub for path, sub, _ in pruned}
    model = sparsify(model, example_input, min_sparsity=min_sparsity, verbose=verbose)
    after = dict(model.named_modules())
    for path, old in before.items():
        new = after.get(path)
        if new is not None and new is not old:
            new.__dict__[pyg.ORIGINAL] = old
            report.add(path, "torch.Conv2d", _sj_type(new), "measured faster by sparsify")
        else:
            report.add(path, "torch.Conv2d", None, "sparsify measured the dense one faster")
    return model


def accelerate(model: nn.Module, *, verbose: bool = False, example_input=None,
               sparsify_convs: bool = True, min_sparsity: float = 0.3,
               group_edge_types: Union[bool, str] = True,
               return_report: bool = False) -> Union[nn.Module, Tuple[nn.Module, Report]]:
    """Moves `model` onto sparsejit's kernels in place and returns it (the returned module
    when `model` itself is a converted layer).

    * Each torch_geometric conv that :mod:`sparsejit.nn` implements (GCN, SAGE, GraphConv,
      GIN, GINE, EdgeConv, GAT, GATv2, Transformer, RGCN / FastRGCN) becomes that layer,
      holding the PyG module's own parameter and buffer tensors: optimizers, tensor hooks
      and ``state_dict`` keys keep working; module hooks move with it.
    * Every other PyG ``MessagePassing`` layer whose message is a per-edge scaled gather
      (SGConv, APPNP, TAGConv, ChebConv, ClusterGCNConv, LEConv, users' own) keeps its class
      and forward; its ``propagate`` runs on sparsejit's SpMM (see
      :mod:`sparsejit.convert.message_passing`).
    * Any other ``MessagePassing`` layer (GENConv, FeaStConv, AGNNConv, users' attention
      layers) keeps its message; its aggregation (sum / mean / max / min, softmax, power
      mean) runs on sparsejit's SpMM, and a ``softmax(alpha, index)`` its message calls on
      ``sj.edge_softmax`` (see :mod:`sparsejit.convert.edge_path`).
    * spconv.pytorch modules become :mod:`sparsejit.spconv`'s, MinkowskiEngine modules
      :mod:`sparsejit.minkowski`'s and TorchSparse modules :mod:`sparsejit.torchsparse`'s,
      with the same weights (see :mod:`sparsejit.convert.engines`).
    * In a ``to_hetero`` model or a ``HeteroConv`` (aggr="sum"), one layer's SAGEConv /
      GraphConv calls whose outputs are summed into one node type run as one
      ``sparsejit.rgms`` call (see
      :mod:`sparsejit.convert.hetero`, with the measurements): ``group_edge_types="inference"``
      only for passes that record no gradient; ``False`` keeps one call per edge type.
    * Conv2d layers with at least `min_sparsity` zeros are offered to
      :func:`sparsejit.sparsify`'s measured decision when `example_input` is given (and
      `sparsify_convs`); without it they are listed in the report.

    Anything sparsejit would not compute exactly as the original is left as it was, with
    the reason in the report (``verbose=True`` prints it; ``return_report=True`` returns
    ``(model, report)``; ``sparsejit.convert.last_report()`` is the latest).
    Idempotent; :func:`restore` puts the original modules back."""
    global LAST_REPORT
    if not isinstance(model, nn.Module):
        raise TypeError(f"sparsejit.accelerate: model must be a torch.nn.Module; got "
                        f"{type(model).__name__}")
    report = Report()
    blocked = dict(engines.engines_in(model), spconv=spconv.blocker(model))
    model = _walk(model, "", report, {}, blocked)
    if group_edge_types not in (True, False, "inference"):
        raise ValueError(f"sparsejit.accelerate: group_edge_types must be True, False or "
                         f"'inference'; got {group_edge_types!r}")
    when = "always" if group_edge_types is True else "inference"
    for path, sub in list(model.named_modules()) if group_edge_types else ():
        if isinstance(sub, fx.GraphModule):  # to_hetero's: edge types into one rgms call
            hetero.group(sub, path, report, when)
        elif hetero.is_heteroconv(sub):
            hetero.group_heteroconv(sub, path, report, when)
    if sparsify_convs:
        model = _sparsify(model, example_input, report, verbose, min_sparsity)
    LAST_REPORT = report
    if verbose:
        print(report)
    return (model, report) if return_report else model


def _restore(m: nn.Module, done: Dict[int, nn.Module]) -> nn.Module:
    if id(m) in done:
        return done[id(m)]
    out = m
    if _is_converted(m):
        orig = m.__dict__[pyg.ORIGINAL]
        if spconv.spconv_kind(orig) is not None:
            out = spconv.original_of(m)
        elif engines.engine_of(orig) is not None:
            out = engines.original_of(m)
        elif pyg.pyg_conv_name(orig) is not None:
            out = pyg.original_of(m)
        else:  # a layer sparsify replaced: the dense module as it was
            out = orig
    if mp.installed(out):
        mp.uninstall(out)
    if am.installed(out):
        am.uninstall(out)
    if ep.installed(out):
        ep.uninstall(out)
    done[id(m)] = out
    for name, child in list(out._modules.items()):
        if child is not None:
            restored = _restore(child, done)
            if restored is not child:
                out._modules[name] = restored
    return out


def restore(model: nn.Module) -> nn.Module:
    """Undoes :func:`accelerate`: the original PyG / spconv / Conv2d modules back in place
    (holding the current parameter tensors; a sparsified Conv2d comes back as it was when
    converted), the generic path's ``propagate`` removed. Returns the model (the original
    module when `model` itself was a converted layer)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"sparsejit.restore: model must be a torch.nn.Module; got "
                        f"{type(model).__name__}")
    for sub in list(model.modules()):
        hetero.ungroup(sub)
        hetero.ungroup_heteroconv(sub)
    return _restore(model, {})
