// The fused sparse attention's driver (kernels/cpu/attention_kernel.h), Torch-free: the JIT
// lookup (codegen/cpu_attention_spec.h: score form, H, D and Dv fixed at compile time) and the
// generic instantiation (the same template, same summation order, so the same bits). The
// Torch adapter (torch_ext/ops/attention.cpp) checks arguments, converts tensors and fills
// the AttentionLaunch structs run here.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "codegen/cpu_jit.h"
#include "kernels/cpu/attention_kernel.h"

namespace sparsejit::attention {

// The JIT-compiled entry for this launch's sizes, or null (JIT off, sizes outside the spec,
// too small, or the compile failed: CpuJit warns once and remembers the failure).
// `dtype` BF16: the forward-only kernel with bfloat16 q, k, v and out.
codegen::EntryFn jit_entry(ScalarKind dtype, IndexKind index, const Shape& s, int64_t nnz);

// Runs every launch in `ls` (in order) on the JIT's kernel or the generic one; `dtype` is the
// computation dtype (F32 or F64).
void launch(ScalarKind dtype, IndexKind index, int64_t nnz,
            std::initializer_list<AttentionLaunch*> ls);

}  // namespace sparsejit::attention
