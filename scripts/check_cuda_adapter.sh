#!/usr/bin/env bash
# Compiles the Torch adapter's CUDA code paths (torch_ext/*.cpp with SPARSEJIT_WITH_CUDA), on
# both backends (stable ABI and ATen), against a CUDA build of PyTorch, syntax only: no GPU,
# no linking. The CUDA torch wheel
# (about 1.2 GB, installed without its dependencies into a private venv) supplies the
# c10/cuda headers; CUDA's own headers come from the CUDA toolkit (CUDA_HOME, default
# /usr/local/cuda). Usage: scripts/check_cuda_adapter.sh   (or: make check-cuda-adapter)
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_CUDA_SPEC=${TORCH_CUDA_SPEC:-torch==2.14.1}
VENV=${SPARSEJIT_CUDA_TORCH_VENV:-$HOME/.cache/sparsejit/cuda-torch-venv}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$CUDA_HOME/include/cuda_runtime_api.h" ]; then
  echo "check_cuda_adapter: no CUDA toolkit headers under $CUDA_HOME; skipped"; exit 0
fi
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import pathlib, sys; sys.exit(0)' ; then
  python3 -m venv "$VENV"
fi
T=$(find "$VENV" -path '*site-packages/torch/include' -maxdepth 6 -type d | head -1 || true)
if [ -z "$T" ] || [ ! -d "$T/c10/cuda" ]; then
  "$VENV/bin/pip" install -q --no-deps "$TORCH_CUDA_SPEC"
  T=$(find "$VENV" -path '*site-packages/torch/include' -maxdepth 6 -type d | head -1)
fi
status=0
# Both backends of torch_ext/tensor_api.h: the stable ABI (the default build) and ATen.
# (hidden visibility, as CMake builds it: torch's stable types live in hidden namespaces)
STABLE=(-DSPARSEJIT_STABLE_ABI=1 -DUSE_CUDA=1 -fvisibility=hidden
        "-DTORCH_TARGET_VERSION=(((0ULL + 2) << 56) | ((0ULL + 10) << 48))")
for backend in stable aten; do
  for f in torch_ext/library.cpp torch_ext/cuda_fallback.cpp torch_ext/ops/*.cpp \
           torch_ext/composite/*.cpp; do
    flags=()
    [ "$backend" = stable ] && flags=("${STABLE[@]}")
    if ${CXX:-g++} -std=c++20 -fsyntax-only -Wall -Wextra -Wno-unused-parameter \
        -DSPARSEJIT_WITH_CUDA=1 "${flags[@]}" -I. -Itorch_ext/include -I"$T" \
        -I"$T/torch/csrc/api/include" -I"$CUDA_HOME/include" "$f"; then
      echo "ok    $backend $f"
    else
      echo "FAIL  $backend $f"; status=1
    fi
  done
done
exit $status
