// pybind11 module `sparsejit._core`: the Torch-free parts Python needs that are not ops
// (structure statistics, fingerprints, build information). Takes numpy arrays.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "csrc/core/csr.h"

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

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "sparsejit core (Torch-free): structure statistics and fingerprints";
  m.def("row_stats", &stats_impl<int64_t>, py::arg("indptr"), py::arg("num_cols"));
  m.def("row_stats", &stats_impl<int32_t>, py::arg("indptr"), py::arg("num_cols"));
  m.def("fingerprint", &fingerprint_impl<int64_t>, py::arg("indptr"), py::arg("indices"),
        py::arg("num_cols"));
  m.def("fingerprint", &fingerprint_impl<int32_t>, py::arg("indptr"), py::arg("indices"),
        py::arg("num_cols"));
#ifdef _OPENMP
  m.attr("openmp") = true;
#else
  m.attr("openmp") = false;
#endif
}
