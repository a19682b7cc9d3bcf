"""Moved to ``sparsejit.families.spmm.plans``; this name stays for existing imports (the same module)."""

import sys

from sparsejit.families.spmm import plans as _moved

sys.modules[__name__] = _moved
