#include "codegen/cpu_jit.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include "codegen/disk_cache.h"
#include "codegen/embedded_headers.h"
#include "kernels/common/isa_cap.h"

#ifndef SPARSEJIT_VERSION
#define SPARSEJIT_VERSION "0.0.0"
#endif

namespace sparsejit::codegen {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Runs a shell command, returning its exit status and combined output.
int run_command(const std::string& cmd, std::string* output) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  output->clear();
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

bool on_path(const std::string& exe) {
  if (exe.find('/') != std::string::npos) return access(exe.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (!dir.empty() && access((dir + "/" + exe).c_str(), X_OK) == 0) return true;
  }
  return false;
}

std::string find_compiler() {
  for (const char* var : {"SPARSEJIT_CXX", "CXX"}) {
    if (const char* v = std::getenv(var); v && *v) return v;
  }
  for (const char* c : {"c++", "g++", "clang++"}) {
    if (on_path(c)) return c;
  }
  return "";
}

// The CPU model line: part of the cache key, since -march=native differs per CPU.
std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, model, flags;
  while (std::getline(f, line)) {
    if (model.empty() && line.rfind("model name", 0) == 0) model = line;
    if (flags.empty() && line.rfind("flags", 0) == 0) flags = line;
    if (!model.empty() && !flags.empty()) break;
  }
  return model + "|" + hash_hex(flags);
}

// Writes the embedded headers under <root>/include-<hash> (once, under the build lock: see
// DiskCache::ensure_files); returns that directory, or "" with `error` set.
std::string ensure_headers(const std::string& root, std::string* headers_hash,
                           std::string* error) {
  static const std::vector<std::pair<std::string, std::string>> files = [] {
    std::vector<std::pair<std::string, std::string>> v;
    for (const auto& [path, text] : embedded_headers()) v.emplace_back(path, text);
    return v;
  }();
  std::string all;
  for (const auto& [path, text] : files) {
    all += path;
    all += '\n';
    all += text;
  }
  *headers_hash = hash_hex(all);
  const std::string dir = root + "/include-" + headers_hash->substr(0, 16);
  if (!DiskCache::ensure_files(dir, files, error)) return "";
  return dir;
}

struct Loaded {
  EntryFn fn = nullptr;
  std::string source_path, library_path;
};

std::mutex g_mutex;
std::map<std::string, Loaded> g_loaded;  // keyed by spec name
std::unordered_map<uint64_t, EntryFn> g_fast;  // keyed by KernelSpecBase::packed_key()

}  // namespace

CpuJit& CpuJit::instance() {
  static CpuJit jit;
  return jit;
}

CpuJit::CpuJit() { refresh_env(); }

void CpuJit::refresh_env() {
  const char* v = std::getenv("SPARSEJIT_JIT");
  enabled_ = !(v && (std::string(v) == "0" || std::string(v) == "off" || std::string(v) == "false"));
}

// -ffp-contract=off: no fused multiply-add, so JIT and generic kernels round alike (the
// bit-identity tests). -fno-trapping-math: lets the vectorizer if-convert selects such as
// GATv2's LeakyReLU gradient (values are unchanged; only floating-point exception flags could
// differ, and nothing reads them); without it those loops stayed scalar with a branch.
// The target follows SPARSEJIT_MAX_ISA (csrc/core/isa.h): the host's own ISA, or a named
// x86-64 level with the host's tuning (AMX off under an "avx512" cap).
std::string CpuJit::compiler_command() const {
  std::string target = " -march=native";
#if defined(__x86_64__)
  switch (max_isa()) {
    case IsaTier::kAvx512:
      target = " -march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16";
      break;
    case IsaTier::kAvx2:  // a host below x86-64-v3 keeps its own (lower) ISA
      if (__builtin_cpu_supports("x86-64-v3")) target = " -march=x86-64-v3 -mtune=native";
      break;
    case IsaTier::kBaseline: target = " -march=x86-64 -mtune=native"; break;
    default: break;
  }
#endif
  return find_compiler() + " -O3" + target +
         " -std=c++17 -ffp-contract=off -fno-trapping-math -fPIC -shared -fopenmp "
         "-fno-math-errno -w";
}

std::string CpuJit::compiler_version() {
  static std::mutex m;
  static std::map<std::string, std::string> versions;
  const std::string cxx = find_compiler();
  std::lock_guard<std::mutex> g(m);
  auto it = versions.find(cxx);
  if (it != versions.end()) return it->second;
  std::string out;
  if (cxx.empty() || run_command(shell_quote(cxx) + " --version", &out) != 0) out = "";
  out = out.substr(0, out.find('\n'));
  versions[cxx] = out;
  return out;
}

void CpuJit::clear_memory_cache() {
  std::lock_guard<std::mutex> g(g_mutex);
  g_loaded.clear();
  g_fast.clear();
}

