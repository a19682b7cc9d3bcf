"""Moved to ``sparsejit.families.filter_conv.fold``; this name stays for existing imports (the same module)."""

import sys

from sparsejit.families.filter_conv import fold as _moved

sys.modules[__name__] = _moved
