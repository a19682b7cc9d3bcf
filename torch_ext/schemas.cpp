// Every sparsejit op schema, in one place. Implementations are registered per backend in
// cpu_ops.cpp (and cuda_ops.cpp when CUDA is built); fake (meta) implementations and
// autograd formulas live in python/sparsejit/_ops.py.
//
// Structure arguments come first (rowptr, col: int32 or int64, same dtype), then values,
// then dense operands. The optional t_* arguments carry a cached transpose of the structure
// (rowptr, col, perm) for the backward pass; forward never reads them. `plan` is an int64
// plan header (csrc/plan/spmm_plan.h); without one the cost model picks the kernel. The
// epilogue computes activation(scale * reduced + bias) in the output write. For max / min
// the second output holds the CSR position of each extremum (the gradient's routing) when
// need_arg is true, and is empty otherwise (inference skips that work).
#include <torch/library.h>

TORCH_LIBRARY(sparsejit, m) {
  m.def("validate_csr(Tensor rowptr, Tensor col, int num_cols) -> ()");
  m.def("csr_transpose(Tensor rowptr, Tensor col, int num_cols) -> (Tensor, Tensor, Tensor)");
  m.def(
      "spmm(Tensor rowptr, Tensor col, Tensor? values, Tensor x, str reduce, "
      "Tensor? t_rowptr=None, Tensor? t_col=None, Tensor? t_perm=None, Tensor? plan=None, "
      "Tensor? bias=None, str activation=\"none\", float act_param=0.01, float scale=1.0, "
      "bool need_arg=True) "
      "-> (Tensor, Tensor)");
  m.def(
      "sddmm(Tensor rowptr, Tensor col, Tensor q, Tensor k, "
      "Tensor? t_rowptr=None, Tensor? t_col=None, Tensor? t_perm=None) -> Tensor");
  m.def("edge_softmax(Tensor rowptr, Tensor s) -> Tensor");
  m.def("edge_softmax_backward(Tensor rowptr, Tensor y, Tensor grad) -> Tensor");
  // Plan for spmm chosen by the cost model, as a header tensor (for explain / caching).
  m.def("spmm_plan(Tensor rowptr, int num_cols, int row_width, ScalarType dtype) -> Tensor");
  // A Bucketed spmm plan: rows regrouped by length (csrc/plan/spmm_plan.h), as one tensor.
  m.def("spmm_bucketed_plan(Tensor rowptr, Tensor col, int max_log2=3, int prefetch=0) -> Tensor");
}
