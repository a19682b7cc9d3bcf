#!/usr/bin/env bash
# Cross-version check of the wheel (not run by CI: the registry's other torch releases are
# CUDA builds of several GB). Builds the wheel against the pinned torch (the Makefile's
# TORCH_SPEC), installs it into a fresh venv per torch release given on the command line
# (CPU tensors only), and runs the smoke suite there. Prints one line per release and writes
# the log of each to $OUT_DIR/<version>.log.
#
#   scripts/wheel_cross_version.sh 2.12.1 2.14.1 2.15.0
#
# The op library is built on torch's stable ABI (TORCH_TARGET_VERSION 2.10): every release from
# 2.10 up is expected to pass; an older one to be refused at import with an ImportError naming
# the minimum (the wheel's Requires-Dist says torch>=2.10; the install here uses --no-deps, to
# see what a user gets who forces it). A wheel built on the ATen backend
# (SPARSEJIT_STABLE_ABI=OFF) is refused under any other release, naming both versions; the
# script then reruns the suite with SPARSEJIT_ALLOW_TORCH_MISMATCH=1 to show what forcing gives.
# PIP_FIND_LINKS=<dir of downloaded wheels> avoids downloading the torch builds again.
# The registry's releases are CUDA builds: torch's own CMake package (needed by the smoke test
# of sparsejit's CMake package) does not configure here for them (Caffe2Config.cmake: "cannot
# find the CUDA libraries"; pointed at CUDA 13, CMake 3.25 lacks the CUDA20 dialect torch
# 2.14 asks for), so that one test fails under every release but the CPU build of the pinned
# torch. LibTorch programs need C++20 from torch 2.14 on (examples/cpp uses it).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT_DIR=${OUT_DIR:-build-wheel/cross_version}
VENV_ROOT=${VENV_ROOT:-/tmp/sparsejit-xv}
[ $# -gt 0 ] || { echo "usage: $0 TORCH_VERSION..." >&2; exit 2; }

if ! ls build-wheel/dist/sparsejit-*.whl >/dev/null 2>&1 || [ -n "${REBUILD:-}" ]; then
  make wheel PYTHON="$PYTHON"
fi
WHEEL=$(ls build-wheel/dist/sparsejit-*.whl | head -1)
mkdir -p "$OUT_DIR"
echo "wheel: $WHEEL (built against $($PYTHON -c 'import torch; print(torch.__version__)'))"

status=0
for v in "$@"; do
  venv="$VENV_ROOT/torch-$v" log="$OUT_DIR/$v.log"
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  {
    "$venv/bin/python" -m pip install -q "torch==$v" numpy pytest &&
    "$venv/bin/python" -m pip install -q --no-deps "$WHEEL" &&
    (cd /tmp && SPARSEJIT_SOURCE_DIR="$OLDPWD" CUDA_VISIBLE_DEVICES= "$venv/bin/python" -m pytest -q \
       -p no:cacheprovider "$OLDPWD/tests/smoke")
  } >"$log" 2>&1 && result=passed || result=failed
  if [ "$result" = failed ] && grep -q "stable ABI and loads under torch >=" "$log"; then
    result="refused at import (older than the stable ABI's target release; message names it)"
  elif [ "$result" = failed ] && grep -q "op library was built against torch" "$log"; then
    result="refused at import (ABI-bound op library; message names both versions)"
    # What a user who forces it gets (not a supported configuration).
    forced=$(cd /tmp && SPARSEJIT_ALLOW_TORCH_MISMATCH=1 SPARSEJIT_SOURCE_DIR="$OLDPWD" \
      CUDA_VISIBLE_DEVICES= "$venv/bin/python" -m pytest -q -p no:cacheprovider \
      "$OLDPWD/tests/smoke" 2>&1 | tee -a "$log" | tail -1 || true)
    result="$result; forced with SPARSEJIT_ALLOW_TORCH_MISMATCH=1: $forced"
  fi
  [ "$result" = passed ] || status=1
  printf 'torch %-8s %s\n' "$v" "$result" | tee -a "$OUT_DIR/summary.txt"
  [ -n "${KEEP_VENVS:-}" ] || rm -rf "$venv"
done
exit $status
