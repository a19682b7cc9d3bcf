// Rough timing of kernel-map building (csrc/point_conv): not a benchmark suite, no peers.
// Prints the median time to build the 27 submanifold maps (3x3x3) and the stride-2 map
// (spconv k=3, s=2, p=1: output sites + pairs) on a voxelized KITTI scan and on 20k random
// voxels in a 128^3 grid. Build and run from the repository root:
//
//   g++ -O3 -std=c++17 -fopenmp -I. benchmarks/archive/kmap_bench.cpp csrc/point_conv/*.cpp
//       -o /tmp/kmap_bench && OMP_NUM_THREADS=2 /tmp/kmap_bench
//
// Time it on a quiet machine only (uptime load < 1).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "csrc/point_conv/coords.h"
#include "csrc/point_conv/kernel_map.h"

using namespace sparsejit::point_conv;

namespace {

template <typename F>
double median_ms(F&& f, int reps = 21) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a)
                    .count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<int32_t> kitti(const std::string& path, double voxel) {
  std::vector<int32_t> c;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return c;
  std::vector<float> p;
  float b[4];
  while (std::fread(b, sizeof(float), 4, f) == 4) p.insert(p.end(), b, b + 3);
  std::fclose(f);
  float mn[3] = {1e30f, 1e30f, 1e30f};
  for (size_t i = 0; i < p.size(); i += 3)
    for (int d = 0; d < 3; ++d) mn[d] = std::min(mn[d], p[i + d]);
  for (size_t i = 0; i < p.size(); i += 3) {
    c.push_back(0);
    for (int d = 0; d < 3; ++d)
      c.push_back(static_cast<int32_t>(std::floor((p[i + d] - mn[d]) / voxel)));
  }
  return c;
}

std::vector<int32_t> random_voxels(int64_t n, int64_t extent, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> c;
  for (int64_t i = 0; i < n; ++i) {
    c.push_back(0);
    for (int d = 0; d < 3; ++d) c.push_back(static_cast<int32_t>(rng() % extent));
  }
  return c;
}

void run(const char* name, const std::vector<int32_t>& c) {
  CoordSetOptions o;
  o.dedup = true;
  const int64_t rows = static_cast<int64_t>(c.size()) / 4;
  CoordSet s;
  const double t_set = median_ms([&] { s = make_coord_set(c.data(), rows, 4, o); });
  KernelMap subm, strided;
  const ConvParams sp = cube_params(3, 3), st = cube_params(3, 3, 2, 1, 1);
  const double t_subm = median_ms([&] { submanifold_map(s, sp, subm); });
  CoordSet out;
  const double t_sites = median_ms([&] { out = spconv_output_sites(s, st); });
  const double t_map = median_ms([&] { generalized_map(s, out, st, strided); });
  std::printf("%s: %lld rows, %lld sites\n  sort+dedup %.2f ms | submanifold 27 maps %.2f ms "
              "(%lld pairs) | stride 2: sites %.2f ms + map %.2f ms (%lld outputs, %lld pairs)\n",
              name, (long long)rows, (long long)s.size(), t_set, t_subm, (long long)subm.size(),
              t_sites, t_map, (long long)out.size(), (long long)strided.size());
}

}  // namespace

int main() {
  const char* env = std::getenv("SPARSEJIT_DATA");
  const std::string dir = env ? env : "../shared/data";
  const auto scan = kitti(dir + "/pointclouds/kitti_pointpillars/000000.bin", 0.05);
  if (scan.empty())
    std::printf("no KITTI scan under %s (set SPARSEJIT_DATA)\n", dir.c_str());
  else
    run("KITTI 000000 @ 5 cm", scan);
  run("random 20k in 128^3", random_voxels(20000, 128, 1));
  return 0;
}
