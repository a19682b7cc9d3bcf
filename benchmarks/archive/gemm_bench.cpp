// Small-GEMM timing behind csrc/dense/gemm.h: oneDNN's sgemm against the built-in packed
// kernel on the tile shapes the RGMS passes multiply (m = groups per tile, k = n = widths),
// single-threaded (as inside a parallel region). Build and run from the repository root:
//
//   g++ -O3 -std=c++17 -fopenmp -I. benchmarks/archive/gemm_bench.cpp csrc/dense/gemm.cpp \
//       csrc/dense/gemm_avx2.cpp -DSPARSEJIT_WITH_ONEDNN -ldnnl -o /tmp/gemm_bench
//   (gemm_avx2.cpp needs -mavx2 -mfma: compile it separately or add them for a quick run)
//   OMP_NUM_THREADS=1 /tmp/gemm_bench
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "csrc/dense/gemm.h"

namespace dn = sparsejit::dense;

template <typename Fn>
double median_us(Fn fn, int reps) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> u(-1, 1);
  std::printf("backend: %s\n%6s %5s %5s %12s %12s %10s %10s\n", dn::gemm_backend(), "m", "k",
              "n", "onednn_us", "builtin_us", "onednn_GF", "builtin_GF");
  const int shapes[][3] = {{16, 16, 16},   {64, 16, 16},   {512, 16, 16},  {64, 64, 64},
                           {128, 64, 64},  {256, 64, 64},  {32, 128, 128}, {128, 128, 128},
                           {1024, 64, 64}, {4096, 32, 32}};
  for (auto& s : shapes) {
    const int m = s[0], k = s[1], n = s[2];
    std::vector<float> a(size_t(m) * k), b(size_t(k) * n), c(size_t(m) * n);
    for (auto& v : a) v = u(rng);
    for (auto& v : b) v = u(rng);
    const int inner = std::max(1, 2000000 / (m * k * n));
    auto run = [&](bool onednn) {
      for (int i = 0; i < inner; ++i) {
        if (onednn) {
          dn::sgemm(false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, c.data(), n);
        } else {
          dn::sgemm_builtin(false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, c.data(), n);
        }
      }
    };
    const double t1 = median_us([&] { run(true); }, 21) / inner;
    const double t2 = median_us([&] { run(false); }, 21) / inner;
    const double flop = 2.0 * m * k * n;
    std::printf("%6d %5d %5d %12.3f %12.3f %10.1f %10.1f\n", m, k, n, t1, t2, flop / t1 / 1e3,
                flop / t2 / 1e3);
  }
}
