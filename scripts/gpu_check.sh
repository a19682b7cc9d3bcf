#!/usr/bin/env bash
# The one script to run on a GPU machine (no network needed): builds sparsejit with the CUDA
# backend against the machine's PyTorch, runs the C++ tests (NVRTC variants, kernel-level guard
# band checks on the GPU), the CUDA Python tests (also under compute-sanitizer memcheck) and
# the GPU benchmarks. Logs, JUnit XML and JSON go to $GPU_CHECK_WORK (default ./gpu_out).
#
#   scripts/gpu_check.sh              the one-call profile: env build cpp pytest families
#   scripts/gpu_check.sh all          every step: env build cpp sanitize pytest bench families
#   scripts/gpu_check.sh build cpp    only the named steps, in the order given
#
# Sized for the device tool (one command of at most 10 minutes, 15 minutes of device time a
# session): the steps share a budget, GPU_CHECK_BUDGET_S (default 540 s); a step is stopped
# when the budget runs out and the steps after it are reported as skipped, so the call returns
# with what it has. Without named steps `families` runs with --quick (FAMILY_ARGS overrides);
# a later call can run `families`, `sanitize` or `bench` on their own (the build stays in
# BUILD_DIR while the machine is warm). When $OUT is set (the device tool's folder, which
# takes back at most 8 files), the summaries are copied there and everything is also packed
# into $OUT/gpu_check_logs.tar.gz.
#
# Before lending the tree, run scripts/gpu_prepare.sh here: the GPU machine has no
# GoogleTest package and builds the one carried in .gtest/ (carry: [".gtest"]).
#
# Steps: `cpp` is ctest without the CPU emulation (CI runs it): every NVRTC variant compiled
# and checked on the GPU with guard bands; `pytest` the CUDA Python tests; `sanitize` those
# under compute-sanitizer memcheck; `bench` SpMM / SDDMM against cuSPARSE and the
# gather/scatter path; `families` every op family fwd+bwd against the GPU peers installed
# (cuSPARSE, PyG's layers, spconv's CUDA build, cuDNN's dense convolution) and both
# point-conv dataflows: bench_families.{json,md}.
#
# Environment: OUT, GPU_CHECK_WORK, GPU_CHECK_BUDGET_S, BUILD_DIR (default build-gpu), JOBS,
# PYTHON (default python3), BENCH_ARGS (extra arguments for `python3 -m sparsejit.tools.bench`),
# FAMILY_ARGS (for `python3 -m sparsejit.tools.bench_all`), SANITIZE_K (pytest -k expression
# for the sanitizer run; default: the CUDA tests without the graph-capture ones).
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WORK="${GPU_CHECK_WORK:-$ROOT/gpu_out}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-gpu}"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc)}"
BUDGET_S="${GPU_CHECK_BUDGET_S:-540}"
mkdir -p "$WORK"
STATUS_FILE="$WORK/status.txt"

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

log() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$WORK/gpu_check.log"; }

# run_step NAME: runs step_NAME in a child of this script under what is left of the budget,
# logs to $WORK/NAME.log, records the exit status (124: stopped by the budget).
run_step() {
  local name="$1"
  local left=$((BUDGET_S - SECONDS))
  if [ "$left" -le 5 ]; then
    log "step $name: skipped, the ${BUDGET_S} s budget is spent"
    echo "$name skipped (budget)" >> "$STATUS_FILE"
    return 1
  fi
  log "step $name (at most ${left} s)"
  local t0=$SECONDS
  timeout --kill-after=10 "$left" "$0" --one-step "$name" > "$WORK/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && log "step $name: stopped by the budget"
  log "step $name: exit $rc after $((SECONDS - t0)) s (log: $WORK/$name.log)"
  echo "$name $rc $((SECONDS - t0))s" >> "$STATUS_FILE"
  tail -n 25 "$WORK/$name.log"
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
  } > "$WORK/env.txt" 2>&1
  cat "$WORK/env.txt"
}

step_build() {
  local prefix pybind_dir
  prefix="$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')" || return 1
  pybind_dir="$("$PYTHON" -m pybind11 --cmakedir 2>/dev/null || true)"
  local gen=()
  command -v ninja > /dev/null && gen=(-G Ninja)
  configure() {
    cmake -S "$ROOT" -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DSPARSEJIT_WITH_CUDA=ON -DSPARSEJIT_BUILD_TESTS="$1" -DSPARSEJIT_BUILD_PYTHON=ON \
      -DCMAKE_PREFIX_PATH="$prefix" ${pybind_dir:+-Dpybind11_DIR="$pybind_dir"} \
      -DPython_EXECUTABLE="$(command -v "$PYTHON")"
  }
  # Without GoogleTest (none installed, no .gtest/ carried) the rest still builds and runs.
  configure ON || { echo "== configure with the C++ tests failed: again without them"; configure OFF; } || return 1
  cmake --build "$BUILD_DIR" -j "$JOBS" || return 1
  # The CUDA op implementations must be in the op library.
  "$PYTHON" -c 'import torch, sparsejit; assert torch._C._dispatch_has_kernel_for_dispatch_key("sparsejit::spmm", "CUDA"), "no CUDA kernel registered for sparsejit::spmm"; print("sparsejit CUDA ops registered")'
}

