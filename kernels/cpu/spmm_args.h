// Arguments of a CPU SpMM launch, shared by the generic kernel and JIT-compiled ones (the
// JIT compiles against this exact header, embedded in the library, so the layout matches).
#pragma once

#include <cstdint>

#include "csrc/core/types.h"

namespace sparsejit::cpu {

// Activation fused into the output write. Runtime: read from SpmmArgs::act (generic kernel).
enum class Act : int32_t { None = 0, Relu = 1, LeakyRelu = 2, Elu = 3, Gelu = 4, Runtime = 99 };

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

// Arguments of a CPU SDDMM launch (generic and JIT-compiled kernels).
struct SddmmArgs {
  int64_t rows = 0;
  int64_t heads = 1;     // H
  int64_t features = 0;  // F (per head)
  int32_t num_threads = 1;
  int64_t min_parallel_work = 32768;
};

}  // namespace sparsejit::cpu
