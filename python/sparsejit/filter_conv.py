"""Moved to ``sparsejit.families.filter_conv.layers``; this name stays for existing imports (the same module)."""

import sys

from sparsejit.families.filter_conv import layers as _moved

sys.modules[__name__] = _moved
