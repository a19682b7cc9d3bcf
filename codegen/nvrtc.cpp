#include "codegen/nvrtc.h"

#include <dirent.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#include "codegen/disk_cache.h"

#ifndef SPARSEJIT_VERSION
#define SPARSEJIT_VERSION "0.0.0"
#endif

namespace sparsejit::codegen {

namespace {

// The few NVRTC declarations we need (nvrtc.h is not required at build time).
using nvrtcResult = int;
using nvrtcProgram = struct NvrtcProgramOpaque*;
constexpr nvrtcResult kNvrtcSuccess = 0;

struct NvrtcApi {
  const char* (*GetErrorString)(nvrtcResult) = nullptr;
  nvrtcResult (*Version)(int*, int*) = nullptr;
  nvrtcResult (*CreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                               const char* const*) = nullptr;
  nvrtcResult (*DestroyProgram)(nvrtcProgram*) = nullptr;
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char* const*) = nullptr;
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*GetPTX)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*GetNumSupportedArchs)(int*) = nullptr;
  nvrtcResult (*GetSupportedArchs)(int*) = nullptr;
};

struct NvrtcState {
  std::once_flag once;
  void* handle = nullptr;
  NvrtcApi api;
  std::string path;
  std::string why;  // why loading failed
  int major = 0, minor = 0;
  std::vector<int> archs;
};

NvrtcState& state() {
  static NvrtcState s;
  return s;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

// libnvrtc.so* files in `dir` (not the builtins library), newest-looking name first.
std::vector<std::string> nvrtc_files_in(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("libnvrtc.so", 0) == 0 || n.rfind("libnvrtc.alt.so", 0) == 0) {
        if (n.find("builtins") == std::string::npos) names.push_back(n);
      }
    }
    closedir(d);
  }
  // Prefer the plain library over the .alt one, longer (more versioned) names last.
  std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
    const bool aa = a.find(".alt.") != std::string::npos, ba = b.find(".alt.") != std::string::npos;
    if (aa != ba) return !aa;
    return a < b;
  });
  std::vector<std::string> out;
  for (auto& n : names) out.push_back(dir + "/" + n);
  return out;
}

std::vector<std::string> candidates() {
  std::vector<std::string> c;
  if (const char* p = std::getenv("SPARSEJIT_NVRTC_LIBRARY"); p && *p) c.push_back(p);
  c.push_back("libnvrtc.so");
  c.push_back("libnvrtc.so.13");
  c.push_back("libnvrtc.so.12");
  std::vector<std::string> dirs;
  if (const char* p = std::getenv("SPARSEJIT_NVRTC_DIRS"); p && *p) dirs = split(p, ':');
  if (const char* p = std::getenv("CUDA_HOME"); p && *p) dirs.push_back(std::string(p) + "/lib64");
  dirs.push_back("/usr/local/cuda/lib64");
  for (const auto& d : dirs)
    for (auto& f : nvrtc_files_in(d)) c.push_back(f);
  return c;
}

template <typename Fn>
bool bind(void* h, const char* sym, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(h, sym));
  if (*fn == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += sym;
    return false;
  }
  return true;
}

bool bind_all(void* h, NvrtcApi* a, std::string* missing) {
  bool ok = true;
  ok &= bind(h, "nvrtcGetErrorString", &a->GetErrorString, missing);
  ok &= bind(h, "nvrtcVersion", &a->Version, missing);
  ok &= bind(h, "nvrtcCreateProgram", &a->CreateProgram, missing);
  ok &= bind(h, "nvrtcDestroyProgram", &a->DestroyProgram, missing);
  ok &= bind(h, "nvrtcCompileProgram", &a->CompileProgram, missing);
  ok &= bind(h, "nvrtcGetProgramLogSize", &a->GetProgramLogSize, missing);
  ok &= bind(h, "nvrtcGetProgramLog", &a->GetProgramLog, missing);
  ok &= bind(h, "nvrtcGetPTXSize", &a->GetPTXSize, missing);
  ok &= bind(h, "nvrtcGetPTX", &a->GetPTX, missing);
  ok &= bind(h, "nvrtcGetCUBINSize", &a->GetCUBINSize, missing);
  ok &= bind(h, "nvrtcGetCUBIN", &a->GetCUBIN, missing);
  ok &= bind(h, "nvrtcGetNumSupportedArchs", &a->GetNumSupportedArchs, missing);
  ok &= bind(h, "nvrtcGetSupportedArchs", &a->GetSupportedArchs, missing);
  return ok;
}

