#include "codegen/cpu_spmm_spec.h"

#include <sstream>

namespace sparsejit::codegen {

uint64_t CpuSpmmSpec::packed_key() const {
  return pack(OpKind::Spmm,
              static_cast<uint64_t>(dtype) | static_cast<uint64_t>(index) << 2 |
                  static_cast<uint64_t>(reduce) << 3 | static_cast<uint64_t>(value_mode) << 5 |
                  static_cast<uint64_t>(static_cast<int32_t>(act) & 0x7f) << 7 |
                  static_cast<uint64_t>(prefetch & 0xff) << 14 |
                  static_cast<uint64_t>(heads & 0xffff) << 22 |
                  static_cast<uint64_t>(features & 0xfffff) << 38);
}

std::string CpuSpmmSpec::name() const {
  std::ostringstream os;
  os << "spmm_" << scalar_name(dtype) << "_" << index_name(index) << "_" << reduce_name(reduce)
     << "_v" << value_mode << "_h" << heads << "_f" << features << "_" << act_name(act) << "_pf"
     << prefetch;
  return os.str();
}

std::string CpuSpmmSpec::source() const {
  std::ostringstream os;
  os << "// sparsejit generated kernel: " << name() << "\n"
     << "// SpMM, " << scalar_name(dtype) << " values, "
     << (index == IndexKind::I32 ? "int32" : "int64") << " indices, reduce=" << reduce_name(reduce)
     << ", value mode " << value_mode << ", H=" << heads << ", F=" << features
     << ", activation=" << act_name(act) << ", prefetch distance " << prefetch << ".\n"
     << "#include \"kernels/cpu/spmm_kernel.h\"\n\n"
     << "extern \"C\" void sparsejit_entry(const void* launch) {\n"
     << "  const auto& l = *static_cast<const sparsejit::cpu::SpmmLaunch*>(launch);\n"
     << "  using T = " << cpp_scalar_type(dtype) << ";\n"
     << "  using I = " << cpp_index_type(index) << ";\n"
     << "  sparsejit::cpu::detail::spmm_run<T, I, " << cpp_enum(reduce) << ", " << value_mode
     << ", " << heads << ", " << features << ", " << cpp_enum(act) << ", " << prefetch << ">(\n"
     << "      l.args, static_cast<const I*>(l.rowptr), static_cast<const I*>(l.col),\n"
     << "      static_cast<const T*>(l.values), static_cast<const T*>(l.x), static_cast<T*>(l.out),\n"
     << "      l.arg);\n"
     << "}\n";
  return os.str();
}

}  // namespace sparsejit::codegen
