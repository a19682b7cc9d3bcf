// The fused sparse attention's driver (Torch-free): picks the JIT-specialized kernel
// (codegen/cpu_attention_spec.h: score form, H, D and Dv fixed at compile time) when the JIT
// is on and the pass is big enough (codegen/jit_policy.h), else the generic instantiation of
// kernels/cpu/attention_kernel.h (the same template and summation order, so the same bits),
// and runs the passes of a launch on it. torch_ext/ops/attention.cpp checks arguments and
// turns tensors into the launch structs.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "codegen/kernel_spec.h"
#include "kernels/cpu/attention_args.h"

namespace sparsejit::attention {

// The JIT's entry for these sizes, or null (JIT off, sizes outside the spec, a pass too small
// to be worth it, or the compile failed: CpuJit warns once and remembers the failure).
// `dtype` F32 or F64, or BF16 for the forward-only kernel with bfloat16 q, k, v and out.
codegen::EntryFn jit_entry(ScalarKind dtype, IndexKind index, const Shape& s, int64_t nnz);

// Runs every launch in `ls`, in order, on the JIT's kernel or the generic one. `dtype` F32 or
// F64 (the computation type; bfloat16 and float16 inputs are widened by the caller).
void launch(ScalarKind dtype, IndexKind index, int64_t nnz,
            std::initializer_list<AttentionLaunch*> ls);

}  // namespace sparsejit::attention
