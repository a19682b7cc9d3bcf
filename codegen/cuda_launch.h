// Launching generated CUDA kernels: a launch (entry, grid, block) and the executor that
// compiles (NVRTC, disk cache), loads (driver, per device) and launches the kernels of a spec
// of any family. Each family's launch plans (problem size -> grids, blocks, workspace; GPU-free
// and unit-tested, shared with the host-emulation tests) sit beside its spec: plan_spmm_launch
// in codegen/cuda_spmm.h, plan_attention_launch in cuda_attention.h, the point-conv and filter
// conv plans in cuda_point_conv.h and cuda_filter_conv.h.
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

// Compiles and loads specs on demand (memory cache keyed by spec name, arch and device) and
// launches them on a stream. Thread-safe.
class CudaKernels {
 public:
  static CudaKernels& instance();

  // False (with `why`) when NVRTC or the driver is missing: callers fall back to the CPU.
  bool available(std::string* why = nullptr);

  // Runs `launches` from `spec`'s module on `device` and `stream`, each with the parameter
  // block `params`. Errors name the kernel, grid, block and the generated source.
  bool run(const CudaKernelSpecBase& spec, int device, void* stream,
           const std::vector<CudaLaunch>& launches, void* params, std::string* error);

  // Compiles (through the disk cache) without launching; returns the binary path.
  std::string build(const CudaKernelSpecBase& spec, int device, CudaBuildInfo* info);

 private:
  CudaKernels() = default;
};

}  // namespace sparsejit::codegen
