// The JIT spec of a CPU SDDMM kernel (kernels/cpu/sddmm_kernel.h with compile-time H and F);
// its entry point takes a cpu::SddmmLaunch.
#pragma once

#include <cstdint>
#include <string>

#include "codegen/kernel_spec.h"
#include "kernels/cpu/sddmm_args.h"

namespace sparsejit::codegen {

struct CpuSddmmSpec final : KernelSpecBase {
  ScalarKind dtype = ScalarKind::F32;
  IndexKind index = IndexKind::I64;
  int64_t heads = 1;
  int64_t features = 0;  // per head

  OpKind op() const override { return OpKind::Sddmm; }
  // sddmm_f32_i64_h1_f64
  std::string name() const override;
  std::string source() const override;
  uint64_t packed_key() const override;
};

}  // namespace sparsejit::codegen
