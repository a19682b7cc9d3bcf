#!/usr/bin/env bash
# The host compiler with -march=native replaced as sparsejit's JIT does under
# SPARSEJIT_MAX_ISA (codegen/cpu_jit.cpp): for timing builds that predate the cap on the same
# terms, as their SPARSEJIT_CXX (benchmarks/ab_sparsejit.py --isa sets it for them).
# The real compiler: SPARSEJIT_REAL_CXX, else c++.
set -euo pipefail
case "${SPARSEJIT_MAX_ISA:-native}" in
  native | "") target=(-march=native) ;;
  avx512) target=(-march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16) ;;
  avx2) target=(-march=x86-64-v3 -mtune=native) ;;
  baseline) target=(-march=x86-64 -mtune=native) ;;
  *)
    echo "cxx_max_isa.sh: SPARSEJIT_MAX_ISA='$SPARSEJIT_MAX_ISA' is not one of native," \
      "avx512, avx2, baseline" >&2
    exit 2
    ;;
esac
args=()
for a in "$@"; do
  if [[ "$a" == "-march=native" ]]; then args+=("${target[@]}"); else args+=("$a"); fi
done
exec "${SPARSEJIT_REAL_CXX:-c++}" "${args[@]}"
