"""Moved to ``sparsejit.families.point_conv.tuner``; this name stays for existing imports (the same module)."""

import sys

from sparsejit.families.point_conv import tuner as _moved

sys.modules[__name__] = _moved