step_cpp() {
  # Every NVRTC variant compiles, the planner, host-emulated kernels, and every variant
  # checked on the GPU with guard bands.
  if [ ! -f "$BUILD_DIR/tests/cpp/CTestTestfile.cmake" ]; then
    echo "no C++ tests in $BUILD_DIR (GoogleTest missing: run scripts/gpu_prepare.sh before lending the tree)"
    return 1
  fi
  SPARSEJIT_TEST_GPU_ALL_VARIANTS=1 ctest --test-dir "$BUILD_DIR" --output-on-failure \
    -j "$JOBS" -E 'CudaEmulated|aoti_packages' --timeout 900 --output-junit "$WORK/ctest.xml"
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
    --log-file "$WORK/sanitizer.%p.log" --print-limit 50 \
    "$PYTHON" -m pytest "$ROOT/tests/python" -q -x -p no:cacheprovider \
    -k "${SANITIZE_K:-cuda and not graph_capture}" --junitxml "$WORK/pytest_sanitize.xml"
}

step_pytest() {
  "$PYTHON" -m pytest "$ROOT/tests/python" -q -p no:cacheprovider -k cuda \
    --junitxml "$WORK/pytest_cuda.xml" --durations 15
}

step_bench() {
  if ! "$PYTHON" -c 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec("sparsejit.tools.bench") else 1)'; then
    echo "sparsejit.tools.bench is not in this tree: step skipped"
    return 0
  fi
  # BENCH_ARGS lets the harness's own flags through (e.g. a suite name or repeat count).
  # shellcheck disable=SC2086
  "$PYTHON" -m sparsejit.tools.bench --device cuda --out-json "$WORK/bench_cuda.json" \
    --out-md "$WORK/bench_cuda.md" ${BENCH_ARGS:-}
}

step_families() {
  # FAMILY_ARGS lets sparsejit-bench's flags through (e.g. --quick or --families rgms).
  # shellcheck disable=SC2086
  "$PYTHON" -m sparsejit.tools.bench_all --device cuda --train --out-json "$WORK/bench_families.json" \
    --out-md "$WORK/bench_families.md" ${FAMILY_ARGS-$DEFAULT_FAMILY_ARGS}
}

ALL_STEPS=(env build cpp sanitize pytest bench families)
if [ "${1:-}" = "--one-step" ]; then  # a child of run_step
  case "${2:-}" in
    env | build | cpp | sanitize | pytest | bench | families) "step_$2"; exit $? ;;
    *) echo "unknown step '${2:-}'"; exit 2 ;;
  esac
fi

: > "$STATUS_FILE"
DEFAULT_FAMILY_ARGS=""
steps=("$@")
if [ ${#steps[@]} -eq 0 ]; then
  steps=(env build cpp pytest families)
  DEFAULT_FAMILY_ARGS="--quick"
elif [ "${steps[*]}" = all ]; then
  steps=("${ALL_STEPS[@]}")
fi
export DEFAULT_FAMILY_ARGS
log "steps: ${steps[*]}; budget ${BUDGET_S} s; work folder $WORK"
failed=0
for s in "${steps[@]}"; do
  case "$s" in
    env | build | cpp | sanitize | pytest | bench | families) run_step "$s" || failed=1 ;;
    *) log "unknown step '$s' (steps: ${ALL_STEPS[*]}, or all)"; failed=1 ;;
  esac
  if [ "$s" = build ] && [ $failed -ne 0 ]; then
    log "the build failed: later steps skipped"
    break
  fi
done
log "summary:"
tee -a "$WORK/gpu_check.log" < "$STATUS_FILE"
# The device tool takes back at most 8 files from $OUT: the summaries, and one archive.
if [ -n "${OUT:-}" ] && [ "$(mkdir -p "$OUT" && cd "$OUT" && pwd)" != "$(cd "$WORK" && pwd)" ]; then
  for f in gpu_check.log status.txt env.txt bench_families.md bench_families.json bench_cuda.md; do
    [ -f "$WORK/$f" ] && cp "$WORK/$f" "$OUT/"
  done
  tar -C "$WORK" -czf "$OUT/gpu_check_logs.tar.gz" . 2> /dev/null
fi
exit $failed
