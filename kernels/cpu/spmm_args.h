// Arguments of a CPU SpMM launch, shared by the generic kernel and JIT-compiled ones (the
// JIT compiles against this exact header, embedded in the library, so the layout matches).
#pragma once

#include <cstdint>

#include "kernels/common/types.h"

namespace sparsejit::cpu {

// Activation fused into the output write (kernels/common/enums.h). Runtime: read from
// SpmmArgs::act (generic kernel).
using sparsejit::Act;

struct SpmmArgs {
  int64_t rows = 0;
  int64_t heads = 1;        // H
  int64_t features = 0;     // F (per head)
  int64_t value_heads = 0;  // 0: no values (all ones); 1: one value per entry; H: per head
  Reduce reduce = Reduce::Sum;
  int32_t num_threads = 1;
  int64_t min_parallel_work = 32768;  // below this much work, run on one thread
  // Epilogue: out = act(scale * reduced + bias). bias: [H * F] of the output dtype or null.
  Act act = Act::None;
  float act_param = 0.01f;  // negative slope (leaky_relu) or alpha (elu)
  float scale = 1.0f;
  const void* bias = nullptr;
  // Output row of each (decomposed) input row, or null for the identity (plain CSR).
  const int64_t* out_rows = nullptr;
};

// What a JIT-compiled SpMM's entry point receives: extern "C" void sparsejit_entry(const void*
// launch) is called with a SpmmLaunch (codegen/kernel_spec.h).
struct SpmmLaunch {
  SpmmArgs args;
  const void* rowptr = nullptr;  // [rows + 1], the spec's index type
  const void* col = nullptr;     // [nnz]
  const void* values = nullptr;  // [nnz * value_heads] or null
  const void* x = nullptr;       // [n, H, F]
  void* out = nullptr;           // [rows, H, F]
  int64_t* arg = nullptr;        // [rows, H, F] (max / min positions) or null
};

}  // namespace sparsejit::cpu
