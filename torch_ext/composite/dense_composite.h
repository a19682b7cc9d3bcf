// segment_matmul from ATen's GEMM: what torch_ext/ops/dense.cpp runs, after its checks, where
// the dense layer's one-region float32 kernels (csrc/dense/gemm.h segment_matmul) do not apply
// (float64, or tensors on another device: one tx::mm_out per segment, cuBLAS on a GPU).
#pragma once

#include "torch_ext/tensor_api.h"

#include <cstdint>

namespace sparsejit::composite {

// y[seg[k] : seg[k + 1]] = x[seg[k] : seg[k + 1]] @ w[k] for the k of w.size(0); seg on the
// host; y [N, F_out] preallocated (rows of empty segments are left as they are).
void segment_matmul(const tx::Tensor& x, const tx::Tensor& w, const int64_t* seg,
                    tx::Tensor& y);

// dw[k] = x[seg[k] : seg[k + 1]]^T @ dy[seg[k] : seg[k + 1]] for every k of dw.size(0).
void segment_matmul_grad_w(const tx::Tensor& x, const tx::Tensor& dy, const int64_t* seg,
                           tx::Tensor& dw);

}  // namespace sparsejit::composite
