// The filter conv CUDA spec, its variants, planner and launch plan (codegen/cuda_filter_conv.h).
#include <algorithm>
#include <sstream>

#include "codegen/cuda_filter_conv.h"

namespace sparsejit::codegen {

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

std::string CudaFilterConvSpec::validate_family() const {
  std::ostringstream e;
  const auto& c = conv;
  if (c.r < 1 || c.s < 1 || c.r > 64 || c.s > 64)
    e << "kernel size must be in [1, 64]; got " << c.r << "x" << c.s << ". ";
  if (c.stride_h < 1 || c.stride_w < 1 || c.stride_h > 64 || c.stride_w > 64)
    e << "stride must be in [1, 64]; got " << c.stride_h << "x" << c.stride_w << ". ";
  if (c.dil_h < 1 || c.dil_w < 1 || c.dil_h > 64 || c.dil_w > 64)
    e << "dilation must be in [1, 64]; got " << c.dil_h << "x" << c.dil_w << ". ";
  if (c.pad_h < 0 || c.pad_w < 0 || c.pad_h > 4096 || c.pad_w > 4096)
    e << "padding must be in [0, 4096]; got " << c.pad_h << "x" << c.pad_w << ". ";
  if (c.channels_per_block < 1 || c.channels_per_block > 64)
    e << "channels_per_block must be in [1, 64]; got " << c.channels_per_block << ". ";
  if (act != Act::None && act != Act::Relu)
    e << "filter conv fuses ReLU or no activation. ";
  if (index != IndexKind::I64) e << "filter conv plans hold int64 taps. ";
  return e.str();
}

std::string CudaFilterConvSpec::stem() const {
  const auto& c = conv;
  std::ostringstream os;
  os << "filter_conv_" << cuda_scalar_name(dtype) << "_k" << c.r << "x" << c.s << "_s"
     << c.stride_h << "x" << c.stride_w << "_p" << c.pad_h << "x" << c.pad_w << "_d" << c.dil_h
     << "x" << c.dil_w << (act == Act::Relu ? "_relu" : "") << "_oc" << c.channels_per_block;
  return os.str();
}

std::string CudaFilterConvSpec::config(std::vector<std::string>* bodies) const {
  const auto& c = conv;
  std::ostringstream os;
  os << "  static constexpr int R = " << c.r << ", S = " << c.s << ";\n"
     << "  static constexpr int SH = " << c.stride_h << ", SW = " << c.stride_w << ";\n"
     << "  static constexpr int PH = " << c.pad_h << ", PW = " << c.pad_w << ";\n"
     << "  static constexpr int DH = " << c.dil_h << ", DW = " << c.dil_w << ";\n"
     << "  static constexpr int ACT = " << (act == Act::Relu ? 1 : 0) << ";\n"
     << "  static constexpr int OCB = " << c.channels_per_block << ";\n";
  *bodies = {"filter_conv_kernel"};
  return os.str();
}

void append_filter_conv_variants(std::vector<CudaSpecPtr>* all) {
  // (r, s, stride, pad, dilation): the layers of ResNet / MobileNet-style networks and the
  // odd ones (rectangular, dilated, padding larger than the kernel reach).
  const int shapes[][5] = {{1, 1, 1, 0, 1}, {3, 3, 1, 1, 1}, {3, 3, 2, 1, 1}, {7, 7, 2, 3, 1},
                           {1, 1, 2, 0, 1}, {3, 3, 1, 2, 2}, {5, 5, 1, 2, 1}, {1, 3, 1, 0, 1},
                           {3, 3, 1, 0, 1}, {1, 1, 1, 1, 1}};
  const CudaScalar dtypes[] = {CudaScalar::F32, CudaScalar::F16, CudaScalar::BF16,
                               CudaScalar::F64};
  const int tiles[][2] = {{64, 1}, {128, 2}, {256, 4}, {256, 8}};  // (block, channels)
  std::vector<CudaFilterConvSpec> out;
  int turn = 0;
  for (const auto& sh : shapes) {
    for (CudaScalar dt : dtypes) {
      CudaFilterConvSpec s;
      s.dtype = dt;
      s.conv.r = sh[0];
      s.conv.s = sh[1];
      s.conv.stride_h = s.conv.stride_w = sh[2];
      s.conv.pad_h = s.conv.pad_w = sh[3];
      s.conv.dil_h = s.conv.dil_w = sh[4];
      s.act = turn % 2 ? Act::Relu : Act::None;
      s.block = tiles[turn % 4][0];
      s.conv.channels_per_block = tiles[turn % 4][1];
      if (s.validate().empty()) out.push_back(s);
      ++turn;
    }
  }
  // Rectangular kernels with different strides, padding and dilation per axis.
  for (CudaScalar dt : dtypes) {
    CudaFilterConvSpec s = out[static_cast<size_t>(dt == CudaScalar::F32 ? 1 : 2)];
    s.dtype = dt;
    s.conv.r = 3;
    s.conv.s = 1;
    s.conv.stride_h = 1;
    s.conv.stride_w = 2;
    s.conv.pad_h = 2;
    s.conv.pad_w = 0;
    s.conv.dil_h = 2;
    s.conv.dil_w = 1;
    if (s.validate().empty()) out.push_back(s);
  }
  for (const CudaFilterConvSpec& s : out) all->push_back(share_spec(s));
}

CudaFilterConvSpec plan_cuda_filter_conv(const CudaFilterConvProblem& prob) {
  CudaFilterConvSpec s;
  s.dtype = prob.dtype;
  s.act = prob.relu ? Act::Relu : Act::None;
  s.conv.r = prob.r;
  s.conv.s = prob.s;
  s.conv.stride_h = prob.stride_h;
  s.conv.stride_w = prob.stride_w;
  s.conv.pad_h = prob.pad_h;
  s.conv.pad_w = prob.pad_w;
  s.conv.dil_h = prob.dil_h;
  s.conv.dil_w = prob.dil_w;
  s.block = prob.pixels >= 4096 ? 256 : prob.pixels >= 512 ? 128 : 64;
  const int64_t pixel_blocks = std::max<int64_t>(1, ceil_div(prob.pixels, s.block));
  // About 512 blocks in all: channels per block = pixel blocks * C_out / 512, in [1, 8].
  const int64_t want = pixel_blocks * std::max<int64_t>(1, prob.c_out) / 512;
  s.conv.channels_per_block = static_cast<int32_t>(std::clamp<int64_t>(want, 1, 8));
  return s;
}

std::vector<CudaLaunch> plan_filter_conv_launch(const CudaFilterConvSpec& spec, int64_t pixels,
                                                int64_t c_out) {
  if (pixels <= 0 || c_out <= 0) return {};
  CudaLaunch a;
  a.entry = spec.entry_points()[0];
  a.block.x = static_cast<unsigned>(spec.block);
  a.grid.x = static_cast<unsigned>(ceil_div(pixels, spec.block));
  a.grid.y = static_cast<unsigned>(ceil_div(c_out, spec.conv.channels_per_block));
  return {a};
}

}  // namespace sparsejit::codegen
