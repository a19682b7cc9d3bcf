// The fused attention's CUDA specs (kernels/cuda/attention.cuh): validation, names, the
// configuration the generator emits, the variants NVRTC compiles in CI and the planner.
#include <algorithm>
#include <sstream>

#include "codegen/cuda_spec.h"

namespace sparsejit::codegen {

namespace {

int64_t pow2_at_least(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

const char* mode_name(int32_t m) {
  return m == 0 ? "dot" : m == 1 ? "add" : m == 2 ? "gatv2" : "bad";
}

}  // namespace

namespace attention_spec {

std::string attention_validate(const CudaKernelSpec& s) {
  std::ostringstream e;
  if (s.dtype != CudaScalar::F32 && s.dtype != CudaScalar::F64)
    e << "attention kernels compute in float32 or float64 (float16 / bfloat16 are converted). ";
  if (s.att_mode < 0 || s.att_mode > 2) e << "att_mode must be 0, 1 or 2. ";
  if (s.features < 1 || s.v_features < 1) e << "head widths must be >= 1. ";
  if (s.att_mode == 1 && s.features != 1) e << "additive mode has D = 1. ";
  if (s.group < 1 || s.group > 32 || (s.group & (s.group - 1)) != 0)
    e << "group must be 1, 2, 4, 8, 16 or 32; got " << s.group << ". ";
  // Registers: a lane keeps ceil(D / G) of q (and att), ceil(Dv / G) of the accumulator.
  else if ((s.features + s.group - 1) / s.group > 32 ||
           (s.v_features + s.group - 1) / s.group > 32)
    e << "head widths above 32 * group per lane. ";
  return e.str();
}

std::string attention_name(const CudaKernelSpec& s) {
  std::ostringstream os;
  os << (s.op == CudaOp::Attention ? "attention_fwd_" : "attention_bwd_")
     << cuda_scalar_name(s.dtype) << "_" << index_name(s.index) << "_" << mode_name(s.att_mode)
     << "_h" << s.heads << "_d" << s.features << "_dv" << s.v_features << "_g" << s.group;
  if (s.has_bias) os << "_bias";
  return os.str();
}

std::vector<std::string> attention_entry_points(const CudaKernelSpec& s) {
  const std::string n = s.name();
  if (s.op == CudaOp::Attention) return {n};
  return {n + "_rows", n + "_cols"};
}

std::string attention_config(const CudaKernelSpec& s, std::vector<std::string>* bodies) {
  std::ostringstream os;
  os << "  static constexpr int D = " << s.features << ";\n"
     << "  static constexpr int DV = " << s.v_features << ";\n"
     << "  static constexpr int MODE = " << s.att_mode << ";  // " << mode_name(s.att_mode)
     << "\n"
     << "  static constexpr bool BIAS = " << (s.has_bias ? "true" : "false") << ";\n"
     << "  static constexpr int G = " << s.group << ";\n";
  if (s.op == CudaOp::Attention) {
    *bodies = {"attention_forward"};
  } else {
    *bodies = {"attention_rows", "attention_cols"};
  }
  return os.str();
}

void add_attention_variants(std::vector<CudaKernelSpec>* out) {
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
        CudaKernelSpec s = plan_cuda_attention(dt, ix, sh[1], sh[2], sh[3],
                                               static_cast<int32_t>(sh[0]), bias, backward);
        if (s.validate().empty()) out->push_back(s);
      }
    }
  }
}

}  // namespace attention_spec

CudaKernelSpec plan_cuda_attention(CudaScalar dtype, IndexKind index, int64_t heads, int64_t d,
                                   int64_t dv, int32_t mode, bool bias, bool backward) {
  CudaKernelSpec s;
  s.op = backward ? CudaOp::AttentionBackward : CudaOp::Attention;
  s.dtype = dtype;
  s.index = index;
  s.heads = heads;
  s.features = d;
  s.v_features = dv;
  s.att_mode = mode;
  s.has_bias = bias;
  // About two elements of the wider head per lane, at most a warp.
  s.group = static_cast<int32_t>(
      std::min<int64_t>(32, pow2_at_least((std::max(d, dv) + 1) / 2)));
  return s;
}

}  // namespace sparsejit::codegen
