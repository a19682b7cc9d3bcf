"""The tuner registry: ``sj.tune`` and ``sj.explain`` dispatch on the object they are given to
the family tuner that registered for it, so this module (and every op) needs no family's
tuner, and a family's tuner imports its ops, never the reverse."""

from __future__ import annotations

from typing import Callable, List, NamedTuple, Optional


class Tuner(NamedTuple):
    family: str
    accepts: Callable[[object, tuple, dict], bool]
    tune: Callable[..., dict]
    explain: Optional[Callable[..., dict]] = None


_TUNERS: List[Tuner] = []


def register_tuner(family: str, accepts, tune, explain=None) -> None:
    """Registers `family`'s tuner: `accepts(obj, args, kwargs)` says whether it handles a call."""
    global _TUNERS
    _TUNERS = [t for t in _TUNERS if t.family != family] + [Tuner(family, accepts, tune, explain)]


def _find(obj, args, kwargs, what: str) -> Tuner:
    for t in _TUNERS:
        if t.accepts(obj, args, kwargs) and (what == "tune" or t.explain is not None):
            return t
    names = ", ".join(t.family for t in _TUNERS) or "none registered"
    raise TypeError(f"sparsejit.{what}: no tuner takes a {type(obj).__name__} (families with "
                    f"a tuner: {names}); pass a SparseMatrix, a TypedSparseMatrix, a point-cloud "
                    "conv plan or a model with its example input")


def tune(obj, *args, **kwargs) -> dict:
    """Measures the candidate schedules of `obj`'s family and stores the fastest (see each
    family's tuner: spmm, rgms, point_conv)."""
    return _find(obj, args, kwargs, "tune").tune(obj, *args, **kwargs)


def explain(obj, *args, **kwargs) -> dict:
    """Prints (and returns) the plan and schedule the family's op would use on `obj`, and why."""
    return _find(obj, args, kwargs, "explain").explain(obj, *args, **kwargs)
