#include "csrc/plan/spmm_plan.h"

#include <algorithm>

namespace sparsejit::plan {

SpmmPlan choose_spmm(int64_t rows, int64_t cols, int64_t nnz, int64_t row_width,
                     int64_t elem_size, bool jit_available) {
  SpmmPlan p;
  if (!jit_available) {
    p.reason = "JIT unavailable or off";
    return p;
  }
  if (row_width <= 0 || row_width > kMaxJitRowWidth) {
    p.reason = "row width outside the specialized range (1.." + std::to_string(kMaxJitRowWidth) + ")";
    return p;
  }
  const int64_t work = (rows + nnz) * row_width;
  if (work < kMinJitWork) {
    p.reason = "small problem (" + std::to_string(work) + " < " + std::to_string(kMinJitWork) +
               " entry-features): the generic kernel is as fast and needs no compile";
    return p;
  }
  p.kernel = Kernel::Jit;
  const int64_t x_bytes = cols * row_width * elem_size;
  constexpr int64_t kL2Bytes = 1 << 20;
  if (x_bytes > kL2Bytes) {
    // Enough gathered rows in flight to cover memory latency. Measured on a 2-core EPYC
    // (benchmarks/RESULTS.md): 16 entries ahead beat 0/4/8 for F = 32 and 128 alike.
    p.prefetch = 16;
    p.reason = "specialized kernel; X (" + std::to_string(x_bytes >> 10) +
               " KiB) exceeds L2, prefetch " + std::to_string(p.prefetch) + " entries ahead";
  } else {
    p.reason = "specialized kernel; X fits in L2, no prefetch";
  }
  return p;
}

bool sddmm_use_jit(int64_t nnz, int64_t row_width, bool jit_available, std::string* reason) {
  if (!jit_available) {
    *reason = "JIT unavailable or off";
    return false;
  }
  if (row_width <= 0 || row_width > kMaxJitRowWidth) {
    *reason = "row width outside the specialized range";
    return false;
  }
  if (nnz * row_width < kMinJitWork) {
    *reason = "small problem: the generic kernel is as fast and needs no compile";
    return false;
  }
  *reason = "specialized kernel (compile-time H and F)";
  return true;
}

void encode(const SpmmPlan& p, int64_t* words) {
  words[0] = kPlanMagic;
  words[1] = kPlanVersion;
  words[2] = static_cast<int64_t>(p.kernel);
  words[3] = p.prefetch;
}

bool decode(const int64_t* words, int64_t n, SpmmPlan* p, std::string* error) {
  if (n < kPlanWords || words[0] != kPlanMagic) {
    *error = "not a sparsejit SpMM plan (bad size or magic)";
    return false;
  }
  if (words[1] > kPlanVersion) {
    *error = "plan version " + std::to_string(words[1]) + " is newer than this sparsejit (" +
             std::to_string(kPlanVersion) + ")";
    return false;
  }
  if (words[2] != static_cast<int64_t>(Kernel::Generic) &&
      words[2] != static_cast<int64_t>(Kernel::Jit)) {
    *error = "unknown kernel id " + std::to_string(words[2]) + " in plan";
    return false;
  }
  p->kernel = static_cast<Kernel>(words[2]);
  p->prefetch = static_cast<int32_t>(std::clamp<int64_t>(words[3], 0, 64));
  p->reason = "from plan";
  return true;
}

}  // namespace sparsejit::plan
