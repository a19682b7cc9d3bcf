"""How often a stored tap of a pruned convolution has its bfloat16 channel-pair partner.

AVX512-BF16's `vdpbf16ps` multiplies two bfloat16 pairs per lane: in a filter-sparse
convolution a pair is two stored taps of one output channel at the same kernel position on
input channels 2k and 2k + 1 (the input interleaved by channel pairs). A stored tap whose
partner is pruned still takes one instruction, with a zero in the other half: the same
useful multiply-adds per instruction as a float32 FMA on the same bytes. With a fraction p
of taps paired, the multiply instructions per tap drop to 1 - p / 2, so 1 / (1 - p / 2) bounds
what pairs could gain. Prints p per layer and overall for the DLMC magnitude-pruned
ResNet-50 patterns (80%; `SPARSEJIT_DATA`/dlmc) and for uniformly random 80% / 90% patterns.

    python3 benchmarks/archive/filter_conv_pairs.py
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

DATA = Path(os.environ.get("SPARSEJIT_DATA", Path(__file__).resolve().parents[3] / "shared/data"))


def paired_fraction(rowptr: np.ndarray, cols: np.ndarray, taps: int) -> float:
    """Share of stored taps (column c * taps + t) whose channel partner (c ^ 1, same t) of
    the same row is stored too."""
    if cols.size == 0:
        return 0.0
    paired = 0
    for r in range(rowptr.size - 1):
        row = cols[rowptr[r]:rowptr[r + 1]]
        c, t = row // taps, row % taps
        partner = (c ^ 1) * taps + t
        paired += np.isin(partner, row, assume_unique=True).sum()
    return paired / cols.size


def dlmc_layers():
    root = DATA / "dlmc/rn50/magnitude_pruning/0.8"
    for f in sorted(root.glob("*.smtx.gz")) if root.is_dir() else ():
        with gzip.open(f, "rt") as fh:
            n, m, nnz = (int(v) for v in fh.readline().split(","))
            rowptr = np.array(fh.readline().split(), dtype=np.int64)
            cols = np.array(fh.readline().split(), dtype=np.int64)
        yield f.name.replace(".smtx.gz", ""), n, m, rowptr, cols


def main() -> None:
    from sparsejit.info import cpu_line
    print(f"CPU: {cpu_line()}", flush=True)
    total = paired = 0
    rows = []
    for name, n, m, rowptr, cols in dlmc_layers():
        if "dense" in name:
            continue
        taps = 9 if m % 9 == 0 and m // 9 in (64, 128, 256, 512) else (49 if m == 147 else 1)
        # DLMC does not say whether a column is c * taps + t or t * c_in + c: the larger
        # paired share of the two readings (an upper bound on what pairs could gain)
        p = paired_fraction(rowptr, cols, taps)
        if taps > 1:
            c_in = m // taps
            p = max(p, paired_fraction(rowptr, (cols % c_in) * taps + cols // c_in, taps))
        rows.append((name, n, m, taps, p))
        total += cols.size
        paired += p * cols.size
    for name, n, m, taps, p in rows:
        print(f"{name:40s} {n:5d} x {m:5d}  taps/channel {taps}  paired {p:.3f}")
    if total:
        p = paired / total
        print(f"DLMC ResNet-50, magnitude 80%: {total} stored taps, paired {p:.3f}: "
              f"at most {1 / (1 - p / 2):.3f}x fewer multiply instructions")
    rng = np.random.default_rng(0)
    for sparsity in (0.8, 0.9):
        keep = rng.random((256, 256 * 9)) >= sparsity
        rowptr = np.concatenate([[0], np.cumsum(keep.sum(1))])
        cols = np.nonzero(keep)[1]
        p = paired_fraction(rowptr, cols, 9)
        print(f"uniform random {sparsity:.0%} (256 x 256 x 3 x 3): paired {p:.3f}: "
              f"at most {1 / (1 - p / 2):.3f}x")


if __name__ == "__main__":
    main()
