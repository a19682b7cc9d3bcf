#include "codegen/cuda_driver.h"

#include <dlfcn.h>

#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

namespace sparsejit::codegen {

namespace {

// The few driver declarations we need (cuda.h is not required at build time).
using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctxOpaque*;
using CUmodule = struct CUmodOpaque*;
using CUfunction = struct CUfuncOpaque*;
using CUstream = struct CUstreamOpaque*;
using CUdeviceptr = unsigned long long;
constexpr CUresult kCudaSuccess = 0;
constexpr int kAttrComputeMajor = 75;
constexpr int kAttrComputeMinor = 76;

struct DriverApi {
  CUresult (*Init)(unsigned) = nullptr;
  CUresult (*GetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*DeviceGetCount)(int*) = nullptr;
  CUresult (*DeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*CtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*CtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*CtxGetDevice)(CUdevice*) = nullptr;
  CUresult (*CtxSynchronize)() = nullptr;
  CUresult (*ModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, CUstream, void**, void**) = nullptr;
  CUresult (*MemAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*MemFree)(CUdeviceptr) = nullptr;
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void*, size_t) = nullptr;
  CUresult (*MemcpyDtoH)(void*, CUdeviceptr, size_t) = nullptr;
  CUresult (*StreamIsCapturing)(CUstream, int*) = nullptr;  // optional (bound if present)
};

struct DriverState {
  std::once_flag once;
  void* handle = nullptr;
  DriverApi api;
  std::string why;
  std::mutex mutex;                                         // guards the maps below
  std::map<std::pair<int, std::string>, CUmodule> modules;  // (device, binary path)
  std::map<std::pair<CUmodule, std::string>, CUfunction> functions;
};

DriverState& state() {
  static DriverState s;
  return s;
}

template <typename Fn>
void bind(void* h, const char* sym, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(h, sym));
  if (*fn == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + sym;
}

bool read_binary(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  if (path.size() > 4 && path.compare(path.size() - 4, 4, ".ptx") == 0 &&
      (out->empty() || out->back() != '\0'))
    out->push_back('\0');  // PTX is loaded as a C string
  return true;
}

std::string dims(CudaDim d) {
  return "(" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) + ")";
}

}  // namespace

CudaDriver& CudaDriver::instance() {
  static CudaDriver d;
  return d;
}

void CudaDriver::load() {
  DriverState& s = state();
  std::call_once(s.once, [&s] {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* e = dlerror();
      s.why = std::string("the CUDA driver (libcuda.so.1) could not be loaded: ") +
              (e ? e : "not found");
      return;
    }
    DriverApi& a = s.api;
    std::string missing;
    bind(h, "cuInit", &a.Init, &missing);
    bind(h, "cuGetErrorName", &a.GetErrorName, &missing);
    bind(h, "cuGetErrorString", &a.GetErrorString, &missing);
    bind(h, "cuDeviceGetCount", &a.DeviceGetCount, &missing);
    bind(h, "cuDeviceGet", &a.DeviceGet, &missing);
    bind(h, "cuDeviceGetAttribute", &a.DeviceGetAttribute, &missing);
    bind(h, "cuDevicePrimaryCtxRetain", &a.DevicePrimaryCtxRetain, &missing);
    bind(h, "cuCtxGetCurrent", &a.CtxGetCurrent, &missing);
    bind(h, "cuCtxSetCurrent", &a.CtxSetCurrent, &missing);
    bind(h, "cuCtxGetDevice", &a.CtxGetDevice, &missing);
    bind(h, "cuCtxSynchronize", &a.CtxSynchronize, &missing);
    bind(h, "cuModuleLoadData", &a.ModuleLoadData, &missing);
    bind(h, "cuModuleGetFunction", &a.ModuleGetFunction, &missing);
    bind(h, "cuLaunchKernel", &a.LaunchKernel, &missing);
    bind(h, "cuMemAlloc_v2", &a.MemAlloc, &missing);
    bind(h, "cuMemFree_v2", &a.MemFree, &missing);
    bind(h, "cuMemcpyHtoD_v2", &a.MemcpyHtoD, &missing);
    bind(h, "cuMemcpyDtoH_v2", &a.MemcpyDtoH, &missing);
    a.StreamIsCapturing =
        reinterpret_cast<decltype(a.StreamIsCapturing)>(dlsym(h, "cuStreamIsCapturing"));
    if (!missing.empty()) {
      s.why = "the CUDA driver lacks " + missing;
      dlclose(h);
      return;
    }
    const CUresult r = a.Init(0);
    if (r != kCudaSuccess) {
      s.why = "cuInit failed: " + std::to_string(r);
      return;
    }
    s.handle = h;
  });
}

