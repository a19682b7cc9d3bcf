// Helpers shared by the CUDA implementations in torch_ext/ops/*.cpp (built with
// SPARSEJIT_WITH_CUDA): dtype mapping, alignment, determinism, NVRTC availability (or one
// warning and the CPU fallback), and cached row statistics for the schedule planner.
#pragma once

#ifdef SPARSEJIT_WITH_CUDA
#ifdef SPARSEJIT_STABLE_ABI
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>

#include "codegen/cuda_driver.h"
#else
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstdlib>
#include <list>
#include <mutex>
#include <string>

#include "codegen/cuda_launch.h"
#include "codegen/cuda_spmm.h"  // CudaRowStats (row_stats below)
#include "codegen/disk_cache.h"
#include "torch_ext/common.h"
#include "torch_ext/cuda_fallback.h"

namespace sparsejit::cuda_ext {

using codegen::CudaKernels;
using codegen::CudaKernelSpecBase;
using codegen::CudaScalar;
using ::sparsejit::IndexKind;

// ---- Device, stream, determinism: the two backends --------------------------------------------
#ifdef SPARSEJIT_STABLE_ABI
// Makes `d`'s device current for the scope.
struct DeviceGuard {
  explicit DeviceGuard(const tx::Device& d) : guard_(d.has_index() ? d.index() : 0) {}
  torch::stable::accelerator::DeviceGuard guard_;
};
// PyTorch's current stream on the current device (a cudaStream_t).
inline void* current_stream() {
  void* s = nullptr;
  const int32_t device = torch::stable::accelerator::getCurrentDeviceIndex();
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device, &s));
  return s;
}
// A host sync would break a CUDA graph being captured on the current stream.
inline bool stream_capturing() {
  return codegen::CudaDriver::instance().stream_capturing(current_stream());
}
// torch.use_deterministic_algorithms has no stable accessor: SPARSEJIT_DETERMINISTIC only.
inline bool torch_deterministic() { return false; }
#else
using DeviceGuard = c10::cuda::CUDAGuard;
inline void* current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }
inline bool stream_capturing() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}
inline bool torch_deterministic() { return at::globalContext().deterministicAlgorithms(); }
#endif

inline CudaScalar cuda_scalar(tx::ScalarType t) {
  switch (t) {
    case tx::kFloat: return CudaScalar::F32;
    case tx::kHalf: return CudaScalar::F16;
    case tx::kBFloat16: return CudaScalar::BF16;
    case tx::kDouble: return CudaScalar::F64;
    default: SJ_CHECK_TYPE(false, "sparsejit (CUDA): unsupported dtype ", t);
  }
}

// The widest access (bytes, at most 16) every pointer allows.
inline int32_t aligned_bytes(std::initializer_list<const void*> ptrs) {
  int32_t a = 16;
  for (const void* p : ptrs) {
    if (p == nullptr) continue;
    const auto v = reinterpret_cast<uintptr_t>(p);
    while (a > 1 && v % a != 0) a /= 2;
  }
  return a;
}

inline bool deterministic() {
  if (torch_deterministic()) return true;
  const char* v = std::getenv("SPARSEJIT_DETERMINISTIC");
  return v && *v && std::string(v) != "0";
}

// NVRTC and the driver, or one warning and the CPU fallback.
inline bool gpu_kernels_available() {
  static const bool ok = [] {
    std::string why;
    const bool a = CudaKernels::instance().available(&why);
    if (!a)
      codegen::warn("sparsejit: CUDA kernels unavailable (" + why +
                    "); CUDA tensors are computed on the CPU and copied back, which is slow");
    return a;
  }();
  return ok;
}

[[noreturn]] inline void raise_cuda_error(const std::string& op, const std::string& err) {
  SJ_CHECK_RUNTIME(false, "sparsejit.", op, " (CUDA): ", err);
}

// ---- Row statistics (one device sync per structure, cached) ---------------------------------
struct StatsKey {
  const void* ptr;
  int64_t numel;
  int64_t version;
  int device;
  bool operator==(const StatsKey& o) const {
    return ptr == o.ptr && numel == o.numel && version == o.version && device == o.device;
  }
};

inline codegen::CudaRowStats row_stats(const tx::Tensor& rowptr, int64_t nnz) {
  codegen::CudaRowStats st;
  st.rows = rowptr.numel() - 1;
  st.nnz = nnz;
  if (st.rows <= 0 || nnz == 0) return st;
  // A sync is not allowed while a CUDA graph is captured: assume the worst skew (the chunked
  // schedules are correct and balanced for any structure).
  if (stream_capturing()) {
    st.max_row = nnz;
    return st;
  }
  static std::mutex mu;
  static std::list<std::pair<StatsKey, int64_t>> cache;  // most recent first, a few entries
  const StatsKey key{rowptr.data_ptr(), rowptr.numel(), static_cast<int64_t>(rowptr._version()),
                     rowptr.get_device()};
  {
    std::lock_guard<std::mutex> g(mu);
    for (auto it = cache.begin(); it != cache.end(); ++it) {
      if (it->first == key) {
        st.max_row = it->second;
        cache.splice(cache.begin(), cache, it);
        return st;
      }
    }
  }
  // Statistics only steer the schedule; a stale entry (reused memory) costs speed, not results.
  st.max_row = (rowptr.narrow(0, 1, st.rows) - rowptr.narrow(0, 0, st.rows)).max().item<int64_t>();
  std::lock_guard<std::mutex> g(mu);
  cache.emplace_front(key, st.max_row);
  if (cache.size() > 64) cache.pop_back();
  return st;
}

}  // namespace sparsejit::cuda_ext
#endif
