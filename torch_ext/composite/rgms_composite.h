// RGMS from ATen ops and sparsejit's own SpMM / SDDMM ops: device generic, so what CUDA
// tensors run (torch_ext/ops/rgms.cpp calls it after its checks).
//   - rgms_plan_tensor: the plan built with tensor ops on the edges' own device, word for word
//     the counting sorts' plan (csrc/rgms/rgms_plan.h);
//   - rgms_composite / rgms_backward_composite: the aggregate-first dataflow. Each
//     (relation, target) group's reduce of its sources' rows is an SpMM over the groups
//     (NVRTC kernels on a GPU), the per-relation GEMMs are tx::mm_out on each relation's
//     slice of groups (cuBLAS), the scatter of the groups' products to their targets a second
//     SpMM over a target -> group CSR (no atomics). Backward: dW per relation on tx::mm_out,
//     dX an SpMM over a source -> entry CSR, dvalues an SDDMM. Host reads: rel_ptr (R + 1
//     sizes) once per plan, and the plan's first validation.
// SPARSEJIT_STRUCTURE_ATEN=1 runs the plan builder on CPU tensors, SPARSEJIT_RGMS_COMPOSITE=1
// the composite, which is how tests check both against the CPU code without a GPU.
#pragma once

#include "torch_ext/tensor_api.h"

#include <optional>
#include <tuple>

#include "torch_ext/ops/rgms_checks.h"

namespace sparsejit::composite {

// nullopt when an edge is out of range (the caller's CPU checks name it) or the key could
// overflow.
std::optional<tx::Tensor> rgms_plan_tensor(const tx::Tensor& ei, const tx::Tensor& et,
                                           int64_t num_src, int64_t num_dst, int64_t r);

// Whether SPARSEJIT_RGMS_COMPOSITE asks for the composite on CPU tensors.
bool rgms_composite_forced();

// Y [num_rows, F_out] = the RGMS of a checked call (x, w, values in the compute type), plus
// x_root @ root and bias when given.
tx::Tensor rgms_composite(const PlanArgs& a, const tx::Tensor& x, const tx::Tensor& w,
                          const std::optional<tx::Tensor>& values, int64_t num_rows,
                          const std::optional<tx::Tensor>& root,
                          const std::optional<tx::Tensor>& x_root,
                          const std::optional<tx::Tensor>& bias);

// (dX, dW, dvalues), each empty when not needed; dX gets dY @ root^T with root.
std::tuple<tx::Tensor, tx::Tensor, tx::Tensor> rgms_backward_composite(
    const PlanArgs& a, const tx::Tensor& x, const tx::Tensor& w,
    const std::optional<tx::Tensor>& values, const tx::Tensor& dy, bool need_x, bool need_w,
    bool need_values, const std::optional<tx::Tensor>& root);

}  // namespace sparsejit::composite
