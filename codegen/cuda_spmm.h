// CUDA specs of the SpMM group (kernels/cuda/spmm.cuh, sddmm.cuh, edge_softmax.cuh): SpMM with
// its schedules, SDDMM and the edge softmax (forward and backward); their variants, planners
// (row-length statistics -> schedule) and launch plans. Torch-free and GPU-free
// (codegen/cuda_spec_spmm.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "codegen/cuda_launch.h"
#include "codegen/cuda_spec.h"

namespace sparsejit::codegen {

// SpMM schedules (kernels/cuda/spmm.cuh): a group of lanes per row, or equal chunks of stored
// entries whose split rows are finished by an ordered segment fix-up or by atomics.
enum class CudaStrategy : int32_t { RowGroup = 0, NnzSegment = 1, NnzAtomic = 2 };
const char* cuda_strategy_name(CudaStrategy s);  // rowgroup, segment, atomic

struct CudaSpmmSpec final : CudaKernelSpecBase {
  int64_t heads = 1;
  int64_t features = 1;    // per head
  int32_t value_mode = 0;  // 0 none, 1 values[nnz], 2 values[nnz, H]
  Reduce reduce = Reduce::Sum;
  Act act = Act::None;  // never Runtime: the activation is compiled in
  CudaStrategy strategy = CudaStrategy::RowGroup;
  int32_t group = 32;          // g: lanes per row / chunk worker (1, 2, 4, ..., 32)
  int32_t vec = 1;             // scalars per load; vec * sizeof(T) <= 16 and features % vec == 0
  bool deterministic = false;  // no floating-point atomics (the atomic strategy is refused)

  OpKind op() const override { return OpKind::Spmm; }
  // The row-group kernel, or the chunk pass and its fix-up.
  std::vector<std::string> entry_points() const override;
  const char* params_type() const override { return "SpmmParams"; }
  std::unique_ptr<CudaKernelSpecBase> clone() const override { return clone_spec(*this); }

 protected:
  // spmm_rowgroup_f32_i32_sum_v1_h1_f64_relu_g8_vec4 (+ _det)
  std::string stem() const override;
  std::string validate_family() const override;
  const char* kernel_header() const override { return "kernels/cuda/spmm.cuh"; }
  int64_t config_heads() const override { return heads; }
  std::string config(std::vector<std::string>* bodies) const override;
};

struct CudaSddmmSpec final : CudaKernelSpecBase {
  int64_t heads = 1;
  int64_t features = 1;  // per head
  int32_t group = 32;    // lanes per stored entry (1, 2, 4, ..., 32)
  int32_t vec = 1;       // scalars per load
  int32_t split = 1;     // groups per stored entry (1, 2, 4, 8), summed in shared memory

  OpKind op() const override { return OpKind::Sddmm; }
  const char* params_type() const override { return "SddmmParams"; }
  std::unique_ptr<CudaKernelSpecBase> clone() const override { return clone_spec(*this); }

 protected:
  std::string stem() const override;  // sddmm_f32_i32_h4_f64_g16_s1_vec4
  std::string validate_family() const override;
  const char* kernel_header() const override { return "kernels/cuda/sddmm.cuh"; }
  int64_t config_heads() const override { return heads; }
  std::string config(std::vector<std::string>* bodies) const override;
};

struct CudaEdgeSoftmaxSpec final : CudaKernelSpecBase {
  int64_t heads = 1;
  bool backward = false;

  OpKind op() const override {
    return backward ? OpKind::EdgeSoftmaxBackward : OpKind::EdgeSoftmax;
  }
  const char* params_type() const override { return "SoftmaxParams"; }
  std::unique_ptr<CudaKernelSpecBase> clone() const override { return clone_spec(*this); }

