// From a CUDA kernel spec and a problem size to launches: grids, blocks, workspace layout
// (plan_* functions, GPU-free and unit-tested, shared with the host-emulation tests), and the
// executor that compiles (NVRTC, disk cache), loads (driver, per device) and launches them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "codegen/cuda_driver.h"
#include "codegen/cuda_spec.h"
#include "codegen/nvrtc.h"
#include "kernels/cuda/cuda_args.h"

namespace sparsejit::codegen {

struct CudaLaunch {
  std::string entry;  // extern "C" name in the spec's module
  CudaDim grid, block;
  unsigned shared_bytes = 0;
};

// An SpMM call: launches in order and the workspace they need. The first `zero_bytes` of
// the workspace must be zeroed before the first launch (atomic partials).
struct SpmmLaunchPlan {
  std::vector<CudaLaunch> launches;
  int64_t num_chunks = 0;
  size_t workspace_bytes = 0;
  size_t zero_bytes = 0;
  size_t partial_offset = 0, partial_arg_offset = 0, tail_row_offset = 0;
};

SpmmLaunchPlan plan_spmm_launch(const CudaSpmmChoice& choice, int64_t rows, int64_t nnz);
// Points the workspace fields of `p` into `workspace` (and sets chunk / num_chunks).
void bind_spmm_workspace(const SpmmLaunchPlan& plan, const CudaSpmmChoice& choice, void* workspace,
                         cuda::SpmmParams* p);

CudaLaunch plan_sddmm_launch(const CudaKernelSpec& spec, int64_t nnz);
CudaLaunch plan_edge_softmax_launch(const CudaKernelSpec& spec, int64_t rows);
// Fused attention: the forward, or the backward's rows pass then its columns pass.
std::vector<CudaLaunch> plan_attention_launch(const CudaKernelSpec& spec, int64_t rows,
                                              int64_t cols);

// Compiles and loads specs on demand (memory cache keyed by spec name, arch and device) and
// launches them on a stream. Thread-safe.
class CudaKernels {
 public:
  static CudaKernels& instance();

  // False (with `why`) when NVRTC or the driver is missing: callers fall back to the CPU.
  bool available(std::string* why = nullptr);

  // Runs `launches` from `spec`'s module on `device` and `stream`, each with the parameter
  // block `params`. Errors name the kernel, grid, block and the generated source.
  bool run(const CudaKernelSpec& spec, int device, void* stream,
           const std::vector<CudaLaunch>& launches, void* params, std::string* error);

  // Compiles (through the disk cache) without launching; returns the binary path.
  std::string build(const CudaKernelSpec& spec, int device, CudaBuildInfo* info);

 private:
  CudaKernels() = default;
};

}  // namespace sparsejit::codegen
