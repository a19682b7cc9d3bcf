// CUDA spec of the fused sparse attention (kernels/cuda/attention.cuh): the forward, and the
// backward's rows pass then columns pass; its variants, planner and launch plan. Torch-free
// and GPU-free (codegen/cuda_spec_attention.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/cuda_launch.h"
#include "codegen/cuda_spec.h"

namespace sparsejit::codegen {

struct CudaAttentionSpec final : CudaKernelSpecBase {
  int64_t heads = 1;
  int64_t d = 1;          // q / k width per head
  int64_t dv = 1;         // v width per head
  int32_t mode = 0;       // 0 dot product, 1 additive (GAT; d = 1), 2 GATv2
  bool has_bias = false;  // a [nnz, H] score bias
  bool backward = false;
  int32_t group = 32;  // lanes per (row, head): 1, 2, 4, ..., 32

  OpKind op() const override {
    return backward ? OpKind::AttentionBackward : OpKind::Attention;
  }
  // The forward, or the backward's _rows and _cols passes.
  std::vector<std::string> entry_points() const override;
  const char* params_type() const override { return "AttentionParams"; }
  std::unique_ptr<CudaKernelSpecBase> clone() const override { return clone_spec(*this); }

 protected:
  std::string stem() const override;  // attention_fwd_f32_i32_dot_h4_d32_dv32_g16[_bias]
  std::string validate_family() const override;
  const char* kernel_header() const override { return "kernels/cuda/attention.cuh"; }
  int64_t config_heads() const override { return heads; }
  std::string config(std::vector<std::string>* bodies) const override;
};

// A group of lanes per (row, head) sized to the head widths (f32 / f64 compute; float16 and
// bfloat16 inputs run in float32).
CudaAttentionSpec plan_cuda_attention(CudaScalar dtype, IndexKind index, int64_t heads, int64_t d,
                                      int64_t dv, int32_t mode, bool bias, bool backward);

// The three score forms, forward and backward, at covering widths (enumerate_cuda_variants).
void append_attention_variants(std::vector<CudaSpecPtr>* out);

// The forward, or the backward's rows pass then its columns pass.
std::vector<CudaLaunch> plan_attention_launch(const CudaAttentionSpec& spec, int64_t rows,
                                              int64_t cols);

}  // namespace sparsejit::codegen
