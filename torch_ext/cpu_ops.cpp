// CPU implementations of the sparsejit ops: argument checks, dtype dispatch, and calls into
// the Torch-free kernels in kernels/cpu.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "codegen/cpu_jit.h"
#include "codegen/disk_cache.h"
#include "csrc/core/csr.h"
#include "csrc/plan/spmm_plan.h"
#include "kernels/cpu/kernels.h"
#include "torch_ext/checks.h"

namespace sparsejit {
namespace {

template <typename F>
void dispatch_index(const at::Tensor& t, F&& f) {
  if (t.scalar_type() == at::kInt) {
    f(int32_t{});
  } else {
    f(int64_t{});
  }
}

// Calls f(T{}) with T the kernel scalar type matching `dtype`.
template <typename F>
void dispatch_float(at::ScalarType dtype, F&& f) {
  switch (dtype) {
    case at::kFloat: f(float{}); break;
    case at::kDouble: f(double{}); break;
    case at::kBFloat16: f(bf16{}); break;
    default: TORCH_CHECK_TYPE(false, "sparsejit: unsupported dtype ", dtype);
  }
}

template <typename T>
T* ptr(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

void validate_csr_cpu(const at::Tensor& rowptr, const at::Tensor& col, int64_t num_cols) {
  check_index_pair(rowptr, col);
  auto rp = rowptr.contiguous();
  auto cl = col.contiguous();
  dispatch_index(rp, [&](auto I) {
    using IT = decltype(I);
    auto r = validate_csr<IT>(ptr<IT>(rp), rp.numel(), ptr<IT>(cl), cl.numel(), num_cols);
    TORCH_CHECK_VALUE(r.ok, "sparsejit: invalid CSR structure: ", r.message);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> csr_transpose_cpu(const at::Tensor& rowptr,
                                                                 const at::Tensor& col,
                                                                 int64_t num_cols) {
  check_index_pair(rowptr, col);
  auto rp = rowptr.contiguous();
  auto cl = col.contiguous();
  const int64_t rows = rp.numel() - 1;
  auto t_rowptr = at::empty({num_cols + 1}, rp.options());
  auto t_col = at::empty({cl.numel()}, rp.options());
  auto t_perm = at::empty({cl.numel()}, rp.options());
  dispatch_index(rp, [&](auto I) {
    using IT = decltype(I);
    csr_transpose<IT>(ptr<IT>(rp), ptr<IT>(cl), rows, num_cols, ptr<IT>(t_rowptr), ptr<IT>(t_col),
                      ptr<IT>(t_perm));
  });
  return {t_rowptr, t_col, t_perm};
}

codegen::ScalarKind scalar_kind(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return codegen::ScalarKind::F64;
    case at::kBFloat16: return codegen::ScalarKind::BF16;
    default: return codegen::ScalarKind::F32;
  }
}

plan::SpmmPlan cost_model_plan(int64_t rows, int64_t cols, int64_t nnz, int64_t row_width,
                               at::ScalarType dtype) {
  return plan::choose_spmm(rows, cols, nnz, row_width, c10::elementSize(dtype),
                           codegen::CpuJit::instance().enabled());
}

at::Tensor spmm_plan_cpu(const at::Tensor& rowptr, int64_t num_cols, int64_t row_width,
                         at::ScalarType dtype) {
  const int64_t rows = rowptr.numel() - 1;
  const int64_t nnz = rows > 0 ? rowptr[rows].item<int64_t>() : 0;
  auto header = at::empty({plan::kPlanWords}, rowptr.options().dtype(at::kLong));
  plan::encode(cost_model_plan(rows, num_cols, nnz, row_width, dtype),
               header.data_ptr<int64_t>());
  return header;
}

std::tuple<at::Tensor, at::Tensor> spmm_cpu(
    const at::Tensor& rowptr, const at::Tensor& col, const std::optional<at::Tensor>& values,
    const at::Tensor& x, c10::string_view reduce, const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>& plan_header, const std::optional<at::Tensor>& bias,
    c10::string_view activation, double act_param, double scale, bool need_arg) {
  const SpmmShape s = check_spmm_args(rowptr, col, values, x, reduce);
  auto rp = rowptr.contiguous();
  auto cl = col.contiguous();
  auto xc = x.contiguous();
  at::Tensor vc = values.has_value() ? values->contiguous() : at::Tensor();
  auto out = at::empty(s.out_sizes, x.options());
  const bool with_arg = need_arg && (s.reduce == Reduce::Max || s.reduce == Reduce::Min);
  auto arg = with_arg ? at::empty(s.out_sizes, x.options().dtype(at::kLong))
                      : at::empty({0}, x.options().dtype(at::kLong));
  const int64_t row_width = s.heads * s.features;
  at::Tensor bc;
  if (bias.has_value()) {
    TORCH_CHECK_VALUE(bias->numel() == row_width, "sparsejit.spmm: bias has ", bias->numel(),
                      " elements but each output row has ", row_width);
    bc = bias->to(x.scalar_type()).contiguous();
  }
  cpu::SpmmArgs a;
  a.rows = s.rows;
  a.heads = s.heads;
  a.features = s.features;
  a.value_heads = s.value_heads;
  a.reduce = s.reduce;
  a.num_threads = at::get_num_threads();
  a.min_parallel_work = cpu::min_parallel_work();
  a.act = parse_activation(activation);
  a.act_param = static_cast<float>(act_param);
  a.scale = static_cast<float>(scale);
  a.bias = bc.defined() ? bc.data_ptr() : nullptr;

  plan::SpmmPlan p;
  at::Tensor h;  // keeps a bucketed plan's arrays alive for the call
  if (plan_header.has_value()) {
    h = plan_header->to(at::kCPU).to(at::kLong).contiguous();
    std::string err;
    TORCH_CHECK_VALUE(plan::decode(h.data_ptr<int64_t>(), h.numel(), &p, &err, s.rows,
                                   cl.numel()),
                      "sparsejit.spmm: ", err);
  } else {
    p = cost_model_plan(s.rows, x.size(0), cl.numel(), row_width, x.scalar_type());
  }
  const bool bucketed = p.kernel == plan::Kernel::Bucketed;
  at::Tensor pos;
  if (bucketed) {
    // The decomposed structure (int64) replaces the CSR arrays; values follow their entries.
    pos = at::from_blob(const_cast<int64_t*>(p.pos), {cl.numel()}, h.options());
    if (vc.defined()) vc = vc.index_select(0, pos);
    a.out_rows = p.row_map;
  }
  const bool idx32 = !bucketed && rp.scalar_type() == at::kInt;
  const void* rows_ptr = bucketed ? static_cast<const void*>(p.rowptr) : rp.data_ptr();
  const void* cols_ptr = bucketed ? static_cast<const void*>(p.col) : cl.data_ptr();
  codegen::SpmmFn fn = nullptr;
  if ((p.kernel == plan::Kernel::Jit || bucketed) && row_width > 0 &&
      row_width <= plan::kMaxJitRowWidth) {
    codegen::KernelSpec spec;
    spec.dtype = scalar_kind(x.scalar_type());
    spec.index = idx32 ? codegen::IndexKind::I32 : codegen::IndexKind::I64;
    spec.reduce = s.reduce;
    spec.value_mode = s.value_heads == 0 ? 0 : (s.value_heads == 1 ? 1 : 2);
    spec.heads = s.heads;
    spec.features = s.features;
    spec.act = a.act;
    spec.prefetch = p.prefetch;
    fn = codegen::CpuJit::instance().spmm(spec);
  }
  int64_t* arg_ptr = with_arg ? arg.data_ptr<int64_t>() : nullptr;
  if (fn != nullptr) {
    fn(&a, rows_ptr, cols_ptr, vc.defined() ? vc.data_ptr() : nullptr, xc.data_ptr(),
       out.data_ptr(), arg_ptr);
  } else {
    auto run = [&](auto I) {
      using IT = decltype(I);
      dispatch_float(x.scalar_type(), [&](auto V) {
        using T = decltype(V);
        cpu::spmm<T, IT>(a, static_cast<const IT*>(rows_ptr), static_cast<const IT*>(cols_ptr),
                         vc.defined() ? ptr<T>(vc) : nullptr, ptr<T>(xc), ptr<T>(out), arg_ptr);
      });
    };
    if (idx32) {
      run(int32_t{});
    } else {
      run(int64_t{});
    }
  }
  if (bucketed && with_arg && arg.numel() > 0 && pos.numel() > 0) {
    // Positions were found in the decomposed layout: map them back to CSR positions.
    arg = at::where(arg >= 0, pos.index({arg.clamp_min(0)}), arg);
  }
  return {out, arg};
}

at::Tensor spmm_bucketed_plan_cpu(const at::Tensor& rowptr, const at::Tensor& col,
                                  int64_t max_log2, int64_t prefetch) {
  check_index_pair(rowptr, col);
  TORCH_CHECK_VALUE(max_log2 >= 0 && max_log2 <= 20,
                    "sparsejit.spmm_bucketed_plan: max_log2 must be in [0, 20]; got ", max_log2);
  TORCH_CHECK_VALUE(prefetch >= 0 && prefetch <= 64,
                    "sparsejit.spmm_bucketed_plan: prefetch must be in [0, 64]; got ", prefetch);
  auto rp = rowptr.contiguous();
  auto cl = col.contiguous();
  const int64_t rows = rp.numel() - 1;
  auto words = at::empty({plan::bucketed_plan_words(rows, cl.numel())},
                         rp.options().dtype(at::kLong));
  dispatch_index(rp, [&](auto I) {
    using IT = decltype(I);
    plan::build_bucketed_plan<IT>(ptr<IT>(rp), ptr<IT>(cl), rows, static_cast<int>(max_log2),
                                  static_cast<int32_t>(prefetch), words.data_ptr<int64_t>());
  });
  return words;
}

at::Tensor sddmm_cpu(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& q,
                     const at::Tensor& k, const std::optional<at::Tensor>&,
                     const std::optional<at::Tensor>&, const std::optional<at::Tensor>&) {
  const SddmmShape s = check_sddmm_args(rowptr, col, q, k);
  auto rp = rowptr.contiguous();
  auto cl = col.contiguous();
  auto qc = q.contiguous();
  auto kc = k.contiguous();
  auto out = at::empty(s.out_sizes, q.options());
  const int64_t row_width = s.heads * s.features;
  std::string why;
  if (plan::sddmm_use_jit(cl.numel(), row_width, codegen::CpuJit::instance().enabled(), &why)) {
    codegen::KernelSpec spec;
    spec.op = codegen::OpKind::Sddmm;
    spec.dtype = scalar_kind(q.scalar_type());
    spec.index = rp.scalar_type() == at::kInt ? codegen::IndexKind::I32 : codegen::IndexKind::I64;
    spec.heads = s.heads;
    spec.features = s.features;
    if (codegen::SddmmFn fn = codegen::CpuJit::instance().sddmm(spec)) {
      cpu::SddmmArgs a;
      a.rows = s.rows;
      a.heads = s.heads;
      a.features = s.features;
      a.num_threads = at::get_num_threads();
      a.min_parallel_work = cpu::min_parallel_work();
      fn(&a, rp.data_ptr(), cl.data_ptr(), qc.data_ptr(), kc.data_ptr(), out.data_ptr());
      return out;
    }
  }
  dispatch_index(rp, [&](auto I) {
    using IT = decltype(I);
    dispatch_float(q.scalar_type(), [&](auto V) {
      using T = decltype(V);
      cpu::sddmm<T, IT>(s.rows, s.heads, s.features, ptr<IT>(rp), ptr<IT>(cl), ptr<T>(qc),
                        ptr<T>(kc), ptr<T>(out), at::get_num_threads());
    });
  });
  return out;
}

at::Tensor edge_softmax_cpu(const at::Tensor& rowptr, const at::Tensor& scores) {
  const int64_t heads = check_edge_scores(rowptr, scores, "scores");
  auto rp = rowptr.contiguous();
  auto sc = scores.contiguous();
  auto out = at::empty_like(sc);
  dispatch_index(rp, [&](auto I) {
    using IT = decltype(I);
    dispatch_float(sc.scalar_type(), [&](auto V) {
      using T = decltype(V);
      cpu::edge_softmax<T, IT>(rp.numel() - 1, heads, ptr<IT>(rp), ptr<T>(sc), ptr<T>(out),
                               at::get_num_threads());
    });
  });
  return out;
}

at::Tensor edge_softmax_backward_cpu(const at::Tensor& rowptr, const at::Tensor& y,
                                     const at::Tensor& grad) {
  const int64_t heads = check_edge_scores(rowptr, y, "y");
  TORCH_CHECK_VALUE(grad.sizes() == y.sizes(), "sparsejit.edge_softmax_backward: grad has shape ",
                    grad.sizes(), " but the softmax output has shape ", y.sizes());
  auto rp = rowptr.contiguous();
  auto yc = y.contiguous();
  auto gc = grad.to(y.scalar_type()).contiguous();
  auto out = at::empty_like(yc);
  dispatch_index(rp, [&](auto I) {
    using IT = decltype(I);
    dispatch_float(yc.scalar_type(), [&](auto V) {
      using T = decltype(V);
      cpu::edge_softmax_backward<T, IT>(rp.numel() - 1, heads, ptr<IT>(rp), ptr<T>(yc),
                                        ptr<T>(gc), ptr<T>(out), at::get_num_threads());
    });
  });
  return out;
}

}  // namespace

// JIT warnings (unwritable cache, failed compile) reach Python as UserWarning.
[[maybe_unused]] const bool kWarningsRouted = [] {
  codegen::set_warning_handler([](const std::string& msg) { TORCH_WARN(msg); });
  return true;
}();

TORCH_LIBRARY_IMPL(sparsejit, CPU, m) {
  m.impl("validate_csr", &validate_csr_cpu);
  m.impl("csr_transpose", &csr_transpose_cpu);
  m.impl("spmm", &spmm_cpu);
  m.impl("sddmm", &sddmm_cpu);
  m.impl("edge_softmax", &edge_softmax_cpu);
  m.impl("edge_softmax_backward", &edge_softmax_backward_cpu);
  m.impl("spmm_plan", &spmm_plan_cpu);
  m.impl("spmm_bucketed_plan", &spmm_bucketed_plan_cpu);
}

}  // namespace sparsejit
