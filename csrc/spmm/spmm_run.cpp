#include "csrc/spmm/spmm_run.h"

#include <cstring>
#include <stdexcept>
#include <vector>

#include "codegen/cpu_jit.h"
#include "codegen/cpu_sddmm_spec.h"
#include "codegen/cpu_spmm_spec.h"
#include "csrc/spmm/spmm_plan.h"
#include "kernels/cpu/kernels.h"

namespace sparsejit::plan {
namespace {

int64_t elem_size(ScalarKind k) {
  switch (k) {
    case ScalarKind::F32: return 4;
    case ScalarKind::F64: return 8;
    case ScalarKind::BF16: return 2;
    default:
      throw std::invalid_argument(std::string("the CPU kernels have no scalar kind ") +
                                  scalar_name(k));
  }
}



// Calls f(T{}) for the kernel scalar type of `k`.
template <typename F>
void with_scalar(ScalarKind k, F&& f) {
  switch (k) {
    case ScalarKind::F32: f(float{}); return;
    case ScalarKind::F64: f(double{}); return;
    case ScalarKind::BF16: f(bf16{}); return;
    default:
      throw std::invalid_argument(std::string("the CPU kernels have no scalar kind ") +
                                  scalar_name(k));
  }
}

void run_generic_spmm(const SpmmProblem& p, const cpu::SpmmArgs& a, bool idx32,
                      const void* rowptr, const void* col, const void* values) {
  with_scalar(p.dtype, [&](auto V) {
    using T = decltype(V);
    if (idx32) {
      cpu::spmm<T, int32_t>(a, static_cast<const int32_t*>(rowptr),
                            static_cast<const int32_t*>(col), static_cast<const T*>(values),
                            static_cast<const T*>(p.x), static_cast<T*>(p.out), p.arg);
    } else {
      cpu::spmm<T, int64_t>(a, static_cast<const int64_t*>(rowptr),
                            static_cast<const int64_t*>(col), static_cast<const T*>(values),
                            static_cast<const T*>(p.x), static_cast<T*>(p.out), p.arg);
    }
  });
}

}  // namespace

StructureStamp stamp_of(IndexKind index, const void* rowptr, const void* col,
                        int64_t rows, int64_t cols) {
  if (index == IndexKind::I32)
    return stamp_structure(static_cast<const int32_t*>(rowptr), static_cast<const int32_t*>(col),
                           rows, cols);
  return stamp_structure(static_cast<const int64_t*>(rowptr), static_cast<const int64_t*>(col),
                         rows, cols);
}

void cost_model_plan(const StructureStamp& s, int64_t row_width, int64_t elem_size,
                     int64_t* words) {
  encode(choose_spmm(s.rows, s.cols, s.nnz, row_width, elem_size,
                     codegen::CpuJit::instance().enabled()),
         s, words);
}

std::string run_spmm(const SpmmProblem& p, const int64_t* plan_words, int64_t plan_len) {
  const cpu::SpmmArgs& args = p.args;
  const int64_t rows = args.rows;
  const int64_t row_width = args.heads * args.features;
  const StructureStamp& stamp = p.stamp;
  SpmmPlan plan;
  if (plan_words != nullptr) {
    std::string err;
    if (!decode(plan_words, plan_len, stamp, &plan, &err)) return err;
  } else {
    plan = choose_spmm(rows, p.num_cols, stamp.nnz, row_width, elem_size(p.dtype),
                       codegen::CpuJit::instance().enabled());
  }
  const bool bucketed = plan.kernel == Kernel::Bucketed;
  cpu::SpmmArgs a = args;
  const void* rowptr = p.rowptr;
  const void* col = p.col;
  const void* values = p.values;
  std::vector<char> gathered;  // values in the decomposed order (bucketed plans)
  if (bucketed) {
    rowptr = plan.rowptr;
    col = plan.col;
    a.out_rows = plan.row_map;
    if (values != nullptr) {
      const int64_t vh = args.value_heads, es = elem_size(p.dtype);
      gathered.resize(static_cast<size_t>(stamp.nnz * vh * es));
      const char* src = static_cast<const char*>(values);
      for (int64_t e = 0; e < stamp.nnz; ++e)
        std::memcpy(gathered.data() + e * vh * es, src + plan.pos[e] * vh * es,
                    static_cast<size_t>(vh * es));
      values = gathered.data();
    }
  }
  const bool idx32 = !bucketed && p.index == IndexKind::I32;
  codegen::EntryFn fn = nullptr;
  if ((plan.kernel == Kernel::Jit || bucketed) && row_width > 0 && row_width <= kMaxJitRowWidth) {
    codegen::CpuSpmmSpec spec;
    spec.dtype = p.dtype;
    spec.index = idx32 ? IndexKind::I32 : IndexKind::I64;
    spec.reduce = args.reduce;
    spec.value_mode = args.value_heads == 0 ? 0 : (args.value_heads == 1 ? 1 : 2);
    spec.heads = args.heads;
    spec.features = args.features;
    spec.act = args.act;
    spec.prefetch = plan.prefetch;
    fn = codegen::CpuJit::instance().lookup(spec);
  }
  if (fn != nullptr) {
    const cpu::SpmmLaunch launch{a, rowptr, col, values, p.x, p.out, p.arg};
    fn(&launch);
  } else {
    run_generic_spmm(p, a, idx32, rowptr, col, values);
  }
  if (bucketed && p.arg != nullptr) {
    // Positions were found in the decomposed layout: map them back to CSR positions.
    const int64_t n = rows * row_width;
    for (int64_t i = 0; i < n; ++i)
      if (p.arg[i] >= 0) p.arg[i] = plan.pos[p.arg[i]];
  }
  return "";
}

void run_sddmm(const SddmmProblem& p) {
  const cpu::SddmmArgs& a = p.args;
  const int64_t row_width = a.heads * a.features;
  std::string why;
  if (sddmm_use_jit(p.nnz, row_width, codegen::CpuJit::instance().enabled(), &why)) {
    codegen::CpuSddmmSpec spec;
    spec.dtype = p.dtype;
    spec.index = p.index;
    spec.heads = a.heads;
    spec.features = a.features;
    if (codegen::EntryFn fn = codegen::CpuJit::instance().lookup(spec)) {
      const cpu::SddmmLaunch launch{a, p.rowptr, p.col, p.q, p.k, p.s};
      fn(&launch);
      return;
    }
  }
  with_scalar(p.dtype, [&](auto V) {
    using T = decltype(V);
    auto go = [&](auto I) {
      using IT = decltype(I);
      cpu::sddmm<T, IT>(a.rows, a.heads, a.features, static_cast<const IT*>(p.rowptr),
                        static_cast<const IT*>(p.col), static_cast<const T*>(p.q),
                        static_cast<const T*>(p.k), static_cast<T*>(p.s), a.num_threads);
    };
    if (p.index == IndexKind::I32) {
      go(int32_t{});
    } else {
      go(int64_t{});
    }
  });
}

namespace {
template <typename I>
std::string check_rowptr_t(const I* rp, int64_t rows, int64_t nnz) {
  if (rows < 0) return "indptr is empty (it needs rows + 1 >= 1 entries)";
  if (rp[0] != 0) return "indptr[0] = " + std::to_string(rp[0]) + " (must be 0)";
  if (static_cast<int64_t>(rp[rows]) != nnz)
    return "indptr[" + std::to_string(rows) + "] = " + std::to_string(rp[rows]) +
           " but indices has " + std::to_string(nnz) + " entries";
  // Branch-free scan first (vectorizes); the position is searched only on failure.
  int64_t bad = 0;
  for (int64_t i = 0; i < rows; ++i) bad |= rp[i + 1] < rp[i];
  if (!bad) return "";
  for (int64_t i = 0; i < rows; ++i)
    if (rp[i + 1] < rp[i])
      return "indptr decreases at position " + std::to_string(i + 1) + " (" +
             std::to_string(rp[i]) + " -> " + std::to_string(rp[i + 1]) + ")";
  return "";
}
}  // namespace

std::string check_rowptr(IndexKind index, const void* rowptr, int64_t rows,
                         int64_t nnz) {
  return index == IndexKind::I32
             ? check_rowptr_t(static_cast<const int32_t*>(rowptr), rows, nnz)
             : check_rowptr_t(static_cast<const int64_t*>(rowptr), rows, nnz);
}

}  // namespace sparsejit::plan
