// The op library's one door to Torch. Every op file reaches Torch only through what this
// header declares:
//   - namespace tx: the tensor type (tx::Tensor, tx::TensorOptions), dtype constants
//     (tx::kFloat ...), tx::ScalarType, tx::IntArrayRef, tx::Str (a schema `str` argument),
//     and the few tensor functions the adapters call (tx::empty, tx::sort, tx::mm_out, ...);
//   - SJ_CHECK_VALUE / SJ_CHECK_TYPE / SJ_CHECK_RUNTIME: the argument checks (ValueError,
//     TypeError, RuntimeError in Python; SPARSEJIT_CHECK in common.h builds on the first);
//   - SJ_LIBRARY(m) (library.cpp only) / SJ_LIBRARY_FRAGMENT(m) / SJ_LIBRARY_IMPL(KEY, m) / SJ_KERNEL(&fn): op registration.
//
// Backend today: ATen (tx is at::, the macros are TORCH_CHECK_* and TORCH_LIBRARY_*), so the
// op library is bound to the torch release it was built against. This header is the seam of
// the move to PyTorch's stable ABI (issue 20): the stable backend (torch/csrc/stable,
// STABLE_TORCH_LIBRARY_*, TORCH_BOX, TORCH_TARGET_VERSION) implements the same names, and
// what it cannot express (ATen ops without a stable wrapper) goes through the dispatcher by
// name. Op files must not include ATen or c10 headers themselves: a name they need goes here.
//
// Not yet behind the seam: the CUDA adapters' c10::cuda guards and streams
// (torch_ext/cuda_common.h), the boxed CUDA -> CPU fallback (torch_ext/cuda_fallback.h),
// the version-counter validation tables (torch_ext/validated.h) and the typed dispatcher
// calls of rgms.cpp and api.cpp.
#pragma once

#ifdef SPARSEJIT_STABLE_ABI
#include "torch_ext/tensor_api_stable.h"
#else

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

namespace sparsejit::tx {

using namespace ::at;  // NOLINT: the ATen backend: tx::X is at::X

using Str = c10::string_view;  // a schema `str` argument

}  // namespace sparsejit::tx

#define SJ_CHECK_VALUE(cond, ...) TORCH_CHECK_VALUE(cond, __VA_ARGS__)
#define SJ_CHECK_TYPE(cond, ...) TORCH_CHECK_TYPE(cond, __VA_ARGS__)
#define SJ_CHECK_RUNTIME(cond, ...) TORCH_CHECK(cond, __VA_ARGS__)

#define SJ_LIBRARY(m) TORCH_LIBRARY(sparsejit, m)
#define SJ_LIBRARY_FRAGMENT(m) TORCH_LIBRARY_FRAGMENT(sparsejit, m)
#define SJ_LIBRARY_IMPL(key, m) TORCH_LIBRARY_IMPL(sparsejit, key, m)
#define SJ_KERNEL(fn) (fn)

#endif  // SPARSEJIT_STABLE_ABI
