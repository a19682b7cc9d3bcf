// What every op file of the Torch adapter shares: argument checks (each failure names the
// argument, what was expected and what was given), the mapping of Torch dtypes onto the
// kernels' scalar kinds (with an error for every other dtype), and float16 handling.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

#include "codegen/cpu_jit.h"
#include "csrc/core/huge_pages.h"
#include "kernels/common/types.h"
#include "csrc/spmm/spmm_run.h"
#include "torch_ext/validated.h"
#include "kernels/cpu/spmm_args.h"

namespace sparsejit {

// The kernels' scalar kind of a Torch dtype; float16 is computed in float32 (see
// HalfAsFloat), so it never reaches this function.
inline ScalarKind scalar_kind(at::ScalarType t, const char* name) {
  switch (t) {
    case at::kFloat: return ScalarKind::F32;
    case at::kDouble: return ScalarKind::F64;
    case at::kBFloat16: return ScalarKind::BF16;
    default:
      TORCH_CHECK_TYPE(false, "sparsejit: ", name,
                       " must be float32, float64, bfloat16 or float16; got ", t);
  }
}

inline IndexKind index_kind(const at::Tensor& rowptr) {
  switch (rowptr.scalar_type()) {
    case at::kInt: return IndexKind::I32;
    case at::kLong: return IndexKind::I64;
    default:
      TORCH_CHECK_TYPE(false, "sparsejit: indptr must be int32 or int64; got ",
                       rowptr.scalar_type());
  }
}

// An uninitialized output tensor. On the CPU a large one is advised onto transparent huge
// pages before it is first written (csrc/core/huge_pages.h: SPARSEJIT_HUGE_PAGES).
inline at::Tensor new_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  at::Tensor t = at::empty(sizes, options);
  if (t.is_cpu()) advise_huge_pages(t.data_ptr(), t.nbytes());
  return t;
}
inline at::Tensor new_output_like(const at::Tensor& t) {
  return new_output(t.sizes(), t.options());
}

template <typename T>
T* ptr(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

// float16 inputs run through the float32 kernels: converted on the way in, the result
// converted back (accumulation in float32, like bfloat16). Other dtypes pass through.
inline at::Tensor half_as_float(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf ? t.to(at::kFloat) : t;
}
inline std::optional<at::Tensor> half_as_float(const std::optional<at::Tensor>& t) {
  if (!t.has_value()) return std::nullopt;
  return half_as_float(*t);
}

// The O(rows) invariants of a CSR structure handed to a raw op: indptr starts at 0, never
// decreases and ends at the number of stored entries. (Column indices are checked once, when
// a structure is built: sparsejit.SparseMatrix / the validate_csr op.)
inline void check_structure(const at::Tensor& rowptr, int64_t nnz, const char* op) {
  const at::Tensor rp = rowptr.device().is_cpu() ? rowptr.contiguous() : rowptr.cpu();
  const std::string err =
      plan::check_rowptr(index_kind(rp), rp.data_ptr(), rp.numel() - 1, nnz);
  TORCH_CHECK_VALUE(err.empty(), "sparsejit.", op, ": invalid indptr: ", err);
}

// num_cols from the schema: -1 means "not given" and takes the dense operand's rows (the
// structure's validation then checks every column against them).
inline int64_t resolve_num_cols(int64_t num_cols, const char* op, const at::Tensor& dense,
                                const char* dense_name) {
  if (num_cols >= 0) return num_cols;
  TORCH_CHECK_VALUE(num_cols == -1, "sparsejit.", op, ": num_cols must be >= 0 (or -1 to "
                    "take ", dense_name, "'s rows); got ", num_cols);
  TORCH_CHECK_VALUE(dense.dim() >= 1, "sparsejit.", op, ": ", dense_name,
                    " must have at least one dimension; got shape ", dense.sizes());
  return dense.size(0);
}

inline void check_index_pair(const at::Tensor& rowptr, const at::Tensor& col) {
  TORCH_CHECK_TYPE(rowptr.scalar_type() == at::kInt || rowptr.scalar_type() == at::kLong,
                   "sparsejit: indptr must be int32 or int64; got ", rowptr.scalar_type());
  TORCH_CHECK_TYPE(col.scalar_type() == rowptr.scalar_type(),
                   "sparsejit: indices dtype (", col.scalar_type(),
                   ") must match indptr dtype (", rowptr.scalar_type(), ")");
  TORCH_CHECK_VALUE(rowptr.dim() == 1 && col.dim() == 1,
                    "sparsejit: indptr and indices must be 1-D; got shapes ", rowptr.sizes(),
                    " and ", col.sizes());
  TORCH_CHECK_VALUE(rowptr.numel() >= 1, "sparsejit: indptr must have rows + 1 >= 1 entries");
  TORCH_CHECK_VALUE(rowptr.device() == col.device(), "sparsejit: indptr is on ", rowptr.device(),
                    " but indices is on ", col.device());
}

inline void check_float(const at::Tensor& t, const char* name) {
  const auto d = t.scalar_type();
  TORCH_CHECK_TYPE(d == at::kFloat || d == at::kDouble || d == at::kBFloat16 || d == at::kHalf,
                   "sparsejit: ", name, " must be float32, float64, bfloat16 or float16; got ",
                   d);
}

inline void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* an,
                              const char* bn) {
  TORCH_CHECK_VALUE(a.device() == b.device(), "sparsejit: ", an, " is on ", a.device(),
                    " but ", bn, " is on ", b.device());
}

