// Brute-force references for the kernel-map tests: std::map lookups, O(N * K), no keys.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "csrc/point_conv/kernel_map.h"

namespace sparsejit::testing {

using point_conv::ConvParams;
using point_conv::CoordSet;
using point_conv::KernelMap;
using Site = std::array<int64_t, 5>;  // batch, then up to 4 coordinates (unused = 0)
using Pairs = std::vector<std::vector<std::pair<int32_t, int32_t>>>;  // per offset (in, out)

inline Site site_of(const int32_t* row, int dims) {
  Site s{row[0], 0, 0, 0, 0};
  for (int d = 0; d < dims; ++d) s[1 + d] = row[1 + d];
  return s;
}

// Unique random sites in [0, shape) per axis and [0, batch) batch ids.
inline std::vector<int32_t> random_coords(int64_t n, int dims, int64_t batch,
                                          const std::vector<int64_t>& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::set<Site> seen;
  std::vector<int32_t> c;
  while (static_cast<int64_t>(seen.size()) < n) {
    std::vector<int32_t> row(dims + 1);
    row[0] = static_cast<int32_t>(rng() % batch);
    for (int d = 0; d < dims; ++d) row[1 + d] = static_cast<int32_t>(rng() % shape[d]);
    if (seen.insert(site_of(row.data(), dims)).second) c.insert(c.end(), row.begin(), row.end());
  }
  return c;
}

// Sites of a set with their ids, straight from its sorted coordinates.
inline std::vector<std::pair<Site, int32_t>> sites_of(const CoordSet& s) {
  std::vector<std::pair<Site, int32_t>> v;
  for (int64_t p = 0; p < s.size(); ++p)
    v.push_back({site_of(s.coords.data() + p * s.width(), s.dims), s.site[p]});
  return v;
}

// in = o * stride + e * dilation - padding, by lookup in a std::map of the input sites.
inline Pairs reference_pairs(const CoordSet& in, const std::vector<std::pair<Site, int32_t>>& outs,
                             const ConvParams& p) {
  std::map<Site, int32_t> index;
  for (const auto& [s, id] : sites_of(in)) index[s] = id;
  Pairs pairs(p.volume());
  for (int64_t k = 0; k < p.volume(); ++k) {
    int64_t e[4], r = k;
    for (int d = p.dims - 1; d >= 0; --d) e[d] = r % p.kernel[d], r /= p.kernel[d];
    for (const auto& [o, id] : outs) {
      Site q = o;
      for (int d = 0; d < p.dims; ++d)
        q[1 + d] = o[1 + d] * p.stride[d] + e[d] * p.dilation[d] - p.padding[d];
      auto it = index.find(q);
      if (it != index.end()) pairs[k].push_back({it->second, id});
    }
    std::sort(pairs[k].begin(), pairs[k].end());
  }
  return pairs;
}

// Checks the CSR layout and index ranges, returns the pairs sorted per offset.
inline Pairs pairs_of(const KernelMap& m, int64_t n_in, int64_t n_out) {
  Pairs pairs(m.kernel_volume());
  EXPECT_EQ(m.offset_ptr.at(0), 0);
  EXPECT_EQ(static_cast<int64_t>(m.in_idx.size()), m.size());
  EXPECT_EQ(static_cast<int64_t>(m.out_idx.size()), m.size());
  for (int64_t k = 0; k < m.kernel_volume(); ++k) {
    EXPECT_LE(m.offset_ptr[k], m.offset_ptr[k + 1]);
    for (int64_t j = m.offset_ptr[k]; j < m.offset_ptr[k + 1] && j < m.size(); ++j) {
      EXPECT_TRUE(m.in_idx[j] >= 0 && m.in_idx[j] < n_in) << "in_idx[" << j << "]";
      EXPECT_TRUE(m.out_idx[j] >= 0 && m.out_idx[j] < n_out) << "out_idx[" << j << "]";
      pairs[k].push_back({m.in_idx[j], m.out_idx[j]});
    }
    std::sort(pairs[k].begin(), pairs[k].end());
  }
  return pairs;
}

// spconv output sites: every o in [0, out_shape) some input reaches.
inline std::set<Site> reference_spconv_sites(const CoordSet& in, const ConvParams& p,
                                             const std::vector<int64_t>& out_shape) {
  std::set<Site> out;
  for (const auto& [c, id] : sites_of(in))
    for (int64_t k = 0; k < p.volume(); ++k) {
      int64_t r = k;
      Site o = c;
      bool ok = true;
      for (int d = p.dims - 1; d >= 0; --d) {
        const int64_t e = r % p.kernel[d];
        r /= p.kernel[d];
        const int64_t t = c[1 + d] + p.padding[d] - e * p.dilation[d];
        ok &= t >= 0 && t % p.stride[d] == 0 && t / p.stride[d] < out_shape[d];
        o[1 + d] = t / p.stride[d];
      }
      if (ok) out.insert(o);
    }
  return out;
}

// A map buffer full of garbage, larger than any map a test builds.
inline KernelMap poisoned_map(int64_t k, int64_t m) {
  KernelMap map;
  map.offset_ptr.assign(k + 8, -777);
  map.in_idx.assign(m + 64, -777);
  map.out_idx.assign(m + 64, -777);
  return map;
}

// KITTI scan (float32 x, y, z, intensity) voxelized at `voxel` metres: floor((p - min) / v).
inline std::vector<int32_t> kitti_voxels(const std::string& path, double voxel) {
  std::vector<int32_t> coords;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return coords;
  std::vector<float> pts;
  float buf[4];
  while (std::fread(buf, sizeof(float), 4, f) == 4) pts.insert(pts.end(), buf, buf + 4);
  std::fclose(f);
  double mn[3] = {1e30, 1e30, 1e30};
  for (size_t i = 0; i < pts.size(); i += 4)
    for (int d = 0; d < 3; ++d) mn[d] = std::min<double>(mn[d], pts[i + d]);
  for (size_t i = 0; i < pts.size(); i += 4) {
    coords.push_back(0);
    for (int d = 0; d < 3; ++d)
      coords.push_back(static_cast<int32_t>(std::floor((pts[i + d] - mn[d]) / voxel)));
  }
  return coords;
}

inline std::string data_dir() {
  const char* env = std::getenv("SPARSEJIT_DATA");
  return env ? env : std::string(SPARSEJIT_SOURCE_DIR) + "/../shared/data";
}

}  // namespace sparsejit::testing
