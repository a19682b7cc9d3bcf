// pybind11 module `sparsejit._core`: the Torch-free parts Python needs that are not ops
// (structure statistics, fingerprints, build information). Takes numpy arrays.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "csrc/core/huge_pages.h"
#include "csrc/core/isa.h"
#include "csrc/core/owned.h"
#include "codegen/cpu_attention_spec.h"
#include "codegen/cpu_point_conv_spec.h"
#include "codegen/cpu_jit.h"
#include "codegen/cpu_row_tile_spec.h"
#include "codegen/cpu_sddmm_spec.h"
#include "codegen/cpu_spmm_spec.h"
#include "codegen/disk_cache.h"
#include "csrc/core/csr.h"
#include "csrc/dense/gemm.h"
#include "csrc/rgms/rgms_run.h"
#include "csrc/plan/plan_header.h"
#include "csrc/point_conv/plan_layout.h"
#include "csrc/point_conv/point_conv_run.h"
#include "csrc/rgms/plan_layout.h"
#include "csrc/spmm/spmm_plan.h"
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

py::dict info_dict(const sparsejit::codegen::KernelSpecBase& spec,
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

// Compiles (or finds) `spec` with the GIL released; what the JIT did, as a dict.
py::dict jit_lookup(const sparsejit::codegen::KernelSpecBase& spec) {
  sparsejit::codegen::JitInfo info;
  sparsejit::codegen::EntryFn fn;
  {
    py::gil_scoped_release nogil;
    fn = sparsejit::codegen::CpuJit::instance().lookup(spec, &info);
  }
  return info_dict(spec, info, fn != nullptr);
}

py::dict jit_sddmm(int dtype, int index, int64_t heads, int64_t features) {
  using namespace sparsejit;
  codegen::CpuSddmmSpec spec;
  spec.dtype = static_cast<ScalarKind>(dtype);
  spec.index = static_cast<IndexKind>(index);
  spec.heads = heads;
  spec.features = features;
  return jit_lookup(spec);
}

py::dict jit_row_tile(int dtype, int64_t width, int64_t width2) {
  using namespace sparsejit;
  codegen::CpuRowTileSpec spec;
  spec.dtype = static_cast<ScalarKind>(dtype);
  spec.width = width;
  spec.width2 = width2;
  return jit_lookup(spec);
}

py::dict jit_point_conv(int dtype, int64_t c_in, int64_t c_out, int64_t rows) {
  using namespace sparsejit;
  codegen::CpuPointConvSpec spec;
  spec.dtype = static_cast<ScalarKind>(dtype);
  spec.c_in = c_in;
  spec.c_out = c_out;
  spec.rows = rows;
  return jit_lookup(spec);
}

py::dict jit_attention(int dtype, int index, int mode, int64_t heads, int64_t qk_width,
                       int64_t v_width) {
  using namespace sparsejit;
  codegen::CpuAttentionSpec spec;
  spec.dtype = static_cast<ScalarKind>(dtype);
  spec.index = static_cast<IndexKind>(index);
  spec.mode = static_cast<attention::Mode>(mode);
  spec.heads = heads;
  spec.qk_width = qk_width;
  spec.v_width = v_width;
  return jit_lookup(spec);
}

py::dict jit_spmm(int dtype, int index, const std::string& reduce, int value_mode, int64_t heads,
                  int64_t features, int act, int prefetch) {
  using namespace sparsejit;
  codegen::CpuSpmmSpec spec;
  spec.dtype = static_cast<ScalarKind>(dtype);
  spec.index = static_cast<IndexKind>(index);
  spec.reduce = parse_reduce(reduce);
  spec.value_mode = value_mode;
  spec.heads = heads;
  spec.features = features;
  spec.act = static_cast<Act>(act);
  spec.prefetch = prefetch;
  return jit_lookup(spec);
}

py::dict choose_spmm(int64_t rows, int64_t cols, int64_t nnz, int64_t width, int64_t elem) {
  using namespace sparsejit;
  auto p = plan::choose_spmm(rows, cols, nnz, width, elem, codegen::CpuJit::instance().enabled());
  py::dict d;
  d["kernel"] = plan::kernel_name(p.kernel);
  d["prefetch"] = p.prefetch;
  d["max_log2"] = p.max_log2;
  d["reason"] = p.reason;
  return d;
}

// The header fields of a plan (or a recipe), without checking it against a structure.
py::dict describe_plan(const std::vector<int64_t>& w) {
  using namespace sparsejit::plan;
  if (static_cast<int64_t>(w.size()) < kHeaderWords || w[kWordMagic] != kPlanMagic)
    throw py::value_error("not a sparsejit plan (" + std::to_string(w.size()) + " words)");
  if (w[kWordVersion] != kPlanVersion)
    throw py::value_error("plan version " + std::to_string(w[kWordVersion]) +
                          " but this sparsejit reads " + std::to_string(kPlanVersion));
  py::dict d;
  const int64_t op = w[kWordOp];
  d["op"] = plan_op_name(op);
  const int64_t k = w[kWordKernel];
  d["kernel"] = op == static_cast<int64_t>(OpKind::Spmm) && k >= 1 && k <= 3
                    ? kernel_name(static_cast<Kernel>(k))
                    : "unknown";
  d["prefetch"] = w[kWordPrefetch];
  d["max_log2"] = w[kWordParam];
  d["rows"] = w[kWordRows];
  d["nnz"] = w[kWordNnz];
  d["cols"] = w[kWordCols];
  d["stamp"] = w[kWordStamp];
  return d;
}

// A recipe: an SpMM plan header for no structure in particular (what tune stores); the
// plan ops (or stamp_plan) make it a plan for one structure.
std::vector<int64_t> spmm_recipe(const std::string& kernel, int prefetch, int max_log2) {
  using namespace sparsejit::plan;
  Kernel k;
  try {
    k = parse_kernel(kernel);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  std::vector<int64_t> words(kHeaderWords);
  write_header(words.data(), OpKind::Spmm, static_cast<int64_t>(k), prefetch, max_log2,
               StructureStamp{-1, -1, -1, 0});
  return words;
}

// The recipe's header stamped for a structure (header-only kernels: a ready plan).
template <typename I>
std::vector<int64_t> stamp_plan(std::vector<int64_t> words, py::array_t<I, py::array::c_style> rp,
                                py::array_t<I, py::array::c_style> col, int64_t cols) {
  using namespace sparsejit::plan;
  if (static_cast<int64_t>(words.size()) < kHeaderWords || words[kWordMagic] != kPlanMagic)
    throw py::value_error("not a sparsejit plan header");
  const int64_t rows = static_cast<int64_t>(rp.size()) - 1;
  if (rows < 0) throw py::value_error("indptr must have at least one entry");
  if (static_cast<int64_t>(col.size()) != static_cast<int64_t>(rp.data()[rows]))
    throw py::value_error("indices has " + std::to_string(col.size()) + " entries but indptr[-1] = " +
                          std::to_string(rp.data()[rows]));
  const StructureStamp s = stamp_structure<I>(rp.data(), col.data(), rows, cols);
  write_header(words.data(), static_cast<OpKind>(words[kWordOp]), words[kWordKernel],
               words[kWordPrefetch], words[kWordParam], s);
  return words;
}

py::dict plan_layout() {
  using namespace sparsejit::plan;
  py::dict d, words, ops, kernels;
  d["magic"] = kPlanMagic;
  d["version"] = kPlanVersion;
  d["header_words"] = static_cast<int64_t>(kHeaderWords);
  words["magic"] = static_cast<int>(kWordMagic);
  words["version"] = static_cast<int>(kWordVersion);
  words["op"] = static_cast<int>(kWordOp);
  words["kernel"] = static_cast<int>(kWordKernel);
  words["prefetch"] = static_cast<int>(kWordPrefetch);
  words["param"] = static_cast<int>(kWordParam);
  words["rows"] = static_cast<int>(kWordRows);
  words["nnz"] = static_cast<int>(kWordNnz);
  words["cols"] = static_cast<int>(kWordCols);
  words["stamp"] = static_cast<int>(kWordStamp);
  for (OpKind op : sparsejit::kPlanOpKinds) ops[op_name(op)] = static_cast<int64_t>(op);
  for (auto k : {Kernel::Generic, Kernel::Jit, Kernel::Bucketed})
    kernels[kernel_name(k)] = static_cast<int64_t>(k);
  py::dict pc;  // the point-cloud plan (csrc/point_conv/plan_layout.h)
  pc["kernel_volume"] = static_cast<int>(sparsejit::point_conv::kWordKernelVolume);
  pc["fixed_words"] = static_cast<int>(sparsejit::point_conv::kFixedWords);
  py::list arrays;
  for (const auto& a : sparsejit::point_conv::kArrays) arrays.append(a.name);
  pc["arrays"] = arrays;
  d["point_conv"] = pc;
  py::dict rg;  // the RGMS plan (csrc/rgms/plan_layout.h)
  rg["fixed_words"] = static_cast<int>(sparsejit::rgms::kFixedWords);
  py::list rg_arrays;
  for (const auto& a : sparsejit::rgms::kArrays) rg_arrays.append(a.name);
  rg["arrays"] = rg_arrays;
  d["rgms"] = rg;
  d["words"] = words;
  d["ops"] = ops;
  d["spmm_kernels"] = kernels;
  return d;
}

// Where each array of a point-cloud plan with these sizes lies: {name: (first word, "int64" or
// "int32", length)} and "total_words" (csrc/point_conv/plan_layout.h, the code the ops use).
py::dict point_conv_plan_view(int64_t k, int64_t m, int64_t n_in, int64_t n_out) {
  using namespace sparsejit::point_conv;
  if (k < 0 || m < 0 || n_in < 0 || n_out < 0)
    throw py::value_error("point_conv_plan_view: sizes must be >= 0");
  py::dict d;
  int64_t word = kFixedWords;
  for (const auto& a : kArrays) {
    d[a.name] = py::make_tuple(word, a.int32 ? "int32" : "int64", a.length(k, m, n_in, n_out));
    word += array_words(a, k, m, n_in, n_out);
  }
  d["total_words"] = word;
  return d;
}

// Where each array of an RGMS plan for R relations and E entries lies: {name: (first word,
// length)} and "total_words" (csrc/rgms/plan_layout.h, the code the ops use).
py::dict rgms_plan_view(int64_t r, int64_t e) {
  using namespace sparsejit::rgms;
  if (r < 1 || e < 0) throw py::value_error("rgms_plan_view: needs R >= 1 and E >= 0");
  py::dict d;
  int64_t at[kNumArrays];
  array_offsets(r, e, at);
  for (int i = 0; i < kNumArrays; ++i)
    d[kArrays[i].name] = py::make_tuple(at[i], kArrays[i].length(r, e));
  d["total_words"] = plan_words(r, e);
  return d;
}

// kernels/common/enums.h as {"scalar": {"f32": 0, ...}, "index": ..., "reduce": ...,
// "act": ..., "op": ...}, and the op arguments of RGMS (csrc/rgms/rgms_run.h: "rgms_strategy",
// "rgms_gemm") and point_conv (point_conv_run.h: "point_conv_dataflow", "point_conv_wgrad"):
// the one numbering, for Python code that passes enum values.
template <typename E, size_t N>
py::dict enum_dict(const E (&values)[N], const char* (*name)(E)) {
  py::dict d;
  for (E v : values) d[name(v)] = static_cast<int>(v);
  return d;
}

py::dict enums() {
  using namespace sparsejit;
  py::dict d;
  d["scalar"] = enum_dict(kAllScalarKinds, &scalar_name);
  d["index"] = enum_dict(kAllIndexKinds, &index_name);
  d["reduce"] = enum_dict(kAllReduces, &reduce_name);
  d["act"] = enum_dict(kAllActs, &act_name);
  d["op"] = enum_dict(kAllOpKinds, &op_name);
  d["rgms_strategy"] = enum_dict(rgms::kAllStrategies, &rgms::strategy_name);
  d["rgms_gemm"] = enum_dict(rgms::kAllGemms, &rgms::gemm_name);
  d["point_conv_dataflow"] = enum_dict(point_conv::kAllDataflows, &point_conv::dataflow_name);
  d["point_conv_wgrad"] = enum_dict(point_conv::kAllWgradPaths, &point_conv::wgrad_path_name);
  return d;
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
  m.def("jit_point_conv", &jit_point_conv, "Compiles (or finds) the point-cloud convolution's "
        "output-stationary rows for (c_in, c_out), `rows` out rows at a time; returns what "
        "the JIT did", py::arg("dtype"), py::arg("c_in"), py::arg("c_out"), py::arg("rows") = 1);
  m.def("point_conv_rows_together", &sparsejit::point_conv::os_rows_together,
        "Out rows the output-stationary JIT kernel takes together for num_groups x c_in x "
        "c_out weights of elem_bytes each (4 beyond four times the L1 data cache, else 1)",
        py::arg("num_groups"), py::arg("c_in"), py::arg("c_out"), py::arg("elem_bytes"));
  m.def("jit_row_tile", &jit_row_tile, "Compiles (or finds) the row-tile loops for a row "
        "width (and, width2 > 0, the fused row kernels for that pair of widths); returns "
        "what it did", py::arg("dtype"), py::arg("width"), py::arg("width2") = 0);
  m.def("jit_enabled", [] { return CpuJit::instance().enabled(); });
  m.def("jit_refresh_env", [] {
    CpuJit::instance().refresh_env();
    DiskCache::instance().reset_root_from_env();
  });
  m.def("jit_clear_memory_cache", [] { CpuJit::instance().clear_memory_cache(); });
  // Owned index arrays and the op library's once-per-tensor tables (csrc/core/owned.h).
  namespace owned = sparsejit::owned;
  m.def("own", &owned::own, "Registers data addresses a live object owns", py::arg("addresses"));
  m.def("disown", &owned::disown, "Releases addresses registered by own()",
        py::arg("addresses"));
  m.def("owned_count", &owned::owned_count);
  m.def("cache_budget", &owned::cache_budget_bytes);
  m.def("unowned_budget", &owned::unowned_budget_bytes);
  m.def("set_cache_budget", &owned::set_cache_budget_bytes, py::arg("bytes"));
  m.def("clear_op_tables", [] {
    py::gil_scoped_release nogil;
    owned::clear_tables();
  });
  // What the allocator has free goes back to the system (glibc keeps freed chunks in its
  // heaps otherwise; sparsejit.clear_caches calls this last). False where there is no trim.
  m.def("trim_heap", [] {
#if defined(__GLIBC__)
    py::gil_scoped_release nogil;
    malloc_trim(0);
    return true;
#else
    return false;
#endif
  });
  m.def("op_table_stats", [] {
    py::list out;
    for (const auto& s : owned::table_stats())
      out.append(py::make_tuple(s.name, s.entries, s.owned, s.bytes));
    return out;
  });
  m.def("compiler_command", [] { return CpuJit::instance().compiler_command(); });
  m.def(
      "isa_state",
      [] {
        auto name = [](sparsejit::IsaTier t) {
          switch (t) {
            case sparsejit::IsaTier::kBaseline: return "baseline";
            case sparsejit::IsaTier::kAvx2: return "avx2";
            case sparsejit::IsaTier::kAvx512: return "avx512";
            default: return "native";
          }
        };
        py::dict d;
        d["cap"] = name(sparsejit::max_isa());
        d["tier"] = name(sparsejit::isa_tier());
        d["avx2_fma"] = sparsejit::cpu_has_avx2_fma();
        d["avx512_bf16"] = sparsejit::cpu_has_avx512_bf16();
        d["bf16_dot"] = sparsejit::cpu_has_bf16_dot();
        d["amx"] = sparsejit::cpu_has_amx();
        return d;
      },
      "What the ahead-of-time kernels may use: SPARSEJIT_MAX_ISA's cap, the tier of the "
      "three-copy loops and the feature predicates, each within the cap");
  m.def("compiler_version", [] { return CpuJit::instance().compiler_version(); });
  m.def("cache_dir", [] { return DiskCache::instance().root(); });
  m.def("min_parallel_work", &sparsejit::cpu::min_parallel_work,
        "Below this much work ((rows + nnz) * row width) SpMM runs on one thread");
  m.def("set_min_parallel_work", &sparsejit::cpu::set_min_parallel_work, py::arg("work"));
  m.def("choose_spmm", &choose_spmm, py::arg("rows"), py::arg("cols"), py::arg("nnz"),
        py::arg("row_width"), py::arg("elem_size"));
  m.def("describe_plan", &describe_plan, py::arg("words"));
  m.def("spmm_recipe", &spmm_recipe, py::arg("kernel"), py::arg("prefetch"),
        py::arg("max_log2") = 3);
  m.def("stamp_plan", &stamp_plan<int64_t>, py::arg("words"), py::arg("indptr"),
        py::arg("indices"), py::arg("num_cols"));
  m.def("stamp_plan", &stamp_plan<int32_t>, py::arg("words"), py::arg("indptr"),
        py::arg("indices"), py::arg("num_cols"));
  m.def("enums", &enums, "The enums of kernels/common/enums.h: {kind: {name: value}}");
  m.def("point_conv_plan_view", &point_conv_plan_view, py::arg("kernel_volume"),
        py::arg("pairs"), py::arg("num_in"), py::arg("num_out"),
        "Word offset, dtype and length of each array of a point-cloud plan of these sizes");
  m.def("rgms_plan_view", &rgms_plan_view, py::arg("num_relations"), py::arg("entries"),
        "Word offset and length of each array of an RGMS plan of these sizes");
  m.def("plan_layout", &plan_layout, "The plan header's layout (csrc/plan/plan_header.h)");
  m.def("rgms_default_tile", &sparsejit::rgms::default_tile, py::arg("f_in"), py::arg("f_out"),
        "Groups per GEMM tile of the RGMS kernels for these widths (csrc/rgms/rgms_run.h)");
  m.def("huge_page_threshold", [] { return sparsejit::huge_page_threshold(); },
        "Bytes from which the outputs sparsejit allocates are advised onto transparent huge "
        "pages (0: off, by SPARSEJIT_HUGE_PAGES=0 or the OS's THP mode).");
  m.def("set_huge_page_threshold",
        [](std::size_t bytes) { return sparsejit::set_huge_page_threshold(bytes); },
        py::arg("bytes"),
        "Sets that threshold for the rest of the process (0: off); returns the previous one.");
  m.def("gemm_backend", [] { return std::string(sparsejit::dense::gemm_backend()); },
        "Where dense products run: \"onednn <version>\" or \"builtin\" (csrc/dense/gemm.h)");
  m.def("gemm_ukernel", [] { return sparsejit::dense::gemm_ukernel(); },
        "Whether small float32 tile products run on oneDNN's brgemm micro-kernel as this "
        "process's PyTorch exports it (csrc/dense/gemm.h; SPARSEJIT_GEMM_UKERNEL=0: off)");
  m.def("set_gemm_ukernel", [](bool on) { return sparsejit::dense::set_gemm_ukernel(on); },
        py::arg("on"), "Turns that on or off for the process; returns the previous state.");
  m.def("gemm_bf16_native", [] { return sparsejit::dense::gemm_bf16_native(); },
        "Whether bfloat16 products run on oneDNN's bfloat16 GEMM here (oneDNN loaded, CPU with "
        "AVX512-BF16 or AMX): RGMS's bfloat16 tile products use it (csrc/dense/gemm.h)");
  m.def("jit_attention", &jit_attention,
        "Compiles (or finds) a specialized fused attention (mode 0 dot, 1 GAT, 2 GATv2)",
        py::arg("dtype"), py::arg("index"), py::arg("mode"), py::arg("heads"),
        py::arg("qk_width"), py::arg("v_width"));
#ifdef _OPENMP
  m.attr("openmp") = true;
#else
  m.attr("openmp") = false;
#endif
}
