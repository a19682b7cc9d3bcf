"""Tables for benchmarks/RESULTS.md from the harness's JSON (python -m sparsejit.bench).

    python3 benchmarks/summarize.py benchmarks/results/cpu.json [more.json ...]

Prints markdown: geometric means of peer time / sparsejit time against the JIT issue's
targets, the SpMM speed-up over torch.sparse.mm per graph and F for every reduce, and the
roofline fraction of the graphs with more than 2M stored entries.
"""

import argparse
import collections
import json
import math

# (op, peer) -> target geometric-mean speed-up from the CPU JIT issue.
TARGETS = {("spmm", "torch.sparse"): 2.0, ("spmm", "scatter"): 3.0, ("sddmm", "gather-dot"): 2.0}


def gmean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def load(paths):
    records, roofline = [], None
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        records += d["records"]
        roofline = d.get("roofline_copy_gbps", roofline)
    return records, roofline


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+")
    args = ap.parse_args()
    records, roofline = load(args.json)
    cells = collections.defaultdict(dict)
    for r in records:
        cells[(r["op"], r["graph"], r["F"], r.get("reduce") or "-")][r["impl"]] = r
    ratios = collections.defaultdict(list)
    per_graph = collections.defaultdict(dict)
    failed = []
    for (op, graph, F, reduce), impls in cells.items():
        ours = impls.get("sparsejit")
        if ours is None:
            continue
        for peer, r in impls.items():
            if peer == "sparsejit":
                continue
            if not r.get("ok", True):
                failed.append((op, graph, F, reduce, peer))
            ratio = r["median_ms"] / ours["median_ms"]
            ratios[(op, peer, reduce)].append(ratio)
            if peer == "torch.sparse":
                per_graph[(reduce, graph, ours["nnz"])][F] = ratio

    print(f"Copy bandwidth (roofline): {roofline} GB/s\n")
    print("| op | peer | reduce | geomean speed-up | cases | issue target | met |")
    print("|---|---|---|---|---|---|---|")
    for (op, peer, reduce), xs in sorted(ratios.items()):
        target = TARGETS.get((op, peer))
        g = gmean(xs)
        met = "-" if target is None else ("yes" if g >= target else "**no**")
        shown = "-" if target is None else f"{target:.1f}x"
        print(f"| {op} | {peer} | {reduce} | {g:.2f}x | {len(xs)} | {shown} | {met} |")
    print(f"\nCells where a peer disagreed with sparsejit: {len(failed)} {failed or ''}\n")

    feats = sorted({key[2] for key in cells})
    print("| reduce | graph | nnz | " + " | ".join(f"F={F}" for F in feats) + " |")
    print("|---|---|---|" + "---|" * len(feats))
    for (reduce, graph, nnz), row in sorted(per_graph.items(), key=lambda kv: (kv[0][0], kv[0][2])):
        vals = " | ".join(f"{row[F]:.2f}" if F in row else "-" for F in feats)
        print(f"| {reduce} | {graph} | {nnz} | {vals} |")

    print("\n| op | graph | F | sparsejit ms | GB/s | fraction of copy bandwidth |")
    print("|---|---|---|---|---|---|")
    for r in sorted(records, key=lambda r: (r["op"], r["graph"], r["F"])):
        if (r["impl"] == "sparsejit" and r["nnz"] > 2_000_000
                and (r.get("reduce") or "sum") in ("sum", "-", None) and r.get("gbps")):
            print(f"| {r['op']} | {r['graph']} | {r['F']} | {r['median_ms']:.1f} | "
                  f"{r['gbps']:.1f} | {100 * r['roofline_frac']:.0f}% |")


if __name__ == "__main__":
    main()
