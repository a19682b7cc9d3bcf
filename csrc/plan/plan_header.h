// The plan header: one layout for every op family's plan tensor (int64 words).
//
// A plan is an int64 tensor that starts with this header and may carry arrays after it
// (a decomposed structure, position maps). The header names the op family the plan is for
// and stamps the structure it was built from, so an op handed a plan built for another op,
// or for another structure of the same size, rejects it with an error instead of running a
// schedule (or reading arrays) that do not belong to its inputs.
//
// The stamp is the structure's sizes and its 64-bit fingerprint (every entry of rowptr and
// col). Computing it is O(rows + nnz), so the Torch adapter computes it once per structure,
// when it first validates the structure's tensors, and keeps it with them
// (torch_ext/validated.h); checking a plan against it is O(1).
//
// Python reads this layout from sparsejit._core.plan_layout() rather than restating it.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/common/enum_names.h"

namespace sparsejit::plan {

constexpr int64_t kPlanMagic = 0x534A504C;  // "SJPL"
constexpr int64_t kPlanVersion = 4;  // 4: the structure stamp hashes two indices per multiply

// Which op a plan belongs to: the one numbering of kernels/common/enums.h (OpKind; the
// families with plans are kPlanOpKinds of enum_names.h). Its name: op_name(OpKind).
using sparsejit::OpKind;

// The name of the op a plan's op word names ("spmm", ...), or "unknown" for a word that
// names no family with plans.
inline const char* plan_op_name(int64_t word) {
  for (OpKind k : kPlanOpKinds)
    if (word == static_cast<int64_t>(k)) return op_name(k);
  return "unknown";
}

// Word positions in the header.
enum HeaderWord : int {
  kWordMagic = 0,
  kWordVersion = 1,
  kWordOp = 2,        // OpKind
  kWordKernel = 3,    // op-specific kernel id
  kWordPrefetch = 4,  // schedule parameter (SpMM: entries ahead to prefetch)
  kWordParam = 5,     // schedule parameter (SpMM bucketed: max_log2)
  kWordRows = 6,      // structure stamp: rows, stored entries, columns, sampled hash
  kWordNnz = 7,
  kWordCols = 8,
  kWordStamp = 9,
  kHeaderWords = 10,
};

// What a plan is checked against: the structure an op was called with.
struct StructureStamp {
  int64_t rows = 0, nnz = 0, cols = 0, hash = 0;
};

// The stamp of a CSR structure (O(rows + nnz): sizes and the fingerprint of both arrays).
template <typename I>
StructureStamp stamp_structure(const I* rowptr, const I* col, int64_t rows, int64_t cols);

// Writes the header words (the first kHeaderWords of `words`).
void write_header(int64_t* words, OpKind op, int64_t kernel, int64_t prefetch, int64_t param,
                  const StructureStamp& s);

// Checks magic, version, op family and stamp. On failure returns false with an error that
// says which (e.g. "plan built for sddmm, not spmm", "plan built for another structure").
bool check_header(const int64_t* words, int64_t n, OpKind op, const StructureStamp& s,
                  std::string* error);

}  // namespace sparsejit::plan
