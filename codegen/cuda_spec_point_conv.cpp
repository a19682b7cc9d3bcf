// Point-cloud convolution CUDA specs, variants and launch planning (codegen/cuda_point_conv.h).
#include <algorithm>
#include <sstream>

#include "codegen/cuda_point_conv.h"

namespace sparsejit::codegen {

namespace {

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

unsigned blocks_for(int64_t threads, int block) {
  return static_cast<unsigned>(std::max<int64_t>(0, (threads + block - 1) / block));
}

}  // namespace

std::string point_conv_validate(const CudaKernelSpec& s) {
  std::ostringstream e;
  if (s.op == CudaOp::PointConvMap) return "";  // only the index type and block matter
  if (s.op == CudaOp::PointConvImplicit) {
    if (s.features < 1 || s.features > (int64_t(1) << 16))
      e << "C_in (features) must be in [1, 65536]; got " << s.features << ". ";
    if (s.v_features < 1 || s.v_features > (int64_t(1) << 16))
      e << "C_out (v_features) must be in [1, 65536]; got " << s.v_features << ". ";
    if (s.cols_per_thread != 1 && s.cols_per_thread != 2 && s.cols_per_thread != 4)
      e << "cols_per_thread must be 1, 2 or 4; got " << s.cols_per_thread << ". ";
    if (s.index != IndexKind::I32) e << "the implicit GEMM reads int32 plans. ";
    if (s.block % 16 != 0 || s.block > 512)
      e << "the implicit GEMM needs a block of at most 512 threads, a multiple of 16. ";
    if (s.act != Act::None && s.act != Act::Relu)
      e << "the point-conv kernels fuse no activation but ReLU. ";
    return e.str();
  }
  if (s.features < 1 || s.features > (int64_t(1) << 24))
    e << "channels (features) must be in [1, 2^24]; got " << s.features << ". ";
  if (!is_pow2(s.vec) || s.vec * cuda_scalar_bytes(s.dtype) > 16)
    e << "vec must be a power of two with vec * sizeof(T) <= 16; got " << s.vec << ". ";
  else if (s.features >= 1 && s.features % s.vec != 0)
    e << "vec (" << s.vec << ") must divide the channels (" << s.features << "). ";
  if (s.act != Act::None && s.act != Act::Relu)
    e << "the point-conv kernels fuse no activation but ReLU. ";
  return e.str();
}

std::string point_conv_name(const CudaKernelSpec& s) {
  std::ostringstream os;
  if (s.op == CudaOp::PointConvMap) return std::string("pconv_map_") + index_name(s.index);
  if (s.op == CudaOp::PointConvImplicit) {
    os << "pconv_implicit_" << cuda_scalar_name(s.dtype) << "_ci" << s.features << "_co"
       << s.v_features << "_tn" << s.cols_per_thread;
    if (s.trans_w) os << "_wt";
    if (s.act == Act::Relu) os << "_relu";
    return os.str();
  }
  os << "pconv_" << cuda_scalar_name(s.dtype) << "_" << index_name(s.index) << "_c" << s.features
     << "_vec" << s.vec;
  if (s.act == Act::Relu) os << "_relu";
  return os.str();
}

std::vector<std::string> point_conv_entry_points(const CudaKernelSpec& s) {
  const std::string n = s.name();
  if (s.op == CudaOp::PointConvMap) return {n};
  if (s.op == CudaOp::PointConvImplicit) return {n + "_nbr", n + "_gemm"};
  return {n + "_gather", n + "_rows"};
}

std::string point_conv_config(const CudaKernelSpec& s) {
  std::ostringstream os;
  if (s.op == CudaOp::PointConvMap) return "";
  if (s.op == CudaOp::PointConvImplicit) {
    os << "  static constexpr int CI = " << s.features << ";\n"
       << "  static constexpr int CO = " << s.v_features << ";\n"
       << "  static constexpr int TN = " << s.cols_per_thread << ";\n"
       << "  static constexpr bool TRANS_W = " << (s.trans_w ? "true" : "false") << ";\n"
       << "  static constexpr int ACT = " << (s.act == Act::Relu ? 1 : 0) << ";\n";
    return os.str();
  }
  os << "  static constexpr int CH = " << s.features << ";\n"
     << "  static constexpr int VEC = " << s.vec << ";\n"
     << "  static constexpr int ACT = " << (s.act == Act::Relu ? 1 : 0) << ";\n";
  return os.str();
}

std::vector<std::string> point_conv_bodies(const CudaKernelSpec& s) {
  if (s.op == CudaOp::PointConvMap) return {"pconv_map_search"};
  if (s.op == CudaOp::PointConvImplicit) return {"pconv_nbr", "pconv_implicit"};
  return {"pconv_gather", "pconv_rows"};
}

const char* point_conv_params_type(const CudaKernelSpec& s) {
  if (s.op == CudaOp::PointConvImplicit) return "PointConvImplicitParams";
  return s.op == CudaOp::PointConvMap ? "PointMapParams" : "PointConvParams";
}

void append_point_conv_variants(std::vector<CudaKernelSpec>* out) {
  const CudaScalar dtypes[] = {CudaScalar::F32, CudaScalar::F16, CudaScalar::BF16,
                               CudaScalar::F64};
  const int64_t widths[] = {1, 3, 16, 32, 64, 96, 128, 256};
  int turn = 0;
  for (CudaScalar dt : dtypes)
    for (IndexKind ix : {IndexKind::I32, IndexKind::I64})
      for (int64_t c : widths) {
        CudaKernelSpec s;
        s.op = CudaOp::PointConv;
        s.dtype = dt;
        s.index = ix;
        s.features = c;
        s.vec = choose_vec(dt, c, 16);
        s.act = (turn++ % 3 == 1) ? Act::Relu : Act::None;
        if (s.validate().empty()) out->push_back(s);
      }
  for (IndexKind ix : {IndexKind::I32, IndexKind::I64}) out->push_back(plan_cuda_point_map(ix));
  // The implicit GEMM: every dtype, the widths the networks use (and odd ones), both weight
  // orientations, with and without ReLU.
  const int64_t pairs[][2] = {{16, 16}, {32, 32}, {64, 64}, {128, 128}, {256, 256}, {3, 16},
                              {4, 32}, {32, 64}, {64, 32}, {96, 96}, {64, 128}, {1, 1}};
  for (CudaScalar dt : dtypes)
    for (const auto& c : pairs)
      for (bool wt : {false, true}) {
        const bool relu = !wt && (turn++ % 2 == 0);
        CudaKernelSpec s = plan_cuda_point_conv_implicit(dt, c[0], c[1], wt, relu);
        if (s.validate().empty()) out->push_back(s);
      }
}

CudaKernelSpec plan_cuda_point_map(IndexKind index) {
  CudaKernelSpec s;
  s.op = CudaOp::PointConvMap;
  s.index = index;
  return s;
}

CudaLaunch plan_point_map_launch(const CudaKernelSpec& s, int64_t k, int64_t n_query) {
  CudaLaunch a;
  a.entry = s.entry_points()[0];
  a.block.x = static_cast<unsigned>(s.block);
  a.grid.x = blocks_for(k * n_query, s.block);
  return a;
}

CudaKernelSpec plan_cuda_point_conv(CudaScalar dtype, IndexKind index, int64_t channels,
                                    bool relu, int32_t max_vec_bytes) {
  CudaKernelSpec s;
  s.op = CudaOp::PointConv;
  s.dtype = dtype;
  s.index = index;
  s.features = channels;
  s.vec = choose_vec(dtype, channels, max_vec_bytes);
  s.act = relu ? Act::Relu : Act::None;
  return s;
}

CudaLaunch plan_point_conv_gather_launch(const CudaKernelSpec& s, int64_t n) {
  CudaLaunch a;
  a.entry = s.entry_points()[0];
  a.block.x = static_cast<unsigned>(s.block);
  a.grid.x = blocks_for(n * (s.features / s.vec), s.block);
  return a;
}

CudaLaunch plan_point_conv_rows_launch(const CudaKernelSpec& s, int64_t rows) {
  CudaLaunch a;
  a.entry = s.entry_points()[1];
  a.block.x = static_cast<unsigned>(s.block);
  a.grid.x = blocks_for(rows * (s.features / s.vec), s.block);
  return a;
}

}  // namespace sparsejit::codegen

