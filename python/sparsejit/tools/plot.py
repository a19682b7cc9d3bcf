"""Bar chart (SVG, no plotting library needed) of sparsejit's speed-up over each peer, per
case group (geometric mean over F and reduce), from benchmark records: ``svg(records, title)``.
Used by ``sparsejit-bench --out-svg`` and ``benchmarks/plot.py``. ``loss_curves``: the examples'
training-loss-against-time plot (matplotlib, when installed)."""

from __future__ import annotations

import math
from collections import defaultdict

COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3"]


def speedups(records):
    by = defaultdict(list)  # (op, graph, peer) -> ratios
    for r in records:
        if r["impl"] != "sparsejit" and r.get("ratio"):
            by[(r["op"], r["graph"], r["impl"])].append(r["ratio"])
    return {k: math.exp(sum(map(math.log, v)) / len(v)) for k, v in by.items()}


def svg(records, title):
    s = speedups(records)
    groups = sorted({(op, g) for op, g, _ in s})
    peers = sorted({p for _, _, p in s})
    W, H, left, bottom, top = 120 + 70 * len(groups), 420, 60, 150, 40
    ymax = max(s.values()) * 1.15
    scale = (H - bottom - top) / math.log10(max(ymax, 2.0) * 1.0 / 0.1)
    y = lambda v: H - bottom - math.log10(v / 0.1) * scale  # log axis from 0.1  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>']
    for tick in (0.1, 0.5, 1, 2, 5, 10, 20, 50):
        if tick <= ymax:
            out.append(f'<line x1="{left}" x2="{W - 10}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
                       f'stroke="{"#000" if tick == 1 else "#ddd"}"/>')
            out.append(f'<text x="{left - 5}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick}x</text>')
    bw = 60 / max(len(peers), 1)
    for gi, (op, g) in enumerate(groups):
        x0 = left + 10 + gi * 70
        for pi, p in enumerate(peers):
            v = s.get((op, g, p))
            if v is None:
                continue
            top_y, base_y = y(max(v, 0.1)), y(1.0)
            out.append(f'<rect x="{x0 + pi * bw:.1f}" y="{min(top_y, base_y):.1f}" width="{bw - 2:.1f}" '
                       f'height="{abs(base_y - top_y):.1f}" fill="{COLORS[pi % len(COLORS)]}"><title>{op} {g} vs {p}: {v:.2f}x</title></rect>')
        label = f"{op}: {g}"[:34]
        out.append(f'<text transform="translate({x0 + 30},{H - bottom + 10}) rotate(60)">{label}</text>')
    for pi, p in enumerate(peers):
        out.append(f'<rect x="{left + pi * 130}" y="{H - 18}" width="10" height="10" fill="{COLORS[pi % len(COLORS)]}"/>'
                   f'<text x="{left + pi * 130 + 14}" y="{H - 9}">vs {p}</text>')
    out.append("</svg>")
    return "\n".join(out)


def loss_curves(runs, title: str, path) -> bool:
    """Training loss against training time of each run (``{label: (losses, clock, ...)}``, the
    examples' records) as a PNG at `path`, with matplotlib when it is installed. Returns whether
    the plot was written (False, with a message, without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, (losses, clock, *_) in runs.items():
        ax.plot(clock, losses, label=label)
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    print(f"wrote {path}")
    return True
