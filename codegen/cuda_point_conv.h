// CUDA specs and launch planning of the point-cloud convolution (kernels/cuda/point_conv.cuh):
// one module per (dtype, index type, channel width, load width, activation) holding the gather
// and the ordered row-reduce entries (OpKind::PointConv; the GEMMs between them run on cuBLAS
// through ATen), the kernel-map search per index type (OpKind::PointConvMap), and the
// output-stationary implicit GEMM per (dtype, C_in, C_out, weight orientation, activation)
// (OpKind::PointConvImplicit). The shared CudaKernelSpec code (codegen/cuda_spec.cpp) calls the
// point_conv_* hooks below for the three ops. Torch-free and GPU-free.
#pragma once

#include <string>
#include <vector>

#include "codegen/cuda_launch.h"
#include "codegen/cuda_spec.h"

namespace sparsejit::codegen {

inline bool is_point_conv_op(CudaOp op) {
  return op == CudaOp::PointConv || op == CudaOp::PointConvMap ||
         op == CudaOp::PointConvImplicit;
}

// Spec hooks (CudaKernelSpec::validate / name / entry_points / source, the three ops above).
std::string point_conv_validate(const CudaKernelSpec& s);
std::string point_conv_name(const CudaKernelSpec& s);  // pconv_f32_i32_c64_vec4[_relu]
std::vector<std::string> point_conv_entry_points(const CudaKernelSpec& s);  // gather, rows
std::string point_conv_config(const CudaKernelSpec& s);  // the Config members
std::vector<std::string> point_conv_bodies(const CudaKernelSpec& s);  // templates, entry order
const char* point_conv_params_type(const CudaKernelSpec& s);  // PointConvParams, PointMapParams
// Variants for enumerate_cuda_variants(): every dtype x index type x load width, odd and
// wide channel counts, with and without the fused ReLU.
void append_point_conv_variants(std::vector<CudaKernelSpec>* out);

// The spec moving rows of `channels` scalars: the widest load the pointers allow.
CudaKernelSpec plan_cuda_point_conv(CudaScalar dtype, IndexKind index, int64_t channels,
                                    bool relu, int32_t max_vec_bytes);

// Launches: gather of n rows, reduce into n output rows.
CudaLaunch plan_point_conv_gather_launch(const CudaKernelSpec& s, int64_t n);
CudaLaunch plan_point_conv_rows_launch(const CudaKernelSpec& s, int64_t rows);

// Kernel-map search (OpKind::PointConvMap, kernels/cuda/point_conv.cuh pconv_map_search):
// one thread per (offset, query).
CudaKernelSpec plan_cuda_point_map(IndexKind index);
CudaLaunch plan_point_map_launch(const CudaKernelSpec& s, int64_t k, int64_t n_query);

// Output-stationary implicit GEMM (OpKind::PointConvImplicit, pconv_nbr + pconv_implicit):
// out [n, c_out] = act(bias + sum_k x[nbr[:, k]] @ W[k]) with W [K, c_in, c_out] (trans_w: the
// weight is [K, c_out, c_in] and read transposed, the feature gradient's case). Channels per
// block: 16, 32 or 64 (the smallest that covers c_out, at most 64).
CudaKernelSpec plan_cuda_point_conv_implicit(CudaScalar dtype, int64_t c_in, int64_t c_out,
                                             bool trans_w, bool relu);
// The neighbour-map fill over n_pairs pairs, and the GEMM over n output rows.
CudaLaunch plan_point_conv_nbr_launch(const CudaKernelSpec& s, int64_t n_pairs);
CudaLaunch plan_point_conv_implicit_launch(const CudaKernelSpec& s, int64_t n);
// Output rows per block of the GEMM (BLOCK / 4).
int64_t point_conv_implicit_rows_per_block(const CudaKernelSpec& s);

}  // namespace sparsejit::codegen