// libnvrtc opens libnvrtc-builtins by its bare name when it compiles, which fails when the
// library came from a folder the loader does not search (pip wheels). Loading the builtins
// from libnvrtc's own folder first makes that later lookup find the loaded copy.
void preload_builtins_next_to(void* symbol_in_nvrtc) {
  Dl_info info;
  if (dladdr(symbol_in_nvrtc, &info) == 0 || info.dli_fname == nullptr) return;
  std::string lib = info.dli_fname;
  const size_t slash = lib.rfind('/');
  if (slash == std::string::npos) return;
  const std::string dir = lib.substr(0, slash);
  const bool alt = lib.find(".alt.") != std::string::npos;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      const bool is_alt = n.find(".alt.") != std::string::npos;
      if (n.rfind("libnvrtc-builtins", 0) == 0 && n.find(".so") != std::string::npos &&
          is_alt == alt) {
        dlopen((dir + "/" + n).c_str(), RTLD_NOW | RTLD_GLOBAL);  // failure: NVRTC reports it
      }
    }
    closedir(d);
  }
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Nvrtc& Nvrtc::instance() {
  static Nvrtc n;
  return n;
}

void Nvrtc::load() {
  NvrtcState& s = state();
  std::call_once(s.once, [&s] {
    std::string tried;
    for (const auto& path : candidates()) {
      void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) {
        const char* e = dlerror();
        tried += "\n  " + path + ": " + (e ? e : "not found");
        continue;
      }
      NvrtcApi api;
      std::string missing;
      if (!bind_all(h, &api, &missing)) {
        tried += "\n  " + path + ": missing symbols " + missing;
        dlclose(h);
        continue;
      }
      preload_builtins_next_to(reinterpret_cast<void*>(api.Version));
      s.handle = h;
      s.api = api;
      s.path = path;
      api.Version(&s.major, &s.minor);
      int n = 0;
      if (api.GetNumSupportedArchs(&n) == kNvrtcSuccess && n > 0) {
        s.archs.resize(n);
        if (api.GetSupportedArchs(s.archs.data()) != kNvrtcSuccess) s.archs.clear();
      }
      return;
    }
    s.why = "libnvrtc could not be loaded; tried:" + tried +
            "\nSet SPARSEJIT_NVRTC_LIBRARY to the full path of libnvrtc.so, or install the "
            "nvidia-cuda-nvrtc wheel.";
  });
}

bool Nvrtc::available(std::string* why) {
  load();
  if (state().handle == nullptr && why) *why = state().why;
  return state().handle != nullptr;
}

std::string Nvrtc::library_path() {
  load();
  return state().path;
}

std::string Nvrtc::version_string() {
  if (!available()) return "";
  return std::to_string(state().major) + "." + std::to_string(state().minor);
}

std::vector<int> Nvrtc::supported_archs() {
  load();
  return state().archs;
}

std::string Nvrtc::target_for(int cc) {
  const std::vector<int> archs = supported_archs();
  if (std::find(archs.begin(), archs.end(), cc) != archs.end()) return "sm_" + std::to_string(cc);
  int best = 0;
  for (int a : archs)
    if (a <= cc) best = std::max(best, a);
  if (best == 0) best = cc;  // let NVRTC report the unsupported architecture
  return "compute_" + std::to_string(best);
}

std::vector<std::string> Nvrtc::default_options() {
  // No fast math: exp / erf in the epilogues and softmax must match the CPU kernels closely.
  // -lineinfo lets compute-sanitizer and profilers point at lines of the generated source.
  return {"-std=c++17", "-lineinfo", "-default-device"};
}

