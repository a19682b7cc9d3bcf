"""Moved to ``sparsejit.families.spmm.matrix``; this name stays for existing imports (the same module)."""

import sys

from sparsejit.families.spmm import matrix as _moved

sys.modules[__name__] = _moved
