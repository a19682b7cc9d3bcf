// Arguments of a CPU SDDMM launch, shared by the generic kernel and JIT-compiled ones (the
// JIT compiles against this exact header, embedded in the library, so the layout matches).
#pragma once

#include <cstdint>

namespace sparsejit::cpu {

struct SddmmArgs {
  int64_t rows = 0;
  int64_t heads = 1;     // H
  int64_t features = 0;  // F (per head)
  int32_t num_threads = 1;
  int64_t min_parallel_work = 32768;
};

// What a JIT-compiled SDDMM's entry point receives (codegen/kernel_spec.h).
struct SddmmLaunch {
  SddmmArgs args;
  const void* rowptr = nullptr;  // [rows + 1], the spec's index type
  const void* col = nullptr;     // [nnz]
  const void* q = nullptr;       // [rows, H, F]
  const void* k = nullptr;       // [n, H, F]
  void* s = nullptr;             // [nnz, H]
};

}  // namespace sparsejit::cpu
