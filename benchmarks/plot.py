"""Bar chart (SVG, no plotting library needed) of sparsejit's speed-up over each peer, per
graph (geometric mean over F and reduce), from the harness's JSON.

    python3 benchmarks/plot.py results.json out.svg
"""

import json
import sys

from sparsejit.tools.plot import svg


def main(argv):
    src, dst = argv[1], argv[2]
    with open(src) as f:
        doc = json.load(f)
    recs = doc["records"] if isinstance(doc, dict) else doc
    with open(dst, "w") as f:
        f.write(svg(recs, "sparsejit speed-up (peer time / sparsejit time, log scale)"))


if __name__ == "__main__":
    main(sys.argv)
