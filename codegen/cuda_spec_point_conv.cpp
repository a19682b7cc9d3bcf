// Point-cloud convolution CUDA specs, variants and launch planning (codegen/cuda_point_conv.h).
#include <algorithm>
#include <sstream>

#include "codegen/cuda_point_conv.h"

namespace sparsejit::codegen {

namespace {

unsigned blocks_for(int64_t threads, int block) {
  return static_cast<unsigned>(std::max<int64_t>(0, (threads + block - 1) / block));
}

const char* relu_suffix(Act a) {
  return a == Act::Relu ? "_relu" : "";
}

void check_act(std::ostringstream& e, Act a) {
  if (a != Act::None && a != Act::Relu) e << "the point-conv kernels fuse no activation but ReLU. ";
}

}  // namespace

// ---- Gather and row reduce ----------------------------------------------------------------------
std::string CudaPointConvSpec::validate_family() const {
  std::ostringstream e;
  if (channels < 1 || channels > (int64_t(1) << 24))
    e << "channels must be in [1, 2^24]; got " << channels << ". ";
  if (!cuda_spec_detail::is_pow2(vec) || vec * cuda_scalar_bytes(dtype) > 16)
    e << "vec must be a power of two with vec * sizeof(T) <= 16; got " << vec << ". ";
  else if (channels >= 1 && channels % vec != 0)
    e << "vec (" << vec << ") must divide the channels (" << channels << "). ";
  check_act(e, act);
  return e.str();
}

std::string CudaPointConvSpec::stem() const {
  std::ostringstream os;
  os << "pconv_" << cuda_scalar_name(dtype) << "_" << index_name(index) << "_c" << channels
     << "_vec" << vec << relu_suffix(act);
  return os.str();
}

std::vector<std::string> CudaPointConvSpec::entry_points() const {
  const std::string n = name();
  return {n + "_gather", n + "_rows"};
}

std::string CudaPointConvSpec::config(std::vector<std::string>* bodies) const {
  std::ostringstream os;
  os << "  static constexpr int CH = " << channels << ";\n"
     << "  static constexpr int VEC = " << vec << ";\n"
     << "  static constexpr int ACT = " << (act == Act::Relu ? 1 : 0) << ";\n";
  *bodies = {"pconv_gather", "pconv_rows"};
  return os.str();
}

CudaPointConvSpec plan_cuda_point_conv(CudaScalar dtype, IndexKind index, int64_t channels,
                                       bool relu, int32_t max_vec_bytes) {
  CudaPointConvSpec s;
  s.dtype = dtype;
  s.index = index;
  s.channels = channels;
  s.vec = choose_vec(dtype, channels, max_vec_bytes);
  s.act = relu ? Act::Relu : Act::None;
  return s;
}

CudaLaunch plan_point_conv_gather_launch(const CudaPointConvSpec& s, int64_t n) {
  CudaLaunch a;
  a.entry = s.entry_points()[0];
  a.block.x = static_cast<unsigned>(s.block);
  a.grid.x = blocks_for(n * (s.channels / s.vec), s.block);
  return a;
}

CudaLaunch plan_point_conv_rows_launch(const CudaPointConvSpec& s, int64_t rows) {
  CudaLaunch a;
  a.entry = s.entry_points()[1];
  a.block.x = static_cast<unsigned>(s.block);
  a.grid.x = blocks_for(rows * (s.channels / s.vec), s.block);
  return a;
}

// ---- Kernel-map search --------------------------------------------------------------------------
std::string CudaPointMapSpec::stem() const {
  return std::string("pconv_map_") + index_name(index);
}

std::string CudaPointMapSpec::config(std::vector<std::string>* bodies) const {
  *bodies = {"pconv_map_search"};
  return "";
}

CudaPointMapSpec plan_cuda_point_map(IndexKind index) {
  CudaPointMapSpec s;
  s.index = index;
  return s;
}

CudaLaunch plan_point_map_launch(const CudaPointMapSpec& s, int64_t k, int64_t n_query) {
  CudaLaunch a;
  a.entry = s.entry_points()[0];
  a.block.x = static_cast<unsigned>(s.block);
  a.grid.x = blocks_for(k * n_query, s.block);
  return a;
}

// ---- Implicit GEMM ------------------------------------------------------------------------------
std::string CudaPointConvImplicitSpec::validate_family() const {
  std::ostringstream e;
  if (c_in < 1 || c_in > (int64_t(1) << 16))
    e << "C_in must be in [1, 65536]; got " << c_in << ". ";
  if (c_out < 1 || c_out > (int64_t(1) << 16))
    e << "C_out must be in [1, 65536]; got " << c_out << ". ";
  if (cols_per_thread != 1 && cols_per_thread != 2 && cols_per_thread != 4)
    e << "cols_per_thread must be 1, 2 or 4; got " << cols_per_thread << ". ";
  if (index != IndexKind::I32) e << "the implicit GEMM reads int32 plans. ";
  if (block % 16 != 0 || block > 512)
    e << "the implicit GEMM needs a block of at most 512 threads, a multiple of 16. ";
  check_act(e, act);
  return e.str();
}

std::string CudaPointConvImplicitSpec::stem() const {
  std::ostringstream os;
  os << "pconv_implicit_" << cuda_scalar_name(dtype) << "_ci" << c_in << "_co" << c_out << "_tn"
     << cols_per_thread;
  if (trans_w) os << "_wt";
  os << relu_suffix(act);
  return os.str();
}

std::vector<std::string> CudaPointConvImplicitSpec::entry_points() const {
  const std::string n = name();
  return {n + "_nbr", n + "_gemm"};
}

std::string CudaPointConvImplicitSpec::config(std::vector<std::string>* bodies) const {
  std::ostringstream os;
  os << "  static constexpr int CI = " << c_in << ";\n"
     << "  static constexpr int CO = " << c_out << ";\n"
     << "  static constexpr int TN = " << cols_per_thread << ";\n"
     << "  static constexpr bool TRANS_W = " << (trans_w ? "true" : "false") << ";\n"
     << "  static constexpr int ACT = " << (act == Act::Relu ? 1 : 0) << ";\n";
  *bodies = {"pconv_nbr", "pconv_implicit"};
  return os.str();
}

CudaPointConvImplicitSpec plan_cuda_point_conv_implicit(CudaScalar dtype, int64_t c_in,
                                                        int64_t c_out, bool trans_w, bool relu) {
  CudaPointConvImplicitSpec s;
  s.dtype = dtype;
  s.index = IndexKind::I32;
  s.c_in = c_in;
  s.c_out = c_out;
  s.trans_w = trans_w;
  s.cols_per_thread = c_out <= 16 ? 1 : c_out <= 32 ? 2 : 4;
  s.act = relu ? Act::Relu : Act::None;
  return s;
}

int64_t point_conv_implicit_rows_per_block(const CudaPointConvImplicitSpec& s) {
  return s.block / 4;
}

CudaLaunch plan_point_conv_nbr_launch(const CudaPointConvImplicitSpec& s, int64_t n_pairs) {
  CudaLaunch a;
  a.entry = s.entry_points()[0];
  a.block.x = static_cast<unsigned>(s.block);
  a.grid.x = blocks_for(n_pairs, s.block);
  return a;
}

CudaLaunch plan_point_conv_implicit_launch(const CudaPointConvImplicitSpec& s, int64_t n) {
  CudaLaunch a;
  a.entry = s.entry_points()[1];
  a.block.x = static_cast<unsigned>(s.block);
  a.grid.x = blocks_for(n, static_cast<int>(point_conv_implicit_rows_per_block(s)));
  a.grid.y = static_cast<unsigned>((s.c_out + 16 * s.cols_per_thread - 1) /
                                   (16 * s.cols_per_thread));
  return a;
}

// ---- Variants -----------------------------------------------------------------------------------
void append_point_conv_variants(std::vector<CudaSpecPtr>* out) {
  const CudaScalar dtypes[] = {CudaScalar::F32, CudaScalar::F16, CudaScalar::BF16,
                               CudaScalar::F64};
  const int64_t widths[] = {1, 3, 16, 32, 64, 96, 128, 256};
  int turn = 0;
  for (CudaScalar dt : dtypes)
    for (IndexKind ix : {IndexKind::I32, IndexKind::I64})
      for (int64_t c : widths) {
        CudaPointConvSpec s;
        s.dtype = dt;
        s.index = ix;
        s.channels = c;
        s.vec = choose_vec(dt, c, 16);
        s.act = (turn++ % 3 == 1) ? Act::Relu : Act::None;
        if (s.validate().empty()) out->push_back(share_spec(s));
      }
  for (IndexKind ix : {IndexKind::I32, IndexKind::I64})
    out->push_back(share_spec(plan_cuda_point_map(ix)));
  // The implicit GEMM: every dtype, the widths the networks use (and odd ones), both weight
  // orientations, with and without ReLU.
  const int64_t pairs[][2] = {{16, 16}, {32, 32}, {64, 64}, {128, 128}, {256, 256}, {3, 16},
                              {4, 32}, {32, 64}, {64, 32}, {96, 96}, {64, 128}, {1, 1}};
  for (CudaScalar dt : dtypes)
    for (const auto& c : pairs)
      for (bool wt : {false, true}) {
        const bool relu = !wt && (turn++ % 2 == 0);
        const CudaPointConvImplicitSpec s = plan_cuda_point_conv_implicit(dt, c[0], c[1], wt, relu);
        if (s.validate().empty()) out->push_back(share_spec(s));
      }
}

}  // namespace sparsejit::codegen