 protected:
  std::string stem() const override;  // edge_softmax_f32_i32_h4, edge_softmax_bwd_...
  std::string validate_family() const override;
  const char* kernel_header() const override { return "kernels/cuda/edge_softmax.cuh"; }
  int64_t config_heads() const override { return heads; }
  std::string config(std::vector<std::string>* bodies) const override;
};

// How an SpMM spec spreads its lanes (derived, shared by the generator and the launcher).
struct SpmmLayout {
  int gf = 1;         // lanes over features
  int gn = 1;         // lanes over stored entries (row-group only)
  int co = 1;         // vectors per lane per tile (feature coarsening)
  int tile = 1;       // features per tile: gf * co * vec
  int tiles = 1;      // tiles per row: grid.y
  bool exact = true;  // every tile full
};
SpmmLayout spmm_layout(const CudaSpmmSpec& s);

// SDDMM: vectors per lane per head, entries per block.
struct SddmmLayout {
  int m = 1;
  int entries_per_block = 1;
};
SddmmLayout sddmm_layout(const CudaSddmmSpec& s);

// The variants of the three ops (enumerate_cuda_variants): each schedule (strategy x g x
// vector width, SDDMM splits) with each dtype, each reduce, value mode and activation at least
// once, and both index types.
void append_spmm_variants(std::vector<CudaSpecPtr>* out);

// ---- Planner -------------------------------------------------------------------------------
struct CudaRowStats {
  int64_t rows = 0;
  int64_t nnz = 0;
  int64_t max_row = 0;  // longest row (stored entries)
};

struct CudaSpmmProblem {
  CudaScalar dtype = CudaScalar::F32;
  IndexKind index = IndexKind::I64;
  int64_t heads = 1;
  int64_t features = 1;
  int32_t value_mode = 0;
  Reduce reduce = Reduce::Sum;
  Act act = Act::None;
  int32_t max_vec_bytes = 16;  // 16 when every operand pointer is 16-byte aligned, less if not
  bool deterministic = false;
};

struct CudaSpmmChoice {
  CudaSpmmSpec spec;
  int64_t chunk = 0;  // stored entries per chunk (nnz-balanced strategies)
  std::string reason;
};

// Heuristic from row-length statistics: a group of lanes per row sized to the row width and
// the average row length while rows are balanced; equal-nnz chunks when the longest row is far
// above the average (atomic partials for sum / mean unless deterministic, ordered segments
// otherwise).
CudaSpmmChoice plan_cuda_spmm(const CudaSpmmProblem& prob, const CudaRowStats& stats);

CudaSddmmSpec plan_cuda_sddmm(CudaScalar dtype, IndexKind index, int64_t heads, int64_t features,
                              int32_t max_vec_bytes);
CudaEdgeSoftmaxSpec plan_cuda_edge_softmax(CudaScalar dtype, IndexKind index, int64_t heads,
                                           bool backward);

// Number of chunks for an nnz-balanced launch: max(1, ceil(nnz / chunk)).
int64_t spmm_num_chunks(int64_t nnz, int64_t chunk);

// ---- Launch plans ----------------------------------------------------------------------------
// An SpMM call: launches in order and the workspace they need. The first `zero_bytes` of
// the workspace must be zeroed before the first launch (atomic partials).
struct SpmmLaunchPlan {
  std::vector<CudaLaunch> launches;
  int64_t num_chunks = 0;
  size_t workspace_bytes = 0;
  size_t zero_bytes = 0;
  size_t partial_offset = 0, partial_arg_offset = 0, tail_row_offset = 0;
};

SpmmLaunchPlan plan_spmm_launch(const CudaSpmmChoice& choice, int64_t rows, int64_t nnz);
// Points the workspace fields of `p` into `workspace` (and sets chunk / num_chunks).
void bind_spmm_workspace(const SpmmLaunchPlan& plan, const CudaSpmmChoice& choice, void* workspace,
                         cuda::SpmmParams* p);

CudaLaunch plan_sddmm_launch(const CudaSddmmSpec& spec, int64_t nnz);
CudaLaunch plan_edge_softmax_launch(const CudaEdgeSoftmaxSpec& spec, int64_t rows);

}  // namespace sparsejit::codegen
