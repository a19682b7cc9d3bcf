// SpMM plans: which kernel runs, with which schedule. A plan travels with the matrix as a
// small int64 tensor (the header below), so it crosses torch.compile, torch.save and .to().
#pragma once

#include <cstdint>
#include <string>

namespace sparsejit::plan {

// Plan header layout (int64 words).
constexpr int64_t kPlanMagic = 0x534A504C;  // "SJPL"
constexpr int64_t kPlanVersion = 1;
constexpr int kPlanWords = 4;  // magic, version, kernel, prefetch

enum class Kernel : int64_t { Generic = 1, Jit = 2 };

struct SpmmPlan {
  Kernel kernel = Kernel::Generic;
  int32_t prefetch = 0;
  std::string reason;  // why the cost model chose it (for explain)
};

// Cost model, no measurement: the JIT whenever it is available and the row width is one it
// specializes; X rows prefetched when X does not fit in the per-core L2 cache.
SpmmPlan choose_spmm(int64_t rows, int64_t cols, int64_t nnz, int64_t row_width,
                     int64_t elem_size, bool jit_available);

// SDDMM has no tunable schedule: the JIT-specialized kernel (compile-time H and F) when the
// JIT is available, the width is specialized and the work (nnz * row width) is large enough.
bool sddmm_use_jit(int64_t nnz, int64_t row_width, bool jit_available, std::string* reason);

// Encodes / decodes the header. decode returns false (with `error`) for a foreign or newer
// header.
void encode(const SpmmPlan& p, int64_t* words);
bool decode(const int64_t* words, int64_t n, SpmmPlan* p, std::string* error);

// Largest row width (H * F) the JIT specializes; wider rows use the generic kernel.
constexpr int64_t kMaxJitRowWidth = 1024;
// Below this much work ((rows + nnz) * row width) the cost model keeps the generic kernel.
constexpr int64_t kMinJitWork = 1 << 17;

}  // namespace sparsejit::plan
