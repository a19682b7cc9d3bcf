// CUDA spec of the filter-sparse convolution (kernels/cuda/filter_conv.cuh): the kernel
// geometry compiled in, its variants, the planner (layer geometry -> spec) and the launch plan.
// Torch-free and GPU-free (codegen/cuda_spec_filter_conv.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/cuda_launch.h"
#include "codegen/cuda_spec.h"

namespace sparsejit::codegen {

struct CudaFilterConvSpec final : CudaKernelSpecBase {
  CudaFilterConvSpec() { index = IndexKind::I64; }
  // Compiled-in kernel geometry and the output channels per block.
  struct Shape {
    int32_t r = 1, s = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
    int32_t channels_per_block = 4;
  } conv;
  Act act = Act::None;  // the epilogue: None or Relu (with an optional bias)

  OpKind op() const override { return OpKind::FilterConv; }
  const char* params_type() const override { return "FilterConvParams"; }
  std::unique_ptr<CudaKernelSpecBase> clone() const override { return clone_spec(*this); }

 protected:
  std::string stem() const override;  // filter_conv_f32_k3x3_s1x1_p1x1_d1x1[_relu]_oc4
  std::string validate_family() const override;
  const char* kernel_header() const override { return "kernels/cuda/filter_conv.cuh"; }
  std::string config(std::vector<std::string>* bodies) const override;
};

// Kernel shapes x dtypes x epilogues x tile shapes (enumerate_cuda_variants).
void append_filter_conv_variants(std::vector<CudaSpecPtr>* out);

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
CudaFilterConvSpec plan_cuda_filter_conv(const CudaFilterConvProblem& prob);

// grid.x over BLOCK pixels, grid.y over groups of channels_per_block output channels. No
// launch when there is nothing to write.
std::vector<CudaLaunch> plan_filter_conv_launch(const CudaFilterConvSpec& spec, int64_t pixels,
                                                int64_t c_out);

}  // namespace sparsejit::codegen
