// SPARSEJIT_MAX_ISA, the cap on the instruction sets sparsejit uses (csrc/core/isa.h applies
// it to the ahead-of-time kernels, codegen/cpu_jit.cpp to the JIT's -march). Host only: not
// one of the headers the JIT or NVRTC compiles.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace sparsejit {

// Ordered tiers: a CPU or a cap at one tier has everything of the tiers below it.
enum class IsaTier : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2, kNative = 3 };

// SPARSEJIT_MAX_ISA parsed: kNative when unset or empty, kNative (and one line on stderr
// naming the variable and the values it takes) when it holds anything else.
inline IsaTier parse_max_isa(const char* v) {
  if (v == nullptr || *v == 0 || std::strcmp(v, "native") == 0) return IsaTier::kNative;
  if (std::strcmp(v, "avx512") == 0) return IsaTier::kAvx512;
  if (std::strcmp(v, "avx2") == 0) return IsaTier::kAvx2;
  if (std::strcmp(v, "baseline") == 0) return IsaTier::kBaseline;
  std::fprintf(stderr,
               "sparsejit: SPARSEJIT_MAX_ISA='%s' is not one of native, avx512, avx2, baseline; "
               "ignored (no cap)\n",
               v);
  return IsaTier::kNative;
}

// The cap from SPARSEJIT_MAX_ISA (read once).
inline IsaTier max_isa() {
  static const IsaTier cap = parse_max_isa(std::getenv("SPARSEJIT_MAX_ISA"));
  return cap;
}

}  // namespace sparsejit
