#include "codegen/cuda_launch.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "codegen/nvrtc.h"

namespace sparsejit::codegen {

// ---- Executor -------------------------------------------------------------------------------

namespace {

struct LoadedModule {
  std::string binary_path;
  std::string source_path;
  std::string error;  // a failed build is remembered, not retried on every call
};

std::mutex g_mutex;
std::map<std::tuple<std::string, int>, LoadedModule> g_modules;  // (spec name, device)
std::map<int, std::string> g_targets;                            // device -> NVRTC target

std::string target_for_device(int device, std::string* error) {
  {
    std::lock_guard<std::mutex> g(g_mutex);
    auto it = g_targets.find(device);
    if (it != g_targets.end()) return it->second;
  }
  const int cc = CudaDriver::instance().compute_capability(device, error);
  if (cc == 0) return "";
  const std::string t = Nvrtc::instance().target_for(cc);
  std::lock_guard<std::mutex> g(g_mutex);
  g_targets[device] = t;
  return t;
}

}  // namespace

CudaKernels& CudaKernels::instance() {
  static CudaKernels k;
  return k;
}

bool CudaKernels::available(std::string* why) {
  std::string a, b;
  const bool nv = Nvrtc::instance().available(&a);
  const bool dr = CudaDriver::instance().available(&b);
  if (why) *why = nv ? b : a;
  return nv && dr;
}

std::string CudaKernels::build(const CudaKernelSpecBase& spec, int device, CudaBuildInfo* info) {
  CudaBuildInfo local;
  CudaBuildInfo& bi = info ? *info : local;
  std::string err;
  const std::string target = target_for_device(device, &err);
  if (target.empty()) {
    bi.error = "kernel " + spec.name() + ": " + err;
    return "";
  }
  return compile_cuda_cached(spec.source(), spec.name(), target, &bi);
}

bool CudaKernels::run(const CudaKernelSpecBase& spec, int device, void* stream,
                      const std::vector<CudaLaunch>& launches, void* params, std::string* error) {
  if (launches.empty()) return true;
  const auto key = std::make_tuple(spec.name(), device);
  LoadedModule mod;
  bool known = false;
  {
    std::lock_guard<std::mutex> g(g_mutex);
    auto it = g_modules.find(key);
    if (it != g_modules.end()) {
      mod = it->second;
      known = true;
    }
  }
  if (!known) {
    CudaBuildInfo bi;
    mod.binary_path = build(spec, device, &bi);
    mod.source_path = bi.source_path;
    mod.error = bi.error;
    std::lock_guard<std::mutex> g(g_mutex);
    g_modules.emplace(key, mod);
  }
  if (!mod.error.empty() || mod.binary_path.empty()) {
    *error = mod.error.empty() ? "kernel " + spec.name() + " could not be built" : mod.error;
    return false;
  }
  CudaDriver& drv = CudaDriver::instance();
  for (const CudaLaunch& l : launches) {
    // The driver caches modules and functions, so this is a map lookup after the first call.
    CudaFunction f = drv.function(device, mod.binary_path, l.entry, mod.source_path, error);
    if (!f) return false;
    if (!drv.launch(f, l.grid, l.block, l.shared_bytes, stream, params, error)) return false;
  }
  return true;
}

}  // namespace sparsejit::codegen
