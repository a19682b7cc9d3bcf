// Segment products (pyg-lib's segment_matmul) on the dense GEMM layer: see gemm.h.
#include <algorithm>
#include <cstring>
#include <exception>
#include <vector>

#include "csrc/core/first_error.h"
#include "csrc/dense/gemm.h"

namespace sparsejit::dense {

void segment_sgemm(const int64_t* ptr, int64_t segments, const float* x, int64_t f_in,
                   const float* w, int64_t f_out, float* y, int num_threads, const float* bias,
                   bool accumulate) {
  constexpr int64_t kRows = 256;
  std::vector<int64_t> items;  // (segment, first row)
  for (int64_t k = 0; k < segments; ++k)
    for (int64_t r = ptr[k]; r < ptr[k + 1]; r += kRows) {
      items.push_back(k);
      items.push_back(r);
    }
  const int64_t n_items = int64_t(items.size() / 2);
  FirstError fe;
#pragma omp parallel for schedule(dynamic, 1) num_threads(std::max(1, num_threads)) if (n_items > 1)
  for (int64_t it = 0; it < n_items; ++it) {
    const int64_t k = items[2 * it], r0 = items[2 * it + 1];
    const int64_t r1 = std::min(ptr[k + 1], r0 + kRows);
    fe.guard([&] {
      if (f_in == 0) {
        if (!accumulate) std::memset(y + r0 * f_out, 0, sizeof(float) * (r1 - r0) * f_out);
      } else {
        sgemm(false, false, r1 - r0, f_out, f_in, 1.f, x + r0 * f_in, f_in, w + k * f_in * f_out,
              std::max<int64_t>(f_out, 1), accumulate ? 1.f : 0.f, y + r0 * f_out,
              std::max<int64_t>(f_out, 1));
      }
      if (bias != nullptr) {
        for (int64_t r = r0; r < r1; ++r) {
          float* row = y + r * f_out;
          for (int64_t j = 0; j < f_out; ++j) row[j] += bias[j];
        }
      }
    });
  }
  fe.rethrow();
}

void segment_sgemm_grad_w(const int64_t* ptr, int64_t segments, const float* x, int64_t f_in,
                          const float* dy, int64_t f_out, float* dw, int num_threads) {
  auto one = [&](int64_t k) {
    float* out = dw + k * f_in * f_out;
    const int64_t rows = ptr[k + 1] - ptr[k];
    if (rows == 0 || f_in == 0 || f_out == 0) {
      std::memset(out, 0, sizeof(float) * f_in * f_out);
      return;
    }
    sgemm(true, false, f_in, f_out, rows, 1.f, x + ptr[k] * f_in, f_in, dy + ptr[k] * f_out,
          f_out, 0.f, out, f_out);
  };
  if (segments < 2 * std::max(1, num_threads)) {
    for (int64_t k = 0; k < segments; ++k) one(k);
    return;
  }
  FirstError fe;
#pragma omp parallel for schedule(dynamic, 1) num_threads(std::max(1, num_threads))
  for (int64_t k = 0; k < segments; ++k) fe.guard([&] { one(k); });
  fe.rethrow();
}

}  // namespace sparsejit::dense
