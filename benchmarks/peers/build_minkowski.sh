#!/usr/bin/env bash
# Build MinkowskiEngine 0.5.4 CPU-only (OpenMP, OpenBLAS) into its own virtual environment,
# for benchmarking sparsejit against it. Never a dependency of sparsejit.
#
#   benchmarks/peers/build_minkowski.sh [DIR]      (default DIR: ~/.cache/sparsejit-peers)
#
# Result: DIR/minkowski/venv/bin/python imports MinkowskiEngine. The venv is created with
# --system-site-packages, so it sees the python3 it was made from, with its pinned torch and
# sparsejit's dev install (sparsejit-dev.pth); run this with the python3 sparsejit uses.
#
# Idempotent: each step is skipped when its result is already there; a finished build is
# detected by importing MinkowskiEngine in the venv. Needs PyPI and Debian mirrors only.
#
# Patches (all in Python files; the C++ builds unchanged against torch 2.13):
#   1. collections.Sequence -> collections.abc.Sequence (removed in Python 3.10) in
#      MinkowskiCommon.py, MinkowskiCoordinateManager.py, MinkowskiKernelGenerator.py,
#      MinkowskiTensorField.py and utils/quantization.py.
#   Not patched: utils/gradcheck.py imports torch._six and private torch.autograd.gradcheck
#   helpers that torch 2.x removed; nothing imports it (`import MinkowskiEngine` and
#   MinkowskiEngine.utils do not), so ME's own gradcheck is unusable and nothing else is.
# Build environment:
#   - SETUPTOOLS_USE_DISTUTILS=stdlib: numpy's old distutils helper, which setup.py uses to
#     find a BLAS, crashes on setuptools' bundled distutils.
#   - libopenblas-dev from Debian: setup.py looks for a BLAS even to download the sdist.
#   - MAX_JOBS=${MAX_JOBS:-2}; about 6 minutes on 2 cores.
# Run the benchmark with OPENBLAS_NUM_THREADS=1: ME's CPU conv runs OpenBLAS inside its own
# OpenMP region and the two thread pools busy-wait against each other on a 2-core machine.
set -euo pipefail

DIR=${1:-$HOME/.cache/sparsejit-peers}
PY=${PYTHON:-python3}
VER=0.5.4
ROOT="$DIR/minkowski"
VENV="$ROOT/venv"
SRC="$ROOT/MinkowskiEngine-$VER"
mkdir -p "$ROOT"
ROOT=$(cd "$ROOT" && pwd)
VENV="$ROOT/venv"; SRC="$ROOT/MinkowskiEngine-$VER"

. "$(dirname "$0")/common.sh"
log() { echo "[build_minkowski] $*"; }

if [ -x "$VENV/bin/python" ] && (cd / && OPENBLAS_NUM_THREADS=1 "$VENV/bin/python" -c \
    "import MinkowskiEngine as ME; assert ME.__version__ == '$VER'") 2>/dev/null; then
  log "MinkowskiEngine $VER already built in $VENV"
  exit 0
fi

# 1. System packages: OpenBLAS headers and library, a C++ compiler.
apt_need libopenblas-dev g++

# 2. The venv, seeing the system torch.
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV (--system-site-packages, from $($PY -c 'import sys; print(sys.executable)'))"
  "$PY" -m venv --system-site-packages "$VENV"
fi
"$VENV/bin/python" -c "import torch; print('[build_minkowski] torch', torch.__version__)"
"$VENV/bin/python" -m pip install -q wheel 'setuptools<70' ninja

# The venv's bin first: torch's extension builder looks for ninja on PATH, and without it
# compiles one file at a time, ignoring MAX_JOBS.
export PATH="$VENV/bin:$PATH"
export SETUPTOOLS_USE_DISTUTILS=stdlib

# 3. The sdist from PyPI.
if [ ! -d "$SRC" ]; then
  if [ ! -f "$ROOT/MinkowskiEngine-$VER.tar.gz" ]; then
    log "downloading the MinkowskiEngine $VER sdist from PyPI"
    (cd "$ROOT" && "$VENV/bin/python" -m pip download --no-deps --no-binary :all: \
        --no-build-isolation -d . "minkowskiengine==$VER")
  fi
  tar -xzf "$ROOT/MinkowskiEngine-$VER.tar.gz" -C "$ROOT"
fi

# 4. Patches (idempotent: they rewrite only the unpatched imports).
cd "$SRC"
"$VENV/bin/python" - <<'PYEOF'
import re, sys
files = ["MinkowskiCommon.py", "MinkowskiCoordinateManager.py", "MinkowskiKernelGenerator.py",
         "MinkowskiTensorField.py", "utils/quantization.py"]
for name in files:
    path = "MinkowskiEngine/" + name
    text = open(path).read()
    # "from collections import Sequence[, namedtuple]": Sequence now lives in collections.abc.
    def fix(m):
        names = [n.strip() for n in m.group(1).split(",")]
        abc = [n for n in names if n == "Sequence"]
        rest = [n for n in names if n != "Sequence"]
        lines = []
        if rest:
            lines.append("from collections import " + ", ".join(rest))
        if abc:
            lines.append("from collections.abc import Sequence")
        return "\n".join(lines)
    new = re.sub(r"^from collections import ([A-Za-z_, ]+)$", fix, text, flags=re.M)
    new = re.sub(r"\bcollections\.Sequence\b", "collections.abc.Sequence", new)
    if new != text:
        open(path, "w").write(new)
        print("[build_minkowski] patched", path)
    if re.search(r"^from collections import .*\bSequence\b", new, flags=re.M):
        sys.exit("[build_minkowski] patch left collections.Sequence in " + path)
PYEOF
# 5. Build and install into the venv.
log "building (MAX_JOBS=${MAX_JOBS:-2}; about 6 minutes on 2 cores)"
MAX_JOBS=${MAX_JOBS:-2} "$VENV/bin/python" setup.py install --cpu_only --blas=openblas

cd /
OPENBLAS_NUM_THREADS=1 "$VENV/bin/python" -c "
import MinkowskiEngine as ME, torch
c = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]], dtype=torch.int32)
x = ME.SparseTensor(torch.ones(3, 2), coordinates=c)
y = ME.MinkowskiConvolution(2, 3, kernel_size=3, dimension=3)(x)
assert y.F.shape == (3, 3)
print('[build_minkowski] MinkowskiEngine', ME.__version__, 'works:', '$VENV/bin/python')
"
