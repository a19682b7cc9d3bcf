// Random CSR structures and a plain reference for the kernel tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace sparsejit::testing {

template <typename I>
struct Csr {
  int64_t rows = 0, cols = 0;
  std::vector<I> rowptr, col;
  int64_t nnz() const { return static_cast<int64_t>(col.size()); }
};

// Row lengths drawn uniformly in [0, 2 * avg] or from a power law (a few very long rows).
template <typename I>
Csr<I> random_csr(int64_t rows, int64_t cols, double avg, bool power_law, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Csr<I> a;
  a.rows = rows;
  a.cols = cols;
  a.rowptr.assign(rows + 1, 0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t i = 0; i < rows; ++i) {
    int64_t len;
    if (cols == 0) {
      len = 0;
    } else if (power_law) {
      len = static_cast<int64_t>(avg * 0.3 / std::pow(std::max(u(rng), 1e-4), 0.9));
    } else {
      len = static_cast<int64_t>(u(rng) * 2.0 * avg);
    }
    a.rowptr[i + 1] = static_cast<I>(a.rowptr[i] + len);
  }
  std::uniform_int_distribution<int64_t> c(0, std::max<int64_t>(cols - 1, 0));
  a.col.resize(a.rowptr[rows]);
  for (auto& v : a.col) v = static_cast<I>(c(rng));
  return a;
}

inline std::vector<double> random_vec(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace sparsejit::testing
