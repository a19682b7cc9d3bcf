// Arguments of a CPU fused-attention launch (kernels/cpu/attention_kernel.h), shared by the
// generic instantiation (torch_ext/ops/attention.cpp) and JIT-compiled ones
// (codegen/cpu_attention_spec.h): the JIT compiles against this exact header, embedded in the
// library, so the layout matches.
#pragma once

#include <cstdint>

namespace sparsejit::attention {

enum class Mode : int64_t { Dot = 0, Additive = 1, GATv2 = 2 };

struct Shape {
  int64_t rows;      // targets
  int64_t cols;      // sources
  int64_t heads;     // H
  int64_t qk_width;  // D of q and k (1 in additive mode)
  int64_t v_width;   // Dv
  Mode mode;
  double scale;
  double negative_slope;
  double dropout;  // probability of dropping an attention weight
  uint64_t seed;
  int threads;
  const void* att = nullptr;  // GATv2 mode: [H, D] of the kernel's scalar type
};

// Which of the kernel's passes a launch runs (one entry point per spec runs all four).
enum class Phase : int32_t { Forward = 0, RowDelta = 1, BackwardRows = 2, BackwardCols = 3 };

// What a JIT-compiled attention kernel's entry point receives (codegen/kernel_spec.h). Arrays
// are of the spec's scalar / index type; those a phase does not use may be null.
struct AttentionLaunch {
  Shape shape{};
  Phase phase = Phase::Forward;
  const void* rowptr = nullptr;    // [rows + 1]
  const void* col = nullptr;       // [nnz]
  const void* t_rowptr = nullptr;  // [cols + 1], BackwardCols
  const void* t_col = nullptr;     // [nnz], BackwardCols
  const void* t_perm = nullptr;    // [nnz], BackwardCols
  int64_t nnz = 0;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* bias = nullptr;   // [nnz, H] or null
  const void* lse = nullptr;    // [rows, H], backward phases
  const void* delta = nullptr;  // [rows, H], backward phases
  const void* dout = nullptr;   // [rows, H, Dv], backward phases and RowDelta
  void* out = nullptr;          // Forward: [rows, H, Dv]; RowDelta reads it (as const)
  void* lse_out = nullptr;      // Forward: [rows, H]
  void* delta_out = nullptr;    // RowDelta: [rows, H]
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  void* dbias = nullptr;
  void* datt = nullptr;
  // [nnz, H] each, optional: BackwardRows writes every entry's dz (the gradient of its
  // pre-activation score) and dropout-scaled probability there, and BackwardCols reads them
  // instead of recomputing score, exp and <dout, v> a second time.
  void* dz = nullptr;
  void* pk = nullptr;
  bool bad_perm = false;  // BackwardCols: set when t_perm held a position outside [0, nnz)
};

}  // namespace sparsejit::attention
