"""Loads the op library (libsparsejit_ops.so: the schemas and CPU / CUDA kernels of every
``torch.ops.sparsejit`` op). Fakes, autograd and the user-facing wrappers of each op live in
``sparsejit/families/<family>/ops.py``."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent


def _point_at_nvrtc() -> None:
    """Lets the CUDA backend find libnvrtc from the pip wheels (nvidia-cuda-nvrtc, or the
    ones a CUDA build of torch depends on) without LD_LIBRARY_PATH."""
    if os.environ.get("SPARSEJIT_NVRTC_DIRS"):
        return
    # nvidia: the namespace package of NVIDIA's wheels, located without importing it.
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return
    dirs = [os.path.join(root, sub) for root in spec.submodule_search_locations
            for sub in ("cu13/lib", "cuda_nvrtc/lib", "cu12/lib")]
    found = [d for d in dirs if os.path.isdir(d)]
    if found:
        os.environ["SPARSEJIT_NVRTC_DIRS"] = os.pathsep.join(found)


def _release(version: str) -> tuple:
    """(major, minor) of a torch version string such as '2.13.0+cpu'."""
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (version,)


def _abi_mismatch(built: str, detail: str = "") -> ImportError:
    return ImportError(
        f"sparsejit: the op library was built against torch {built}, but torch "
        f"{torch.__version__} is installed. The op library uses torch's C++ ABI, which changes "
        f"between torch releases, so it only loads under torch {'.'.join(map(str, _release(built)))}.x. "
        f"Install that torch (pip install 'torch=={'.'.join(map(str, _release(built)))}.*'), or "
        "rebuild sparsejit against this one (pip install --no-build-isolation . from the "
        "source tree, or `make build`). SPARSEJIT_ALLOW_TORCH_MISMATCH=1 loads it anyway, at "
        "your own risk." + (f" Loader error: {detail}" if detail else ""))


def _read_stamp(stamp: Path):
    """The stamp beside the op library: the torch it was built against (first line) and, for
    a library on torch's stable ABI, a line ``stable-abi X.Y``: the oldest torch it loads
    under. Returns (built, min_release or None)."""
    if not stamp.exists():
        return None, None
    lines = [ln.strip() for ln in stamp.read_text().splitlines() if ln.strip()]
    built = lines[0] if lines else None
    for ln in lines[1:]:
        if ln.startswith("stable-abi "):
            return built, _release(ln.split()[1])
    return built, None


def _too_old(built: str, minimum: tuple, detail: str = "") -> ImportError:
    need = ".".join(map(str, minimum))
    return ImportError(
        f"sparsejit: the op library is built on torch's stable ABI and loads under torch >= "
        f"{need} (built against {built}), but torch {torch.__version__} is installed. Install a "
        f"newer torch (pip install 'torch>={need}'), or rebuild sparsejit against this one "
        "(pip install --no-build-isolation . from the source tree, or `make build`)."
        + (f" Loader error: {detail}" if detail else ""))


STABLE_ABI = False  # set by _load_library: the op library is on torch's stable ABI
MIN_TORCH = None    # and then the oldest torch release (major, minor) it loads under


def _load_library() -> None:
    global STABLE_ABI, MIN_TORCH
    candidates = [_HERE / "libsparsejit_ops.so"]
    env = os.environ.get("SPARSEJIT_OPS_LIBRARY")
    if env:
        candidates.insert(0, Path(env))
    for path in candidates:
        if path.exists():
            built, minimum = _read_stamp(path.with_suffix(".torch_version"))
            if minimum is not None:
                STABLE_ABI, MIN_TORCH = True, minimum
                if _release(torch.__version__) < minimum:
                    raise _too_old(built, minimum)
            elif built and _release(built) != _release(torch.__version__):
                if os.environ.get("SPARSEJIT_ALLOW_TORCH_MISMATCH") != "1":
                    raise _abi_mismatch(built)
                import warnings
                warnings.warn(
                    f"sparsejit: loading an op library built against torch {built} under torch "
                    f"{torch.__version__} (SPARSEJIT_ALLOW_TORCH_MISMATCH=1). torch does not "
                    "keep its C++ ABI between releases: results are not guaranteed.",
                    RuntimeWarning, stacklevel=3)
            try:
                torch.ops.load_library(str(path))
            except OSError as e:
                # torch wraps the loader's error ("undefined symbol: ...") as the cause.
                detail = f"{e}: {e.__cause__}" if e.__cause__ is not None else str(e)
                if built and "undefined symbol" in detail:
                    if minimum is not None:
                        raise _too_old(built, minimum, detail) from e
                    raise _abi_mismatch(built, detail) from e
                raise
            return
    raise ImportError(
        "sparsejit: the op library libsparsejit_ops.so was not found next to "
        f"{_HERE} (looked for: {', '.join(map(str, candidates))}). Build it with `make build` "
        "from the repository root, or set SPARSEJIT_OPS_LIBRARY to its path."
    )


_point_at_nvrtc()
_load_library()

ops = torch.ops.sparsejit

# The floating dtypes every family's ops take for features (float16 computed in float32).
FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)

_TYPE_PREFIX = "TypeError: "


def restores_type_errors(fn):
    """Decorates a public function that calls the raw ops: on the stable ABI a raw op reports a
    wrong dtype as ValueError("TypeError: ...") (a stable-ABI op cannot raise TypeError; the
    prefix marks it, tensor_api_stable.h), and the public API re-raises it as the TypeError it
    is. A no-op on the ATen backend, whose ops raise TypeError themselves."""
    if not STABLE_ABI:
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ValueError as e:
            msg = str(e)
            if msg.startswith(_TYPE_PREFIX):
                raise TypeError(msg[len(_TYPE_PREFIX):]) from None
            raise
    return wrapper
