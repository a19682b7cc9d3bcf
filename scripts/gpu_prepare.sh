#!/usr/bin/env bash
# Run here, before lending the tree to a GPU machine (which reaches no package registry):
# copies a GoogleTest source tree into .gtest/ (ignored by git), which tests/cpp/CMakeLists.txt
# builds when no installed GoogleTest is found. Pass `.gtest` in the device call's carry.
#
#   scripts/gpu_prepare.sh [googletest source dir, default /usr/src/googletest]
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${1:-/usr/src/googletest}
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  echo "gpu_prepare: no googletest sources at $SRC (apt-get install libgtest-dev)" >&2
  exit 1
fi
rm -rf .gtest
cp -r "$SRC" .gtest
echo "gpu_prepare: .gtest/ <- $SRC ($(du -sh .gtest | cut -f1)); carry it: carry=[\".gtest\"]"
