// Host-compiler JIT for CPU kernels: KernelSpec -> C++ source -> shared object -> function.
//
// The generated source is a few lines that instantiate the loop nest of
// kernels/cpu/spmm_kernel.h with compile-time constants; the headers it needs are embedded
// in the library (embedded_headers.cpp, generated at build time) and written next to the
// cache, so the JIT never depends on a source checkout. Shared objects live in the disk cache
// (disk_cache.h); loaded functions are cached in memory.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cpu/spmm_args.h"

namespace sparsejit::codegen {

enum class ScalarKind : int32_t { F32 = 0, F64 = 1, BF16 = 2 };
enum class IndexKind : int32_t { I32 = 0, I64 = 1 };

enum class OpKind : int32_t { Spmm = 0, Sddmm = 1 };

// Everything that changes the generated code of one kernel. SDDMM uses dtype, index, heads
// and features; the other fields keep their defaults.
struct KernelSpec {
  OpKind op = OpKind::Spmm;
  ScalarKind dtype = ScalarKind::F32;
  IndexKind index = IndexKind::I64;
  Reduce reduce = Reduce::Sum;
  int32_t value_mode = 0;  // 0 none, 1 per entry, 2 per entry and head
  int64_t heads = 1;
  int64_t features = 0;  // per head
  cpu::Act act = cpu::Act::None;
  int32_t prefetch = 0;  // entries ahead to prefetch X rows (0: off)

  // A 64-bit key unique among the specs the planner emits (in-memory lookup per call).
  uint64_t packed_key() const;
  // Readable name, also the cache file prefix: spmm_f32_i32_sum_v1_h1_f64_relu_pf8,
  // sddmm_f32_i64_h1_f64.
  std::string name() const;
  // The full C++ source of the kernel.
  std::string source() const;
};
using SpmmSpec = KernelSpec;

using SpmmFn = void (*)(const cpu::SpmmArgs*, const void* rowptr, const void* col,
                        const void* values, const void* x, void* out, int64_t* arg);
using SddmmFn = void (*)(const cpu::SddmmArgs*, const void* rowptr, const void* col,
                         const void* q, const void* k, void* s);

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

  // The compiled function for `spec`, or nullptr (with info->error) when the JIT is off,
  // no compiler is available, or the compile failed; callers then use the generic kernel.
  SpmmFn spmm(const KernelSpec& spec, JitInfo* info = nullptr);
  SddmmFn sddmm(const KernelSpec& spec, JitInfo* info = nullptr);

  // The compiler command used (without file names), e.g. "g++ -O3 -march=native ...".
  std::string compiler_command() const;
  std::string compiler_version();
  // Drops the in-memory function cache (the disk cache stays).
  void clear_memory_cache();

 private:
  CpuJit();
  // The loaded entry point for any op kind (what spmm() / sddmm() cast).
  void* lookup(const KernelSpec& spec, JitInfo* info);
  bool enabled_ = true;
};

}  // namespace sparsejit::codegen