namespace sparsejit::codegen {

CudaKernelSpec plan_cuda_point_conv_implicit(CudaScalar dtype, int64_t c_in, int64_t c_out,
                                             bool trans_w, bool relu) {
  CudaKernelSpec s;
  s.op = CudaOp::PointConvImplicit;
  s.dtype = dtype;
  s.index = IndexKind::I32;
  s.features = c_in;
  s.v_features = c_out;
  s.trans_w = trans_w;
  s.cols_per_thread = c_out <= 16 ? 1 : c_out <= 32 ? 2 : 4;
  s.act = relu ? Act::Relu : Act::None;
  return s;
}

int64_t point_conv_implicit_rows_per_block(const CudaKernelSpec& s) { return s.block / 4; }

CudaLaunch plan_point_conv_nbr_launch(const CudaKernelSpec& s, int64_t n_pairs) {
  CudaLaunch a;
  a.entry = s.entry_points()[0];
  a.block.x = static_cast<unsigned>(s.block);
  a.grid.x = blocks_for(n_pairs, s.block);
  return a;
}

CudaLaunch plan_point_conv_implicit_launch(const CudaKernelSpec& s, int64_t n) {
  CudaLaunch a;
  a.entry = s.entry_points()[1];
  a.block.x = static_cast<unsigned>(s.block);
  a.grid.x = blocks_for(n, static_cast<int>(point_conv_implicit_rows_per_block(s)));
  a.grid.y = static_cast<unsigned>((s.v_features + 16 * s.cols_per_thread - 1) /
                                   (16 * s.cols_per_thread));
  return a;
}

}  // namespace sparsejit::codegen
