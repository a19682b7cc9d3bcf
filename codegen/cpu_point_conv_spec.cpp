#include "codegen/cpu_point_conv_spec.h"

#include <sstream>
#include <stdexcept>

namespace sparsejit::codegen {

uint64_t CpuPointConvSpec::packed_key() const {
  return pack(OpKind::PointConv,
              static_cast<uint64_t>(dtype) | static_cast<uint64_t>(c_in & 0xfffff) << 2 |
                  static_cast<uint64_t>(c_out & 0xfffff) << 22 |
                  static_cast<uint64_t>(rows & 0xff) << 42);
}

std::string CpuPointConvSpec::name() const {
  std::ostringstream os;
  os << "point_conv_" << scalar_name(dtype) << "_i" << c_in << "_o" << c_out;
  if (rows != 1) os << "_r" << rows;
  return os.str();
}

std::string CpuPointConvSpec::source() const {
  if (dtype != ScalarKind::F32 && dtype != ScalarKind::F64 && dtype != ScalarKind::BF16)
    throw std::invalid_argument(
        "sparsejit: conv output-stationary kernels are float32 / float64 / bfloat16 only");
  const int64_t lanes = dtype == ScalarKind::F64 ? 4 : 8;
  if (c_in < 1 || c_in > kMaxChannels)
    throw std::invalid_argument("sparsejit: conv kernel c_in " + std::to_string(c_in) +
                                " out of range");
  if (c_out < lanes || c_out > kMaxChannels || c_out % lanes != 0)
    throw std::invalid_argument("sparsejit: conv kernel c_out " + std::to_string(c_out) +
                                " must be a multiple of " + std::to_string(lanes) + " up to " +
                                std::to_string(kMaxChannels));
  if (rows != 1 && rows != 4)
    throw std::invalid_argument("sparsejit: conv kernel rows " + std::to_string(rows) +
                                " must be 1 or 4");
  std::ostringstream os;
  os << "// sparsejit generated kernel: " << name() << "\n"
     << "// Output-stationary convolution rows, " << scalar_name(dtype) << ", " << c_in
     << " -> " << c_out << " channels.\n"
     << "#include \"kernels/cpu/point_conv_kernel.h\"\n\n"
     << "extern \"C\" void sparsejit_entry(const void* launch) {\n"
     << "  sparsejit::cpu::point_conv_detail::rows<"
     << (dtype == ScalarKind::BF16 ? "float" : cpp_scalar_type(dtype)) << ", " << c_in << ", "
     << c_out << ", " << (dtype == ScalarKind::BF16 ? "uint16_t" : cpp_scalar_type(dtype))
     << ", " << rows << ">(*static_cast<const sparsejit::cpu::ConvOsLaunch*>(launch));\n"
     << "}\n";
  return os.str();
}

}  // namespace sparsejit::codegen
