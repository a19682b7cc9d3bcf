"""Moved to ``sparsejit.families.rgms.tuner``; this name stays for existing imports (the same module)."""

import sys

from sparsejit.families.rgms import tuner as _moved

sys.modules[__name__] = _moved
