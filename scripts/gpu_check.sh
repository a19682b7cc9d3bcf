#!/usr/bin/env bash
# The one script to run on a GPU machine (no network needed): builds sparsejit with the CUDA
# backend against the machine's PyTorch, runs the C++ tests (NVRTC variants, kernel-level guard
# band checks on the GPU), the CUDA Python tests under compute-sanitizer memcheck and then
# normally, and the GPU benchmark. Logs, JUnit XML and JSON go to $OUT (default ./gpu_out).
#
#   scripts/gpu_check.sh              every step
#   scripts/gpu_check.sh build cpp    only the named steps, in the order given
# Steps: env build cpp sanitize pytest bench families   (about 2 + 3 + 3 + 6 + 2 + 5 + 5 minutes
# on an H100 machine with 16 cores; each step stays under 10 minutes so it can run as one remote
# command). `bench` is SpMM / SDDMM against cuSPARSE and the gather/scatter path; `families` is
# every op family fwd+bwd against the GPU peers installed (cuSPARSE, PyG's layers, spconv's CUDA
# build, cuDNN's dense convolution): bench_families.{json,md}.
#
# Environment: OUT, BUILD_DIR (default build-gpu), JOBS, PYTHON (default python3),
# BENCH_ARGS (extra arguments for `python3 -m sparsejit.tools.bench`), FAMILY_ARGS (for
# `python3 -m sparsejit.tools.bench_all`), SANITIZE_K (pytest -k
# expression for the sanitizer run; default: the CUDA tests without the largest matrices).
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu_out}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-gpu}"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc)}"
mkdir -p "$OUT"
STATUS_FILE="$OUT/status.txt"
: > "$STATUS_FILE"

# Compiled kernels are shared by every step (and kept between runs of this script).
export SPARSEJIT_CACHE_DIR="${SPARSEJIT_CACHE_DIR:-$BUILD_DIR/jit-cache}"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
# libnvrtc from the CUDA wheels PyTorch depends on (the Python package sets this too).
if [ -z "${SPARSEJIT_NVRTC_DIRS:-}" ]; then
  SPARSEJIT_NVRTC_DIRS="$("$PYTHON" - <<'EOF' 2>/dev/null
import os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
dirs = [os.path.join(r, s) for r in roots for s in ("cu13/lib", "cuda_nvrtc/lib", "cu12/lib")]
print(":".join(d for d in dirs if os.path.isdir(d)))
EOF
)"
  export SPARSEJIT_NVRTC_DIRS
fi

log() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$OUT/gpu_check.log"; }

# run_step NAME COMMAND...: runs, logs to $OUT/NAME.log, records the exit status.
run_step() {
  local name="$1"
  shift
  log "step $name: $*"
  local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  log "step $name: exit $rc after $((SECONDS - t0)) s (log: $OUT/$name.log)"
  echo "$name $rc $((SECONDS - t0))s" >> "$STATUS_FILE"
  tail -n 25 "$OUT/$name.log"
  return $rc
}

step_env() {
  {
    echo "== date"; date
    echo "== nvidia-smi"; nvidia-smi || true
    echo "== nvcc"; nvcc --version || true
    echo "== python / torch"
    "$PYTHON" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available()); print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no device")'
    echo "== cmake / ninja"; cmake --version | head -1; ninja --version || true
    echo "== SPARSEJIT_NVRTC_DIRS=$SPARSEJIT_NVRTC_DIRS"
    echo "== compute-sanitizer"; command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer || true
  } > "$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
}

step_build() {
  local prefix pybind_dir
  prefix="$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')" || return 1
  pybind_dir="$("$PYTHON" -m pybind11 --cmakedir 2>/dev/null || true)"
  local gen=()
  command -v ninja > /dev/null && gen=(-G Ninja)
  cmake -S "$ROOT" -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DSPARSEJIT_WITH_CUDA=ON -DSPARSEJIT_BUILD_TESTS=ON -DSPARSEJIT_BUILD_PYTHON=ON \
    -DCMAKE_PREFIX_PATH="$prefix" ${pybind_dir:+-Dpybind11_DIR="$pybind_dir"} \
    -DPython_EXECUTABLE="$(command -v "$PYTHON")" || return 1
  cmake --build "$BUILD_DIR" -j "$JOBS" || return 1
  # The CUDA op implementations must be in the op library.
  "$PYTHON" -c 'import torch, sparsejit; assert torch._C._dispatch_has_kernel_for_dispatch_key("sparsejit::spmm", "CUDA"), "no CUDA kernel registered for sparsejit::spmm"; print("sparsejit CUDA ops registered")'
}

step_cpp() {
  # Every NVRTC variant compiles, the planner, host-emulated kernels, and every variant
  # checked on the GPU with guard bands.
  SPARSEJIT_TEST_GPU_ALL_VARIANTS=1 ctest --test-dir "$BUILD_DIR" --output-on-failure \
    -j 2 --timeout 900 --output-junit "$OUT/ctest.xml"
}

sanitizer_bin() {
  command -v compute-sanitizer 2> /dev/null || { [ -x /usr/local/cuda/bin/compute-sanitizer ] && echo /usr/local/cuda/bin/compute-sanitizer; }
}

step_sanitize() {
  local cs
  cs="$(sanitizer_bin)"
  if [ -z "$cs" ]; then
    echo "compute-sanitizer not found: step skipped"
    return 0
  fi
  # No caching allocator: every tensor is its own allocation, so out-of-bounds accesses hit
  # unallocated memory and are reported.
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$cs" --tool memcheck --error-exitcode 97 \
    --log-file "$OUT/sanitizer.%p.log" --print-limit 50 \
    "$PYTHON" -m pytest "$ROOT/tests/python" -q -x -p no:cacheprovider \
    -k "${SANITIZE_K:-cuda and not graph_capture}" --junitxml "$OUT/pytest_sanitize.xml"
}

step_pytest() {
  "$PYTHON" -m pytest "$ROOT/tests/python" -q -p no:cacheprovider -k cuda \
    --junitxml "$OUT/pytest_cuda.xml" --durations 15
}

step_bench() {
  if ! "$PYTHON" -c 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec("sparsejit.tools.bench") else 1)'; then
    echo "sparsejit.tools.bench is not in this tree: step skipped"
    return 0
  fi
  # BENCH_ARGS lets the harness's own flags through (e.g. a suite name or repeat count).
  # shellcheck disable=SC2086
  "$PYTHON" -m sparsejit.tools.bench --device cuda --out-json "$OUT/bench_cuda.json" \
    --out-md "$OUT/bench_cuda.md" ${BENCH_ARGS:-}
}

step_families() {
  # FAMILY_ARGS lets sparsejit-bench's flags through (e.g. --quick or --families rgms).
  # shellcheck disable=SC2086
  "$PYTHON" -m sparsejit.tools.bench_all --device cuda --train --out-json "$OUT/bench_families.json" \
    --out-md "$OUT/bench_families.md" ${FAMILY_ARGS:-}
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(env build cpp sanitize pytest bench families)
failed=0
for s in "${steps[@]}"; do
  case "$s" in
    env | build | cpp | sanitize | pytest | bench | families) run_step "$s" "step_$s" || failed=1 ;;
    *) log "unknown step '$s' (steps: env build cpp sanitize pytest bench families)"; failed=1 ;;
  esac
  if [ "$s" = build ] && [ $failed -ne 0 ]; then
    log "the build failed: later steps skipped"
    break
  fi
done
log "summary:"
cat "$STATUS_FILE" | tee -a "$OUT/gpu_check.log"
exit $failed