struct SpmmShape {
  int64_t num_cols = 0;
  plan::StructureStamp stamp;
  int64_t rows, heads, features, value_heads;
  Reduce reduce;
  std::vector<int64_t> out_sizes;
};

inline SpmmShape check_spmm_args(const at::Tensor& rowptr, const at::Tensor& col,
                                 const std::optional<at::Tensor>& values, const at::Tensor& x,
                                 c10::string_view reduce, int64_t num_cols) {
  check_index_pair(rowptr, col);
  check_float(x, "X");
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(0) == num_cols, "sparsejit.spmm: X has ",
                    x.dim() >= 1 ? x.size(0) : 0, " rows but the sparse matrix has ", num_cols,
                    " columns");
  check_same_device(rowptr, x, "the sparse structure", "X");
  SpmmShape s;
  try {
    s.reduce = parse_reduce(std::string(reduce));
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, "sparsejit.spmm: ", e.what());
  }
  TORCH_CHECK_VALUE(x.dim() == 2 || x.dim() == 3,
                    "sparsejit.spmm: X must be [num_cols, F] or [num_cols, H, F]; got shape ",
                    x.sizes());
  s.rows = rowptr.numel() - 1;
  s.heads = x.dim() == 3 ? x.size(1) : 1;
  s.features = x.size(-1);
  s.value_heads = 0;
  const int64_t nnz = col.numel();
  if (values.has_value()) {
    const auto& v = *values;
    TORCH_CHECK_TYPE(v.scalar_type() == x.scalar_type(), "sparsejit.spmm: values dtype (",
                     v.scalar_type(), ") must match X dtype (", x.scalar_type(), ")");
    check_same_device(v, x, "values", "X");
    TORCH_CHECK_VALUE(v.size(0) == nnz && (v.dim() == 1 || v.dim() == 2),
                      "sparsejit.spmm: values must be [nnz] or [nnz, H] with nnz = ", nnz,
                      "; got shape ", v.sizes());
    if (v.dim() == 2) {
      TORCH_CHECK_VALUE(x.dim() == 3 && v.size(1) == s.heads,
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

inline SddmmShape check_sddmm_args(const at::Tensor& rowptr, const at::Tensor& col,
                                   const at::Tensor& q, const at::Tensor& k, int64_t num_cols) {
  check_index_pair(rowptr, col);
  check_float(q, "Q");
  check_float(k, "K");
  check_same_device(rowptr, q, "the sparse structure", "Q");
  check_same_device(q, k, "Q", "K");
  TORCH_CHECK_TYPE(q.scalar_type() == k.scalar_type(), "sparsejit.sddmm: Q dtype (",
                   q.scalar_type(), ") must match K dtype (", k.scalar_type(), ")");
  TORCH_CHECK_VALUE(q.dim() == k.dim() && (q.dim() == 2 || q.dim() == 3),
                    "sparsejit.sddmm: Q and K must both be [N, F] or both [N, H, F]; got ",
                    q.sizes(), " and ", k.sizes());
  TORCH_CHECK_VALUE(q.size(0) == rowptr.numel() - 1, "sparsejit.sddmm: Q has ", q.size(0),
                    " rows but the sparse matrix has ", rowptr.numel() - 1);
  TORCH_CHECK_VALUE(k.size(0) == num_cols, "sparsejit.sddmm: K has ", k.size(0),
                    " rows but the sparse matrix has ", num_cols, " columns");
  TORCH_CHECK_VALUE(q.sizes().slice(1) == k.sizes().slice(1),
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
inline int64_t check_edge_scores(const at::Tensor& rowptr, const at::Tensor& s,
                                 const char* name) {
  TORCH_CHECK_TYPE(rowptr.scalar_type() == at::kInt || rowptr.scalar_type() == at::kLong,
                   "sparsejit: indptr must be int32 or int64; got ", rowptr.scalar_type());
  check_float(s, name);
  check_same_device(rowptr, s, "indptr", name);
  TORCH_CHECK_VALUE(s.dim() == 1 || s.dim() == 2, "sparsejit.edge_softmax: ", name,
                    " must be [nnz] or [nnz, H]; got shape ", s.sizes());
  TORCH_CHECK_VALUE(rowptr.dim() == 1 && rowptr.numel() >= 1,
                    "sparsejit.edge_softmax: indptr must be 1-D with rows + 1 >= 1 entries; got "
                    "shape ", rowptr.sizes());
  check_structure(rowptr, s.size(0), "edge_softmax");
  return s.dim() == 2 ? s.size(1) : 1;
}

// A cached transpose handed to an op for its backward: sizes must fit the structure.
inline void check_transpose_args(const std::optional<at::Tensor>& t_rowptr,
                                 const std::optional<at::Tensor>& t_col,
                                 const std::optional<at::Tensor>& t_perm, const at::Tensor& col,
                                 int64_t num_cols, const char* op) {
  const int n = t_rowptr.has_value() + t_col.has_value() + t_perm.has_value();
  if (n == 0) return;
  TORCH_CHECK_VALUE(n == 3, "sparsejit.", op,
                    ": t_rowptr, t_col and t_perm must be given together");
  check_index_pair(*t_rowptr, *t_col);
  TORCH_CHECK_VALUE(t_rowptr->numel() == num_cols + 1, "sparsejit.", op, ": t_rowptr has ",
                    t_rowptr->numel(), " entries; the transpose of a matrix with ", num_cols,
                    " columns needs ", num_cols + 1);
  TORCH_CHECK_VALUE(t_col->numel() == col.numel() && t_perm->numel() == col.numel() &&
                        t_perm->dim() == 1,
                    "sparsejit.", op, ": t_col and t_perm must have nnz = ", col.numel(),
                    " entries; got ", t_col->sizes(), " and ", t_perm->sizes());
  TORCH_CHECK_TYPE(t_perm->scalar_type() == at::kInt || t_perm->scalar_type() == at::kLong,
                   "sparsejit.", op, ": t_perm must be int32 or int64; got ",
                   t_perm->scalar_type());
}

// The fused epilogue's activation, by name (shared by every backend).
inline cpu::Act parse_activation(c10::string_view name) {
  try {
    return sparsejit::parse_activation(std::string(name));
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, "sparsejit.spmm: ", e.what());
  }
}

// Every check of an spmm call (CPU and CUDA alike): arguments, then the structure (validated
// once per tensor version, see validated.h). num_cols = -1 takes X's rows.
inline SpmmShape check_spmm_call(const at::Tensor& rowptr, const at::Tensor& col,
                                 const std::optional<at::Tensor>& values, const at::Tensor& x,
                                 c10::string_view reduce, int64_t num_cols,
                                 const std::optional<at::Tensor>& t_rowptr,
                                 const std::optional<at::Tensor>& t_col,
                                 const std::optional<at::Tensor>& t_perm) {
  check_index_pair(rowptr, col);
  num_cols = resolve_num_cols(num_cols, "spmm", x, "X");
  SpmmShape s = check_spmm_args(rowptr, col, values, x, reduce, num_cols);
  check_transpose_args(t_rowptr, t_col, t_perm, col, num_cols, "spmm");
  s.num_cols = num_cols;
  s.stamp = checked_structure(rowptr, col, num_cols, "spmm");
  return s;
}

// The same for sddmm (num_cols = -1 takes K's rows).
inline SddmmShape check_sddmm_call(const at::Tensor& rowptr, const at::Tensor& col,
                                   const at::Tensor& q, const at::Tensor& k, int64_t num_cols,
                                   const std::optional<at::Tensor>& t_rowptr,
                                   const std::optional<at::Tensor>& t_col,
                                   const std::optional<at::Tensor>& t_perm) {
  check_index_pair(rowptr, col);
  num_cols = resolve_num_cols(num_cols, "sddmm", k, "K");
  SddmmShape s = check_sddmm_args(rowptr, col, q, k, num_cols);
  check_transpose_args(t_rowptr, t_col, t_perm, col, num_cols, "sddmm");
  s.num_cols = num_cols;
  s.stamp = checked_structure(rowptr, col, num_cols, "sddmm");
  return s;
}

}  // namespace sparsejit
