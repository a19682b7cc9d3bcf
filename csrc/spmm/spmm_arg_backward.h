// The gradient of SpMM max / min with respect to X (Torch-free): each output element routes
// its gradient to the entry that won it,
//
//   dX[col[p], f] += coef_p * dY[i, f]   for p = arg[i, f] >= 0,   coef_p = values[p] or 1,
//
// O(rows x F) work, where a gather over the transposed structure would read every entry's
// row (O(nnz x F)). Winners collide on popular sources, so threads split the rows of dY and
// each adds into its own copy of dX (thread 0 into dX itself); the copies are summed at the
// end, rows split between threads. The order of the additions is fixed for a thread count.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace sparsejit::spmm {

// arg [rows, f] (CSR positions, -1 for empty rows), dy [rows, f], col [nnz], values [nnz] or
// null, dx [cols, f] (fully written). Positions must lie in [-1, nnz) and col in [0, cols):
// the caller checks both.
template <typename T, typename I>
void arg_backward_x(const int64_t* arg, const T* dy, int64_t rows, int64_t f, const I* col,
                    const T* values, int64_t cols, T* dx, int threads) {
  const int64_t out = cols * f;
  const int nt = (rows * f >= (int64_t(1) << 15) && threads > 1) ? threads : 1;
  std::vector<std::vector<T>> copies(size_t(nt > 1 ? nt - 1 : 0));
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    T* acc = dx;
    if (t > 0) {
      copies[size_t(t - 1)].assign(size_t(out), T(0));
      acc = copies[size_t(t - 1)].data();
    } else {
      std::memset(dx, 0, sizeof(T) * size_t(out));
    }
    const int64_t i0 = rows * t / n, i1 = rows * (t + 1) / n;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t* a = arg + i * f;
      const T* g = dy + i * f;
      for (int64_t k = 0; k < f; ++k) {
        const int64_t p = a[k];
        if (p < 0) continue;
        acc[int64_t(col[p]) * f + k] += (values ? values[p] : T(1)) * g[k];
      }
    }
#pragma omp barrier
    if (n > 1) {  // dX += the other threads' copies, rows of dX split between threads
      const int64_t r0 = cols * t / n, r1 = cols * (t + 1) / n;
      for (int c = 1; c < n; ++c) {
        const T* src = copies[size_t(c - 1)].data();
        for (int64_t e = r0 * f; e < r1 * f; ++e) dx[e] += src[e];
      }
    }
  }
}

}  // namespace sparsejit::spmm
