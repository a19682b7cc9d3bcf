// The JIT spec of the row-tile loops (kernels/cpu/row_tile_kernel.h with a compile-time row
// width: RGMS's tiles and fused rows, the point-cloud convolution's gathers and scatter-adds);
// its entry point takes a cpu::RowTileLaunch.
#pragma once

#include <cstdint>
#include <string>

#include "codegen/kernel_spec.h"
#include "kernels/cpu/row_tile_kernel.h"

namespace sparsejit::codegen {

struct CpuRowTileSpec final : KernelSpecBase {
  ScalarKind dtype = ScalarKind::F32;  // F32 or F64 (the RGMS compute types)
  int64_t width = 0;                   // gathered row width, 1 .. kMaxWidth
  // The other width of the fused kinds (F_out forward, F_out in the gradients), 1 ..
  // kMaxWidth2; 0: a gather/scatter-only kernel (the fused kinds then read it at run time).
  int64_t width2 = 0;

  static constexpr int64_t kMaxWidth = 1024;
  static constexpr int64_t kMaxWidth2 = 256;

  OpKind op() const override { return OpKind::Rgms; }
  // row_tile_f32_w64, row_tile_f32_w16_o16
  std::string name() const override;
  std::string source() const override;
  uint64_t packed_key() const override;
};

}  // namespace sparsejit::codegen
