#!/usr/bin/env bash
# Build TorchSparse 2.0.0 CPU-only into its own virtual environment, for benchmarking sparsejit
# against it. Never a dependency of sparsejit.
#
#   benchmarks/peers/build_torchsparse.sh SOURCE [DIR]    (default DIR: ~/.cache/sparsejit-peers)
#
# Why 2.0.0: it is the newest TorchSparse that runs on the CPU; 2.1 is GPU-only by its
# maintainers' word. TorchSparse is not on PyPI, and GitHub may not be reachable from the
# machine, so SOURCE is given:
#   - a git repository (a clone or a bare mirror) of https://github.com/mit-han-lab/torchsparse
#     holding tag v2.0.0 (commit 1a10fda15098f3bf4fa2d01f8bee53e85762abcf, 2023-01-08);
#     the script exports that tag, or
#   - an unpacked source tree of that tag (its torchsparse/version.py says 2.0.0b), e.g. from
#     https://github.com/mit-han-lab/torchsparse/archive/refs/tags/v2.0.0.tar.gz
# On a machine with GitHub: git clone https://github.com/mit-han-lab/torchsparse SOURCE
#
# Result: DIR/torchsparse/venv/bin/python imports torchsparse 2.0.0. The venv is created with
# --system-site-packages from python3 (or $PYTHON), so it sees the pinned torch and sparsejit's
# dev install. Idempotent: a finished build (the import works) is not redone.
#
# Patches (Python only; the C++ CPU sources build unchanged against torch 2.13):
#   1. `from torch.cuda.amp import custom_bwd, custom_fwd` (deprecated) becomes
#      torch.amp's with device_type="cuda" in nn/functional/{conv,devoxelize,voxelize}.py:
#      the same behaviour (casts only under CUDA autocast), without the deprecation warning.
#   2. A CPU bug of the v2.0.0 tag itself: nn/functional/build_kmap.py (hashmap mode, the
#      default) calls torchsparse.backend.build_mask_from_kmap, which only the CUDA build
#      defines (backend/pybind_cuda.cpp), so every CPU convolution fails with "module
#      'torchsparse.backend' has no attribute 'build_mask_from_kmap'". The masks feed only the
#      CUDA kernels; on the CPU the patch returns the maps without them, the 2- and 3-tuple
#      forms nn/functional/conv.py already accepts (mask None).
# Not patched, and what it means for the benchmark: TorchSparse 2.0 on the CPU has no kernel-3
# stride-2 convolution (spdownsample raises NotImplementedError unless kernel == stride), so
# its strided rows use kernel 2 stride 2 only. Its CPU gather/scatter opens an OpenMP region
# per row (`#pragma omp parallel for` over channels inside the row loop).
# System packages: libsparsehash-dev (google/dense_hash_map, header-only) and g++.
set -euo pipefail