bool CudaDriver::available(std::string* why) {
  load();
  if (state().handle == nullptr && why) *why = state().why;
  return state().handle != nullptr;
}

std::string CudaDriver::error_string(int result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (available()) {
    state().api.GetErrorName(result, &name);
    state().api.GetErrorString(result, &text);
  }
  return std::string(name ? name : "CUDA error " + std::to_string(result)) + ": " +
         (text ? text : "unknown");
}

int CudaDriver::device_count() {
  int n = 0;
  if (!available() || state().api.DeviceGetCount(&n) != kCudaSuccess) return 0;
  return n;
}

int CudaDriver::compute_capability(int device, std::string* error) {
  if (!available(error)) return 0;
  const DriverApi& a = state().api;
  CUdevice dev = 0;
  int major = 0, minor = 0;
  CUresult r = a.DeviceGet(&dev, device);
  if (r == kCudaSuccess) r = a.DeviceGetAttribute(&major, kAttrComputeMajor, dev);
  if (r == kCudaSuccess) r = a.DeviceGetAttribute(&minor, kAttrComputeMinor, dev);
  if (r != kCudaSuccess) {
    if (error) *error = "device " + std::to_string(device) + ": " + error_string(r);
    return 0;
  }
  return 10 * major + minor;
}

bool CudaDriver::ensure_context(int device, std::string* error) {
  if (!available(error)) return false;
  const DriverApi& a = state().api;
  CUcontext cur = nullptr;
  if (a.CtxGetCurrent(&cur) == kCudaSuccess && cur != nullptr) {
    CUdevice d = -1;
    if (a.CtxGetDevice(&d) == kCudaSuccess && d == device) return true;
  }
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUresult r = a.DeviceGet(&dev, device);
  if (r == kCudaSuccess) r = a.DevicePrimaryCtxRetain(&ctx, dev);
  if (r == kCudaSuccess) r = a.CtxSetCurrent(ctx);
  if (r != kCudaSuccess) {
    if (error)
      *error = "could not make device " + std::to_string(device) +
               "'s context current: " + error_string(r);
    return false;
  }
  return true;
}

CudaFunction CudaDriver::function(int device, const std::string& binary_path,
                                  const std::string& kernel, const std::string& source_path,
                                  std::string* error) {
  CudaFunction f;
  f.name = kernel;
  f.source_path = source_path;
  if (!ensure_context(device, error)) return f;
  DriverState& s = state();
  std::lock_guard<std::mutex> g(s.mutex);
  CUmodule mod = nullptr;
  auto key = std::make_pair(device, binary_path);
  auto it = s.modules.find(key);
  if (it != s.modules.end()) {
    mod = it->second;
  } else {
    std::string image;
    if (!read_binary(binary_path, &image)) {
      if (error) *error = "kernel " + kernel + ": cannot read the compiled module " + binary_path;
      return f;
    }
    const CUresult r = s.api.ModuleLoadData(&mod, image.data());
    if (r != kCudaSuccess) {
      if (error)
        *error = "kernel " + kernel + ": cuModuleLoadData(" + binary_path + ") on device " +
                 std::to_string(device) + " failed: " + error_string(r) +
                 " (generated source: " + source_path + ")";
      return f;
    }
    s.modules.emplace(key, mod);
  }
  auto fkey = std::make_pair(mod, kernel);
  auto fit = s.functions.find(fkey);
  if (fit != s.functions.end()) {
    f.handle = fit->second;
    return f;
  }
  CUfunction fn = nullptr;
  const CUresult r = s.api.ModuleGetFunction(&fn, mod, kernel.c_str());
  if (r != kCudaSuccess) {
    if (error)
      *error = "kernel " + kernel + " not found in " + binary_path + ": " + error_string(r) +
               " (generated source: " + source_path + ")";
    return f;
  }
  s.functions.emplace(fkey, fn);
  f.handle = fn;
  return f;
}

