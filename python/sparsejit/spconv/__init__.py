"""spconv 2.x-compatible modules: ``sparsejit.families.point_conv.spconv`` under the name spconv
users import (the same package and module objects)."""

import sys as _sys

from sparsejit.families.point_conv import spconv as _moved
from sparsejit.families.point_conv.spconv import conv, core, modules

for _name, _mod in (("conv", conv), ("core", core), ("modules", modules)):
    _sys.modules[f"{__name__}.{_name}"] = _mod
_sys.modules[__name__] = _moved
