// pybind11 module `sparsejit._core`: the Torch-free parts Python needs that are not ops
// (structure statistics, fingerprints, build information). Takes numpy arrays.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "codegen/cpu_jit.h"
#include "codegen/disk_cache.h"
#include "csrc/core/csr.h"
#include "csrc/plan/spmm_plan.h"
#include "kernels/cpu/kernels.h"

namespace py = pybind11;

namespace {

template <typename I>
py::dict stats_impl(py::array_t<I, py::array::c_style> rowptr, int64_t cols) {
  const int64_t rows = static_cast<int64_t>(rowptr.size()) - 1;
  if (rows < 0) throw py::value_error("indptr must have at least one entry");
  sparsejit::RowStats s;
  {
    py::gil_scoped_release nogil;
    s = sparsejit::row_stats<I>(rowptr.data(), rows, cols);
  }
  py::dict d;
  d["rows"] = s.rows;
  d["cols"] = s.cols;
  d["nnz"] = s.nnz;
  d["empty_rows"] = s.empty_rows;
  d["max_row"] = s.max_row;
  d["mean_row"] = s.mean_row;
  d["std_row"] = s.std_row;
  d["skew"] = s.skew;
  d["log2_histogram"] = s.log2_histogram;
  return d;
}

template <typename I>
uint64_t fingerprint_impl(py::array_t<I, py::array::c_style> rowptr,
                          py::array_t<I, py::array::c_style> col, int64_t cols) {
  const int64_t rows = static_cast<int64_t>(rowptr.size()) - 1;
  py::gil_scoped_release nogil;
  return sparsejit::fingerprint<I>(rowptr.data(), rows, col.data(), col.size(), cols);
}

py::dict info_dict(const sparsejit::codegen::KernelSpec& spec,
                   const sparsejit::codegen::JitInfo& info, bool ok) {
  py::dict d;
  d["ok"] = ok;
  d["name"] = info.name;
  d["source_path"] = info.source_path;
  d["library_path"] = info.library_path;
  d["disk_hit"] = info.disk_hit;
  d["memory_hit"] = info.memory_hit;
  d["compile_ms"] = info.compile_ms;
  d["load_ms"] = info.load_ms;
  d["error"] = info.error;
  d["source"] = spec.source();
  return d;
}

py::dict jit_sddmm(int dtype, int index, int64_t heads, int64_t features) {
  using namespace sparsejit;
  codegen::KernelSpec spec;
  spec.op = codegen::OpKind::Sddmm;
  spec.dtype = static_cast<codegen::ScalarKind>(dtype);
  spec.index = static_cast<codegen::IndexKind>(index);
  spec.heads = heads;
  spec.features = features;
  codegen::JitInfo info;
  codegen::SddmmFn fn;
  {
    py::gil_scoped_release nogil;
    fn = codegen::CpuJit::instance().sddmm(spec, &info);
  }
  return info_dict(spec, info, fn != nullptr);
}

py::dict jit_spmm(int dtype, int index, const std::string& reduce, int value_mode, int64_t heads,
                  int64_t features, int act, int prefetch) {
  using namespace sparsejit;
  codegen::SpmmSpec spec;
  spec.dtype = static_cast<codegen::ScalarKind>(dtype);
  spec.index = static_cast<codegen::IndexKind>(index);
  spec.reduce = parse_reduce(reduce);
  spec.value_mode = value_mode;
  spec.heads = heads;
  spec.features = features;
  spec.act = static_cast<cpu::Act>(act);
  spec.prefetch = prefetch;
  codegen::JitInfo info;
  codegen::SpmmFn fn;
  {
    py::gil_scoped_release nogil;
    fn = codegen::CpuJit::instance().spmm(spec, &info);
  }
  return info_dict(spec, info, fn != nullptr);
}

py::dict choose_spmm(int64_t rows, int64_t cols, int64_t nnz, int64_t width, int64_t elem) {
  using namespace sparsejit;
  auto p = plan::choose_spmm(rows, cols, nnz, width, elem, codegen::CpuJit::instance().enabled());
  std::vector<int64_t> words(plan::kPlanWords);
  plan::encode(p, words.data());
  py::dict d;
  d["kernel"] = p.kernel == plan::Kernel::Jit ? "jit" : "generic";
  d["prefetch"] = p.prefetch;
  d["reason"] = p.reason;
  d["header"] = words;
  return d;
}

py::dict decode_plan(const std::vector<int64_t>& words) {
  using namespace sparsejit;
  if (words.size() >= 5 && words[0] == plan::kPlanMagic &&
      words[2] == static_cast<int64_t>(plan::Kernel::Bucketed)) {
    // A bucketed plan or just its recipe (what tune stores): the header words suffice.
    py::dict d;
    d["kernel"] = "bucketed";
    d["prefetch"] = words[3];
    d["max_log2"] = words[4];
    return d;
  }
  plan::SpmmPlan p;
  std::string err;
  if (!plan::decode(words.data(), static_cast<int64_t>(words.size()), &p, &err))
    throw py::value_error(err);
  py::dict d;
  d["kernel"] = p.kernel == plan::Kernel::Jit ? "jit" : "generic";
  d["prefetch"] = p.prefetch;
  return d;
}

std::vector<int64_t> encode_plan(const std::string& kernel, int prefetch, int max_log2) {
  using namespace sparsejit;
  plan::SpmmPlan p;
  if (kernel == "bucketed") {
    // The recipe only; sparsejit.ops.spmm_bucketed_plan builds the arrays for a structure.
    return {plan::kPlanMagic, 2, static_cast<int64_t>(plan::Kernel::Bucketed), prefetch,
            max_log2};
  }
  if (kernel == "jit") {
    p.kernel = plan::Kernel::Jit;
  } else if (kernel == "generic") {
    p.kernel = plan::Kernel::Generic;
  } else {
    throw py::value_error("kernel must be 'jit', 'generic' or 'bucketed'; got '" + kernel + "'");
  }
  p.prefetch = prefetch;
  std::vector<int64_t> words(plan::kPlanWords);
  plan::encode(p, words.data());
  return words;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "sparsejit core (Torch-free): structure statistics and fingerprints";
  m.def("row_stats", &stats_impl<int64_t>, py::arg("indptr"), py::arg("num_cols"));
  m.def("row_stats", &stats_impl<int32_t>, py::arg("indptr"), py::arg("num_cols"));
  m.def("fingerprint", &fingerprint_impl<int64_t>, py::arg("indptr"), py::arg("indices"),
        py::arg("num_cols"));
  m.def("fingerprint", &fingerprint_impl<int32_t>, py::arg("indptr"), py::arg("indices"),
        py::arg("num_cols"));
  using sparsejit::codegen::CpuJit;
  using sparsejit::codegen::DiskCache;
  m.def("jit_spmm", &jit_spmm, "Compiles (or finds) a specialized SpMM; returns what it did",
        py::arg("dtype"), py::arg("index"), py::arg("reduce"), py::arg("value_mode"),
        py::arg("heads"), py::arg("features"), py::arg("act"), py::arg("prefetch"));
  m.def("jit_sddmm", &jit_sddmm, "Compiles (or finds) a specialized SDDMM; returns what it did",
        py::arg("dtype"), py::arg("index"), py::arg("heads"), py::arg("features"));
  m.def("jit_enabled", [] { return CpuJit::instance().enabled(); });
  m.def("jit_refresh_env", [] {
    CpuJit::instance().refresh_env();
    DiskCache::instance().reset_root_from_env();
  });
  m.def("jit_clear_memory_cache", [] { CpuJit::instance().clear_memory_cache(); });
  m.def("compiler_command", [] { return CpuJit::instance().compiler_command(); });
  m.def("compiler_version", [] { return CpuJit::instance().compiler_version(); });
  m.def("cache_dir", [] { return DiskCache::instance().root(); });
  m.def("min_parallel_work", &sparsejit::cpu::min_parallel_work,
        "Below this much work ((rows + nnz) * row width) SpMM runs on one thread");
  m.def("set_min_parallel_work", &sparsejit::cpu::set_min_parallel_work, py::arg("work"));
  m.def("choose_spmm", &choose_spmm, py::arg("rows"), py::arg("cols"), py::arg("nnz"),
        py::arg("row_width"), py::arg("elem_size"));
  m.def("decode_plan", &decode_plan, py::arg("words"));
  m.def("encode_plan", &encode_plan, py::arg("kernel"), py::arg("prefetch"),
        py::arg("max_log2") = 3);
  m.attr("max_jit_row_width") = sparsejit::plan::kMaxJitRowWidth;
#ifdef _OPENMP
  m.attr("openmp") = true;
#else
  m.attr("openmp") = false;
#endif
}
