// The JIT spec of a CPU fused-attention kernel (kernels/cpu/attention_kernel.h with the score
// form, head count H, q/k width D and value width Dv fixed at compile time); its entry point
// takes an attention::AttentionLaunch and runs the launch's phase (forward, row delta, or one
// of the two backward passes).
#pragma once

#include <cstdint>
#include <string>

#include "codegen/kernel_spec.h"
#include "kernels/cpu/attention_args.h"

namespace sparsejit::codegen {

struct CpuAttentionSpec final : KernelSpecBase {
  ScalarKind dtype = ScalarKind::F32;
  IndexKind index = IndexKind::I64;
  attention::Mode mode = attention::Mode::Dot;
  int64_t heads = 1;
  int64_t qk_width = 1;  // D (1 in additive mode)
  int64_t v_width = 1;   // Dv

  // Whether sizes fit the spec's key (and are worth a kernel of their own): H <= 64,
  // D and Dv <= 1024, H * max(D, Dv) <= 4096.
  static bool supports(int64_t heads, int64_t qk_width, int64_t v_width);

  OpKind op() const override { return OpKind::Attention; }
  // attention_f32_i64_gat_h4_d1_v16
  std::string name() const override;
  std::string source() const override;
  uint64_t packed_key() const override;
};

}  // namespace sparsejit::codegen
