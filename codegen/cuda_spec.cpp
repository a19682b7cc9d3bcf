// The common part of every CUDA kernel spec (codegen/cuda_spec.h): validation of the shared
// fields, the name's block suffix, the source frame around the family's Config members, and
// the variant list gathered from the families.
#include "codegen/cuda_spec.h"

#include <sstream>

#include "codegen/cuda_attention.h"
#include "codegen/cuda_filter_conv.h"
#include "codegen/cuda_point_conv.h"
#include "codegen/cuda_spmm.h"
#include "codegen/embedded_headers.h"

namespace sparsejit::codegen {

namespace cuda_spec_detail {

int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

int64_t pow2_floor(int64_t v) {
  int64_t p = 1;
  while (p * 2 <= v) p <<= 1;
  return p;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

bool is_pow2(int64_t v) {
  return v > 0 && (v & (v - 1)) == 0;
}

const char* act_short(Act a) {
  switch (a) {
    case Act::None: return "none";
    case Act::Relu: return "relu";
    case Act::LeakyRelu: return "leaky";
    case Act::Elu: return "elu";
    case Act::Gelu: return "gelu";
    case Act::Runtime: return "runtime";
    default: detail::bad_enum("activation", static_cast<int>(a));
  }
}

}  // namespace cuda_spec_detail

namespace {

const char* device_type(CudaScalar s) {
  switch (s) {
    case CudaScalar::F32: return "float";
    case CudaScalar::F16: return "sparsejit::cuda::half_t";
    case CudaScalar::BF16: return "sparsejit::cuda::bf16_t";
    case CudaScalar::F64: return "double";
    default: detail::bad_enum("scalar kind", static_cast<int>(s));
  }
}

// The text of an embedded kernel header without its `#pragma once` (the generated source is
// one translation unit); an #error naming the header if it was not embedded.
std::string embedded(const std::string& rel) {
  for (const auto& [path, text] : embedded_headers()) {
    if (rel != path) continue;
    std::istringstream in(text);
    std::ostringstream out;
    std::string line;
    while (std::getline(in, line))
      if (line != "#pragma once") out << line << "\n";
    return "// ---- " + rel + " ----\n" + out.str();
  }
  return "#error \"sparsejit: " + rel +
         " is not embedded in this build (add it to SPARSEJIT_JIT_HEADERS)\"\n";
}

}  // namespace

int cuda_scalar_bytes(CudaScalar s) {
  return scalar_bytes(s);
}

const char* cuda_scalar_name(CudaScalar s) {
  return scalar_name(s);
}

std::string CudaKernelSpecBase::validate() const {
  std::ostringstream e;
  if (block < 32 || block > 1024 || block % 32 != 0)
    e << "block must be a multiple of 32 in [32, 1024]; got " << block << ". ";
  e << validate_family();
  return e.str();
}

std::string CudaKernelSpecBase::name() const {
  std::string n = stem();
  if (block != 256) n += "_b" + std::to_string(block);
  return n;
}

std::string CudaKernelSpecBase::source() const {
  std::ostringstream os;
  os << "// sparsejit generated CUDA kernel: " << name() << "\n"
     << "// Compiled at run time by NVRTC; the kernel templates are the embedded text of\n"
     << "// kernels/cuda/*.cuh, configured by the struct at the end.\n";
  const std::string err = validate();
  if (!err.empty()) {
    os << "#error \"invalid CUDA kernel spec: " << err << "\"\n";
    return os.str();
  }
  os << "#define SJ_CUDA_AMALGAMATED 1\n"
     << embedded("kernels/common/enums.h") << embedded("kernels/cuda/cuda_args.h")
     << embedded("kernels/cuda/common.cuh") << embedded(kernel_header());
  std::vector<std::string> bodies;
  os << "\n// ---- configuration ----\n"
     << "namespace sj_generated {\n"
     << "struct Config {\n"
     << "  typedef " << device_type(dtype) << " T;\n"
     << "  typedef " << (index == IndexKind::I32 ? "int" : "long long") << " I;\n"
     << "  static constexpr int H = " << config_heads() << ";\n"
     << "  static constexpr int BLOCK = " << block << ";\n"
     << config(&bodies) << "};\n}  // namespace sj_generated\n\n";
  const std::vector<std::string> entries = entry_points();
  for (size_t k = 0; k < entries.size(); ++k) {
    os << "extern \"C\" __global__ void __launch_bounds__(" << block << ") " << entries[k]
       << "(const sparsejit::cuda::" << params_type() << " p) {\n"
       << "  sparsejit::cuda::" << bodies.at(k) << "<sj_generated::Config>(p);\n"
       << "}\n";
  }
  return os.str();
}

std::vector<CudaSpecPtr> enumerate_cuda_variants() {
  std::vector<CudaSpecPtr> out;
  append_spmm_variants(&out);  // SpMM, SDDMM, edge softmax
  append_attention_variants(&out);
  append_filter_conv_variants(&out);
  append_point_conv_variants(&out);
  return out;
}

}  // namespace sparsejit::codegen
