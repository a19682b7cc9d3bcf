// Cache-line prefetches the compiler cannot drop. GCC 12 at -O3 deleted __builtin_prefetch
// under a bounds check (a control-dependent call with no side effect to its dead-code pass):
// the JIT's attention kernels carried no prefetch of the entries' rows at all, and the
// bfloat16 forward on a 200k-node graph spent 60% of its time on one load of k's row (perf
// annotate). On x86 the instruction is issued through asm volatile, which the compiler keeps.
//
// Standard library only: the JIT compiles this file with nothing else on the include path.
#pragma once

#include <cstdint>

namespace sparsejit::cpu {

// One cache line (read).
inline void prefetch_line(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p);
#endif
}

// Every cache line of [p, p + n).
template <typename T>
inline void prefetch_span(const T* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t b = 0; b < n * int64_t(sizeof(T)); b += 64) prefetch_line(c + b);
}

}  // namespace sparsejit::cpu
