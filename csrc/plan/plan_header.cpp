#include "csrc/plan/plan_header.h"

#include <stdexcept>

#include "csrc/core/csr.h"

namespace sparsejit::plan {

template <typename I>
StructureStamp stamp_structure(const I* rowptr, const I* col, int64_t rows, int64_t cols) {
  StructureStamp s;
  s.rows = rows;
  s.nnz = rows > 0 ? static_cast<int64_t>(rowptr[rows]) : 0;
  s.cols = cols;
  // Kept positive so it reads the same from Python's signed view.
  s.hash = static_cast<int64_t>(fingerprint<I>(rowptr, rows, col, s.nnz, cols) >> 1);
  return s;
}

template StructureStamp stamp_structure<int32_t>(const int32_t*, const int32_t*, int64_t,
                                                 int64_t);
template StructureStamp stamp_structure<int64_t>(const int64_t*, const int64_t*, int64_t,
                                                 int64_t);

void write_header(int64_t* w, OpKind op, int64_t kernel, int64_t prefetch, int64_t param,
                  const StructureStamp& s) {
  w[kWordMagic] = kPlanMagic;
  w[kWordVersion] = kPlanVersion;
  w[kWordOp] = static_cast<int64_t>(op);
  w[kWordKernel] = kernel;
  w[kWordPrefetch] = prefetch;
  w[kWordParam] = param;
  w[kWordRows] = s.rows;
  w[kWordNnz] = s.nnz;
  w[kWordCols] = s.cols;
  w[kWordStamp] = s.hash;
}

bool check_header(const int64_t* w, int64_t n, OpKind op, const StructureStamp& s,
                  std::string* error) {
  if (n < kHeaderWords || w[kWordMagic] != kPlanMagic) {
    *error = "not a sparsejit plan (" + std::to_string(n) + " words, expected at least " +
             std::to_string(kHeaderWords) + " starting with the plan magic)";
    return false;
  }
  if (w[kWordVersion] != kPlanVersion) {
    *error = "plan version " + std::to_string(w[kWordVersion]) + " but this sparsejit reads " +
             std::to_string(kPlanVersion) + " (rebuild the plan)";
    return false;
  }
  if (w[kWordOp] != static_cast<int64_t>(op)) {
    const int64_t got = w[kWordOp];
    const std::string name = plan_op_name(got);
    *error = std::string("plan built for ") + (name == "unknown" ? "an unknown op" : name) +
             ", not " +
             op_name(op);
    return false;
  }
  if (w[kWordRows] != s.rows || w[kWordNnz] != s.nnz || w[kWordCols] != s.cols ||
      w[kWordStamp] != s.hash) {
    *error = "plan built for another structure (" + std::to_string(w[kWordRows]) + " x " +
             std::to_string(w[kWordCols]) + " with " + std::to_string(w[kWordNnz]) +
             " entries, stamp " + std::to_string(w[kWordStamp]) + "; this call has " +
             std::to_string(s.rows) + " x " + std::to_string(s.cols) + " with " +
             std::to_string(s.nnz) + " entries, stamp " + std::to_string(s.hash) + ")";
    return false;
  }
  return true;
}

}  // namespace sparsejit::plan
