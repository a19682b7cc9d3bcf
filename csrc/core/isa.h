// One run-time ISA dispatch for the ahead-of-time kernels (ATen's DispatchStub idea, for the
// one split sparsejit needs): a source that holds a kernel is compiled twice, for the
// library's baseline ISA and for AVX2 + FMA (CMake's sparsejit_isa_copy() sets the flags on
// the second copy), each copy inside its own namespace named by SPARSEJIT_ISA_NS (defined by
// the including file, so the copies never meet at link time), and the caller picks a copy
// with cpu_has_avx2_fma(). The JIT needs none of this: it compiles for the machine it runs on.
// Used by the built-in GEMM (csrc/dense/gemm_packed.h) and the filter-sparse convolution's
// tile loops (kernels/cpu/filter_conv_tiles.h).
#pragma once

#include <unistd.h>

#include <cstdio>

namespace sparsejit {

// True when the CPU runs AVX2 and FMA (read once).
inline bool cpu_has_avx2_fma() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}

// True when the CPU multiplies bfloat16 pairs natively (AVX512-BF16 or AMX-BF16; read once).
inline bool cpu_has_bf16_dot() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool ok =
      __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
  return ok;
#else
  return false;
#endif
}

// The level-1 data cache of one core in bytes, as the OS reports it (sysconf), 32 KiB where
// it does not; read once. Cache budgets of the CPU kernels scale with it.
inline long cpu_l1d_bytes() {
  static const long bytes = [] {
    long b = 0;
#if defined(_SC_LEVEL1_DCACHE_SIZE)
    b = sysconf(_SC_LEVEL1_DCACHE_SIZE);
#endif
    return b >= 8 * 1024 && b <= 1024 * 1024 ? b : 32 * 1024;
  }();
  return bytes;
}

// The L3 cache in bytes: the kernel's cache description (sysfs, index3), else sysconf, else 0;
// read once. sysfs first: under a hypervisor glibc's CPUID-based sysconf can be far off (an
// EPYC VM here: 320 MiB from sysconf, 32 MiB in sysfs and lscpu).
inline long cpu_l3_bytes() {
  static const long bytes = [] {
    long b = 0;
    if (FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r")) {
      long v = 0;
      char unit = 0;
      if (std::fscanf(f, "%ld%c", &v, &unit) >= 1)
        b = unit == 'K' ? v << 10 : unit == 'M' ? v << 20 : v;
      std::fclose(f);
    }
#if defined(_SC_LEVEL3_CACHE_SIZE)
    if (b <= 0) b = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    return b > 0 ? b : 0;
  }();
  return bytes;
}

}  // namespace sparsejit
