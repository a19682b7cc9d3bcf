"""Moved to ``sparsejit.families.spmm.tuner``; this name stays for existing imports (the same module)."""

import sys

from sparsejit.families.spmm import tuner as _moved

sys.modules[__name__] = _moved