EntryFn CpuJit::lookup(const KernelSpecBase& spec, JitInfo* info) {
  if (!enabled_) {
    if (info) {
      *info = JitInfo{};
      info->name = spec.name();
      info->error = "the JIT is off (SPARSEJIT_JIT=0)";
    }
    return nullptr;
  }
  // Hot path of every op call: one hash lookup on the packed spec, no strings, no syscalls.
  // Failed specs are remembered too (as null) so a broken compiler is not retried per call.
  const uint64_t packed = spec.packed_key();
  if (!info) {
    std::lock_guard<std::mutex> g(g_mutex);
    auto it = g_fast.find(packed);
    if (it != g_fast.end()) return it->second;
  }
  JitInfo local;
  JitInfo& inf = info ? *info : local;
  inf = JitInfo{};
  inf.name = spec.name();
  auto remember_failure = [&] {
    std::lock_guard<std::mutex> g(g_mutex);
    g_fast[packed] = nullptr;
  };
  const std::string cxx = find_compiler();
  if (cxx.empty()) {
    inf.error = "no host C++ compiler found (set SPARSEJIT_CXX or CXX)";
    warn_once("no-compiler", "sparsejit JIT: " + inf.error +
                                 "; using the precompiled generic kernels (same results)");
    remember_failure();
    return nullptr;
  }
  // Warm path: the spec name determines the source, and the compiler, CPU and headers are
  // fixed for the life of the process, so the name alone finds a loaded function.
  {
    std::lock_guard<std::mutex> g(g_mutex);
    auto it = g_loaded.find(inf.name);
    if (it != g_loaded.end()) {
      inf.memory_hit = true;
      inf.source_path = it->second.source_path;
      inf.library_path = it->second.library_path;
      return it->second.fn;
    }
  }
  DiskCache& cache = DiskCache::instance();
  const std::string source = spec.source();
  const std::string version = compiler_version();
  const std::string root = cache.writable_root("cpu");
  std::string headers_hash, headers_error = "no writable directory for JIT artefacts";
  const std::string include_dir =
      root.empty() ? "" : ensure_headers(root, &headers_hash, &headers_error);
  if (include_dir.empty()) {
    inf.error = headers_error;
    warn_once("headers:" + root, "sparsejit JIT: " + inf.error +
                                     "; using the precompiled generic kernels (same results)");
    remember_failure();
    return nullptr;
  }
  const std::string command = compiler_command();
  // Everything that changes the binary goes into the key.
  const std::string key = hash_hex(source + "\n" + headers_hash + "\n" + command + "\n" + version +
                                   "\n" + cpu_model() + "\n" SPARSEJIT_VERSION);
  std::string source_path;
  auto build = [&](const std::string& tmp_path, std::string& error) {
    // The source sits next to the library (kept readable for explain() and debugging).
    source_path = tmp_path.substr(0, tmp_path.find(".so.build.")) + ".cpp";
    const auto t0 = std::chrono::steady_clock::now();
    // Keep the source readable next to the library (for explain() and debugging).
    const std::string src_dir = source_path.substr(0, source_path.rfind('/'));
    mkdir(src_dir.c_str(), 0755);
    if (!DiskCache::write_atomic(source_path, source)) {
      error = "could not write the generated source to " + source_path;
      return false;
    }
    std::string log;
    const std::string cmd = command + " -I" + shell_quote(include_dir) + " " +
                            shell_quote(source_path) + " -o " + shell_quote(tmp_path);
    if (run_command(cmd, &log) != 0) {
      error = "compiling " + inf.name + " failed:\n" + cmd + "\n" + log.substr(0, 4000);
      return false;
    }
    inf.compile_ms = ms_since(t0);
    return true;
  };
  std::string lib_path, error;
  bool hit = false;
  if (!cache.get_or_build("cpu", inf.name, key, "so", build, &lib_path, &error, &hit)) {
    inf.error = error;
    warn_once("compile:" + inf.name,
              "sparsejit JIT: " + error + "\nusing the precompiled generic kernel instead");
    remember_failure();
    return nullptr;
  }
  inf.disk_hit = hit;
  if (source_path.empty()) source_path = lib_path.substr(0, lib_path.size() - 3) + ".cpp";
  inf.library_path = lib_path;
  inf.source_path = source_path;
  const auto t0 = std::chrono::steady_clock::now();
  void* handle = dlopen(lib_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  void* sym = handle ? dlsym(handle, kEntrySymbol) : nullptr;
  const EntryFn fn = reinterpret_cast<EntryFn>(sym);
  if (!fn) {
    const char* why = dlerror();
    inf.error = std::string("loading ") + lib_path + " failed: " + (why ? why : "no entry point");
    warn_once("load:" + inf.name,
              "sparsejit JIT: " + inf.error + "\nusing the precompiled generic kernel instead");
    remember_failure();
    return nullptr;
  }
  inf.load_ms = ms_since(t0);
  std::lock_guard<std::mutex> g(g_mutex);
  g_loaded[inf.name] = Loaded{fn, source_path, lib_path};
  g_fast[packed] = fn;
  return fn;
}

}  // namespace sparsejit::codegen