if [ $# -lt 1 ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
fi
SOURCE=$1
DIR=${2:-$HOME/.cache/sparsejit-peers}
PY=${PYTHON:-python3}
TAG=v2.0.0
VER=2.0.0
mkdir -p "$DIR/torchsparse"
ROOT=$(cd "$DIR/torchsparse" && pwd)
VENV="$ROOT/venv"
SRC="$ROOT/torchsparse-$VER"

. "$(dirname "$0")/common.sh"
log() { echo "[build_torchsparse] $*"; }
check() {
  (cd / && "$VENV/bin/python" -c "
import torch, torchsparse, torchsparse.nn as spnn
assert torchsparse.__version__.startswith('2.0'), torchsparse.__version__
c = torch.tensor([[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.int32)  # x y z batch
x = torchsparse.SparseTensor(torch.ones(3, 2), c)
y = spnn.Conv3d(2, 3, 3)(x)
assert y.F.shape == (3, 3)
print('[build_torchsparse] torchsparse', torchsparse.__version__, 'works:', '$VENV/bin/python')
")
}

if [ -x "$VENV/bin/python" ] && check 2>/dev/null; then
  log "TorchSparse $VER already built in $VENV"
  exit 0
fi

# 1. System packages.
apt_need libsparsehash-dev g++

# 2. The source of tag v2.0.0, copied so that the patches never touch SOURCE.
if [ ! -f "$SRC/setup.py" ]; then
  rm -rf "$SRC.tmp" && mkdir -p "$SRC.tmp"
  if git --git-dir="$SOURCE" rev-parse -q --verify "$TAG^{commit}" >/dev/null 2>&1; then
    GD="$SOURCE"
  elif git --git-dir="$SOURCE/.git" rev-parse -q --verify "$TAG^{commit}" >/dev/null 2>&1; then
    GD="$SOURCE/.git"
  else
    GD=""
  fi
  if [ -n "$GD" ]; then
    log "exporting $TAG ($(git --git-dir="$GD" rev-parse "$TAG^{commit}")) from $SOURCE"
    git --git-dir="$GD" archive "$TAG" | tar -x -C "$SRC.tmp"
  elif [ -f "$SOURCE/torchsparse/version.py" ]; then
    cp -r "$SOURCE/." "$SRC.tmp/"
  else
    log "$SOURCE is neither a git repository with tag $TAG nor a TorchSparse source tree"
    exit 1
  fi
  got=$(sed -n "s/^__version__ = '\(.*\)'/\1/p" "$SRC.tmp/torchsparse/version.py")
  if [ "${got#2.0}" = "$got" ]; then   # the v2.0.0 tag's version.py says 2.0.0b
    log "$SOURCE gives TorchSparse '$got', not 2.0 (2.1 and later are GPU-only)"
    exit 1
  fi
  mv "$SRC.tmp" "$SRC"
fi

# 3. Patch 1 (idempotent: rewrites only the old import).
cd "$SRC"
for f in torchsparse/nn/functional/conv.py torchsparse/nn/functional/devoxelize.py \
         torchsparse/nn/functional/voxelize.py; do
  if grep -q '^from torch.cuda.amp import custom_bwd, custom_fwd$' "$f"; then
    sed -i 's/^from torch.cuda.amp import custom_bwd, custom_fwd$/import functools\
from torch.amp import custom_bwd as _amp_bwd, custom_fwd as _amp_fwd\
custom_bwd = functools.partial(_amp_bwd, device_type="cuda")\
custom_fwd = functools.partial(_amp_fwd, device_type="cuda")/' "$f"
    log "patched $f"
  fi
done

# Patch 2 (idempotent: it looks for its own marker).
"$PY" - <<'PYEOF'
path = "torchsparse/nn/functional/build_kmap.py"
text = open(path).read()
call = "        input_mask, output_mask = torchsparse.backend.build_mask_from_kmap("
marker = "# sparsejit-peers patch 2"
if marker not in text:
    if text.count(call) != 1:
        raise SystemExit(f"[build_torchsparse] {path}: build_mask_from_kmap call not found")
    guard = ("        if _coords.device.type != 'cuda':  " + marker + ": masks are CUDA-only\n"
             "            if any(s > 1 for s in stride):\n"
             "                return nbmaps, nbsizes, coords\n"
             "            return nbmaps, nbsizes\n")
    open(path, "w").write(text.replace(call, guard + call))
    print("[build_torchsparse] patched", path)
PYEOF

# 4. The venv and the build (FORCE_CUDA unset: setup.py picks the CPU sources when torch has
#    no CUDA).
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV (--system-site-packages)"
  "$PY" -m venv --system-site-packages "$VENV"
fi
"$VENV/bin/python" -m pip install -q wheel ninja tqdm typing-extensions
# The venv's bin first: torch's extension builder looks for ninja on PATH, and without it
# compiles one file at a time, ignoring MAX_JOBS.
export PATH="$VENV/bin:$PATH"
log "building (MAX_JOBS=${MAX_JOBS:-2})"
env -u FORCE_CUDA MAX_JOBS=${MAX_JOBS:-2} "$VENV/bin/python" -m pip install -v \
  --no-build-isolation --no-deps . 2>&1 | tail -n 40
check
