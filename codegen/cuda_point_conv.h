// CUDA specs and launch planning of the point-cloud convolution (kernels/cuda/point_conv.cuh):
// one module per (dtype, index type, channel width, load width, activation) holding the gather
// and the ordered row-reduce entries (OpKind::PointConv; the GEMMs between them run on cuBLAS
// through ATen), and the kernel-map search per index type (OpKind::PointConvMap). The shared
// CudaKernelSpec code (codegen/cuda_spec.cpp) calls the point_conv_* hooks below for both
// ops. Torch-free and GPU-free.
#pragma once

#include <string>
#include <vector>

#include "codegen/cuda_launch.h"
#include "codegen/cuda_spec.h"

namespace sparsejit::codegen {

// Spec hooks (CudaKernelSpec::validate / name / entry_points / source, op == PointConv).
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

}  // namespace sparsejit::codegen
