// The JIT spec of a CPU SpMM kernel (kernels/cpu/spmm_kernel.h with compile-time sizes,
// reduce, value mode, activation and prefetch distance); its entry point takes a
// cpu::SpmmLaunch.
#pragma once

#include <cstdint>
#include <string>

#include "codegen/kernel_spec.h"
#include "kernels/cpu/spmm_args.h"

namespace sparsejit::codegen {

struct CpuSpmmSpec final : KernelSpecBase {
  ScalarKind dtype = ScalarKind::F32;
  IndexKind index = IndexKind::I64;
  Reduce reduce = Reduce::Sum;
  int32_t value_mode = 0;  // 0 none, 1 per entry, 2 per entry and head
  int64_t heads = 1;
  int64_t features = 0;  // per head
  Act act = Act::None;
  int32_t prefetch = 0;  // entries ahead to prefetch X rows (0: off)

  OpKind op() const override { return OpKind::Spmm; }
  // spmm_f32_i32_sum_v1_h1_f64_relu_pf8
  std::string name() const override;
  std::string source() const override;
  // heads < 2^16 and features < 2^20 hold for every width the JIT specializes (<= 1024).
  uint64_t packed_key() const override;
};

}  // namespace sparsejit::codegen
