// The JIT spec of the point-cloud convolution's output-stationary rows
// (kernels/cpu/point_conv_kernel.h with C_in and C_out as constants); its entry point takes a
// cpu::ConvOsLaunch.
#pragma once

#include <cstdint>
#include <string>

#include "codegen/kernel_spec.h"

namespace sparsejit::codegen {

struct CpuPointConvSpec final : KernelSpecBase {
  // F32, F64, or BF16: bfloat16 features and output, float32 weights and accumulation.
  ScalarKind dtype = ScalarKind::F32;
  int64_t c_in = 0;                    // 1 .. kMaxChannels
  int64_t c_out = 0;                   // a multiple of the vector length, up to kMaxChannels
  // Out rows taken together at most (1 or 4; fewer where the registers do not hold them):
  // a kernel offset several rows use is applied from one load of its weights. The caller
  // asks for 4 when the weights are well beyond the L1 cache (os_rows_together).
  int64_t rows = 1;

  static constexpr int64_t kMaxChannels = 1024;

  OpKind op() const override { return OpKind::PointConv; }
  // point_conv_f32_i16_o32, point_conv_f32_i64_o64_r4
  std::string name() const override;
  std::string source() const override;
  uint64_t packed_key() const override;
};

}  // namespace sparsejit::codegen
