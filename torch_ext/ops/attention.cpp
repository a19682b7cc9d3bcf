// Fused sparse attention (kernels/cpu/attention_kernel.h): softmax over each target row's
// stored entries of a dot-product (Transformer) or additive (GAT) score, times V, in one pass
// with an online softmax; the backward recomputes the scores from the saved per-row
// log-sum-exp. float32 / float64 kernels; bfloat16 and float16 run in float32 (converted on
// the way in and out: O(N (H D + H Dv)) work, against the O(nnz H (D + Dv)) of the kernel).
//
// This file is the Torch adapter: schemas, argument checks, tensors to launch structs. The
// driver that picks the JIT-specialized or generic kernel and runs the passes is
// csrc/attention/attention_run.h.
#include "torch_ext/tensor_api.h"

#include <tuple>

#include "csrc/attention/attention_run.h"
#include "codegen/cpu_jit.h"
#include "codegen/cuda_attention.h"
#include "torch_ext/common.h"
#include "torch_ext/cuda_common.h"
#include "torch_ext/cuda_fallback.h"

SJ_LIBRARY_FRAGMENT(m) {
  // mode: 0 = dot (q, k: [N, H, D]), 1 = additive (q, k: [N, H, 1], LeakyReLU after the sum),
  // 2 = GATv2 (q, k: [N, H, D], score att . LeakyReLU(q_i + k_j), att: [H, D]).
  // bias: [nnz, H] added to the pre-activation score. Returns (out [rows, H, Dv], lse [rows, H]).
  m.def("sparse_attention(Tensor rowptr, Tensor col, Tensor q, Tensor k, Tensor v, "
        "Tensor? bias, int mode, float scale, float negative_slope, float dropout, int seed, "
        "Tensor? t_rowptr=None, Tensor? t_col=None, Tensor? t_perm=None, Tensor? att=None) "
        "-> (Tensor, Tensor)");
  m.def("sparse_attention_backward(Tensor rowptr, Tensor col, Tensor t_rowptr, Tensor t_col, "
        "Tensor t_perm, Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor out, Tensor lse, "
        "Tensor grad_out, int mode, float scale, float negative_slope, float dropout, int seed, "
        "bool need_q, bool need_k, bool need_v, bool need_bias, Tensor? att=None, "
        "bool need_att=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

namespace sparsejit {
namespace {

attention::Shape check_args(const tx::Tensor& rowptr, const tx::Tensor& col, const tx::Tensor& q,
                            const tx::Tensor& k, const tx::Tensor& v,
                            const std::optional<tx::Tensor>& bias, int64_t mode, double scale,
                            double negative_slope, double dropout, int64_t seed,
                            const std::optional<tx::Tensor>& att) {
  check_index_pair(rowptr, col);
  SPARSEJIT_CHECK("sparse_attention", mode >= 0 && mode <= 2,
                  "mode must be 0 (dot), 1 (additive) or 2 (GATv2); got ", mode);
  SPARSEJIT_CHECK("sparse_attention", (mode == 2) == att.has_value(),
                  "att must be given exactly in mode 2 (GATv2)");
  for (auto [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    check_float(*t, name);
    check_same_device(rowptr, *t, "indptr", name);
    SPARSEJIT_CHECK("sparse_attention", t->dim() == 3, name, " must be [N, H, D]; got shape ",
                    t->sizes());
  }
  if (att.has_value()) {  // after q's rank is known: att's shape is read from it
    check_float(*att, "att");
    check_same_device(rowptr, *att, "indptr", "att");
    SPARSEJIT_CHECK("sparse_attention",
                    att->dim() == 2 && att->size(0) == q.size(1) && att->size(1) == q.size(2),
                    "att must be [H, D] = [", q.size(1), ", ", q.size(2), "]; got ", att->sizes());
  }
  SPARSEJIT_CHECK("sparse_attention",
                  q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
                  "q, k and v must share a dtype; got ", q.scalar_type(), ", ", k.scalar_type(),
                  ", ", v.scalar_type());
  const int64_t rows = rowptr.numel() - 1, cols = k.size(0), heads = q.size(1);
  SPARSEJIT_CHECK("sparse_attention", q.size(0) == rows, "q has ", q.size(0),
                  " rows but the pattern has ", rows);
  SPARSEJIT_CHECK("sparse_attention", v.size(0) == cols, "v has ", v.size(0), " rows but k has ",
                  cols);
  SPARSEJIT_CHECK("sparse_attention", k.size(1) == heads && v.size(1) == heads,
                  "q, k and v must have the same number of "
                  "heads; got ",
                  q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  SPARSEJIT_CHECK("sparse_attention", q.size(2) == k.size(2),
                  "q and k must have the same head width; got ", q.sizes(), " and ", k.sizes());
  SPARSEJIT_CHECK("sparse_attention", mode != 1 || q.size(2) == 1,
                  "additive mode needs q and k of shape [N, H, 1]; got ", q.sizes());
  SPARSEJIT_CHECK("sparse_attention", dropout >= 0.0 && dropout < 1.0,
                  "dropout must be in [0, 1); got ", dropout);
  SPARSEJIT_CHECK("sparse_attention", std::isfinite(scale) && std::isfinite(negative_slope),
                  "scale and negative_slope must be finite");
  checked_structure(rowptr, col, cols, "sparse_attention");
  if (bias.has_value()) {
    check_float(*bias, "bias");
    check_same_device(rowptr, *bias, "indptr", "bias");
    SPARSEJIT_CHECK("sparse_attention",
                    bias->dim() == 2 && bias->size(0) == col.numel() && bias->size(1) == heads,
                    "bias must be [nnz, H] = [", col.numel(), ", ", heads, "]; got ",
                    bias->sizes());
  }
  SPARSEJIT_CHECK("sparse_attention", rowptr.device().is_cpu(),
                  "only CPU tensors are supported; got ", rowptr.device());
  return attention::Shape{rows, cols, heads, q.size(2), v.size(2),
                          static_cast<attention::Mode>(mode), scale, negative_slope, dropout,
                          uint64_t(seed), int(tx::get_num_threads())};
}

// The backward's own arguments (beside check_args'): the transpose and the saved tensors.
void check_backward_tensors(const attention::Shape& s, const tx::Tensor& rowptr,
                            const tx::Tensor& col, const tx::Tensor& t_rowptr,
                            const tx::Tensor& t_col, const tx::Tensor& t_perm,
                            const tx::Tensor& out_in, const tx::Tensor& lse_in,
                            const tx::Tensor& grad_in) {
  // Before check_transpose_args, whose messages call every index array "indptr" / "indices".
  SJ_CHECK_TYPE(t_rowptr.scalar_type() == rowptr.scalar_type() &&
                       t_col.scalar_type() == rowptr.scalar_type() &&
                       t_perm.scalar_type() == rowptr.scalar_type(),
                   "sparsejit.sparse_attention_backward: the transpose arrays t_rowptr, t_col "
                   "and t_perm must have the index dtype of indptr (", rowptr.scalar_type(),
                   "); got ", t_rowptr.scalar_type(), ", ", t_col.scalar_type(), " and ",
                   t_perm.scalar_type());
  check_transpose_args(t_rowptr, t_col, t_perm, col, s.cols, "sparse_attention_backward");
  checked_structure(t_rowptr, t_col, s.rows, "sparse_attention_backward");
  for (auto [t, name] : {std::pair{&out_in, "out"}, std::pair{&lse_in, "lse"},
                         std::pair{&grad_in, "grad_out"}}) {
    check_float(*t, name);
    check_same_device(rowptr, *t, "indptr", name);
  }
  for (auto [t, name] : {std::pair{&t_rowptr, "t_rowptr"}, std::pair{&t_col, "t_col"},
                         std::pair{&t_perm, "t_perm"}})
    check_same_device(rowptr, *t, "indptr", name);
  const std::vector<int64_t> out_sizes{s.rows, s.heads, s.v_width};
  SPARSEJIT_CHECK(
      "sparse_attention",
      out_in.sizes() == tx::IntArrayRef(out_sizes) && grad_in.sizes() == tx::IntArrayRef(out_sizes),
      "out and grad_out must be [rows, H, Dv] = ", tx::IntArrayRef(out_sizes), "; got ",
      out_in.sizes(), " and ", grad_in.sizes());
  SPARSEJIT_CHECK("sparse_attention",
                  lse_in.dim() == 2 && lse_in.size(0) == s.rows && lse_in.size(1) == s.heads,
                  "lse must be [rows, H]; got ", lse_in.sizes());
}

tx::Tensor prep(const tx::Tensor& t, tx::ScalarType ct) { return t.to(ct).contiguous(); }

std::optional<tx::Tensor> prep(const std::optional<tx::Tensor>& t, tx::ScalarType ct) {
  if (!t.has_value()) return std::nullopt;
  return prep(*t, ct);
}

ScalarKind scalar_kind(tx::ScalarType t) {
  return t == tx::kDouble ? ScalarKind::F64 : t == tx::kBFloat16 ? ScalarKind::BF16 : ScalarKind::F32;
}

IndexKind index_kind(const tx::Tensor& rowptr) {
  return rowptr.scalar_type() == tx::kInt ? IndexKind::I32 : IndexKind::I64;
}

std::tuple<tx::Tensor, tx::Tensor> sparse_attention_cpu(
    const tx::Tensor& rowptr, const tx::Tensor& col, const tx::Tensor& q_in,
    const tx::Tensor& k_in, const tx::Tensor& v_in, const std::optional<tx::Tensor>& bias_in,
    int64_t mode, double scale, double negative_slope, double dropout, int64_t seed,
    const std::optional<tx::Tensor>&, const std::optional<tx::Tensor>&,
    const std::optional<tx::Tensor>&, const std::optional<tx::Tensor>& att_in) {
  auto s = check_args(rowptr, col, q_in, k_in, v_in, bias_in, mode, scale, negative_slope,
                      dropout, seed, att_in);
  const auto ct = compute_type(q_in.scalar_type());
  auto rp = rowptr.contiguous(), cl = col.contiguous();
  auto bias = prep(bias_in, ct);
  auto att = prep(att_in, ct);
  if (att.has_value()) s.att = att->data_ptr();
  // bfloat16 q, k, v: read and written in bfloat16 by the JIT's forward-only kernel (float32
  // accumulation; the same bits as the float32 kernel on the widened inputs, rounded once).
  const codegen::EntryFn bf16_fn = q_in.scalar_type() == tx::kBFloat16
                                       ? attention::jit_entry(ScalarKind::BF16, index_kind(rp), s,
                                                              col.numel())
                                       : nullptr;
  const auto st = bf16_fn ? tx::kBFloat16 : ct;  // storage of q, k, v and out
  auto q = prep(q_in, st), k = prep(k_in, st), v = prep(v_in, st);
  auto out = new_output({s.rows, s.heads, s.v_width}, q.options());
  auto lse = tx::empty({s.rows, s.heads}, q.options().dtype(ct));
  attention::AttentionLaunch l;
  l.shape = s;
  l.phase = attention::Phase::Forward;
  l.rowptr = rp.data_ptr();
  l.col = cl.data_ptr();
  l.nnz = col.numel();
  l.q = q.data_ptr();
  l.k = k.data_ptr();
  l.v = v.data_ptr();
  l.bias = bias.has_value() ? bias->data_ptr() : nullptr;
  l.out = out.data_ptr();
  l.lse_out = lse.data_ptr();
  if (bf16_fn) {
    bf16_fn(&l);
    return {out, lse};
  }
  attention::launch(scalar_kind(ct), index_kind(rp), col.numel(), {&l});
  // lse stays in the computation dtype: the backward needs it at full precision.
  return {out.to(q_in.scalar_type()), lse};
}

std::tuple<tx::Tensor, tx::Tensor, tx::Tensor, tx::Tensor, tx::Tensor>
sparse_attention_backward_cpu(
    const tx::Tensor& rowptr, const tx::Tensor& col, const tx::Tensor& t_rowptr,
    const tx::Tensor& t_col, const tx::Tensor& t_perm, const tx::Tensor& q_in,
    const tx::Tensor& k_in, const tx::Tensor& v_in, const std::optional<tx::Tensor>& bias_in,
    const tx::Tensor& out_in, const tx::Tensor& lse_in, const tx::Tensor& grad_in, int64_t mode,
    double scale, double negative_slope, double dropout, int64_t seed, bool need_q, bool need_k,
    bool need_v, bool need_bias, const std::optional<tx::Tensor>& att_in, bool need_att) {
  auto s = check_args(rowptr, col, q_in, k_in, v_in, bias_in, mode, scale, negative_slope,
                      dropout, seed, att_in);
  check_backward_tensors(s, rowptr, col, t_rowptr, t_col, t_perm, out_in, lse_in, grad_in);
  const auto ct = compute_type(q_in.scalar_type());
  auto rp = rowptr.contiguous(), cl = col.contiguous();
  auto trp = t_rowptr.contiguous(), tcl = t_col.contiguous(), tpm = t_perm.contiguous();
  auto q = prep(q_in, ct), k = prep(k_in, ct), v = prep(v_in, ct);
  auto bias = prep(bias_in, ct);
  auto att = prep(att_in, ct);
  if (att.has_value()) s.att = att->data_ptr();
  const bool want_att = need_att && att.has_value();
  auto datt = want_att ? tx::empty_like(*att) : tx::Tensor();
  auto out = prep(out_in, ct), lse = prep(lse_in, ct), g = prep(grad_in, ct);
  auto delta = tx::empty({s.rows, s.heads}, q.options());
  auto dq = need_q ? new_output_like(q) : tx::Tensor();
  auto dk = need_k ? new_output_like(k) : tx::Tensor();
  auto dv = need_v ? new_output_like(v) : tx::Tensor();
  const bool want_bias = need_bias && bias.has_value();
  auto db = want_bias ? tx::empty({col.numel(), s.heads}, q.options()) : tx::Tensor();
  auto p_or_null = [](const tx::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; };
  attention::AttentionLaunch base;
  base.shape = s;
  base.rowptr = rp.data_ptr();
  base.col = cl.data_ptr();
  base.t_rowptr = trp.data_ptr();
  base.t_col = tcl.data_ptr();
  base.t_perm = tpm.data_ptr();
  base.nnz = col.numel();
  base.q = q.data_ptr();
  base.k = k.data_ptr();
  base.v = v.data_ptr();
  base.bias = bias.has_value() ? bias->data_ptr() : nullptr;
  base.lse = lse.data_ptr();
  base.delta = delta.data_ptr();
  base.dout = g.data_ptr();
  base.out = out.data_ptr();
  attention::AttentionLaunch row_delta = base, rows = base, cols = base;
  row_delta.phase = attention::Phase::RowDelta;
  row_delta.delta_out = delta.data_ptr();
  rows.phase = attention::Phase::BackwardRows;
  rows.dq = p_or_null(dq);
  rows.dbias = p_or_null(db);
  rows.datt = p_or_null(datt);
  cols.phase = attention::Phase::BackwardCols;
  cols.dk = p_or_null(dk);
  cols.dv = p_or_null(dv);
  const bool run_cols = need_k || need_v;
  // The pass over targets keeps every entry's dz and probability ([nnz, H] each; dz is dbias
  // itself when asked for) for the pass over sources, which then skips score, exp and
  // <dout, v>: the backward computes each entry's softmax terms once.
  tx::Tensor dz_keep, pk_keep;
  if (run_cols) {
    dz_keep = want_bias ? db : tx::empty({col.numel(), s.heads}, q.options());
    pk_keep = tx::empty({col.numel(), s.heads}, q.options());
    rows.dz = cols.dz = dz_keep.data_ptr();
    rows.pk = cols.pk = pk_keep.data_ptr();
  }
  if (run_cols)
    attention::launch(scalar_kind(ct), index_kind(rp), col.numel(), {&row_delta, &rows, &cols});
  else if (need_q || want_bias || want_att)
    attention::launch(scalar_kind(ct), index_kind(rp), col.numel(), {&row_delta, &rows});
  const bool bad_perm = cols.bad_perm;
  // t_perm is checked where it is read (no separate O(nnz) pass per call).
  SPARSEJIT_CHECK("sparse_attention", !bad_perm, "t_perm holds positions outside [0, nnz)");
  auto back = [&](const tx::Tensor& t, const tx::Tensor& like) {
    // Gradients not asked for come back empty (an op cannot return undefined tensors).
    return t.defined() ? t.to(like.scalar_type()) : tx::empty({0}, like.options());
  };
  return {back(dq, q_in), back(dk, k_in), back(dv, v_in),
          want_bias ? db.to(bias_in->scalar_type()) : tx::empty({0}, q_in.options()),
          want_att ? datt.to(att_in->scalar_type()) : tx::empty({0}, q_in.options())};
}

#ifdef SPARSEJIT_WITH_CUDA
// ---- CUDA (kernels/cuda/attention.cuh) -------------------------------------------------------
// float32 / float64 kernels; float16 and bfloat16 run in float32 (converted in and out, as on
// the CPU). Host synchronisations: the structure's first validation (validated.h, once per
// structure) and, in the backward, one read of the bad-t_perm flag. Shapes no kernel takes
// (a head wider than 1024) run on the CPU through the fallback.
using namespace cuda_ext;

codegen::CudaAttentionSpec cuda_attention_spec(const attention::Shape& s, tx::ScalarType ct,
                                            const tx::Tensor& rp, bool bias, bool backward) {
  return codegen::plan_cuda_attention(cuda_scalar(ct), index_kind(rp), s.heads, s.qk_width,
                                      s.v_width, static_cast<int32_t>(s.mode), bias, backward);
}

cuda::AttentionParams cuda_attention_params(const attention::Shape& s, const tx::Tensor& rp,
                                            const tx::Tensor& cl, const tx::Tensor& q,
                                            const tx::Tensor& k, const tx::Tensor& v,
                                            const std::optional<tx::Tensor>& bias,
                                            const std::optional<tx::Tensor>& att) {
  cuda::AttentionParams p{};
  p.rowptr = rp.data_ptr();
  p.col = cl.data_ptr();
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.bias = bias.has_value() ? bias->data_ptr() : nullptr;
  p.att = att.has_value() ? att->data_ptr() : nullptr;
  p.rows = s.rows;
  p.cols = s.cols;
  p.nnz = cl.numel();
  p.scale = s.scale;
  p.negative_slope = s.negative_slope;
  p.dropout = s.dropout;
  p.seed = s.seed;
  return p;
}

std::tuple<tx::Tensor, tx::Tensor> sparse_attention_cuda(
    const tx::Tensor& rowptr, const tx::Tensor& col, const tx::Tensor& q_in,
    const tx::Tensor& k_in, const tx::Tensor& v_in, const std::optional<tx::Tensor>& bias_in,
    int64_t mode, double scale, double negative_slope, double dropout, int64_t seed,
    const std::optional<tx::Tensor>& t_rowptr, const std::optional<tx::Tensor>& t_col,
    const std::optional<tx::Tensor>& t_perm, const std::optional<tx::Tensor>& att_in) {
  auto s = check_args(rowptr, col, q_in, k_in, v_in, bias_in, mode, scale, negative_slope,
                      dropout, seed, att_in);
  DeviceGuard guard(q_in.device());
  const auto ct = compute_type(q_in.scalar_type());
  auto rp = rowptr.contiguous(), cl = col.contiguous();
  const auto spec = cuda_attention_spec(s, ct, rp, bias_in.has_value(), false);
  if (!gpu_kernels_available() || !spec.validate().empty())
    return call_on_cpu<std::tuple<tx::Tensor, tx::Tensor>>(
        "sparsejit::sparse_attention", rowptr, col, q_in, k_in, v_in, bias_in, mode, scale,
        negative_slope, dropout, seed, t_rowptr, t_col, t_perm, att_in);
  auto q = prep(q_in, ct), k = prep(k_in, ct), v = prep(v_in, ct);
  auto bias = prep(bias_in, ct), att = prep(att_in, ct);
  auto out = tx::empty({s.rows, s.heads, s.v_width}, q.options());
  auto lse = tx::empty({s.rows, s.heads}, q.options());
  if (s.rows > 0 && s.heads > 0) {
    cuda::AttentionParams p = cuda_attention_params(s, rp, cl, q, k, v, bias, att);
    p.out = out.data_ptr();
    p.lse = lse.data_ptr();
    std::string err;
    if (!CudaKernels::instance().run(spec, q.get_device(),
                                     current_stream(),
                                     codegen::plan_attention_launch(spec, s.rows, s.cols), &p,
                                     &err))
      raise_cuda_error("sparse_attention", err);
  }
  return {out.to(q_in.scalar_type()), lse};
}

std::tuple<tx::Tensor, tx::Tensor, tx::Tensor, tx::Tensor, tx::Tensor>
sparse_attention_backward_cuda(
    const tx::Tensor& rowptr, const tx::Tensor& col, const tx::Tensor& t_rowptr,
    const tx::Tensor& t_col, const tx::Tensor& t_perm, const tx::Tensor& q_in,
    const tx::Tensor& k_in, const tx::Tensor& v_in, const std::optional<tx::Tensor>& bias_in,
    const tx::Tensor& out_in, const tx::Tensor& lse_in, const tx::Tensor& grad_in, int64_t mode,
    double scale, double negative_slope, double dropout, int64_t seed, bool need_q, bool need_k,
    bool need_v, bool need_bias, const std::optional<tx::Tensor>& att_in, bool need_att) {
  using Grads = std::tuple<tx::Tensor, tx::Tensor, tx::Tensor, tx::Tensor, tx::Tensor>;
  auto s = check_args(rowptr, col, q_in, k_in, v_in, bias_in, mode, scale, negative_slope,
                      dropout, seed, att_in);
  DeviceGuard guard(q_in.device());
  const auto ct = compute_type(q_in.scalar_type());
  auto rp = rowptr.contiguous(), cl = col.contiguous();
  const auto spec = cuda_attention_spec(s, ct, rp, bias_in.has_value(), true);
  if (!gpu_kernels_available() || !spec.validate().empty())
    return call_on_cpu<Grads>("sparsejit::sparse_attention_backward", rowptr, col, t_rowptr,
                              t_col, t_perm, q_in, k_in, v_in, bias_in, out_in, lse_in, grad_in,
                              mode, scale, negative_slope, dropout, seed, need_q, need_k, need_v,
                              need_bias, att_in, need_att);
  check_backward_tensors(s, rowptr, col, t_rowptr, t_col, t_perm, out_in, lse_in, grad_in);
  auto q = prep(q_in, ct), k = prep(k_in, ct), v = prep(v_in, ct);
  auto bias = prep(bias_in, ct), att = prep(att_in, ct);
  auto out = prep(out_in, ct), lse = prep(lse_in, ct), g = prep(grad_in, ct);
  auto trp = t_rowptr.contiguous(), tcl = t_col.contiguous(), tpm = t_perm.contiguous();
  const int64_t nnz = cl.numel();
  const bool want_bias = need_bias && bias.has_value(), want_att = need_att && att.has_value();
  auto delta = (out * g).sum(-1);  // <out, dout> per (row, head)
  auto dq = tx::zeros_like(q), dk = tx::zeros_like(k), dv = tx::zeros_like(v);
  auto dz = tx::empty({nnz, s.heads}, q.options()), pk = tx::empty({nnz, s.heads}, q.options());
  auto datt_rows = want_att ? tx::empty_like(q) : tx::Tensor();
  auto bad = tx::zeros({1}, q.options().dtype(tx::kInt));
  if (s.heads > 0 && (s.rows > 0 || s.cols > 0)) {
    cuda::AttentionParams p = cuda_attention_params(s, rp, cl, q, k, v, bias, att);
    p.t_rowptr = trp.data_ptr();
    p.t_col = tcl.data_ptr();
    p.t_perm = tpm.data_ptr();
    p.lse_in = lse.data_ptr();
    p.delta = delta.data_ptr();
    p.dout = g.data_ptr();
    p.dq = need_q ? dq.data_ptr() : nullptr;
    p.dk = need_k ? dk.data_ptr() : nullptr;
    p.dv = need_v ? dv.data_ptr() : nullptr;
    p.dbias = want_bias ? dz.data_ptr() : nullptr;  // dbias is dz itself
    p.datt_rows = want_att ? datt_rows.data_ptr() : nullptr;
    p.dz = dz.data_ptr();
    p.pk = pk.data_ptr();
    p.bad_perm = static_cast<int*>(bad.data_ptr());
    std::string err;
    if (!CudaKernels::instance().run(spec, q.get_device(),
                                     current_stream(),
                                     codegen::plan_attention_launch(spec, s.rows, s.cols), &p,
                                     &err))
      raise_cuda_error("sparse_attention_backward", err);
    // The one host read of the backward.
    SPARSEJIT_CHECK("sparse_attention", bad.item<int>() == 0,
                    "t_perm holds positions outside [0, nnz)");
  }
  auto back = [&](bool want, const tx::Tensor& t, const tx::Tensor& like) {
    return want ? t.to(like.scalar_type()) : tx::empty({0}, like.options());
  };
  return {back(need_q, dq, q_in), back(need_k, dk, k_in), back(need_v, dv, v_in),
          want_bias ? dz.to(bias_in->scalar_type()) : tx::empty({0}, q_in.options()),
          want_att ? datt_rows.sum(0).to(att_in->scalar_type())
                   : tx::empty({0}, q_in.options())};
}
#endif

}  // namespace

SJ_LIBRARY_IMPL(CPU, m) {
  m.impl("sparse_attention", SJ_KERNEL(&sparse_attention_cpu));
  m.impl("sparse_attention_backward", SJ_KERNEL(&sparse_attention_backward_cpu));
}

#ifdef SPARSEJIT_WITH_CUDA
SJ_LIBRARY_IMPL(CUDA, m) {
  m.impl("sparse_attention", SJ_KERNEL(&sparse_attention_cuda));
  m.impl("sparse_attention_backward", SJ_KERNEL(&sparse_attention_backward_cuda));
}
#endif

}  // namespace sparsejit
