"""Old location of the PyG-signature layers and their adjacency helpers, kept for existing
imports: ``sparsejit.pyg.graph``, ``.conv`` and ``.attention_conv`` name the modules now in
the spmm and attention families (the same module objects). The layers are exported by
:mod:`sparsejit.nn`."""

import sys as _sys

from sparsejit.families.attention import layers as attention_conv
from sparsejit.families.spmm import graph, layers as conv

for _name, _mod in (("graph", graph), ("conv", conv), ("attention_conv", attention_conv)):
    _sys.modules[f"{__name__}.{_name}"] = _mod
