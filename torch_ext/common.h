// What every op file of the Torch adapter shares: argument checks (SPARSEJIT_CHECK and the
// helpers below; each failure names the argument, what was expected and what was given), the mapping of Torch dtypes onto the
// kernels' scalar kinds (with an error for every other dtype), the compute type, float16
// handling and output allocation. A family's own checks live beside its op file
// (torch_ext/ops/spmm_checks.h for SpMM / SDDMM / edge softmax).
#pragma once

#include "torch_ext/tensor_api.h"

#include <cstdlib>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "csrc/core/huge_pages.h"
#include "kernels/common/types.h"
#include "torch_ext/validated.h"

// The one argument check of every op: raises ValueError "sparsejit.<op>: <message...>", the
// message streamed from the arguments after `cond` (each names the argument, what was
// expected and what was given). `op` is the schema name ("rgms", "filter_conv", ...).
#define SPARSEJIT_CHECK(op, cond, ...) SJ_CHECK_VALUE(cond, "sparsejit.", op, ": ", __VA_ARGS__)

namespace sparsejit {

// The dtype a family computes in: bfloat16 and float16 inputs run in float32 (converted on
// the way in, the result converted back) unless the family has native kernels for them.
inline tx::ScalarType compute_type(tx::ScalarType t) {
  return (t == tx::kHalf || t == tx::kBFloat16) ? tx::kFloat : t;
}

// The kernels' scalar kind of a Torch dtype; float16 is computed in float32 (see
// HalfAsFloat), so it never reaches this function.
inline ScalarKind scalar_kind(tx::ScalarType t, const char* name) {
  switch (t) {
    case tx::kFloat: return ScalarKind::F32;
    case tx::kDouble: return ScalarKind::F64;
    case tx::kBFloat16: return ScalarKind::BF16;
    default:
      SJ_CHECK_TYPE(false, "sparsejit: ", name,
                       " must be float32, float64, bfloat16 or float16; got ", t);
  }
}

inline IndexKind index_kind(const tx::Tensor& rowptr) {
  switch (rowptr.scalar_type()) {
    case tx::kInt: return IndexKind::I32;
    case tx::kLong: return IndexKind::I64;
    default:
      SJ_CHECK_TYPE(false, "sparsejit: indptr must be int32 or int64; got ",
                       rowptr.scalar_type());
  }
}

// An uninitialized output tensor. On the CPU a large one is advised onto transparent huge
// pages before it is first written (csrc/core/huge_pages.h: SPARSEJIT_HUGE_PAGES).
inline tx::Tensor new_output(tx::IntArrayRef sizes, const tx::TensorOptions& options) {
  tx::Tensor t = tx::empty(sizes, options);
  if (t.is_cpu()) advise_huge_pages(t.data_ptr(), t.nbytes());
  return t;
}
inline tx::Tensor new_output_like(const tx::Tensor& t) {
  return new_output(t.sizes(), t.options());
}

template <typename T>
T* ptr(const tx::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

// float16 inputs run through the float32 kernels: converted on the way in, the result
// converted back (accumulation in float32, like bfloat16). Other dtypes pass through.
inline tx::Tensor half_as_float(const tx::Tensor& t) {
  return t.scalar_type() == tx::kHalf ? t.to(tx::kFloat) : t;
}
inline std::optional<tx::Tensor> half_as_float(const std::optional<tx::Tensor>& t) {
  if (!t.has_value()) return std::nullopt;
  return half_as_float(*t);
}

// num_cols from the schema: -1 means "not given" and takes the dense operand's rows (the
// structure's validation then checks every column against them).
inline int64_t resolve_num_cols(int64_t num_cols, const char* op, const tx::Tensor& dense,
                                const char* dense_name) {
  if (num_cols >= 0) return num_cols;
  SJ_CHECK_VALUE(num_cols == -1, "sparsejit.", op, ": num_cols must be >= 0 (or -1 to "
                    "take ", dense_name, "'s rows); got ", num_cols);
  SJ_CHECK_VALUE(dense.dim() >= 1, "sparsejit.", op, ": ", dense_name,
                    " must have at least one dimension; got shape ", dense.sizes());
  return dense.size(0);
}

inline void check_index_pair(const tx::Tensor& rowptr, const tx::Tensor& col) {
  SJ_CHECK_TYPE(rowptr.scalar_type() == tx::kInt || rowptr.scalar_type() == tx::kLong,
                   "sparsejit: indptr must be int32 or int64; got ", rowptr.scalar_type());
  SJ_CHECK_TYPE(col.scalar_type() == rowptr.scalar_type(),
                   "sparsejit: indices dtype (", col.scalar_type(),
                   ") must match indptr dtype (", rowptr.scalar_type(), ")");
  SJ_CHECK_VALUE(rowptr.dim() == 1 && col.dim() == 1,
                    "sparsejit: indptr and indices must be 1-D; got shapes ", rowptr.sizes(),
                    " and ", col.sizes());
  SJ_CHECK_VALUE(rowptr.numel() >= 1, "sparsejit: indptr must have rows + 1 >= 1 entries");
  SJ_CHECK_VALUE(rowptr.device() == col.device(), "sparsejit: indptr is on ", rowptr.device(),
                    " but indices is on ", col.device());
}

inline void check_float(const tx::Tensor& t, const char* name) {
  const auto d = t.scalar_type();
  SJ_CHECK_TYPE(d == tx::kFloat || d == tx::kDouble || d == tx::kBFloat16 || d == tx::kHalf,
                   "sparsejit: ", name, " must be float32, float64, bfloat16 or float16; got ",
                   d);
}

inline void check_same_device(const tx::Tensor& a, const tx::Tensor& b, const char* an,
                              const char* bn) {
  SJ_CHECK_VALUE(a.device() == b.device(), "sparsejit: ", an, " is on ", a.device(),
                    " but ", bn, " is on ", b.device());
}

// A cached transpose handed to an op for its backward: sizes must fit the structure.
inline void check_transpose_args(const std::optional<tx::Tensor>& t_rowptr,
                                 const std::optional<tx::Tensor>& t_col,
                                 const std::optional<tx::Tensor>& t_perm, const tx::Tensor& col,
                                 int64_t num_cols, const char* op) {
  const int n = t_rowptr.has_value() + t_col.has_value() + t_perm.has_value();
  if (n == 0) return;
  SJ_CHECK_VALUE(n == 3, "sparsejit.", op,
                    ": t_rowptr, t_col and t_perm must be given together");
  check_index_pair(*t_rowptr, *t_col);
  SJ_CHECK_VALUE(t_rowptr->numel() == num_cols + 1, "sparsejit.", op, ": t_rowptr has ",
                    t_rowptr->numel(), " entries; the transpose of a matrix with ", num_cols,
                    " columns needs ", num_cols + 1);
  SJ_CHECK_VALUE(t_col->numel() == col.numel() && t_perm->numel() == col.numel() &&
                        t_perm->dim() == 1,
                    "sparsejit.", op, ": t_col and t_perm must have nnz = ", col.numel(),
                    " entries; got ", t_col->sizes(), " and ", t_perm->sizes());
  SJ_CHECK_TYPE(t_perm->scalar_type() == tx::kInt || t_perm->scalar_type() == tx::kLong,
                   "sparsejit.", op, ": t_perm must be int32 or int64; got ",
                   t_perm->scalar_type());
}

// ---- Device-generic builders (ATen ops only: what CUDA tensors run) ------------------------
// SPARSEJIT_STRUCTURE_ATEN=1: the CPU ops run these builders too (csr.cpp's structure ops,
// point_conv_plan, rgms_plan), which is how tests compare them with the counting sorts and merges.
inline bool structure_aten_forced() {
  const char* v = std::getenv("SPARSEJIT_STRUCTURE_ATEN");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

// Of an ascending 1-D tensor: bool [n], true where a run of equal values starts.
inline tx::Tensor run_starts(const tx::Tensor& sorted) {
  const int64_t n = sorted.numel();
  const auto b = sorted.options().dtype(tx::kLong);
  if (n <= 1) return tx::ones({n}, b) > 0;
  return tx::cat({tx::ones({1}, b) > 0, sorted.narrow(0, 1, n - 1) != sorted.narrow(0, 0, n - 1)});
}

// Of an ascending 1-D tensor: a 0-dim bool, whether two neighbours are equal.
inline tx::Tensor has_duplicates(const tx::Tensor& sorted) {
  const int64_t n = sorted.numel();
  if (n <= 1) return tx::zeros({}, sorted.options().dtype(tx::kLong)) > 0;
  return (sorted.narrow(0, 1, n - 1) == sorted.narrow(0, 0, n - 1)).any();
}

// Each query's position in a non-empty ascending 1-D tensor: (pos int64 in [0, n], hit bool:
// sorted[pos] == query).
inline std::pair<tx::Tensor, tx::Tensor> sorted_lookup(const tx::Tensor& sorted,
                                                       const tx::Tensor& queries) {
  const int64_t n = sorted.numel();
  const tx::Tensor pos = tx::searchsorted(sorted, queries);
  const tx::Tensor padded = tx::cat({sorted, sorted.narrow(0, n - 1, 1)});  // pos == n: a miss
  return {pos, padded.index_select(0, pos) == queries};
}

}  // namespace sparsejit
