#include "codegen/kernel_spec.h"

#include <stdexcept>

namespace sparsejit::codegen {

const char* cpp_scalar_type(ScalarKind k) {
  switch (k) {
    case ScalarKind::F32: return "float";
    case ScalarKind::F64: return "double";
    case ScalarKind::BF16: return "sparsejit::bf16";
    default:
      throw std::invalid_argument(std::string("the CPU JIT has no kernel for scalar kind ") +
                                  scalar_name(k));
  }
}

const char* cpp_index_type(IndexKind k) {
  switch (k) {
    case IndexKind::I32: return "int32_t";
    case IndexKind::I64: return "int64_t";
    default: detail::bad_enum("index kind", static_cast<int>(k));
  }
}

std::string cpp_enum(Reduce r) {
  switch (r) {
    case Reduce::Sum: return "sparsejit::Reduce::Sum";
    case Reduce::Mean: return "sparsejit::Reduce::Mean";
    case Reduce::Max: return "sparsejit::Reduce::Max";
    case Reduce::Min: return "sparsejit::Reduce::Min";
    default: detail::bad_enum("reduce", static_cast<int>(r));
  }
}

std::string cpp_enum(Act a) {
  switch (a) {
    case Act::None: return "sparsejit::Act::None";
    case Act::Relu: return "sparsejit::Act::Relu";
    case Act::LeakyRelu: return "sparsejit::Act::LeakyRelu";
    case Act::Elu: return "sparsejit::Act::Elu";
    case Act::Gelu: return "sparsejit::Act::Gelu";
    case Act::Runtime: return "sparsejit::Act::Runtime";
    default: detail::bad_enum("activation", static_cast<int>(a));
  }
}

}  // namespace sparsejit::codegen
