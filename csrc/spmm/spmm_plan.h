// SpMM plans: which kernel runs, with which schedule. A plan travels with the matrix as an
// int64 tensor (plan_header.h, then arrays for a bucketed plan), so it crosses
// torch.compile, torch.save and .to().
#pragma once

#include <cstdint>
#include <string>

#include "csrc/plan/plan_header.h"

namespace sparsejit::plan {

// Generic / Jit: the merge-path CSR kernel. Bucketed: the same kernel on a decomposition of
// the structure (below), run by the JIT when it is available, else by the generic kernel.
enum class Kernel : int64_t { Generic = 1, Jit = 2, Bucketed = 3 };
const char* kernel_name(Kernel k);
// "generic" | "jit" | "bucketed" -> Kernel; throws std::invalid_argument otherwise.
Kernel parse_kernel(const std::string& name);

// A Bucketed plan is one int64 tensor: the header (kWordParam = max_log2), then
//    row_map[rows],      output row of each decomposed row
//    rowptr[rows + 1],   decomposed CSR: rows of exactly 0, 1, ..., 2^max_log2 entries
//    col[nnz],           (one bucket per length, original order inside a bucket), then the
//    pos[nnz]            longer rows in original order; pos: CSR position of each entry
// Entries keep their order inside each row, so on one thread results are bit-identical to the
// CSR kernel's (with several threads, the merge-path split shares other rows between
// threads, and a shared row's sum is rounded in two parts). Rows of one length sit together,
// so the row loop's exit branch is predictable; the split still shares long rows between
// threads. This is hyb(1, k) from SparseTIR adapted to the CPU: exact-length buckets instead
// of power-of-two ELL padding (no lockstep lanes to fill), long rows kept as CSR. Its recipe
// (kernel, prefetch, max_log2) is what sparsejit.tune stores; the arrays are rebuilt from
// the structure.
struct SpmmPlan {
  Kernel kernel = Kernel::Generic;
  int32_t prefetch = 0;
  int32_t max_log2 = 0;              // Bucketed: rows up to 2^max_log2 entries get own buckets
  const int64_t* row_map = nullptr;  // Bucketed: views into the plan tensor
  const int64_t* rowptr = nullptr;
  const int64_t* col = nullptr;
  const int64_t* pos = nullptr;
  std::string reason;  // why the cost model chose it (for explain)
};

// Cost model, no measurement: the JIT whenever it is available and the row width is one it
// specializes; X rows prefetched when X does not fit in the per-core L2 cache.
SpmmPlan choose_spmm(int64_t rows, int64_t cols, int64_t nnz, int64_t row_width,
                     int64_t elem_size, bool jit_available);

// SDDMM has no tunable schedule: the JIT-specialized kernel (compile-time H and F) when the
// JIT is available, the width is specialized and the work (nnz * row width) is large enough.
bool sddmm_use_jit(int64_t nnz, int64_t row_width, bool jit_available, std::string* reason);

// Writes a header-only SpMM plan (Generic or Jit) for the structure `s`.
void encode(const SpmmPlan& p, const StructureStamp& s, int64_t* words);
// Reads an SpMM plan for the structure `s`: false (with `error`) for another op's or another
// structure's plan, an unknown kernel, a recipe without its arrays, or arrays that do not fit.
bool decode(const int64_t* words, int64_t n, const StructureStamp& s, SpmmPlan* p,
            std::string* error);

// Checks every array entry of a decoded Bucketed plan (O(rows + nnz)): columns inside the
// stamp's column count, positions inside the entries, each output row once. The Torch adapter
// runs it once per plan tensor (and again only if the tensor is modified).
bool validate_bucketed_arrays(const SpmmPlan& p, const StructureStamp& s, std::string* error);

// Size in words of the Bucketed plan of a structure.
inline int64_t bucketed_plan_words(int64_t rows, int64_t nnz) {
  return kHeaderWords + rows + (rows + 1) + 2 * nnz;
}
// Builds the Bucketed plan of a CSR structure into `words` (bucketed_plan_words long).
template <typename I>
void build_bucketed_plan(const I* rowptr, const I* col, int64_t rows, int64_t cols, int max_log2,
                         int32_t prefetch, int64_t* words);

// Largest row width (H * F) the JIT specializes; wider rows use the generic kernel.
constexpr int64_t kMaxJitRowWidth = 1024;
// Below codegen::min_jit_work(OpKind::Spmm) ((rows + nnz) * row width; codegen/jit_policy.h)
// the cost model keeps the generic kernel.

}  // namespace sparsejit::plan
