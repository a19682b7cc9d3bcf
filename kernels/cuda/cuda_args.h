// Kernel parameter blocks of the CUDA kernels, shared by the host launcher (C++) and the
// NVRTC-compiled kernels (embedded into the generated source). Each kernel takes one of these
// by value, so host and device agree on the layout by construction. Plain C types only:
// this header is compiled by the host compiler and by NVRTC without any system header.
//
// Layouts (contiguous, row-major):
//   rowptr[rows + 1], col[nnz]          CSR structure (int32 or int64, the spec's index type)
//   values[nnz] or [nnz, H], or null    edge values (spec value mode 0 / 1 / 2)
//   x[n, H, F], out[rows, H, F]         SpMM dense operand and output
//   arg[rows, H, F] (max / min only)    CSR position of the extremum, -1 for empty rows
//   q[rows, H, F], k[n, H, F], s[nnz, H]  SDDMM
#pragma once

namespace sparsejit {
namespace cuda {

struct SpmmParams {
  const void* rowptr;
  const void* col;
  const void* values;  // null when the spec's value mode is 0
  const void* x;
  const void* bias;  // [H * F] of the output dtype, or null
  void* out;
  long long* arg;  // max / min only
  // nnz-balanced strategies only (null otherwise):
  void* partial;           // accumulator type; segment: [chunks, 2, H*F]; atomic: [chunks, H*F]
  long long* partial_arg;  // segment + max / min: [chunks, 2, H*F]
  long long* tail_row;     // [chunks]: the row that starts in the chunk and ends after it, or -1
  long long rows;
  long long nnz;
  long long chunk;       // stored entries per chunk
  long long num_chunks;  // max(1, ceil(nnz / chunk))
  float scale;           // epilogue: act(scale * reduced + bias)
  float act_param;       // leaky_relu slope / elu alpha
};

struct SddmmParams {
  const void* rowptr;
  const void* col;
  const void* q;
  const void* k;
  void* s;
  long long rows;
  long long nnz;
};

// Edge softmax (grad == null) and its backward (y = softmax output, grad = dL/dy).
struct SoftmaxParams {
  const void* rowptr;
  const void* y;     // forward: the scores
  const void* grad;  // backward only
  void* out;
  long long rows;
  long long pad_;  // keeps the size a multiple of 16 on every compiler
};

// ---- Fused sparse attention (kernels/cuda/attention.cuh) ----------------------------------
// Forward (out, lse) and the two backward passes; arrays in the spec's scalar type (float or
// double: float16 / bfloat16 run in float32, converted by the adapter), indices in its index
// type. Layouts as kernels/cpu/attention_args.h: q, k [N, H, D], v [N, H, Dv], bias [nnz, H],
// att [H, D], lse / delta [rows, H]; dz, pk [nnz, H] scratch written by the rows pass and read
// by the columns pass; datt_rows [rows, H, D] per-row partials of datt (summed by the adapter).
struct AttentionParams {
  const void* rowptr;
  const void* col;
  const void* q;
  const void* k;
  const void* v;
  const void* bias;  // or null
  const void* att;   // GATv2 only
  void* out;         // forward
  void* lse;         // forward
  const void* t_rowptr;  // backward columns pass: the transpose
  const void* t_col;
  const void* t_perm;
  const void* lse_in;  // backward
  const void* delta;
  const void* dout;
  void* dq;  // each may be null
  void* dk;
  void* dv;
  void* dbias;
  void* datt_rows;
  void* dz;  // scratch, always given to the backward
  void* pk;
  int* bad_perm;  // set to 1 when t_perm holds a position outside [0, nnz)
  long long rows;
  long long cols;
  long long nnz;
  double scale;
  double negative_slope;
  double dropout;
  unsigned long long seed;
};


// ---- Point-cloud convolution (kernels/cuda/point_conv.cuh) -----------------------------------
// gather: dst[q] = src[index[q]] for q < n; rows: dst[r] = act(bias + sum of src[index[e]]
// over e in [row_ptr[r], row_ptr[r + 1])) for r < n. index is the spec's index type.
struct PointConvParams {
  const void* src;
  const void* index;
  const long long* row_ptr;  // rows only
  const void* bias;          // rows only: [CH] of T, or null
  void* dst;
  long long n;
};

// Kernel-map search: found[k * n_query + q] = position of query[q] + delta[k] in keys, or -1
// (found has the spec's index type).
struct PointMapParams {
  const unsigned long long* keys;   // [n_keys] ascending
  const unsigned long long* query;  // [n_query]
  const unsigned long long* delta;  // [k]
  void* found;
  long long n_keys, n_query, k;
  long long pad_;
};


// Output-stationary implicit GEMM (kernels/cuda/point_conv.cuh pconv_nbr / pconv_implicit):
// nbr [n, k] int32 (filled with -1 by the caller, then by pconv_nbr from the n_pairs pairs
// src_idx / dst_idx / group), x [n_src, CI], w [k, CI, CO] (or [k, CO, CI] when TRANS_W),
// bias [CO] or null, out [n, CO].
struct PointConvImplicitParams {
  const void* x;
  const void* w;
  const void* bias;
  void* out;
  int* nbr;
  const int* src_idx;
  const int* dst_idx;
  const int* group;
  long long n, k, n_pairs;
  long long pad_;
};


// ---- Filter-sparse convolution (kernels/cuda/filter_conv.cuh) --------------------------------
// rowptr[c_out + 1], taps[nnz] (int64, t = (c * R + r) * S + s), values[nnz] (float32),
// x[batch, c_in, h, w], bias[c_out] (float32) or null, out[batch, c_out, out_h, out_w],
// residual (out's shape and dtype, added before the activation) or null.
struct FilterConvParams {
  const void* rowptr;
  const void* taps;
  const void* values;
  const void* x;
  const void* bias;
  void* out;
  long long batch, c_in, h, w;
  long long c_out, out_h, out_w;
  long long cin_g, cout_g;  // channels per group: input, output
  const void* residual;     // last: the size stays a multiple of 16 on every compiler
};


}  // namespace cuda
}  // namespace sparsejit
