"""One-line conversion of existing models: :func:`accelerate` and :func:`restore`
(PyG convs, PyG message-passing layers of the gather-scale-aggregate kind, other PyG
message-passing layers' aggregation and edge softmax, spconv modules, pruned Conv2d layers).
See docs/MIGRATING_FROM_PYG.md."""

from sparsejit.convert.accelerate import accelerate, restore
from sparsejit.convert.report import Entry, Report



def last_report():
    """The Report of the latest :func:`accelerate` call in this process (None before)."""
    import sys
    return sys.modules["sparsejit.convert.accelerate"].LAST_REPORT


__all__ = ["accelerate", "restore", "Report", "Entry", "last_report"]
