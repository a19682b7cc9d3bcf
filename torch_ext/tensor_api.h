// The op library's one door to Torch. Every op file reaches Torch only through what this
// header declares:
//   - namespace tx: the tensor type (tx::Tensor, tx::TensorOptions), dtype constants
//     (tx::kFloat ...), tx::ScalarType, tx::IntArrayRef, tx::Str (a schema `str` argument),
//     and the few tensor functions the adapters call (tx::empty, tx::sort, tx::mm_out, ...);
//   - SJ_CHECK_VALUE / SJ_CHECK_TYPE / SJ_CHECK_RUNTIME: the argument checks (ValueError,
//     TypeError, RuntimeError in Python; SPARSEJIT_CHECK in common.h builds on the first),
//     SJ_WARN(std::string) (a UserWarning); SJ_DISPATCH_FLOATING_TYPES (float and double);
//   - SJ_LIBRARY(m) (library.cpp only) / SJ_LIBRARY_FRAGMENT(m) / SJ_LIBRARY_IMPL(KEY, m) /
//     SJ_KERNEL(&fn): op registration.
//
// Two backends (docs/ARCHITECTURE.md, "The op library on torch's stable ABI"):
//   - stable (SPARSEJIT_STABLE_ABI, the default): tensor_api_stable.h, on torch/csrc/stable
//     and torch/headeronly with TORCH_TARGET_VERSION 2.10, so that one binary loads under
//     every torch release from 2.10 up;
//   - ATen (below; SPARSEJIT_STABLE_ABI=OFF): tx is at::, the macros are TORCH_CHECK_* and
//     TORCH_LIBRARY_*, and the library is bound to the torch it was built against.
// The CUDA adapters' guard, stream and fallback have one form per backend (cuda_common.h,
// cuda_fallback.h).
// Op files must not include ATen or c10 headers themselves: a name they need goes here, in
// both backends (the build compiles the stable one; scripts/check_cuda_adapter.sh, in CI,
// compiles every adapter on both).
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
using c10::elementSize;

}  // namespace sparsejit::tx

#define SJ_CHECK_VALUE(cond, ...) TORCH_CHECK_VALUE(cond, __VA_ARGS__)
#define SJ_CHECK_TYPE(cond, ...) TORCH_CHECK_TYPE(cond, __VA_ARGS__)
#define SJ_CHECK_RUNTIME(cond, ...) TORCH_CHECK(cond, __VA_ARGS__)
#define SJ_WARN(msg) TORCH_WARN(msg)  // a UserWarning in Python
#define SJ_DISPATCH_FLOATING_TYPES AT_DISPATCH_FLOATING_TYPES  // float, double

#define SJ_LIBRARY(m) TORCH_LIBRARY(sparsejit, m)
#define SJ_LIBRARY_FRAGMENT(m) TORCH_LIBRARY_FRAGMENT(sparsejit, m)
#define SJ_LIBRARY_IMPL(key, m) TORCH_LIBRARY_IMPL(sparsejit, key, m)
#define SJ_KERNEL(fn) (fn)

#endif  // SPARSEJIT_STABLE_ABI
