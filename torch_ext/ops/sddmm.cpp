// SDDMM: S[p, h] = <Q[row(p), h, :], K[col(p), h, :]> for every stored entry p.
//
// Q is [rows, F] or [rows, H, F], K [num_cols, F] or [num_cols, H, F]; S is [nnz] or
// [nnz, H]. num_cols = -1 derives the column count from col (one pass). The t_* arguments
// carry a cached transpose for the backward pass (dK); forward never reads them.
#include "torch_ext/tensor_api.h"

#include "csrc/spmm/spmm_run.h"
#include "codegen/cuda_spmm.h"
#include "kernels/cpu/kernels.h"
#include "torch_ext/common.h"
#include "torch_ext/ops/spmm_checks.h"
#include "torch_ext/cuda_common.h"
#include "torch_ext/cuda_fallback.h"
#include "torch_ext/validated.h"

SJ_LIBRARY_FRAGMENT(m) {
  m.def(
      "sddmm(Tensor rowptr, Tensor col, Tensor q, Tensor k, SymInt num_cols=-1, "
      "Tensor? t_rowptr=None, Tensor? t_col=None, Tensor? t_perm=None) -> Tensor");
}

namespace sparsejit {
namespace {

tx::Tensor sddmm_cpu(const tx::Tensor& rowptr, const tx::Tensor& col, const tx::Tensor& q_in,
                     const tx::Tensor& k_in, int64_t num_cols,
                     const std::optional<tx::Tensor>& t_rowptr,
                     const std::optional<tx::Tensor>& t_col,
                     const std::optional<tx::Tensor>& t_perm) {
  const SddmmShape s =
      check_sddmm_call(rowptr, col, q_in, k_in, num_cols, t_rowptr, t_col, t_perm);
  num_cols = s.num_cols;
  auto rp = rowptr.contiguous();
  auto cl = col.contiguous();
  auto qc = half_as_float(q_in).contiguous();
  auto kc = half_as_float(k_in).contiguous();
  auto out = new_output(s.out_sizes, qc.options());
  plan::SddmmProblem p;
  p.dtype = scalar_kind(qc.scalar_type(), "Q");
  p.index = index_kind(rp);
  p.rowptr = rp.data_ptr();
  p.col = cl.data_ptr();
  p.q = qc.data_ptr();
  p.k = kc.data_ptr();
  p.s = out.data_ptr();
  p.nnz = cl.numel();
  p.args.rows = s.rows;
  p.args.heads = s.heads;
  p.args.features = s.features;
  p.args.num_threads = tx::get_num_threads();
  p.args.min_parallel_work = cpu::min_parallel_work();
  plan::run_sddmm(p);
  return q_in.scalar_type() == tx::kHalf ? out.to(tx::kHalf) : out;
}

#ifdef SPARSEJIT_WITH_CUDA
using namespace cuda_ext;

tx::Tensor sddmm_cuda(const tx::Tensor& rowptr, const tx::Tensor& col, const tx::Tensor& q,
                      const tx::Tensor& k, int64_t num_cols,
                      const std::optional<tx::Tensor>& t_rowptr,
                      const std::optional<tx::Tensor>& t_col,
                      const std::optional<tx::Tensor>& t_perm) {
  const SddmmShape s =
      check_sddmm_call(rowptr, col, q, k, num_cols, t_rowptr, t_col, t_perm);
  num_cols = s.num_cols;
  DeviceGuard guard(q.device());
  if (!gpu_kernels_available())
    return call_on_cpu<tx::Tensor>("sparsejit::sddmm", rowptr, col, q, k, num_cols, t_rowptr,
                                   t_col, t_perm);
  auto rp = rowptr.contiguous();
  auto cl = col.contiguous();
  auto qc = q.contiguous();
  auto kc = k.contiguous();
  const int64_t nnz = cl.numel();
  auto out = new_output(s.out_sizes, q.options());
  if (nnz == 0 || s.heads == 0) return out;
  if (s.features == 0) return out.zero_();
  const codegen::CudaSddmmSpec spec =
      codegen::plan_cuda_sddmm(cuda_scalar(q.scalar_type()), index_kind(rp), s.heads, s.features,
                               aligned_bytes({qc.data_ptr(), kc.data_ptr()}));
  const std::string invalid = spec.validate();
  SJ_CHECK_VALUE(invalid.empty(),
                    "sparsejit.sddmm (CUDA): no kernel for this problem: ", invalid);
  cuda::SddmmParams p{
      rp.data_ptr(), cl.data_ptr(), qc.data_ptr(), kc.data_ptr(), out.data_ptr(), s.rows, nnz};
  std::string err;
  if (!CudaKernels::instance().run(spec, q.get_device(), current_stream(),
                                   {codegen::plan_sddmm_launch(spec, nnz)}, &p, &err))
    raise_cuda_error("sddmm", err);
  return out;
}

#endif

}  // namespace

SJ_LIBRARY_IMPL(CPU, m) { m.impl("sddmm", SJ_KERNEL(&sddmm_cpu)); }

#ifdef SPARSEJIT_WITH_CUDA
SJ_LIBRARY_IMPL(CUDA, m) { m.impl("sddmm", SJ_KERNEL(&sddmm_cuda)); }
#endif

}  // namespace sparsejit
