// The CUDA driver API, opened lazily (dlopen "libcuda.so.1"), so that the library loads on
// machines without a GPU driver. Loads compiled modules per device under a mutex, caches
// function handles, and launches; every launch error names the kernel, grid, block and the
// generated source. Torch-free: streams and device pointers are plain void* / uintptr_t.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace sparsejit::codegen {

struct CudaDim {
  unsigned x = 1, y = 1, z = 1;
};

// A loaded kernel: the driver's CUfunction plus what error messages need.
struct CudaFunction {
  void* handle = nullptr;
  std::string name;
  std::string source_path;
  explicit operator bool() const { return handle != nullptr; }
};

class CudaDriver {
 public:
  static CudaDriver& instance();

  // True when libcuda.so.1 loaded and cuInit succeeded; otherwise `why` says what failed.
  bool available(std::string* why = nullptr);
  int device_count();
  // Compute capability as 10 * major + minor (90 for an H100), or 0 with `error` set.
  int compute_capability(int device, std::string* error);

  // Makes `device`'s primary context current on this thread when no context for it is (the
  // context PyTorch uses). Returns false with `error` set on failure.
  bool ensure_context(int device, std::string* error);

  // Loads `binary_path` (cubin or PTX) on `device` once, and returns the function `kernel`
  // from it (cached). `source_path` is remembered for launch errors.
  CudaFunction function(int device, const std::string& binary_path, const std::string& kernel,
                        const std::string& source_path, std::string* error);

  // Launches f, whose only parameter is the block `params` points at (one of the structs of
  // kernels/cuda/cuda_args.h, passed by value). Errors name the kernel, grid, block and the
  // generated source. An empty grid launches nothing.
  bool launch(const CudaFunction& f, CudaDim grid, CudaDim block, unsigned shared_bytes,
              void* stream, void* params, std::string* error);

  // For Torch-free tests: allocate, copy, free, synchronize on the current context.
  bool malloc(uintptr_t* ptr, size_t bytes, std::string* error);
  bool free(uintptr_t ptr);
  bool copy_to_device(uintptr_t dst, const void* src, size_t bytes, std::string* error);
  bool copy_to_host(void* dst, uintptr_t src, size_t bytes, std::string* error);
  bool synchronize(std::string* error);

  // True while `stream` is being captured into a CUDA graph (a host sync would break the
  // capture); false without a driver or when the driver lacks cuStreamIsCapturing.
  bool stream_capturing(void* stream);

  // "CUDA_ERROR_X: description" for a driver result code.
  std::string error_string(int result);

 private:
  CudaDriver() = default;
  void load();
};

}  // namespace sparsejit::codegen
