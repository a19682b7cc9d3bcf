// CUDA filter-sparse convolution (kernels/cuda/filter_conv.cuh): the parts of a CudaKernelSpec
// that only this family uses (validation, name, Config fields), its variants, the planner
// (layer geometry -> spec) and the launch plan. Torch-free and GPU-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/cuda_launch.h"
#include "codegen/cuda_spec.h"

namespace sparsejit::codegen {

// Called by CudaKernelSpec::validate / name / source for OpKind::FilterConv.
std::string filter_conv_validate(const CudaKernelSpec& s);
std::string filter_conv_name(const CudaKernelSpec& s);
std::string filter_conv_config(const CudaKernelSpec& s);  // Config members
// Kernel shapes x dtypes x epilogues x tile shapes (enumerate_cuda_variants).
std::vector<CudaKernelSpec> filter_conv_variants();

// One layer: what the planner needs (sizes of the call, without the batch for the spec).
struct CudaFilterConvProblem {
  CudaScalar dtype = CudaScalar::F32;
  int32_t r = 1, s = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  bool relu = false;
  int64_t c_out = 0;
  int64_t pixels = 0;  // batch * out_h * out_w
};
// A block of 64 / 128 / 256 lanes sized to the pixel count, and the output channels per block
// chosen so a layer still gives a few hundred blocks (fewer channels per block for small
// images, more when the pixel grid alone fills the GPU).
CudaKernelSpec plan_cuda_filter_conv(const CudaFilterConvProblem& prob);

// grid.x over BLOCK pixels, grid.y over groups of channels_per_block output channels. No
// launch when there is nothing to write.
std::vector<CudaLaunch> plan_filter_conv_launch(const CudaKernelSpec& spec, int64_t pixels,
                                                int64_t c_out);

}  // namespace sparsejit::codegen
