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

// Op families and kernel kinds, numbered once for every layer: the op word of every plan
// header (csrc/plan/plan_header.h; 1..5 are the families whose plans are tensors, values fixed
// since stored plans carry them), the key of every CPU JIT and NVRTC spec, the names Python
// sees (`_core.enums()["op"]`). A new family adds its value here and its name in
// enum_names.h, nowhere else.
enum class OpKind : int {
  Spmm = 1,                 // SpMM (csrc/spmm, kernels/cpu/spmm_kernel.h, kernels/cuda/spmm.cuh)
  Sddmm = 2,                // SDDMM, part of the spmm family (its own plans and specs)
  Rgms = 3,                 // RGMS tile loops (csrc/rgms, kernels/cpu/row_tile_kernel.h)
  PointConv = 4,            // point-cloud convolution (csrc/point_conv, point_conv_kernel.h)
  FilterConv = 5,           // filter-sparse convolution (csrc/filter_conv, filter_conv_tiles.h)
  Attention = 6,            // fused sparse attention (csrc/attention, attention_kernel.h)
  EdgeSoftmax = 7,          // edge softmax, part of the spmm family (CUDA kernels)
  EdgeSoftmaxBackward = 8,
  AttentionBackward = 9,   // fused sparse attention backward (CUDA kernels)
  PointConvMap = 10,       // point-cloud kernel-map search (CUDA kernels)
  // 11 is retired (an RGMS backward kind that never had a kernel): never reuse a number,
  // kernel caches and plans store them.
  PointConvImplicit = 12,  // point-cloud output-stationary implicit GEMM (CUDA kernels)
};

}  // namespace sparsejit
