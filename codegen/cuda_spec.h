// CUDA kernel specs: everything that changes a generated CUDA kernel, the source generator
// (kernel templates of kernels/cuda, embedded as text, plus a configuration struct and an
// extern "C" entry point), the list of variants the planner can pick, and the planner itself
// (row-length statistics -> schedule). Torch-free and GPU-free, so it is unit-tested anywhere.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/kernel_spec.h"  // Act, IndexKind, OpKind, ScalarKind (kernels/common/enums.h)
#include "kernels/common/types.h"

namespace sparsejit::codegen {

// Op and scalar kinds of kernels/common/enums.h (one numbering for CPU and CUDA).
using CudaOp = OpKind;
using CudaScalar = ScalarKind;
// SpMM schedules (kernels/cuda/spmm.cuh): a group of lanes per row, or equal chunks of stored
// entries whose split rows are finished by an ordered segment fix-up or by atomics.
enum class CudaStrategy : int32_t { RowGroup = 0, NnzSegment = 1, NnzAtomic = 2 };

int cuda_scalar_bytes(CudaScalar s);
const char* cuda_scalar_name(CudaScalar s);      // f32, f16, bf16, f64
const char* cuda_strategy_name(CudaStrategy s);  // rowgroup, segment, atomic

struct CudaKernelSpec {
  CudaOp op = CudaOp::Spmm;
  CudaScalar dtype = CudaScalar::F32;
  IndexKind index = IndexKind::I64;
  int64_t heads = 1;
  int64_t features = 1;  // per head (SpMM, SDDMM); unused by edge softmax
  // SpMM only:
  int32_t value_mode = 0;  // 0 none, 1 values[nnz], 2 values[nnz, H]
  Reduce reduce = Reduce::Sum;
  Act act = Act::None;  // never Runtime: the activation is compiled in
  CudaStrategy strategy = CudaStrategy::RowGroup;
  // Schedule:
  int32_t group = 32;          // g: lanes per row / chunk worker / SDDMM group (1, 2, 4, ..., 32)
  int32_t vec = 1;             // scalars per load; vec * sizeof(T) <= 16 and features % vec == 0
  int32_t split = 1;           // SDDMM: groups per stored entry (1, 2, 4), summed in shared memory
  bool deterministic = false;  // no floating-point atomics (the atomic strategy is refused)
  int32_t block = 256;         // threads per block
  // Fused attention only (Attention, AttentionBackward; `features` is the q / k width D):
  int32_t att_mode = 0;     // 0 dot product, 1 additive (GAT; D = 1), 2 GATv2
  int64_t v_features = 1;   // Dv
  bool has_bias = false;    // a [nnz, H] score bias
  // Point-conv implicit GEMM only (codegen/cuda_point_conv.h; `features` is C_in,
  // `v_features` C_out): the weight read as W[k]^T ([K, C_out, C_in]), and outputs per thread
  // along the channels (1, 2 or 4: 16, 32 or 64 channels per block).
  bool trans_w = false;
  int32_t cols_per_thread = 4;
  // Filter conv only (codegen/cuda_filter_conv.h): compiled-in kernel geometry, output
  // channels per block; the epilogue is `act` (None or Relu) with an optional bias.
  struct FilterConvShape {
    int32_t r = 1, s = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
    int32_t channels_per_block = 4;
  } conv;

  // "" when the spec can be generated, else why not.
  std::string validate() const;
  // Readable and unique: spmm_rowgroup_f32_i32_sum_v1_h1_f64_relu_g8_vec4 (+ _det).
  std::string name() const;
  // Kernel entry points in launch order (one, or the chunk pass and its fix-up).
  std::vector<std::string> entry_points() const;
  // The complete CUDA source handed to NVRTC.
  std::string source() const;
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
SpmmLayout spmm_layout(const CudaKernelSpec& s);

// SDDMM: vectors per lane per head, entries per block.
struct SddmmLayout {
  int m = 1;
  int entries_per_block = 1;
};
SddmmLayout sddmm_layout(const CudaKernelSpec& s);

// Every variant the planner may pick, over a covering set of problem shapes: each schedule
// (strategy x g x vector width, SDDMM splits) with each dtype, each reduce, value mode and
// activation at least once, and both index types. A few hundred; all must compile.
std::vector<CudaKernelSpec> enumerate_cuda_variants();

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
  CudaKernelSpec spec;
  int64_t chunk = 0;  // stored entries per chunk (nnz-balanced strategies)
  std::string reason;
};

// The widest load (scalars) with vec * bytes <= max_bytes that divides `features`.
int32_t choose_vec(CudaScalar dtype, int64_t features, int32_t max_bytes);

// Heuristic from row-length statistics: a group of lanes per row sized to the row width and
// the average row length while rows are balanced; equal-nnz chunks when the longest row is far
// above the average (atomic partials for sum / mean unless deterministic, ordered segments
// otherwise).
CudaSpmmChoice plan_cuda_spmm(const CudaSpmmProblem& prob, const CudaRowStats& stats);

CudaKernelSpec plan_cuda_sddmm(CudaScalar dtype, IndexKind index, int64_t heads, int64_t features,
                               int32_t max_vec_bytes);
CudaKernelSpec plan_cuda_edge_softmax(CudaScalar dtype, IndexKind index, int64_t heads,
                                      bool backward);

// Number of chunks for an nnz-balanced launch: max(1, ceil(nnz / chunk)).
int64_t spmm_num_chunks(int64_t nnz, int64_t chunk);

// ---- Fused attention (codegen/cuda_spec_attention.cpp) ---------------------------------------
// A group of lanes per (row, head) sized to the head widths (f32 / f64 compute; float16 and
// bfloat16 inputs run in float32).
CudaKernelSpec plan_cuda_attention(CudaScalar dtype, IndexKind index, int64_t heads, int64_t d,
                                   int64_t dv, int32_t mode, bool bias, bool backward);
namespace attention_spec {
std::string attention_validate(const CudaKernelSpec& s);
std::string attention_name(const CudaKernelSpec& s);
std::vector<std::string> attention_entry_points(const CudaKernelSpec& s);
// The Config members and the kernel bodies of the entry points.
std::string attention_config(const CudaKernelSpec& s, std::vector<std::string>* bodies);
void add_attention_variants(std::vector<CudaKernelSpec>* out);
}  // namespace attention_spec

}  // namespace sparsejit::codegen
