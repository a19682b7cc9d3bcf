// Running SpMM and SDDMM on raw arrays: kernel selection (plan or cost model), plan decoding,
// the JIT lookup and the generic fallback. Torch-free, so the Torch adapter, the C++ API,
// GoogleTest and later op families share one path from arrays to a launched kernel.
#pragma once

#include <cstdint>
#include <string>

#include "csrc/plan/plan_header.h"
#include "kernels/common/enum_names.h"
#include "kernels/cpu/sddmm_args.h"
#include "kernels/cpu/spmm_args.h"

namespace sparsejit::plan {

// One SpMM call. All arrays are contiguous; `arg` may be null (no max/min positions).
struct SpmmProblem {
  ScalarKind dtype = ScalarKind::F32;
  IndexKind index = IndexKind::I64;
  const void* rowptr = nullptr;  // [rows + 1]
  const void* col = nullptr;     // [nnz]
  const void* values = nullptr;  // [nnz * value_heads] or null
  const void* x = nullptr;       // [num_cols, H, F]
  void* out = nullptr;           // [rows, H, F]
  int64_t* arg = nullptr;        // [rows, H, F] or null
  int64_t num_cols = 0;
  // The structure's stamp (sizes + fingerprint), computed once per structure by the caller;
  // a plan must carry the same one.
  StructureStamp stamp;
  cpu::SpmmArgs args;  // rows, H, F, value heads, reduce, threads, epilogue
};

// Runs `p` with the kernel `plan` selects (plan_words == nullptr: the cost model's choice).
// Returns "" on success, else why the plan was rejected (nothing is written then).
std::string run_spmm(const SpmmProblem& p, const int64_t* plan_words, int64_t plan_len);

// The cost model's header-only plan for a structure (what the spmm_plan op returns).
void cost_model_plan(const StructureStamp& s, int64_t row_width, int64_t elem_size,
                     int64_t* words);

// The stamp of a CSR structure of either index width (O(rows + nnz)).
StructureStamp stamp_of(IndexKind index, const void* rowptr, const void* col,
                        int64_t rows, int64_t cols);

// One SDDMM call: s[p, h] = <q[row(p), h], k[col(p), h]>.
struct SddmmProblem {
  ScalarKind dtype = ScalarKind::F32;
  IndexKind index = IndexKind::I64;
  const void* rowptr = nullptr;
  const void* col = nullptr;
  const void* q = nullptr;  // [rows, H, F]
  const void* k = nullptr;  // [num_cols, H, F]
  void* s = nullptr;        // [nnz, H]
  int64_t nnz = 0;
  cpu::SddmmArgs args;
};
void run_sddmm(const SddmmProblem& p);

// Checks the invariants of a CSR row pointer that cost O(rows): rowptr[0] == 0, no decrease,
// rowptr[rows] == nnz. Returns "" or a message naming the position and values.
std::string check_rowptr(IndexKind index, const void* rowptr, int64_t rows, int64_t nnz);

}  // namespace sparsejit::plan
