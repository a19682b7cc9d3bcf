// The filter-sparse convolution's CUDA specs (kernels/cuda/filter_conv.cuh): validation,
// names, the configuration the generator emits, the variants NVRTC compiles in CI.
#include <sstream>

#include "codegen/cuda_spec.h"

namespace sparsejit::codegen {

namespace filter_conv_spec {

std::string validate(const CudaKernelSpec& s) {
  std::ostringstream e;
  if (s.dtype != CudaScalar::F32) e << "the filter-sparse kernel computes in float32. ";
  if (s.conv_r < 1 || s.conv_s < 1 || s.conv_r > 64 || s.conv_s > 64)
    e << "kernel size must be in [1, 64]. ";
  if (s.conv_sh < 1 || s.conv_sw < 1 || s.conv_dh < 1 || s.conv_dw < 1)
    e << "stride and dilation must be >= 1. ";
  if (s.conv_ph < 0 || s.conv_pw < 0) e << "padding must be >= 0. ";
  return e.str();
}

std::string name(const CudaKernelSpec& s) {
  std::ostringstream os;
  os << "filter_conv_f32_k" << s.conv_r << "x" << s.conv_s << "_s" << s.conv_sh << "x"
     << s.conv_sw << "_p" << s.conv_ph << "x" << s.conv_pw << "_d" << s.conv_dh << "x"
     << s.conv_dw;
  return os.str();
}

std::string config(const CudaKernelSpec& s, std::vector<std::string>* bodies) {
  std::ostringstream os;
  os << "  static constexpr int R = " << s.conv_r << ";\n"
     << "  static constexpr int S = " << s.conv_s << ";\n"
     << "  static constexpr int SH = " << s.conv_sh << ";\n"
     << "  static constexpr int SW = " << s.conv_sw << ";\n"
     << "  static constexpr int PH = " << s.conv_ph << ";\n"
     << "  static constexpr int PW = " << s.conv_pw << ";\n"
     << "  static constexpr int DH = " << s.conv_dh << ";\n"
     << "  static constexpr int DW = " << s.conv_dw << ";\n";
  *bodies = {"filter_conv_kernel"};
  return os.str();
}

void add_variants(std::vector<CudaKernelSpec>* out) {
  // ResNet's layers (1x1, 3x3, 3x3 stride 2, the 7x7 stem), a dilated and an asymmetric one.
  const int32_t g[][8] = {{1, 1, 1, 1, 0, 0, 1, 1}, {3, 3, 1, 1, 1, 1, 1, 1},
                          {3, 3, 2, 2, 1, 1, 1, 1}, {1, 1, 2, 2, 0, 0, 1, 1},
                          {7, 7, 2, 2, 3, 3, 1, 1}, {3, 3, 1, 1, 2, 2, 2, 2},
                          {1, 5, 1, 2, 0, 2, 1, 1}};
  for (const auto& v : g) {
    CudaKernelSpec s = plan_cuda_filter_conv(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
    if (s.validate().empty()) out->push_back(s);
  }
}

}  // namespace filter_conv_spec

CudaKernelSpec plan_cuda_filter_conv(int32_t r, int32_t s, int32_t sh, int32_t sw, int32_t ph,
                                     int32_t pw, int32_t dh, int32_t dw) {
  CudaKernelSpec k;
  k.op = CudaOp::FilterConv;
  k.dtype = CudaScalar::F32;
  k.index = IndexKind::I64;
  k.conv_r = r, k.conv_s = s, k.conv_sh = sh, k.conv_sw = sw;
  k.conv_ph = ph, k.conv_pw = pw, k.conv_dh = dh, k.conv_dw = dw;
  k.block = 128;
  return k;
}

}  // namespace sparsejit::codegen
