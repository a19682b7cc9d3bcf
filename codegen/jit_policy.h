// When a pass is worth a JIT-specialized kernel: every family's threshold in one place.
//
// A specialized kernel costs one hash probe once it is in memory, about a millisecond to load
// from the disk cache, and 0.3-1 s to compile the first time; below these sizes the generic
// instantiation (the same template with run-time sizes, the same bits) is as fast and never
// waits for a compiler. Each family measures a pass's work in its own unit, so the thresholds
// differ; each was set when the family's JIT was added and is kept as measured then.
#pragma once

#include <cstdint>
#include <limits>

#include "codegen/cpu_jit.h"
#include "kernels/common/enums.h"

namespace sparsejit::codegen {

// The least work at which `op` takes its JIT kernel, in the family's unit.
constexpr int64_t min_jit_work(OpKind op) {
  switch (op) {
    case OpKind::Spmm:        // (rows + nnz) * row width (H * F)
    case OpKind::Sddmm:       // nnz * H * F
      return int64_t{1} << 17;
    case OpKind::Rgms:        // elements a pass of tile loops gathers or scatters (RGMS, and the
      return int64_t{1} << 16;  // point-cloud convolution's gathers, which reuse those loops)
    case OpKind::PointConv:   // multiply-adds of an output-stationary pass
      return int64_t{1} << 20;
    case OpKind::Attention:   // nnz * H * (D + Dv)
      return int64_t{1} << 15;
    case OpKind::FilterConv:  // a layer's plan is built once and reused for every batch
      return 0;
    default:
      return std::numeric_limits<int64_t>::max();
  }
}

// True when the JIT is on and `work` reaches `op`'s threshold.
inline bool worth_jit(OpKind op, int64_t work) {
  return CpuJit::instance().enabled() && work >= min_jit_work(op);
}

}  // namespace sparsejit::codegen
