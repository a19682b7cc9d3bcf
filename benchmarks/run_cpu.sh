#!/usr/bin/env bash
# The CPU benchmark behind benchmarks/RESULTS.md: the standard suite (real graphs from
# $SPARSEJIT_DATA plus two generated graphs with >= 2M entries), F in {32, 64, 128, 256},
# every reduce, SpMM and SDDMM; JSON, markdown table, SVG plot, JIT overheads.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/out}
mkdir -p "$out"
python3 -m sparsejit.tools.bench --ops spmm sddmm --reduce sum mean max min \
  --features 32 64 128 256 --repeat ${REPEAT:-7} --verbose \
  --out-json "$out/cpu.json" --out-md "$out/cpu.md"
python3 benchmarks/plot.py "$out/cpu.json" "$out/cpu.svg"
python3 benchmarks/jit_overhead.py --out-json "$out/jit_overhead.json"
