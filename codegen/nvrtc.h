// NVRTC, opened lazily with dlopen so that a machine without the CUDA toolkit never needs it.
//
// Where libnvrtc is looked for, in order:
//   $SPARSEJIT_NVRTC_LIBRARY (a full path),
//   libnvrtc.so, libnvrtc.so.13, libnvrtc.so.12 (the loader's search path; also finds a copy
//   torch already loaded),
//   every folder in $SPARSEJIT_NVRTC_DIRS (':'-separated; the Python package sets it to the
//   pip wheels' nvidia/cu13/lib and nvidia/cuda_nvrtc/lib folders),
//   $CUDA_HOME/lib64 and /usr/local/cuda/lib64.
// Compiled kernels are kept in the disk cache (codegen/disk_cache.h), keyed by the source,
// the options, the NVRTC version, the target architecture and the package version.
#pragma once

#include <string>
#include <vector>

namespace sparsejit::codegen {

struct NvrtcOutput {
  bool ok = false;
  bool is_cubin = false;  // cubin (sm_XX target) or null-terminated PTX (compute_XX)
  std::string binary;
  std::string log;  // compiler log; on failure it starts with the kernel name
};

class Nvrtc {
 public:
  static Nvrtc& instance();

  // True when libnvrtc was found and every needed symbol resolved; otherwise `why` (if
  // given) lists what was tried.
  bool available(std::string* why = nullptr);
  std::string library_path();
  // "13.0", or "" when unavailable.
  std::string version_string();
  // Architectures this NVRTC can emit cubins for (e.g. 75, 80, 86, 89, 90, 100, 120).
  std::vector<int> supported_archs();

  // Target for a device of compute capability `cc` (e.g. 90): "sm_90" when this NVRTC emits
  // cubins for it, else "compute_NN" for the newest architecture it knows below cc (PTX,
  // finished by the driver).
  std::string target_for(int cc);

  // Options passed for every compile (part of the cache key).
  static std::vector<std::string> default_options();

  // Compiles `source` (named `name` in messages) for `arch` ("sm_90" gives a cubin,
  // "compute_90" gives PTX). Thread-safe.
  NvrtcOutput compile(const std::string& source, const std::string& name,
                      const std::string& arch = "sm_90");

 private:
  Nvrtc() = default;
  void load();
};

// What compile_cached did.
struct CudaBuildInfo {
  std::string name;
  std::string source_path;  // the generated source, written next to the binary
  std::string binary_path;
  bool disk_hit = false;
  double compile_ms = 0;
  std::string error;  // names the kernel and carries the NVRTC log
};

// Compiles `source` for `arch` through the disk cache and returns the artefact path (empty on
// failure, with info->error set). `name` is the readable cache prefix.
std::string compile_cuda_cached(const std::string& source, const std::string& name,
                                const std::string& arch, CudaBuildInfo* info = nullptr);

}  // namespace sparsejit::codegen
