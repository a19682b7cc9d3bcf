// Host-compiler JIT for CPU kernels: spec -> C++ source -> shared object -> function.
//
// Op-agnostic: any KernelSpecBase (kernel_spec.h; CpuSpmmSpec, CpuSddmmSpec, ...) gives the
// source, a few lines that instantiate a kernel template of kernels/cpu with compile-time
// constants and define the one entry point; the headers it needs are embedded
// in the library (embedded_headers.cpp, generated at build time) and written next to the
// cache, so the JIT never depends on a source checkout. Shared objects live in the disk cache
// (disk_cache.h); loaded functions are cached in memory.
#pragma once

#include <cstdint>
#include <string>

#include "codegen/kernel_spec.h"

namespace sparsejit::codegen {

// What a lookup did, for explain() and the tests.
struct JitInfo {
  std::string name;
  std::string source_path;  // the generated source, kept readable in the cache
  std::string library_path;
  bool disk_hit = false;
  bool memory_hit = false;
  double compile_ms = 0;  // 0 unless this call compiled
  double load_ms = 0;     // dlopen + dlsym, 0 on a memory hit
  std::string error;      // why no function was returned
};

class CpuJit {
 public:
  static CpuJit& instance();

  // False when SPARSEJIT_JIT=0 (read once; tests may call refresh_env()).
  bool enabled() const { return enabled_; }
  void refresh_env();

  // The compiled entry point for `spec` (call it with the spec's launch struct), or nullptr
  // (with info->error) when the JIT is off, no compiler is available, or the compile failed;
  // callers then use the generic kernel. Throws std::invalid_argument for a spec that names
  // an unknown or unsupported enum value.
  EntryFn lookup(const KernelSpecBase& spec, JitInfo* info = nullptr);

  // The compiler command used (without file names), e.g. "g++ -O3 -march=native ...".
  std::string compiler_command() const;
  std::string compiler_version();
  // Drops the in-memory function cache (the disk cache stays).
  void clear_memory_cache();

 private:
  CpuJit();
  bool enabled_ = true;
};

}  // namespace sparsejit::codegen
