#include "csrc/attention/attention_run.h"

#include "codegen/cpu_attention_spec.h"
#include "codegen/jit_policy.h"
#include "kernels/cpu/attention_kernel.h"

namespace sparsejit::attention {
namespace {

// The generic kernel: the computation dtype and index type, with common q/k widths fixed at
// compile time (the dot product unrolls), others read at run time.
template <typename T, typename I>
void run_generic(AttentionLaunch& l) {
  switch (l.shape.qk_width) {
    case 8: run<Fixed<-1, 0, 8, 0>, T, I>(l); return;
    case 16: run<Fixed<-1, 0, 16, 0>, T, I>(l); return;
    case 32: run<Fixed<-1, 0, 32, 0>, T, I>(l); return;
    case 64: run<Fixed<-1, 0, 64, 0>, T, I>(l); return;
    default: run<Fixed<-1, 0, 0, 0>, T, I>(l); return;
  }
}

}  // namespace

codegen::EntryFn jit_entry(ScalarKind dtype, IndexKind index, const Shape& s, int64_t nnz) {
  if (!codegen::CpuAttentionSpec::supports(s.heads, s.qk_width, s.v_width) ||
      !codegen::worth_jit(OpKind::Attention, nnz * s.heads * (s.qk_width + s.v_width)))
    return nullptr;
  codegen::CpuAttentionSpec spec;
  spec.dtype = dtype;
  spec.index = index;
  spec.mode = s.mode;
  spec.heads = s.heads;
  spec.qk_width = s.qk_width;
  spec.v_width = s.v_width;
  return codegen::CpuJit::instance().lookup(spec);
}

void launch(ScalarKind dtype, IndexKind index, int64_t nnz,
            std::initializer_list<AttentionLaunch*> ls) {
  const Shape& s = ls.begin()[0]->shape;
  if (const codegen::EntryFn fn = jit_entry(dtype, index, s, nnz)) {
    for (auto* l : ls) fn(l);
    return;
  }
  const bool i32 = index == IndexKind::I32;
  for (auto* l : ls) {
    if (dtype == ScalarKind::F64) {
      if (i32) run_generic<double, int32_t>(*l);
      else run_generic<double, int64_t>(*l);
    } else {
      if (i32) run_generic<float, int32_t>(*l);
      else run_generic<float, int64_t>(*l);
    }
  }
}

}  // namespace sparsejit::attention
