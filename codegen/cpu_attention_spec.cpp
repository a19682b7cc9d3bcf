#include "codegen/cpu_attention_spec.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace sparsejit::codegen {

namespace {

const char* mode_name(attention::Mode m) {
  switch (m) {
    case attention::Mode::Dot: return "dot";
    case attention::Mode::Additive: return "gat";
    case attention::Mode::GATv2: return "gatv2";
  }
  throw std::invalid_argument("the attention JIT has no score form " +
                              std::to_string(static_cast<int64_t>(m)));
}

}  // namespace

bool CpuAttentionSpec::supports(int64_t heads, int64_t qk_width, int64_t v_width) {
  return heads >= 1 && heads <= 64 && qk_width >= 1 && qk_width <= 1024 && v_width >= 1 &&
         v_width <= 1024 && heads * std::max(qk_width, v_width) <= 4096;
}

uint64_t CpuAttentionSpec::packed_key() const {
  // dtype 2 bits, index 1, mode 2, H 7, D 11, Dv 11: 34 bits (supports() bounds the sizes).
  return pack(OpKind::Attention,
              static_cast<uint64_t>(dtype) | static_cast<uint64_t>(index) << 2 |
                  (static_cast<uint64_t>(mode) & 3) << 3 |
                  static_cast<uint64_t>(heads & 0x7f) << 5 |
                  static_cast<uint64_t>(qk_width & 0x7ff) << 12 |
                  static_cast<uint64_t>(v_width & 0x7ff) << 23);
}

std::string CpuAttentionSpec::name() const {
  std::ostringstream os;
  os << "attention_" << scalar_name(dtype) << "_" << index_name(index) << "_" << mode_name(mode)
     << "_h" << heads << "_d" << qk_width << "_v" << v_width;
  return os.str();
}

std::string CpuAttentionSpec::source() const {
  if (!supports(heads, qk_width, v_width))
    throw std::invalid_argument("the attention JIT has no kernel for H=" +
                                std::to_string(heads) + ", D=" + std::to_string(qk_width) +
                                ", Dv=" + std::to_string(v_width));
  if (dtype != ScalarKind::F32 && dtype != ScalarKind::F64 && dtype != ScalarKind::BF16)
    throw std::invalid_argument(std::string("the attention JIT has no kernel for scalar kind ") +
                                scalar_name(dtype) + " (float16 runs in float32)");
  std::ostringstream os;
  os << "// sparsejit generated kernel: " << name() << "\n"
     << "// Fused sparse attention, " << scalar_name(dtype)
     << (dtype == ScalarKind::BF16 ? " q/k/v/out (forward only, float32 accumulation)" : "")
     << " values, "
     << (index == IndexKind::I32 ? "int32" : "int64") << " indices, " << mode_name(mode)
     << " scores, H=" << heads << ", D=" << qk_width << ", Dv=" << v_width << ".\n"
     << "#include \"kernels/cpu/attention_kernel.h\"\n\n"
     << "extern \"C\" void sparsejit_entry(const void* launch) {\n"
     << "  namespace at = sparsejit::attention;\n"
     << "  auto& l = *static_cast<at::AttentionLaunch*>(const_cast<void*>(launch));\n"
     << "  using K = at::Fixed<" << static_cast<int64_t>(mode) << ", " << heads << ", "
     << qk_width << ", " << v_width << ">;\n"
     << "  at::run<K, " << (dtype == ScalarKind::BF16 ? "float" : cpp_scalar_type(dtype))
     << ", " << cpp_index_type(index)
     << (dtype == ScalarKind::BF16 ? ", sparsejit::bf16" : "") << ">(l);\n"
     << "}\n";
  return os.str();
}

}  // namespace sparsejit::codegen
