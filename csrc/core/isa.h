// One run-time ISA dispatch for the ahead-of-time kernels (ATen's DispatchStub idea, for the
// one split sparsejit needs): a source that holds a kernel is compiled twice, for the
// library's baseline ISA and for AVX2 + FMA (CMake's sparsejit_isa_copy() sets the flags on
// the second copy), each copy inside its own namespace named by SPARSEJIT_ISA_NS (defined by
// the including file, so the copies never meet at link time), and the caller picks a copy
// with cpu_has_avx2_fma(). Small loops instead get three copies of one function in one file
// (SJ_TARGET_V4 / SJ_TARGET_V3 below, picked with isa_tier()). The JIT needs none of this: it
// compiles for the machine it runs on (codegen/cpu_jit.cpp), within the same cap.
// Used by the built-in GEMM (csrc/dense/gemm_packed.h) and the filter-sparse convolution's
// tile loops (kernels/cpu/filter_conv_tiles.h).
//
// SPARSEJIT_MAX_ISA (kernels/common/isa_cap.h) caps what sparsejit uses, as oneDNN's
// ONEDNN_MAX_CPU_ISA does for oneDNN: "avx512" (AVX-512 and AVX512-BF16 where present, no
// AMX), "avx2" (x86-64-v3: AVX2 + FMA), "baseline" (x86-64, no AVX); unset, "" or "native":
// what the CPU has. It is read once, at
// the first question, so it is set before the process starts. Every predicate below, the
// three-copy loops and the JIT's -march follow it, so one machine runs the code another CPU
// of the lower tier would run (tests and A/B timings on the other ISA).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>

#include "kernels/common/isa_cap.h"

namespace sparsejit {

// True when the cap allows `tier`.
inline bool isa_allows(IsaTier tier) {
  return static_cast<int>(max_isa()) >= static_cast<int>(tier);
}

// True when the CPU runs AVX2 and FMA and the cap allows them (read once).
inline bool cpu_has_avx2_fma() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool ok = isa_allows(IsaTier::kAvx2) && __builtin_cpu_supports("avx2") &&
                         __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}

// True when the CPU has AVX512-BF16 (vcvtneps2bf16, vdpbf16ps) and the cap allows AVX-512
// (read once).
inline bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool ok = isa_allows(IsaTier::kAvx512) && __builtin_cpu_supports("avx512bf16");
  return ok;
#else
  return false;
#endif
}

// True when the CPU has AMX tiles and no cap is set (read once).
inline bool cpu_has_amx() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool ok = isa_allows(IsaTier::kNative) && __builtin_cpu_supports("amx-tile");
  return ok;
#else
  return false;
#endif
}

// True when the CPU multiplies bfloat16 pairs natively (AVX512-BF16 or AMX-BF16) within the
// cap (read once).
inline bool cpu_has_bf16_dot() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool ok =
      cpu_has_avx512_bf16() || (cpu_has_amx() && __builtin_cpu_supports("amx-bf16"));
  return ok;
#else
  return false;
#endif
}

// The tier the three-copy loops run: x86-64-v4 (AVX-512 F/BW/CD/DQ/VL), x86-64-v3 (AVX2, FMA,
// BMI) or the baseline, as the CPU has them and the cap allows (read once). Other compilers
// than GCC build no tier copies (SJ_TARGET_* below are empty): the baseline.
inline IsaTier isa_tier() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  static const IsaTier t = isa_allows(IsaTier::kAvx512) && __builtin_cpu_supports("x86-64-v4")
                               ? IsaTier::kAvx512
                           : isa_allows(IsaTier::kAvx2) && __builtin_cpu_supports("x86-64-v3")
                               ? IsaTier::kAvx2
                               : IsaTier::kBaseline;
  return t;
#else
  return IsaTier::kBaseline;
#endif
}

// Copies of one small loop for the tiers: a function marked SJ_TARGET_V4 / SJ_TARGET_V3 is
// compiled for x86-64-v4 / -v3 (its always_inline body with it), and the caller picks one by
// isa_tier(). (GCC's target_clones would pick at load time, where the cap cannot reach.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SJ_TARGET_V4 __attribute__((target("arch=x86-64-v4")))
#define SJ_TARGET_V3 __attribute__((target("arch=x86-64-v3")))
#else
#define SJ_TARGET_V4
#define SJ_TARGET_V3
#endif

// `return name_v4 args;`, `name_v3 args` or `name_base args` by isa_tier().
#define SJ_ISA_CALL(name, args)                                   \
  switch (::sparsejit::isa_tier()) {                              \
    case ::sparsejit::IsaTier::kAvx512: return name##_v4 args;    \
    case ::sparsejit::IsaTier::kAvx2: return name##_v3 args;      \
    default: return name##_base args;                             \
  }

// The size in bytes of CPU 0's data (or unified) cache of `level` as the kernel describes it
// (sysfs, /sys/devices/system/cpu/cpu0/cache/index*/), 0 where it does not. Preferred to
// glibc's CPUID-based sysconf, which under a hypervisor can be far off (an EPYC VM here:
// sysconf's L3 is 320 MiB, sysfs and lscpu give 32 MiB).
inline long sysfs_cache_bytes(int level) {
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    FILE* f = std::fopen((dir + "level").c_str(), "r");
    if (f == nullptr) break;
    int lv = 0;
    const bool ok = std::fscanf(f, "%d", &lv) == 1;
    std::fclose(f);
    if (!ok || lv != level) continue;
    char type[16] = {0};
    if ((f = std::fopen((dir + "type").c_str(), "r")) == nullptr) continue;
    const bool typed = std::fscanf(f, "%15s", type) == 1;
    std::fclose(f);
    if (!typed || std::string(type) == "Instruction") continue;
    long v = 0;
    char unit = 0;
    if ((f = std::fopen((dir + "size").c_str(), "r")) == nullptr) continue;
    const int got = std::fscanf(f, "%ld%c", &v, &unit);
    std::fclose(f);
    if (got >= 1 && v > 0) return unit == 'K' ? v << 10 : unit == 'M' ? v << 20 : v;
  }
  return 0;
}

// The cache of `level` (1: data, 2, 3) in bytes: sysfs, else sysconf, else 0.
inline long cache_bytes(int level) {
  long b = sysfs_cache_bytes(level);
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE) && \
    defined(_SC_LEVEL3_CACHE_SIZE)
  if (b <= 0)
    b = sysconf(level == 1 ? _SC_LEVEL1_DCACHE_SIZE
                           : level == 2 ? _SC_LEVEL2_CACHE_SIZE : _SC_LEVEL3_CACHE_SIZE);
#endif
  return b > 0 ? b : 0;
}

// The level-1 data cache of one core, 32 KiB where the OS does not say; read once. Cache
// budgets of the CPU kernels scale with it.
inline long cpu_l1d_bytes() {
  static const long b = cache_bytes(1);
  return b >= 8 * 1024 && b <= 1024 * 1024 ? b : 32 * 1024;
}

// The level-2 cache of one core, 512 KiB where the OS does not say; read once.
inline long cpu_l2_bytes() {
  static const long b = cache_bytes(2);
  return b >= 64 * 1024 ? b : 512 * 1024;
}

// The L3 cache, 0 where the OS does not say; read once.
inline long cpu_l3_bytes() {
  static const long b = cache_bytes(3);
  return b;
}

}  // namespace sparsejit
