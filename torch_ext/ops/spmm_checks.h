// The argument checks of the SpMM family's ops (spmm, sddmm, edge_softmax), CPU and CUDA
// alike: shapes, dtypes and devices of the operands, the structure's O(rows) invariants, and
// the fused epilogue's activation. Shared checks are in torch_ext/common.h.
#pragma once

#include "torch_ext/tensor_api.h"

#include <optional>
#include <string>
#include <vector>

#include "csrc/spmm/spmm_run.h"
#include "kernels/cpu/spmm_args.h"
#include "torch_ext/common.h"
#include "torch_ext/validated.h"

namespace sparsejit {

// The O(rows) invariants of a CSR structure handed to a raw op: indptr starts at 0, never
// decreases and ends at the number of stored entries. (Column indices are checked once, when
// a structure is built: sparsejit.SparseMatrix / the validate_csr op.)
inline void check_structure(const tx::Tensor& rowptr, int64_t nnz, const char* op) {
  const tx::Tensor rp = rowptr.device().is_cpu() ? rowptr.contiguous() : rowptr.cpu();
  const std::string err =
      plan::check_rowptr(index_kind(rp), rp.data_ptr(), rp.numel() - 1, nnz);
  SJ_CHECK_VALUE(err.empty(), "sparsejit.", op, ": invalid indptr: ", err);
}

struct SpmmShape {
  int64_t num_cols = 0;
  plan::StructureStamp stamp;
  int64_t rows, heads, features, value_heads;
  Reduce reduce;
  std::vector<int64_t> out_sizes;
};

inline SpmmShape check_spmm_args(const tx::Tensor& rowptr, const tx::Tensor& col,
                                 const std::optional<tx::Tensor>& values, const tx::Tensor& x,
                                 tx::Str reduce, int64_t num_cols) {
  check_index_pair(rowptr, col);
  check_float(x, "X");
  SJ_CHECK_VALUE(x.dim() >= 1 && x.size(0) == num_cols, "sparsejit.spmm: X has ",
                    x.dim() >= 1 ? x.size(0) : 0, " rows but the sparse matrix has ", num_cols,
                    " columns");
  check_same_device(rowptr, x, "the sparse structure", "X");
  SpmmShape s;
  try {
    s.reduce = parse_reduce(std::string(reduce));
  } catch (const std::invalid_argument& e) {
    SJ_CHECK_VALUE(false, "sparsejit.spmm: ", e.what());
  }
  SJ_CHECK_VALUE(x.dim() == 2 || x.dim() == 3,
                    "sparsejit.spmm: X must be [num_cols, F] or [num_cols, H, F]; got shape ",
                    x.sizes());
  s.rows = rowptr.numel() - 1;
  s.heads = x.dim() == 3 ? x.size(1) : 1;
  s.features = x.size(-1);
  s.value_heads = 0;
  const int64_t nnz = col.numel();
  if (values.has_value()) {
    const auto& v = *values;
    SJ_CHECK_TYPE(v.scalar_type() == x.scalar_type(), "sparsejit.spmm: values dtype (",
                     v.scalar_type(), ") must match X dtype (", x.scalar_type(), ")");
    check_same_device(v, x, "values", "X");
    SJ_CHECK_VALUE(v.size(0) == nnz && (v.dim() == 1 || v.dim() == 2),
                      "sparsejit.spmm: values must be [nnz] or [nnz, H] with nnz = ", nnz,
                      "; got shape ", v.sizes());
    if (v.dim() == 2) {
      SJ_CHECK_VALUE(x.dim() == 3 && v.size(1) == s.heads,
                        "sparsejit.spmm: values of shape ", v.sizes(),
                        " need X of shape [num_cols, ", v.size(1), ", F]; got X of shape ",
                        x.sizes());
      s.value_heads = s.heads;
    } else {
      s.value_heads = 1;
    }
  }
  s.out_sizes = x.sizes().vec();
  s.out_sizes[0] = s.rows;
  return s;
}

struct SddmmShape {
  int64_t num_cols = 0;
  plan::StructureStamp stamp;
  int64_t rows, heads, features;
  std::vector<int64_t> out_sizes;
};

inline SddmmShape check_sddmm_args(const tx::Tensor& rowptr, const tx::Tensor& col,
                                   const tx::Tensor& q, const tx::Tensor& k, int64_t num_cols) {
  check_index_pair(rowptr, col);
  check_float(q, "Q");
  check_float(k, "K");
  check_same_device(rowptr, q, "the sparse structure", "Q");
  check_same_device(q, k, "Q", "K");
  SJ_CHECK_TYPE(q.scalar_type() == k.scalar_type(), "sparsejit.sddmm: Q dtype (",
                   q.scalar_type(), ") must match K dtype (", k.scalar_type(), ")");
  SJ_CHECK_VALUE(q.dim() == k.dim() && (q.dim() == 2 || q.dim() == 3),
                    "sparsejit.sddmm: Q and K must both be [N, F] or both [N, H, F]; got ",
                    q.sizes(), " and ", k.sizes());
  SJ_CHECK_VALUE(q.size(0) == rowptr.numel() - 1, "sparsejit.sddmm: Q has ", q.size(0),
                    " rows but the sparse matrix has ", rowptr.numel() - 1);
  SJ_CHECK_VALUE(k.size(0) == num_cols, "sparsejit.sddmm: K has ", k.size(0),
                    " rows but the sparse matrix has ", num_cols, " columns");
  SJ_CHECK_VALUE(q.sizes().slice(1) == k.sizes().slice(1),
                    "sparsejit.sddmm: Q and K feature shapes differ: ", q.sizes(), " vs ",
                    k.sizes());
  SddmmShape s;
  s.rows = rowptr.numel() - 1;
  s.heads = q.dim() == 3 ? q.size(1) : 1;
  s.features = q.size(-1);
  if (q.dim() == 3) {
    s.out_sizes = {col.numel(), s.heads};
  } else {
    s.out_sizes = {col.numel()};
  }
  return s;
}

// Scores over stored entries: [nnz] or [nnz, H]. Returns H.
inline int64_t check_edge_scores(const tx::Tensor& rowptr, const tx::Tensor& s,
                                 const char* name) {
  SJ_CHECK_TYPE(rowptr.scalar_type() == tx::kInt || rowptr.scalar_type() == tx::kLong,
                   "sparsejit: indptr must be int32 or int64; got ", rowptr.scalar_type());
  check_float(s, name);
  check_same_device(rowptr, s, "indptr", name);
  SJ_CHECK_VALUE(s.dim() == 1 || s.dim() == 2, "sparsejit.edge_softmax: ", name,
                    " must be [nnz] or [nnz, H]; got shape ", s.sizes());
  SJ_CHECK_VALUE(rowptr.dim() == 1 && rowptr.numel() >= 1,
                    "sparsejit.edge_softmax: indptr must be 1-D with rows + 1 >= 1 entries; got "
                    "shape ", rowptr.sizes());
  check_structure(rowptr, s.size(0), "edge_softmax");
  return s.dim() == 2 ? s.size(1) : 1;
}

// The fused epilogue's activation, by name (shared by every backend).
inline cpu::Act activation_arg(tx::Str name) {
  try {
    return ::sparsejit::parse_activation(std::string(name));
  } catch (const std::invalid_argument& e) {
    SJ_CHECK_VALUE(false, "sparsejit.spmm: ", e.what());
  }
}

// Every check of an spmm call (CPU and CUDA alike): arguments, then the structure (validated
// once per tensor version, see validated.h). num_cols = -1 takes X's rows.
inline SpmmShape check_spmm_call(const tx::Tensor& rowptr, const tx::Tensor& col,
                                 const std::optional<tx::Tensor>& values, const tx::Tensor& x,
                                 tx::Str reduce, int64_t num_cols,
                                 const std::optional<tx::Tensor>& t_rowptr,
                                 const std::optional<tx::Tensor>& t_col,
                                 const std::optional<tx::Tensor>& t_perm) {
  check_index_pair(rowptr, col);
  num_cols = resolve_num_cols(num_cols, "spmm", x, "X");
  SpmmShape s = check_spmm_args(rowptr, col, values, x, reduce, num_cols);
  check_transpose_args(t_rowptr, t_col, t_perm, col, num_cols, "spmm");
  s.num_cols = num_cols;
  s.stamp = checked_structure(rowptr, col, num_cols, "spmm");
  return s;
}

// The same for sddmm (num_cols = -1 takes K's rows).
inline SddmmShape check_sddmm_call(const tx::Tensor& rowptr, const tx::Tensor& col,
                                   const tx::Tensor& q, const tx::Tensor& k, int64_t num_cols,
                                   const std::optional<tx::Tensor>& t_rowptr,
                                   const std::optional<tx::Tensor>& t_col,
                                   const std::optional<tx::Tensor>& t_perm) {
  check_index_pair(rowptr, col);
  num_cols = resolve_num_cols(num_cols, "sddmm", k, "K");
  SddmmShape s = check_sddmm_args(rowptr, col, q, k, num_cols);
  check_transpose_args(t_rowptr, t_col, t_perm, col, num_cols, "sddmm");
  s.num_cols = num_cols;
  s.stamp = checked_structure(rowptr, col, num_cols, "sddmm");
  return s;
}

}  // namespace sparsejit
