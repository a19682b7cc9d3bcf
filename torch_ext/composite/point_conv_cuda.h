// The point-cloud convolution's CUDA dataflows, composed of NVRTC kernels and cuBLAS GEMMs
// (torch_ext/ops/point_conv_cuda.inc checks the arguments and the plan, then calls these):
//   gather-GEMM-scatter: gather_rows (one NVRTC gather of the pairs' rows into [M, C]),
//     offset_gemms (one cuBLAS GEMM per kernel offset into its slice of the products), and
//     reduce_rows (one NVRTC reduction of the products into the output rows through the plan's
//     row index in pair order, bias and ReLU fused); weight_grads, the per-offset GEMMs of the
//     weight gradient;
//   output-stationary: implicit_gemm (a neighbour map [n_out, K] from the pairs, then one NVRTC
//     implicit GEMM that gathers the input rows into shared memory tile by tile).
// Both give the same bits on every run (no floating-point atomics). Header-only, compiled with
// torch_ext/ops/point_conv.cpp under SPARSEJIT_WITH_CUDA (scripts/check_cuda_adapter.sh).
#pragma once

#include "torch_ext/tensor_api.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "codegen/cuda_point_conv.h"
#include "csrc/point_conv/point_conv_run.h"
#include "torch_ext/cuda_common.h"

