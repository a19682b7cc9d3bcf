#!/usr/bin/env bash
# Compiles the op library's Torch adapters on the stable-ABI backend of torch_ext/tensor_api.h
# (torch_ext/tensor_api_stable.h: torch/csrc/stable + torch/headeronly only, TORCH_TARGET_VERSION
# 2.10) and reports, per file, whether it compiles, in seconds (a syntax check, no link). The
# CPU build compiles them that way anyway; this names the files when one breaks, and is the
# tool for porting a new adapter file (VERBOSE=1 prints the errors).
#
#   scripts/check_stable_abi.sh [FILE...]      (default: every adapter file)
#   VERBOSE=1 scripts/check_stable_abi.sh torch_ext/ops/sddmm.cpp   (print the errors)
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_INC=$($PYTHON -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
CXX=${CXX:-c++}
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(torch_ext/library.cpp torch_ext/ops/*.cpp torch_ext/validated.cpp)
out=$(mktemp -d)
ok=0 bad=0
for f in "${files[@]}"; do
  log="$out/$(basename "$f").log"
  if $CXX -std=gnu++17 -fsyntax-only -fopenmp -DSPARSEJIT_STABLE_ABI \
      -DTORCH_TARGET_VERSION='(((0ULL + 2) << 56) | ((0ULL + 10) << 48))' \
      -I. -Itorch_ext/include -isystem "$TORCH_INC" "$f" >"$log" 2>&1; then
    printf '%-40s compiles\n' "$f"; ok=$((ok + 1))
  else
    printf '%-40s %d errors\n' "$f" "$(grep -c 'error:' "$log")"; bad=$((bad + 1))
    [ -n "${VERBOSE:-}" ] && grep -A3 'error:' "$log" | head -${ERRORS:-60}
  fi
done
echo "stable ABI: $ok compile, $bad do not"
rm -rf "$out"
[ "$bad" -eq 0 ]
