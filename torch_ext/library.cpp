// The sparsejit op namespace. Each op family declares its schemas in its own file under
// torch_ext/ops/ (SJ_LIBRARY_FRAGMENT, torch_ext/tensor_api.h) next to its CPU and CUDA
// implementations; fake (meta) implementations and autograd formulas live in
// python/sparsejit/families/<family>/.
#include "torch_ext/tensor_api.h"

#include "codegen/disk_cache.h"

SJ_LIBRARY(m) {}

namespace sparsejit {
// JIT warnings (unwritable cache, failed compile) reach Python as UserWarning.
[[maybe_unused]] const bool kWarningsRouted = [] {
  codegen::set_warning_handler([](const std::string& msg) { SJ_WARN(msg); });
  return true;
}();
}  // namespace sparsejit

// The C++ API (include/sparsejit/sparsejit.h, header-only) references this symbol, so that a
// LibTorch program linked to the op library keeps it (and its op registrations) loaded.
extern "C" __attribute__((visibility("default"))) int sparsejit_ops_loaded() { return 1; }