bool CudaDriver::launch(const CudaFunction& f, CudaDim grid, CudaDim block, unsigned shared_bytes,
                        void* stream, void* params, std::string* error) {
  if (!available(error)) return false;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return true;  // nothing to do
  void* args[] = {params};
  const CUresult r = state().api.LaunchKernel(static_cast<CUfunction>(f.handle), grid.x, grid.y,
                                              grid.z, block.x, block.y, block.z, shared_bytes,
                                              static_cast<CUstream>(stream), args, nullptr);
  if (r != kCudaSuccess) {
    if (error)
      *error = "launch of kernel " + f.name + " failed: " + error_string(r) + "; grid " +
               dims(grid) + ", block " + dims(block) + ", shared " + std::to_string(shared_bytes) +
               " bytes; generated source: " + f.source_path;
    return false;
  }
  return true;
}

bool CudaDriver::malloc(uintptr_t* ptr, size_t bytes, std::string* error) {
  if (!available(error)) return false;
  CUdeviceptr p = 0;
  const CUresult r = state().api.MemAlloc(&p, bytes == 0 ? 1 : bytes);
  if (r != kCudaSuccess) {
    if (error) *error = "cuMemAlloc(" + std::to_string(bytes) + ") failed: " + error_string(r);
    return false;
  }
  *ptr = static_cast<uintptr_t>(p);
  return true;
}

bool CudaDriver::free(uintptr_t ptr) {
  return available() && state().api.MemFree(static_cast<CUdeviceptr>(ptr)) == kCudaSuccess;
}

bool CudaDriver::copy_to_device(uintptr_t dst, const void* src, size_t bytes, std::string* error) {
  if (!available(error)) return false;
  if (bytes == 0) return true;
  const CUresult r = state().api.MemcpyHtoD(static_cast<CUdeviceptr>(dst), src, bytes);
  if (r != kCudaSuccess && error) *error = "cuMemcpyHtoD failed: " + error_string(r);
  return r == kCudaSuccess;
}

bool CudaDriver::copy_to_host(void* dst, uintptr_t src, size_t bytes, std::string* error) {
  if (!available(error)) return false;
  if (bytes == 0) return true;
  const CUresult r = state().api.MemcpyDtoH(dst, static_cast<CUdeviceptr>(src), bytes);
  if (r != kCudaSuccess && error) *error = "cuMemcpyDtoH failed: " + error_string(r);
  return r == kCudaSuccess;
}

bool CudaDriver::synchronize(std::string* error) {
  if (!available(error)) return false;
  const CUresult r = state().api.CtxSynchronize();
  if (r != kCudaSuccess && error) *error = "cuCtxSynchronize failed: " + error_string(r);
  return r == kCudaSuccess;
}

bool CudaDriver::stream_capturing(void* stream) {
  if (!available() || state().api.StreamIsCapturing == nullptr) return false;
  int status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
  const CUresult r = state().api.StreamIsCapturing(static_cast<CUstream>(stream), &status);
  return r != kCudaSuccess || status != 0;  // an error: treat as capturing (no sync)
}

}  // namespace sparsejit::codegen
