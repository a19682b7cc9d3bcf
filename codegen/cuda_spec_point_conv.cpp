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
  os << "pconv_" << cuda_scalar_name(s.dtype) << "_" << index_name(s.index) << "_c" << s.features
     << "_vec" << s.vec;
  if (s.act == Act::Relu) os << "_relu";
  return os.str();
}

std::vector<std::string> point_conv_entry_points(const CudaKernelSpec& s) {
  const std::string n = s.name();
  if (s.op == CudaOp::PointConvMap) return {n};
  return {n + "_gather", n + "_rows"};
}

std::string point_conv_config(const CudaKernelSpec& s) {
  std::ostringstream os;
  if (s.op == CudaOp::PointConvMap) return "";
  os << "  static constexpr int CH = " << s.features << ";\n"
     << "  static constexpr int VEC = " << s.vec << ";\n"
     << "  static constexpr int ACT = " << (s.act == Act::Relu ? 1 : 0) << ";\n";
  return os.str();
}

std::vector<std::string> point_conv_bodies(const CudaKernelSpec& s) {
  if (s.op == CudaOp::PointConvMap) return {"pconv_map_search"};
  return {"pconv_gather", "pconv_rows"};
}

const char* point_conv_params_type(const CudaKernelSpec& s) {
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
