// CUDA kernel specs: the common base of every generated CUDA kernel (element and index type,
// block size; name, validation, entry points, source) and the list of variants CI compiles.
// Each family has its own spec beside its planner, variants and launch plans, as the CPU
// side has one small spec per family over codegen/kernel_spec.h:
//
//   codegen/cuda_spmm.h         CudaSpmmSpec, CudaSddmmSpec, CudaEdgeSoftmaxSpec (spmm.cuh,
//                               sddmm.cuh, edge_softmax.cuh; codegen/cuda_spec_spmm.cpp)
//   codegen/cuda_attention.h    CudaAttentionSpec (attention.cuh; cuda_spec_attention.cpp)
//   codegen/cuda_point_conv.h   CudaPointConvSpec, CudaPointMapSpec, CudaPointConvImplicitSpec
//                               (point_conv.cuh; cuda_spec_point_conv.cpp)
//   codegen/cuda_filter_conv.h  CudaFilterConvSpec (filter_conv.cuh; cuda_spec_filter_conv.cpp)
//
// The generated source is one translation unit: the embedded kernel headers of kernels/cuda,
// a `Config` struct (T, I, H, BLOCK, then the family's members) and one extern "C" entry per
// kernel pass. Torch-free and GPU-free, so it is unit-tested anywhere.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "codegen/kernel_spec.h"  // Act, IndexKind, OpKind, ScalarKind (kernels/common/enums.h)
#include "kernels/common/types.h"

namespace sparsejit::codegen {

// Op and scalar kinds of kernels/common/enums.h (one numbering for CPU and CUDA).
using CudaOp = OpKind;
using CudaScalar = ScalarKind;

int cuda_scalar_bytes(CudaScalar s);
const char* cuda_scalar_name(CudaScalar s);  // f32, f16, bf16, f64

class CudaKernelSpecBase {
 public:
  virtual ~CudaKernelSpecBase() = default;

  CudaScalar dtype = CudaScalar::F32;
  IndexKind index = IndexKind::I64;
  int32_t block = 256;  // threads per block

  virtual OpKind op() const = 0;
  // "" when the spec can be generated, else why not (the block, then the family's checks).
  std::string validate() const;
  // Readable and unique among all specs (spmm_rowgroup_f32_i32_sum_v1_h1_f64_relu_g8_vec4),
  // with _b<block> when the block is not 256.
  std::string name() const;
  // Kernel entry points in launch order (one, or the passes of a multi-pass op).
  virtual std::vector<std::string> entry_points() const { return {name()}; }
  // The complete CUDA source handed to NVRTC.
  std::string source() const;
  // The kernels' parameter struct in kernels/cuda/cuda_args.h (SpmmParams, ...).
  virtual const char* params_type() const = 0;
  // A copy of the family spec (lists of specs of several families hold pointers).
  virtual std::unique_ptr<CudaKernelSpecBase> clone() const = 0;

 protected:
  CudaKernelSpecBase() = default;
  CudaKernelSpecBase(const CudaKernelSpecBase&) = default;
  CudaKernelSpecBase& operator=(const CudaKernelSpecBase&) = default;

  // The name without the block suffix.
  virtual std::string stem() const = 0;
  // The family's checks ("" when valid).
  virtual std::string validate_family() const = 0;
  // kernels/cuda/<family>.cuh
  virtual const char* kernel_header() const = 0;
  // The heads constant H of the Config (1 for the convolutions).
  virtual int64_t config_heads() const { return 1; }
  // The family's Config members and, per entry point, the kernel template it instantiates.
  virtual std::string config(std::vector<std::string>* bodies) const = 0;
};

// A spec of any family, shared (the variant list, the tests' spec lists).
using CudaSpecPtr = std::shared_ptr<const CudaKernelSpecBase>;
template <class Spec>
CudaSpecPtr share_spec(const Spec& s) {
  return std::make_shared<const Spec>(s);
}
// Every family spec implements clone() as this.
template <class Spec>
std::unique_ptr<CudaKernelSpecBase> clone_spec(const Spec& s) {
  return std::make_unique<Spec>(s);
}

// Every variant the planners may pick, over a covering set of problem shapes, for every
// family (each appends its own: append_spmm_variants, append_attention_variants, ...). A few
// hundred; all must compile.
std::vector<CudaSpecPtr> enumerate_cuda_variants();

// The widest load (scalars) with vec * bytes <= max_bytes that divides `features`.
int32_t choose_vec(CudaScalar dtype, int64_t features, int32_t max_bytes);

// Helpers of the family spec files.
namespace cuda_spec_detail {
int64_t pow2_ceil(int64_t v);
int64_t pow2_floor(int64_t v);
int64_t ceil_div(int64_t a, int64_t b);
bool is_pow2(int64_t v);
const char* act_short(Act a);  // none, relu, leaky, elu, gelu
}  // namespace cuda_spec_detail

}  // namespace sparsejit::codegen
