// sparsejit's enums, numbered once: scalar kind, index kind, reduce, activation, op kind.
//
// Compiled by the host compiler (core, kernels, JIT-generated sources) and by NVRTC (pasted
// into every generated CUDA source), so: plain `int` underlying types, no header at all. The
// names and parsers (host only) are in enum_names.h, exported to Python as `_core.enums()`.
// A new op family or dtype adds its value here and its name there, nowhere else.
#pragma once

namespace sparsejit {

// Element type of values and dense operands. float16 and bfloat16 accumulate in float32.
enum class ScalarKind : int { F32 = 0, F64 = 1, BF16 = 2, F16 = 3 };

// Element type of the structure's index arrays.
enum class IndexKind : int { I32 = 0, I64 = 1 };

enum class Reduce : int { Sum = 0, Mean = 1, Max = 2, Min = 3 };

// Activation fused into the output write. Runtime: the generic CPU kernel reads it from its
// arguments (never a value a user names, never compiled into a JIT or CUDA kernel).
enum class Act : int { None = 0, Relu = 1, LeakyRelu = 2, Elu = 3, Gelu = 4, Runtime = 99 };

// Kernel families, on every backend (CUDA kernels of edge softmax included).
enum class OpKind : int {
  Spmm = 0,
  Sddmm = 1,
  EdgeSoftmax = 2,
  EdgeSoftmaxBackward = 3,
  RgmsTile = 4,
  FilterConv = 5,  // CPU JIT only (codegen/cpu_filter_conv_spec.h)
  SparseAttention = 6,  // the fused attention (codegen/cpu_attention_spec.h)
  PointConvRows = 7,  // the convolution's output-stationary rows (codegen/cpu_point_conv_spec.h)
};

}  // namespace sparsejit
