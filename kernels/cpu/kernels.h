// Precompiled generic CPU kernels. Torch-free: raw pointers, sizes, a thread count.
// These are the fallback path; the JIT emits specialized versions of the same loops.
//
// Layouts (all contiguous, row-major):
//   rowptr[rows + 1], col[nnz]               CSR structure
//   values[nnz * VH] or nullptr              VH = 1 (shared by all heads) or H
//   x[n * H * F]                             dense operand, viewed as [n, H, F]
//   out[rows * H * F]                        SpMM output
//   arg[rows * H * F] (max / min; may be null) CSR position of the extremum, -1 for empty rows
#pragma once

#include <cstdint>

#include "kernels/common/types.h"
#include "kernels/cpu/spmm_args.h"

namespace sparsejit::cpu {

// Problems with less work (entries x features) than this run on one thread; waking a
// thread team costs more than it saves. Tests set it to 0 to exercise every partition.
int64_t min_parallel_work();
void set_min_parallel_work(int64_t work);



template <typename T, typename I>
void spmm(const SpmmArgs& a, const I* rowptr, const I* col, const T* values, const T* x, T* out,
          int64_t* arg);

// S[p, h] = <Q[row(p), h, :], K[col(p), h, :]>; q: [rows, H, F], k: [n, H, F], s: [nnz, H].
template <typename T, typename I>
void sddmm(int64_t rows, int64_t heads, int64_t features, const I* rowptr, const I* col,
           const T* q, const T* k, T* s, int num_threads);

// Softmax over each row's stored entries, per head. s, out: [nnz, H].
template <typename T, typename I>
void edge_softmax(int64_t rows, int64_t heads, const I* rowptr, const T* s, T* out,
                  int num_threads);

// Backward of edge_softmax: grad_s = y * (g - sum_row(g * y)).
template <typename T, typename I>
void edge_softmax_backward(int64_t rows, int64_t heads, const I* rowptr, const T* y, const T* g,
                           T* grad_s, int num_threads);

}  // namespace sparsejit::cpu
