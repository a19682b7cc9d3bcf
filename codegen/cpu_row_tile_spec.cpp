#include "codegen/cpu_row_tile_spec.h"

#include <sstream>
#include <stdexcept>

namespace sparsejit::codegen {

uint64_t CpuRowTileSpec::packed_key() const {
  return pack(OpKind::Rgms,
              static_cast<uint64_t>(dtype) | static_cast<uint64_t>(width & 0xfffff) << 2 |
                  static_cast<uint64_t>(width2 & 0xfff) << 22);
}

std::string CpuRowTileSpec::name() const {
  std::ostringstream os;
  os << "row_tile_" << scalar_name(dtype) << "_w" << width;
  if (width2 > 0) os << "_o" << width2;
  return os.str();
}

std::string CpuRowTileSpec::source() const {
  if (dtype != ScalarKind::F32 && dtype != ScalarKind::F64)
    throw std::invalid_argument("sparsejit: rgms tile kernels are float32 / float64 only");
  if (width < 1 || width > kMaxWidth)
    throw std::invalid_argument("sparsejit: rgms tile width " + std::to_string(width) +
                                " out of range");
  if (width2 < 0 || width2 > kMaxWidth2)
    throw std::invalid_argument("sparsejit: rgms tile width2 " + std::to_string(width2) +
                                " out of range");
  std::ostringstream os;
  os << "// sparsejit generated kernel: " << name() << "\n"
     << "// RGMS tile loops (gather-reduce, scatter, fused row products), " << scalar_name(dtype)
     << ", row width " << width << ", other width " << width2 << ".\n"
     << "#include \"kernels/cpu/row_tile_kernel.h\"\n\n"
     << "extern \"C\" void sparsejit_entry(const void* launch) {\n"
     << "  sparsejit::cpu::row_tile_detail::run<" << cpp_scalar_type(dtype) << ", " << width
     << ", " << width2 << ">(*static_cast<const sparsejit::cpu::RowTileLaunch*>(launch));\n"
     << "}\n";
  return os.str();
}

}  // namespace sparsejit::codegen
