// Generic CPU SDDMM (the loop nest of sddmm_kernel.h with run-time sizes) and edge softmax.
// Edge softmax is row-wise; rows are split by merge path (rows + entries balanced).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/common/partition.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/sddmm_kernel.h"

namespace sparsejit::cpu {

template <typename T, typename I>
void sddmm(int64_t rows, int64_t heads, int64_t features, const I* rowptr, const I* col,
           const T* q, const T* k, T* s, int num_threads) {
  SddmmArgs a;
  a.rows = rows;
  a.heads = heads;
  a.features = features;
  a.num_threads = num_threads;
  a.min_parallel_work = min_parallel_work();
  detail::sddmm_run<T, I, -1, -1>(a, rowptr, col, q, k, s);
}

namespace {

// Calls body(i) for every row, rows split between threads by merge path.
template <typename I, typename Body>
void for_each_row_balanced(int64_t rows, const I* rowptr, int num_threads, int64_t work_per_entry,
                           Body body) {
  if (rows == 0) return;
  const int64_t nnz = rowptr[rows];
  int nt = std::max(1, num_threads);
  if ((rows + nnz) * std::max<int64_t>(work_per_entry, 1) < min_parallel_work()) nt = 1;
#pragma omp parallel num_threads(nt)
  {
    MergeCoord b, e;
    merge_path_piece(omp_get_thread_num(), omp_get_num_threads(), rowptr, rows, &b, &e);
    // A piece owns the rows that end inside it; its first row may have started earlier,
    // and is still processed whole by this piece (softmax needs the whole row).
    for (int64_t i = b.row; i < e.row; ++i) body(i);
  }
}

}  // namespace

template <typename T, typename I>
void edge_softmax(int64_t rows, int64_t heads, const I* rowptr, const T* s, T* out,
                  int num_threads) {
  using A = acc_t<T>;
  const int64_t H = heads;
  for_each_row_balanced(rows, rowptr, num_threads, H, [&](int64_t i) {
    const int64_t lo = rowptr[i], hi = rowptr[i + 1];
    for (int64_t h = 0; h < H; ++h) {
      A m = -std::numeric_limits<A>::infinity();
      for (int64_t p = lo; p < hi; ++p) m = std::max(m, A(s[p * H + h]));
      A sum = A(0);
      for (int64_t p = lo; p < hi; ++p) sum += std::exp(A(s[p * H + h]) - m);
      const A inv = sum > A(0) ? A(1) / sum : A(0);
      for (int64_t p = lo; p < hi; ++p) out[p * H + h] = T(std::exp(A(s[p * H + h]) - m) * inv);
    }
  });
}

template <typename T, typename I>
void edge_softmax_backward(int64_t rows, int64_t heads, const I* rowptr, const T* y, const T* g,
                           T* grad_s, int num_threads) {
  using A = acc_t<T>;
  const int64_t H = heads;
  for_each_row_balanced(rows, rowptr, num_threads, H, [&](int64_t i) {
    const int64_t lo = rowptr[i], hi = rowptr[i + 1];
    for (int64_t h = 0; h < H; ++h) {
      A dot = A(0);
      for (int64_t p = lo; p < hi; ++p) dot += A(g[p * H + h]) * A(y[p * H + h]);
      for (int64_t p = lo; p < hi; ++p)
        grad_s[p * H + h] = T(A(y[p * H + h]) * (A(g[p * H + h]) - dot));
    }
  });
}

#define SPARSEJIT_INSTANTIATE_ROWWISE(T, I)                                                   \
  template void sddmm<T, I>(int64_t, int64_t, int64_t, const I*, const I*, const T*,         \
                            const T*, T*, int);                                               \
  template void edge_softmax<T, I>(int64_t, int64_t, const I*, const T*, T*, int);            \
  template void edge_softmax_backward<T, I>(int64_t, int64_t, const I*, const T*, const T*, \
                                            T*, int);

SPARSEJIT_INSTANTIATE_ROWWISE(float, int32_t)
SPARSEJIT_INSTANTIATE_ROWWISE(float, int64_t)
SPARSEJIT_INSTANTIATE_ROWWISE(double, int32_t)
SPARSEJIT_INSTANTIATE_ROWWISE(double, int64_t)
SPARSEJIT_INSTANTIATE_ROWWISE(bf16, int32_t)
SPARSEJIT_INSTANTIATE_ROWWISE(bf16, int64_t)

}  // namespace sparsejit::cpu
