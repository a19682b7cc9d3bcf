// Every sparsejit op schema, in one place. Implementations are registered per backend in
// cpu_ops.cpp (and cuda_ops.cpp when CUDA is built); fake (meta) implementations and
// autograd formulas live in python/sparsejit/_ops.py.
//
// Structure arguments come first (rowptr, col: int32 or int64, same dtype), then values,
// then dense operands. The optional t_* arguments carry a cached transpose of the structure
// (rowptr, col, perm) for the backward pass; forward never reads them.
#include <torch/library.h>

TORCH_LIBRARY(sparsejit, m) {
  m.def("validate_csr(Tensor rowptr, Tensor col, int num_cols) -> ()");
  m.def("csr_transpose(Tensor rowptr, Tensor col, int num_cols) -> (Tensor, Tensor, Tensor)");
  m.def(
      "spmm(Tensor rowptr, Tensor col, Tensor? values, Tensor x, str reduce, "
      "Tensor? t_rowptr=None, Tensor? t_col=None, Tensor? t_perm=None) -> (Tensor, Tensor)");
  m.def(
      "sddmm(Tensor rowptr, Tensor col, Tensor q, Tensor k, "
      "Tensor? t_rowptr=None, Tensor? t_col=None, Tensor? t_perm=None) -> Tensor");
  m.def("edge_softmax(Tensor rowptr, Tensor s) -> Tensor");
  m.def("edge_softmax_backward(Tensor rowptr, Tensor y, Tensor grad) -> Tensor");
}