NvrtcOutput Nvrtc::compile(const std::string& source, const std::string& name,
                           const std::string& arch) {
  NvrtcOutput out;
  std::string why;
  if (!available(&why)) {
    out.log = "kernel " + name + ": " + why;
    return out;
  }
  const NvrtcApi& api = state().api;
  nvrtcProgram prog = nullptr;
  const std::string file = name + ".cu";
  nvrtcResult r = api.CreateProgram(&prog, source.c_str(), file.c_str(), 0, nullptr, nullptr);
  if (r != kNvrtcSuccess) {
    out.log = "kernel " + name + ": nvrtcCreateProgram failed: " + api.GetErrorString(r);
    return out;
  }
  std::vector<std::string> opts = default_options();
  opts.push_back("--gpu-architecture=" + arch);
  std::vector<const char*> copts;
  for (const auto& o : opts) copts.push_back(o.c_str());
  r = api.CompileProgram(prog, static_cast<int>(copts.size()), copts.data());
  size_t log_size = 0;
  std::string log;
  if (api.GetProgramLogSize(prog, &log_size) == kNvrtcSuccess && log_size > 1) {
    log.resize(log_size);
    api.GetProgramLog(prog, &log[0]);
    log.resize(log_size - 1);
  }
  if (r != kNvrtcSuccess) {
    out.log = "kernel " + name + " (" + arch + "): " + api.GetErrorString(r) + "\n" + log;
    api.DestroyProgram(&prog);
    return out;
  }
  out.log = log;
  out.is_cubin = arch.rfind("sm_", 0) == 0;
  size_t size = 0;
  if (out.is_cubin) {
    r = api.GetCUBINSize(prog, &size);
    if (r == kNvrtcSuccess) {
      out.binary.resize(size);
      r = api.GetCUBIN(prog, &out.binary[0]);
    }
  } else {
    r = api.GetPTXSize(prog, &size);
    if (r == kNvrtcSuccess) {
      out.binary.resize(size);  // includes the terminating NUL cuModuleLoadData needs
      r = api.GetPTX(prog, &out.binary[0]);
    }
  }
  api.DestroyProgram(&prog);
  if (r != kNvrtcSuccess || out.binary.empty()) {
    out.log = "kernel " + name +
              ": could not read the compiled code: " + std::string(api.GetErrorString(r)) + "\n" +
              log;
    out.binary.clear();
    return out;
  }
  out.ok = true;
  return out;
}

std::string compile_cuda_cached(const std::string& source, const std::string& name,
                                const std::string& arch, CudaBuildInfo* info) {
  CudaBuildInfo local;
  CudaBuildInfo& bi = info ? *info : local;
  bi = CudaBuildInfo{};
  bi.name = name;
  Nvrtc& nv = Nvrtc::instance();
  std::string why;
  if (!nv.available(&why)) {
    bi.error = "kernel " + name + ": " + why;
    return "";
  }
  std::string options;
  for (const auto& o : Nvrtc::default_options()) options += o + " ";
  const std::string key =
      hash_hex(source + "\n--\n" + options + "\n--nvrtc " + nv.version_string() + "\n--arch " +
               arch + "\n--sparsejit " + SPARSEJIT_VERSION);
  const bool cubin = arch.rfind("sm_", 0) == 0;
  DiskCache& cache = DiskCache::instance();
  // The source is kept readable next to the binary (written first, so a failed compile can
  // point at it), for launch errors, sanitizers and profilers.
  const std::string root = cache.writable_root("cuda");
  if (!root.empty()) {
    bi.source_path = root + "/cuda/" + name + "-" + key + ".cu";
    std::ifstream probe(bi.source_path);
    if (!probe.good()) DiskCache::write_atomic(bi.source_path, source);
  }
  const auto t0 = std::chrono::steady_clock::now();
  bool compiled = false;
  // Runs under the cache's build lock: must not call back into the cache.
  auto build = [&](const std::string& tmp_path, std::string& error) {
    compiled = true;
    NvrtcOutput o = nv.compile(source, name, arch);
    if (!o.ok) {
      error = o.log + "\n(generated source: " +
              (bi.source_path.empty() ? std::string("not written") : bi.source_path) + ")";
      return false;
    }
    std::ofstream f(tmp_path, std::ios::binary);
    f.write(o.binary.data(), static_cast<std::streamsize>(o.binary.size()));
    if (!f.good()) {
      error = "kernel " + name + ": could not write " + tmp_path;
      return false;
    }
    return true;
  };
  std::string path, err;
  bool hit = false;
  if (!cache.get_or_build("cuda", name, key, cubin ? "cubin" : "ptx", build, &path, &err, &hit)) {
    bi.error = err;
    return "";
  }
  bi.binary_path = path;
  bi.disk_hit = hit;
  bi.compile_ms = compiled ? ms_since(t0) : 0;
  return path;
}

}  // namespace sparsejit::codegen
