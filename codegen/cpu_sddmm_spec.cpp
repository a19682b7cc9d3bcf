#include "codegen/cpu_sddmm_spec.h"

#include <sstream>

namespace sparsejit::codegen {

uint64_t CpuSddmmSpec::packed_key() const {
  return pack(OpKind::Sddmm, static_cast<uint64_t>(dtype) | static_cast<uint64_t>(index) << 2 |
                                 static_cast<uint64_t>(heads & 0xffff) << 22 |
                                 static_cast<uint64_t>(features & 0xfffff) << 38);
}

std::string CpuSddmmSpec::name() const {
  std::ostringstream os;
  os << "sddmm_" << scalar_name(dtype) << "_" << index_name(index) << "_h" << heads << "_f"
     << features;
  return os.str();
}

std::string CpuSddmmSpec::source() const {
  std::ostringstream os;
  os << "// sparsejit generated kernel: " << name() << "\n"
     << "// SDDMM, " << scalar_name(dtype) << " values, "
     << (index == IndexKind::I32 ? "int32" : "int64") << " indices, H=" << heads
     << ", F=" << features << ".\n"
     << "#include \"kernels/cpu/sddmm_kernel.h\"\n\n"
     << "extern \"C\" void sparsejit_entry(const void* launch) {\n"
     << "  const auto& l = *static_cast<const sparsejit::cpu::SddmmLaunch*>(launch);\n"
     << "  using T = " << cpp_scalar_type(dtype) << ";\n"
     << "  using I = " << cpp_index_type(index) << ";\n"
     << "  sparsejit::cpu::detail::sddmm_run<T, I, " << heads << ", " << features << ">(\n"
     << "      l.args, static_cast<const I*>(l.rowptr), static_cast<const I*>(l.col),\n"
     << "      static_cast<const T*>(l.q), static_cast<const T*>(l.k), static_cast<T*>(l.s));\n"
     << "}\n";
  return os.str();
}

}  // namespace sparsejit::codegen
