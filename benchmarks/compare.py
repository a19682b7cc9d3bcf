"""Compares two runs of the harness (python -m sparsejit.tools.bench --out-json) case by case:
sparsejit's median time after / before, and its speed-up over each peer in both runs.

    python3 benchmarks/compare.py BEFORE.json AFTER.json [--markdown]

Only cases present in both runs count. Ratios are geometric means over the cases of each
(op, reduce); "after / before" above 1 means the second run is slower.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict


def _load(path):
    with open(path) as f:
        d = json.load(f)
    return d["records"] if isinstance(d, dict) else d


def _index(records):
    out = {}
    for r in records:
        if r.get("ok", True) and r.get("median_ms"):
            out[(r["graph"], r["F"], r["op"], r.get("reduce") or "-", r["impl"])] = r["median_ms"]
    return out


def _geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def compare(before, after):
    b, a = _index(before), _index(after)
    ratio = defaultdict(list)  # (op, reduce) -> sparsejit after / before
    speed = defaultdict(lambda: ([], []))  # (op, reduce, peer) -> (before, after) speed-ups
    for (g, F, op, red, impl), t_after in a.items():
        if impl != "sparsejit" or (g, F, op, red, impl) not in b:
            continue
        ratio[(op, red)].append(t_after / b[(g, F, op, red, impl)])
        for (g2, F2, op2, red2, peer), tp in a.items():
            if (g2, F2, op2, red2) == (g, F, op, red) and peer != "sparsejit":
                tb = b.get((g, F, op, red, peer))
                if tb is not None:
                    speed[(op, red, peer)][0].append(tb / b[(g, F, op, red, impl)])
                    speed[(op, red, peer)][1].append(tp / t_after)
    return ratio, speed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    args = ap.parse_args()
    ratio, speed = compare(_load(args.before), _load(args.after))
    print("| op | reduce | cases | sparsejit time after / before (geomean) | min | max |")
    print("|---|---|---|---|---|---|")
    for (op, red), xs in sorted(ratio.items()):
        print(f"| {op} | {red} | {len(xs)} | {_geomean(xs):.3f} | {min(xs):.2f} | {max(xs):.2f} |")
    print()
    print("| op | reduce | peer | speed-up before | speed-up after |")
    print("|---|---|---|---|---|")
    for (op, red, peer), (xb, xa) in sorted(speed.items()):
        print(f"| {op} | {red} | {peer} | {_geomean(xb):.2f}x | {_geomean(xa):.2f}x |")


if __name__ == "__main__":
    main()
