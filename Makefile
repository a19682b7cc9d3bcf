# sparsejit developer entry points. Two commands do everything on a fresh machine:
#   make demo   - set up, build, and train a GCN with sparsejit vs pure PyTorch
#   make test   - set up, build, and run every C++ and Python test
# and for the package: make wheel (pip wheel into build-wheel/dist), make test-wheel (install
# it into a fresh venv and run the smoke suite from outside the source tree).
PYTHON ?= python3
BUILD  ?= build
JOBS   ?= $(shell nproc)
# Pinned: 2.13.0 is the CPU build (an unpinned torch pulls a multi-GB CUDA build).
TORCH_SPEC ?= torch==2.13.0
APT_PACKAGES := cmake ninja-build g++ libgtest-dev ccache libdnnl-dev
# nvidia-cuda-nvrtc: libnvrtc, so CI compiles every generated CUDA kernel (no GPU needed).
PIP_PACKAGES := $(TORCH_SPEC) numpy scipy pybind11 pytest nvidia-cuda-nvrtc==13.0.* torch_geometric==2.8.1 spconv==2.3.8 scikit-build-core sphinx
# ccache keys on paths relative to the repository, so the wheel's build (build-wheel/, the
# same depth as build/) reuses the objects of `make build`.
export CCACHE_BASEDIR := $(CURDIR)

.PHONY: all setup build develop install test test-cpp test-python test-slow test-sanitize test-wheel wheel docs demo bench format clean

all: build

# System and Python packages, installed only when missing.
setup:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "== apt-get install$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@$(PYTHON) -c "import torch, numpy, scipy, pybind11, pytest, nvidia.cu13, torch_geometric, spconv, scikit_build_core, sphinx" 2>/dev/null || \
	  { echo "== pip install $(PIP_PACKAGES)"; $(PYTHON) -m pip install -q $(PIP_PACKAGES); }

$(BUILD)/build.ninja: CMakeLists.txt | setup
	cmake -S . -B $(BUILD) -G Ninja \
	  -DCMAKE_PREFIX_PATH="$$($(PYTHON) -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
	  -Dpybind11_DIR="$$($(PYTHON) -m pybind11 --cmakedir)" \
	  -DPython_EXECUTABLE="$$(command -v $(PYTHON))" \
	  -DCMAKE_INSTALL_PREFIX="$(CURDIR)/$(BUILD)/install"

build: setup $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)
	cmake --install $(BUILD) > /dev/null
	@$(MAKE) --no-print-directory develop

# Development install: a .pth file puts python/ on the active interpreter's path, so
# `import sparsejit` works from any directory and picks up rebuilt libraries at once.
develop:
	@site=$$($(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	echo "$(CURDIR)/python" > $$site/sparsejit-dev.pth; \
	echo "== sparsejit development install: $$site/sparsejit-dev.pth -> $(CURDIR)/python"

test-cpp: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-python: build
	cd tests/python && $(PYTHON) -m pytest -q -ra -m "not slow" . --ignore=core/test_aoti_deploy.py  # ctest runs that one

# The heavy tier `make test` leaves out (tests marked `slow`: the fuzz test's other seeds, the
# ISA-cap tiers, the full cross product of JIT variants, benchmarks/archive's scripts); .ci/run
# runs it after `make test`.
test-slow: build
	cd tests/python && $(PYTHON) -m pytest -q -ra -m slow . --ignore=core/test_aoti_deploy.py

test: test-cpp test-python docs

# The API reference from the docstrings (docs/api), warnings as errors: build/docs/index.html.
docs: build
	$(PYTHON) -m sphinx -W --keep-going -q -b html docs/api $(BUILD)/docs

# The core library and C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer, in
# build-asan/ (no Torch op library or Python module: see SPARSEJIT_SANITIZE in CMakeLists.txt).
# Kernels the JIT compiles at run time are not instrumented; NVRTC compiles a representative
# subset of the CUDA variants (make test compiles them all).
ASAN_BUILD ?= build-asan
test-sanitize: setup
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DSPARSEJIT_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DPython_EXECUTABLE="$$(command -v $(PYTHON))"
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 SPARSEJIT_TEST_CUDA_VARIANT_SUBSET=1 \
	  ctest --output-on-failure -j $(JOBS)

# The pip wheel, built by scikit-build-core from the same CMakeLists.txt against the installed
# torch (no build isolation: it would fetch another torch).
WHEEL_DIR ?= build-wheel/dist
WHEEL_VENV ?= build-wheel/venv
wheel: setup
	rm -rf $(WHEEL_DIR)
	$(PYTHON) -m pip wheel . --no-build-isolation --no-deps -w $(WHEEL_DIR)

# A fresh venv with only the wheel and its dependencies (no source tree, no development
# .pth), and the smoke suite run from another directory.
test-wheel: wheel
	rm -rf $(WHEEL_VENV)
	$(PYTHON) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -m pip install -q $(TORCH_SPEC) numpy pytest $(WHEEL_DIR)/sparsejit-*.whl
	cd /tmp && SPARSEJIT_SOURCE_DIR=$(CURDIR) $(CURDIR)/$(WHEEL_VENV)/bin/python -m pytest -q \
	  -p no:cacheprovider $(CURDIR)/tests/smoke

demo: build
	$(PYTHON) -m sparsejit.tools.demo $(ARGS)

bench: build
	$(PYTHON) -m sparsejit.tools.bench $(ARGS)

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-wheel python/sparsejit/*.so
