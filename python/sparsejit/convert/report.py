"""What :func:`sparsejit.accelerate` did to each module it looked at."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class Entry:
    """One module: its path in the model (``""`` for the model itself), its original type,
    what it became (``None`` when it was left as it was) and why it was left (or a note)."""

    path: str
    original: str
    became: Optional[str]
    reason: str = ""

    def add_group(self, path: str, became: Optional[str], reason: str = "") -> None:
        self.groups.append(Entry(path, "edge types", became, reason))

    @property
    def converted(self) -> bool:
        return self.became is not None


@dataclass
class Report:
    """The rows of one :func:`sparsejit.accelerate` call, in model order. ``str(report)``
    is the table ``verbose=True`` prints. ``groups`` lists, apart from the modules, the
    calls that were merged or could not be (a ``to_hetero`` layer's edge types into one
    RGMS call): ``path`` names the layer and its relations."""

    entries: List[Entry] = field(default_factory=list)
    groups: List[Entry] = field(default_factory=list)

    def add(self, path: str, original: str, became: Optional[str], reason: str = "") -> None:
        self.entries.append(Entry(path, original, became, reason))

    def add_group(self, path: str, became: Optional[str], reason: str = "") -> None:
        self.groups.append(Entry(path, "edge types", became, reason))

    @property
    def converted(self) -> List[Entry]:
        return [e for e in self.entries if e.converted]

    @property
    def left(self) -> List[Entry]:
        return [e for e in self.entries if not e.converted]

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def __str__(self) -> str:
        if not self.entries:
            return "sparsejit.accelerate: no graph, point-cloud or convolution layers found"
        rows = [("module", "was", "now", "note")]
        for e in self.entries:
            rows.append((e.path or "(model)", e.original, e.became or "(left as it was)",
                         e.reason))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [f"sparsejit.accelerate: {len(self.converted)} converted, "
                 f"{len(self.left)} left as they were"]
        for r in rows:
            lines.append("  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3])
        if self.groups:
            lines.append("calls grouped:")
            width = max(len(g.path) for g in self.groups)
            lines += [f"  {g.path.ljust(width)}  {g.became or '(not grouped)'}  {g.reason}"
                      for g in self.groups]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Report(converted={len(self.converted)}, left={len(self.left)}, "
                f"entries={self.entries!r}, groups={self.groups!r})")
