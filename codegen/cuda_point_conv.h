// CUDA specs and launch planning of the point-cloud convolution (kernels/cuda/point_conv.cuh):
// one module per (dtype, index type, channel width, load width, activation) holding the gather
// and the ordered row-reduce entries (CudaPointConvSpec, OpKind::PointConv; the GEMMs between
// them run on cuBLAS through ATen), the kernel-map search per index type (CudaPointMapSpec,
// OpKind::PointConvMap), and the output-stationary implicit GEMM per (dtype, C_in, C_out,
// weight orientation, activation) (CudaPointConvImplicitSpec, OpKind::PointConvImplicit).
// Torch-free and GPU-free (codegen/cuda_spec_point_conv.cpp).
#pragma once

#include <string>
#include <vector>

#include "codegen/cuda_launch.h"
#include "codegen/cuda_spec.h"

namespace sparsejit::codegen {

// Gather and ordered row-reduce of rows of `channels` scalars.
struct CudaPointConvSpec final : CudaKernelSpecBase {
  int64_t channels = 1;  // 1 .. 2^24
  int32_t vec = 1;       // scalars per load; divides channels
  Act act = Act::None;   // None or Relu

  OpKind op() const override { return OpKind::PointConv; }
  std::vector<std::string> entry_points() const override;  // _gather, _rows
  const char* params_type() const override { return "PointConvParams"; }
  std::unique_ptr<CudaKernelSpecBase> clone() const override { return clone_spec(*this); }

 protected:
  std::string stem() const override;  // pconv_f32_i32_c64_vec4[_relu]
  std::string validate_family() const override;
  const char* kernel_header() const override { return "kernels/cuda/point_conv.cuh"; }
  std::string config(std::vector<std::string>* bodies) const override;
};

// The kernel-map search: only the index type (and block) vary.
struct CudaPointMapSpec final : CudaKernelSpecBase {
  OpKind op() const override { return OpKind::PointConvMap; }
  const char* params_type() const override { return "PointMapParams"; }
  std::unique_ptr<CudaKernelSpecBase> clone() const override { return clone_spec(*this); }

 protected:
  std::string stem() const override;  // pconv_map_i32
  std::string validate_family() const override { return ""; }
  const char* kernel_header() const override { return "kernels/cuda/point_conv.cuh"; }
  std::string config(std::vector<std::string>* bodies) const override;
};

// The output-stationary implicit GEMM and its neighbour-map fill (int32 plans).
struct CudaPointConvImplicitSpec final : CudaKernelSpecBase {
  CudaPointConvImplicitSpec() { index = IndexKind::I32; }
  int64_t c_in = 1;   // 1 .. 65536
  int64_t c_out = 1;  // 1 .. 65536
  // The weight read as W[k]^T ([K, C_out, C_in]): the feature gradient's case.
  bool trans_w = false;
  // Outputs per thread along the channels (1, 2 or 4: 16, 32 or 64 channels per block).
  int32_t cols_per_thread = 4;
  Act act = Act::None;  // None or Relu

  OpKind op() const override { return OpKind::PointConvImplicit; }
  std::vector<std::string> entry_points() const override;  // _nbr, _gemm
  const char* params_type() const override { return "PointConvImplicitParams"; }
  std::unique_ptr<CudaKernelSpecBase> clone() const override { return clone_spec(*this); }

 protected:
  std::string stem() const override;  // pconv_implicit_f32_ci16_co32_tn2[_wt][_relu]
  std::string validate_family() const override;
  const char* kernel_header() const override { return "kernels/cuda/point_conv.cuh"; }
  std::string config(std::vector<std::string>* bodies) const override;
};

// Variants for enumerate_cuda_variants(): every dtype x index type x load width, odd and
// wide channel counts, with and without the fused ReLU; the map search per index type; the
// implicit GEMM at the widths networks use.
void append_point_conv_variants(std::vector<CudaSpecPtr>* out);

// The spec moving rows of `channels` scalars: the widest load the pointers allow.
CudaPointConvSpec plan_cuda_point_conv(CudaScalar dtype, IndexKind index, int64_t channels,
                                       bool relu, int32_t max_vec_bytes);

// Launches: gather of n rows, reduce into n output rows.
CudaLaunch plan_point_conv_gather_launch(const CudaPointConvSpec& s, int64_t n);
CudaLaunch plan_point_conv_rows_launch(const CudaPointConvSpec& s, int64_t rows);

// Kernel-map search (kernels/cuda/point_conv.cuh pconv_map_search): one thread per
// (offset, query).
CudaPointMapSpec plan_cuda_point_map(IndexKind index);
CudaLaunch plan_point_map_launch(const CudaPointMapSpec& s, int64_t k, int64_t n_query);

// Output-stationary implicit GEMM (pconv_nbr + pconv_implicit): out [n, c_out] = act(bias +
// sum_k x[nbr[:, k]] @ W[k]) with W [K, c_in, c_out] (trans_w: the weight is [K, c_out, c_in]
// and read transposed, the feature gradient's case). Channels per block: 16, 32 or 64 (the
// smallest that covers c_out, at most 64).
CudaPointConvImplicitSpec plan_cuda_point_conv_implicit(CudaScalar dtype, int64_t c_in,
                                                        int64_t c_out, bool trans_w, bool relu);
// The neighbour-map fill over n_pairs pairs, and the GEMM over n output rows.
CudaLaunch plan_point_conv_nbr_launch(const CudaPointConvImplicitSpec& s, int64_t n_pairs);
CudaLaunch plan_point_conv_implicit_launch(const CudaPointConvImplicitSpec& s, int64_t n);
// Output rows per block of the GEMM (BLOCK / 4).
int64_t point_conv_implicit_rows_per_block(const CudaPointConvImplicitSpec& s);

}  // namespace sparsejit::codegen