namespace sparsejit::point_conv_cuda {

// The plan's arrays on the device, read forwards (swap false) or backwards; filled and checked
// by the adapter (device_plan in point_conv_cuda.inc).
struct DevicePlan {
  int64_t k = 0, m = 0, n_src = 0, n_dst = 0;
  std::vector<int64_t> group_ptr;  // host copy
  tx::Tensor src_idx, dst_idx;     // int32 [M]: gathered row and output row of each pair
  tx::Tensor dst_row_ptr;          // int64 [n_dst + 1]
  tx::Tensor dst_row_pair;         // int32 [M]
  tx::Tensor src_row_ptr, src_row_pair;  // the other direction's row index
  tx::Tensor pair_group;                 // int32 [M]: each pair's kernel offset
  // The transposed map: the same pairs, reduced into the source rows.
  DevicePlan flipped() const {
    DevicePlan b = *this;
    std::swap(b.n_src, b.n_dst);
    std::swap(b.src_idx, b.dst_idx);
    std::swap(b.src_row_ptr, b.dst_row_ptr);
    std::swap(b.src_row_pair, b.dst_row_pair);
    return b;
  }
  point_conv::Pairs shape() const {  // sizes only, for the adapter's argument checks
    point_conv::Pairs p;
    p.num_groups = k;
    p.num_in = n_src;
    p.num_out = n_dst;
    return p;
  }
};

inline void run_kernel(const char* op, const codegen::CudaKernelSpecBase& spec,
                       const tx::Tensor& on, const codegen::CudaLaunch& launch,
                       cuda::PointConvParams* p) {
  std::string err;
  if (!cuda_ext::CudaKernels::instance().run(spec, on.get_device(), cuda_ext::current_stream(),
                                             {launch}, p, &err))
    cuda_ext::raise_cuda_error(op, err);
}

// dst[q] = src[idx[q]] for every pair: [M, C].
inline tx::Tensor gather_rows(const char* op, const tx::Tensor& src, const tx::Tensor& idx) {
  const int64_t m = idx.numel(), c = src.size(1);
  auto out = tx::empty({m, c}, src.options());
  if (m == 0 || c == 0) return out;
  const auto spec = codegen::plan_cuda_point_conv(
      cuda_ext::cuda_scalar(src.scalar_type()), IndexKind::I32, c, false,
      cuda_ext::aligned_bytes({src.data_ptr(), out.data_ptr()}));
  cuda::PointConvParams p{src.data_ptr(), idx.data_ptr(), nullptr, nullptr, out.data_ptr(), m};
  run_kernel(op, spec, src, codegen::plan_point_conv_gather_launch(spec, m), &p);
  return out;
}

// out[r] = act(bias + sum of prod[pair] over the row's pairs, in pair order): [rows, C].
inline tx::Tensor reduce_rows(const char* op, const tx::Tensor& prod, const DevicePlan& d,
                              const std::optional<tx::Tensor>& bias, bool relu) {
  const int64_t c = prod.size(1);
  auto out = tx::empty({d.n_dst, c}, prod.options());
  if (d.n_dst == 0 || c == 0) return out;
  const auto spec = codegen::plan_cuda_point_conv(
      cuda_ext::cuda_scalar(prod.scalar_type()), IndexKind::I32, c, relu,
      cuda_ext::aligned_bytes({prod.data_ptr(), out.data_ptr()}));
  cuda::PointConvParams p{prod.data_ptr(), d.dst_row_pair.data_ptr(),
                          static_cast<const long long*>(d.dst_row_ptr.const_data_ptr()),
                          bias.has_value() ? bias->data_ptr() : nullptr, out.data_ptr(),
                          d.n_dst};
  run_kernel(op, spec, prod, codegen::plan_point_conv_rows_launch(spec, d.n_dst), &p);
  return out;
}

// The output-stationary dataflow: out [n_dst, C_out] = act(bias + sum_k x[nbr[:, k]] @ W[k])
// (W[k]^T when trans_w) in one NVRTC implicit GEMM, after a neighbour map [n_dst, K] int32 is
// filled from the plan's pairs (kernels/cuda/point_conv.cuh pconv_nbr / pconv_implicit). No
// [M, C] buffers; the map costs n_dst * K * 4 bytes.
inline tx::Tensor implicit_gemm(const char* op, const tx::Tensor& x, const tx::Tensor& w,
                                const DevicePlan& d, const std::optional<tx::Tensor>& bias,
                                bool relu, bool trans_w) {
  const int64_t c_in = x.size(1), c_out = trans_w ? w.size(1) : w.size(2);
  auto out = tx::empty({d.n_dst, c_out}, x.options());
  if (d.n_dst == 0 || c_out == 0) return out;
  auto nbr = tx::empty({d.n_dst, d.k}, x.options().dtype(tx::kInt)).fill_(-1.0);
  const auto spec = codegen::plan_cuda_point_conv_implicit(
      cuda_ext::cuda_scalar(x.scalar_type()), c_in, c_out, trans_w, relu);
  cuda::PointConvImplicitParams p{x.data_ptr(),
                                  w.data_ptr(),
                                  bias.has_value() ? bias->data_ptr() : nullptr,
                                  out.data_ptr(),
                                  static_cast<int*>(nbr.data_ptr()),
                                  static_cast<const int*>(d.src_idx.const_data_ptr()),
                                  static_cast<const int*>(d.dst_idx.const_data_ptr()),
                                  static_cast<const int*>(d.pair_group.const_data_ptr()),
                                  d.n_dst,
                                  d.k,
                                  d.m,
                                  0};
  std::vector<codegen::CudaLaunch> launches;
  if (d.m > 0) launches.push_back(codegen::plan_point_conv_nbr_launch(spec, d.m));
  launches.push_back(codegen::plan_point_conv_implicit_launch(spec, d.n_dst));
  std::string err;
  if (!cuda_ext::CudaKernels::instance().run(spec, x.get_device(), cuda_ext::current_stream(),
                                             launches, &p, &err))
    cuda_ext::raise_cuda_error(op, err);
  return out;
}

// The dataflow a CUDA call runs: 1 gather-GEMM-scatter (cuBLAS), 2 output-stationary (the
// implicit GEMM). `requested` is the op's 2-bit field (0 = auto). Auto takes the implicit GEMM
// for float32 / float64 up to 128 channels each side (no [M, C] round trips through memory,
// one launch instead of one GEMM per offset) and cuBLAS otherwise (its tensor cores for the
// half types, its tiles for wide layers). Not yet measured on a GPU: gpu_check's families
// step times both dataflows so the rule can be set from numbers.
inline int cuda_dataflow(int64_t requested, tx::ScalarType dtype, int64_t c_in, int64_t c_out) {
  if (c_in == 0) return 1;  // nothing to multiply: the GEMM path writes act(bias)
  if (requested == 1 || requested == 2) return static_cast<int>(requested);
  const bool wide = dtype == tx::kFloat || dtype == tx::kDouble;
  return wide && c_in <= 128 && c_out <= 128 ? 2 : 1;
}

// products[group k's pairs] = gathered[group k's pairs] @ w[k] (or w[k]^T).
inline tx::Tensor offset_gemms(const tx::Tensor& gathered, const tx::Tensor& w,
                               const DevicePlan& d, bool trans_w) {
  const int64_t c_out = trans_w ? w.size(1) : w.size(2);
  auto prod = tx::empty({d.m, c_out}, gathered.options());
  for (int64_t g = 0; g < d.k; ++g) {
    const int64_t lo = d.group_ptr[g], n = d.group_ptr[g + 1] - lo;
    if (n == 0) continue;
    auto dst = prod.narrow(0, lo, n);
    const auto wk = trans_w ? w[g].t() : w[g];
    tx::mm_out(dst, gathered.narrow(0, lo, n), wk);
  }
  return prod;
}

// d_weight[k] = gathered inputs^T @ gathered grad_out over offset k's pairs: [K, C_in, C_out].
inline tx::Tensor weight_grads(const tx::Tensor& gx, const tx::Tensor& gdy, const tx::Tensor& w,
                               const DevicePlan& fwd) {
  auto dw = tx::zeros_like(w);
  for (int64_t g = 0; g < fwd.k; ++g) {
    const int64_t lo = fwd.group_ptr[g], n = fwd.group_ptr[g + 1] - lo;
    if (n == 0) continue;
    auto dst = dw[g];
    tx::mm_out(dst, gx.narrow(0, lo, n).t(), gdy.narrow(0, lo, n));
  }
  return dw;
}

// The map search of point_conv_tensor::subm_plan: the NVRTC kernel over the sorted keys.
inline tx::Tensor search_keys_on_gpu(const tx::Tensor& keys, const tx::Tensor& delta,
                                     int64_t k) {
  const int64_t n = keys.numel();
  auto found = tx::empty({k, n}, keys.options().dtype(tx::kInt));
  const auto spec = codegen::plan_cuda_point_map(IndexKind::I32);
  const auto* kp = static_cast<const unsigned long long*>(keys.data_ptr());
  cuda::PointMapParams p{kp, kp, static_cast<const unsigned long long*>(delta.data_ptr()),
                         found.data_ptr(), n, n, k, 0};
  std::string err;
  if (!cuda_ext::CudaKernels::instance().run(spec, keys.get_device(), cuda_ext::current_stream(),
                                             {codegen::plan_point_map_launch(spec, k, n)}, &p,
                                             &err))
    cuda_ext::raise_cuda_error("point_conv_plan", err);
  return found;
}

}  // namespace sparsejit::point_conv_cuda
