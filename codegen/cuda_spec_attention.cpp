// The fused attention's CUDA spec (codegen/cuda_attention.h): validation, names, the
// configuration the generator emits, the variants NVRTC compiles in CI, the planner and the
// launch plan.
#include <algorithm>
#include <sstream>

#include "codegen/cuda_attention.h"

namespace sparsejit::codegen {

namespace {

const char* mode_name(int32_t m) {
  return m == 0 ? "dot" : m == 1 ? "add" : m == 2 ? "gatv2" : "bad";
}

}  // namespace

std::string CudaAttentionSpec::validate_family() const {
  std::ostringstream e;
  if (heads < 1) e << "heads must be >= 1; got " << heads << ". ";
  if (dtype != CudaScalar::F32 && dtype != CudaScalar::F64)
    e << "attention kernels compute in float32 or float64 (float16 / bfloat16 are converted). ";
  if (mode < 0 || mode > 2) e << "mode must be 0, 1 or 2. ";
  if (d < 1 || dv < 1) e << "head widths must be >= 1. ";
  if (mode == 1 && d != 1) e << "additive mode has D = 1. ";
  if (group < 1 || group > 32 || (group & (group - 1)) != 0)
    e << "group must be 1, 2, 4, 8, 16 or 32; got " << group << ". ";
  // Registers: a lane keeps ceil(D / G) of q (and att), ceil(Dv / G) of the accumulator.
  else if ((d + group - 1) / group > 32 || (dv + group - 1) / group > 32)
    e << "head widths above 32 * group per lane. ";
  return e.str();
}

std::string CudaAttentionSpec::stem() const {
  std::ostringstream os;
  os << (backward ? "attention_bwd_" : "attention_fwd_") << cuda_scalar_name(dtype) << "_"
     << index_name(index) << "_" << mode_name(mode) << "_h" << heads << "_d" << d << "_dv" << dv
     << "_g" << group;
  if (has_bias) os << "_bias";
  return os.str();
}

std::vector<std::string> CudaAttentionSpec::entry_points() const {
  const std::string n = name();
  if (!backward) return {n};
  return {n + "_rows", n + "_cols"};
}

std::string CudaAttentionSpec::config(std::vector<std::string>* bodies) const {
  std::ostringstream os;
  os << "  static constexpr int D = " << d << ";\n"
     << "  static constexpr int DV = " << dv << ";\n"
     << "  static constexpr int MODE = " << mode << ";  // " << mode_name(mode) << "\n"
     << "  static constexpr bool BIAS = " << (has_bias ? "true" : "false") << ";\n"
     << "  static constexpr int G = " << group << ";\n";
  if (!backward) {
    *bodies = {"attention_forward"};
  } else {
    *bodies = {"attention_rows", "attention_cols"};
  }
  return os.str();
}

void append_attention_variants(std::vector<CudaSpecPtr>* out) {
  // (mode, H, D, Dv): the three score forms, one head and many, widths below, at and above a
  // warp, odd ones, and GAT's D = 1 with wide values.
  const int64_t shapes[][4] = {{0, 1, 64, 64}, {0, 4, 32, 32}, {0, 2, 7, 5},   {0, 8, 128, 64},
                               {1, 1, 1, 16},  {1, 8, 1, 8},   {1, 3, 1, 33},  {2, 1, 64, 64},
                               {2, 4, 16, 16}, {2, 2, 9, 3},   {0, 1, 1, 1}};
  int turn = 0;
  for (const auto& sh : shapes) {
    for (bool backward : {false, true}) {
      for (CudaScalar dt : {CudaScalar::F32, CudaScalar::F64}) {
        const IndexKind ix = (turn % 2) ? IndexKind::I64 : IndexKind::I32;
        const bool bias = (turn % 3) == 0;
        ++turn;
        const CudaAttentionSpec s = plan_cuda_attention(
            dt, ix, sh[1], sh[2], sh[3], static_cast<int32_t>(sh[0]), bias, backward);
        if (s.validate().empty()) out->push_back(share_spec(s));
      }
    }
  }
}

CudaAttentionSpec plan_cuda_attention(CudaScalar dtype, IndexKind index, int64_t heads, int64_t d,
                                      int64_t dv, int32_t mode, bool bias, bool backward) {
  CudaAttentionSpec s;
  s.backward = backward;
  s.dtype = dtype;
  s.index = index;
  s.heads = heads;
  s.d = d;
  s.dv = dv;
  s.mode = mode;
  s.has_bias = bias;
  // About two elements of the wider head per lane, at most a warp.
  s.group = static_cast<int32_t>(
      std::min<int64_t>(32, cuda_spec_detail::pow2_ceil((std::max(d, dv) + 1) / 2)));
  return s;
}

std::vector<CudaLaunch> plan_attention_launch(const CudaAttentionSpec& spec, int64_t rows,
                                              int64_t cols) {
  const std::vector<std::string> entries = spec.entry_points();
  std::vector<CudaLaunch> out;
  for (size_t k = 0; k < entries.size(); ++k) {
    CudaLaunch a;
    a.entry = entries[k];
    a.block.x = static_cast<unsigned>(spec.block);
    // A group per (row, head); the backward's second pass per (column, head).
    const int64_t threads = (k == 0 ? rows : cols) * spec.heads * spec.group;
    a.grid.x = static_cast<unsigned>(
        std::max<int64_t>(0, cuda_spec_detail::ceil_div(threads, spec.block)));
    out.push_back(a);
  }
  return out;
}

}  // namespace sparsejit::codegen
