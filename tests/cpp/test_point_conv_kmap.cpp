// Kernel maps by merging sorted keys, against brute-force std::map references.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <tuple>

#include "csrc/point_conv/coords.h"
#include "csrc/point_conv/kernel_map.h"
#include "tests/cpp/point_conv_reference.h"

namespace sparsejit::testing {
namespace {

using point_conv::CoordSetOptions;
using point_conv::cube_params;
using point_conv::make_coord_set;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "<no error>";
}

#define EXPECT_ERROR(stmt, text) \
  EXPECT_NE(error_of([&] { stmt; }).find(text), std::string::npos) << error_of([&] { stmt; })

CoordSet make_set(const std::vector<int32_t>& c, int dims, CoordSetOptions o = {}) {
  return make_coord_set(c.data(), static_cast<int64_t>(c.size()) / (dims + 1), dims + 1, o);
}

// Keys strictly ascending, coordinates in key order, site ids a permutation of the rows.
void expect_sorted_set(const CoordSet& s) {
  for (int64_t p = 1; p < s.size(); ++p) ASSERT_LT(s.keys[p - 1], s.keys[p]) << "position " << p;
  for (int64_t p = 0; p < s.size(); ++p)
    ASSERT_EQ(s.keys[p], s.layout.pack(s.coords.data() + p * s.width()));
  std::vector<int32_t> ids = s.site;
  std::sort(ids.begin(), ids.end());
  for (int64_t p = 0; p < s.size(); ++p) ASSERT_EQ(ids[p], p);
}

// Submanifold map against the reference (padding = dilation * (k - 1) / 2), poisoned buffer.
void check_submanifold(const CoordSet& s, const ConvParams& p) {
  ConvParams ref = p;
  for (int d = 0; d < p.dims; ++d) ref.padding[d] = p.dilation[d] * (p.kernel[d] - 1) / 2;
  KernelMap m = poisoned_map(p.volume(), p.volume() * s.size());
  point_conv::submanifold_map(s, p, m);
  EXPECT_EQ(pairs_of(m, s.size(), s.size()), reference_pairs(s, sites_of(s), ref));
  const int64_t c = (p.volume() - 1) / 2;  // centre: every site onto itself
  EXPECT_EQ(m.offset_ptr[c + 1] - m.offset_ptr[c], s.size());
}

// Strided map (spconv sites) against the reference sites and pairs.
void check_spconv(const CoordSet& in, const ConvParams& p) {
  const CoordSet out = point_conv::spconv_output_sites(in, p);
  expect_sorted_set(out);
  std::set<Site> got;
  for (const auto& [site, id] : sites_of(out)) got.insert(site);
  EXPECT_EQ(got, reference_spconv_sites(in, p, out.spatial_shape));
  KernelMap m = poisoned_map(p.volume(), p.volume() * out.size());
  point_conv::generalized_map(in, out, p, m);
  EXPECT_EQ(pairs_of(m, in.size(), out.size()), reference_pairs(in, sites_of(out), p));
}

// ---------------------------------------------------------------------------- validation

TEST(ConvCoords, NamesBadInput) {
  std::vector<int32_t> c{0, 1, 2, 0, 3, 4};
  EXPECT_ERROR(make_coord_set(c.data(), 6, 1), "width 1");
  EXPECT_ERROR(make_coord_set(c.data(), 1, 6), "width 6");
  std::vector<int32_t> neg{0, 1, 2, 0, 3, -4};
  EXPECT_ERROR(make_set(neg, 2), "coords[1, 2] = -4 is negative");
  std::vector<int32_t> bneg{0, 1, 2, -1, 3, 4};
  EXPECT_ERROR(make_set(bneg, 2), "coords[1, 0] = -1 is a negative batch index");
  CoordSetOptions o;
  o.spatial_shape = {4, 4};
  EXPECT_ERROR(make_set(c, 2, o), "coords[1, 2] = 4 is outside spatial_shape[1] = 4");
  o.spatial_shape = {4};
  EXPECT_ERROR(make_set(c, 2, o), "spatial_shape has 1 entries");
  CoordSetOptions b;
  b.batch_size = 1;
  std::vector<int32_t> two{0, 1, 2, 1, 3, 4};
  EXPECT_ERROR(make_set(two, 2, b), "coords[1, 0] = 1 is out of range for batch_size 1");
}

TEST(ConvCoords, DuplicatesNamedOrMerged) {
  std::vector<int32_t> c{0, 5, 5, 1, 2, 2, 0, 1, 1, 0, 5, 5, 1, 2, 2};
  EXPECT_ERROR(make_set(c, 2), "coords rows 0 and 3 are the same site (batch 0, 5, 5)");
  CoordSetOptions o;
  o.dedup = true;
  const CoordSet s = make_set(c, 2, o);
  EXPECT_EQ(s.size(), 3);
  EXPECT_EQ(s.num_duplicates(), 2);
  EXPECT_EQ(s.inverse, (std::vector<int32_t>{0, 1, 2, 0, 1}));  // numbered by first occurrence
  expect_sorted_set(s);
  for (int64_t p = 0; p < s.size(); ++p)  // the site's coordinates are those of its first row
    for (int j = 0; j < 3; ++j) EXPECT_EQ(s.coords[p * 3 + j], c[s.site[p] * 3 + j]);
}

TEST(ConvCoords, RefusesPastThePackingRange) {
  std::vector<int32_t> c{0, 1, 2, 3, 4};
  CoordSetOptions o;
  o.spatial_shape = {1 << 20, 1 << 20, 1 << 20, 1 << 20};
  EXPECT_ERROR(make_set(c, 4, o), "past the packing range");
  // 16-bit batch + 3 x 16-bit axes (grid 2^16 - 2 * margin) is exactly 64 bits and fits.
  o.spatial_shape = {65528, 65528, 65528};
  o.batch_size = 65536;
  std::vector<int32_t> c3{65535, 0, 65527, 3};
  EXPECT_EQ(make_set(c3, 3, o).layout.total_bits(), 64);
}

TEST(ConvCoords, RadixSortMatchesStableSort) {
  std::mt19937_64 rng(7);
  for (int64_t n : {0, 1, 100, 5000, 200000}) {
    std::vector<uint64_t> k(n);
    std::vector<int32_t> v(n);
    for (int64_t i = 0; i < n; ++i) k[i] = rng() >> 24, v[i] = static_cast<int32_t>(i);
    std::vector<std::pair<uint64_t, int32_t>> ref;
    for (int64_t i = 0; i < n; ++i) ref.push_back({k[i], v[i]});
    std::stable_sort(ref.begin(), ref.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    point_conv::radix_sort_pairs(k, v, 40);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(std::make_pair(k[i], v[i]), ref[i]) << i;
  }
}

// ---------------------------------------------------------------------------- submanifold

// dims, kernel, dilation, batch, density, margin
using SubmParam = std::tuple<int, int, int, int, double, int>;
class SubmanifoldRandom : public ::testing::TestWithParam<SubmParam> {};

TEST_P(SubmanifoldRandom, MatchesBruteForce) {
  const auto [dims, k, dil, batch, density, margin] = GetParam();
  const std::vector<int64_t> shape = dims == 2 ? std::vector<int64_t>{40, 33}
                                               : std::vector<int64_t>{17, 12, 20};
  int64_t cells = batch;
  for (int64_t e : shape) cells *= e;
  const auto c = random_coords(static_cast<int64_t>(cells * density), dims, batch, shape,
                               dims * 1000 + k * 100 + dil * 10 + batch);
  CoordSetOptions o;
  o.spatial_shape = shape;
  o.margin = margin;  // margin 0 / 1: the map must widen the key fields (repack)
  const CoordSet s = make_set(c, dims, o);
  expect_sorted_set(s);
  check_submanifold(s, cube_params(dims, k, 1, dil));
}

INSTANTIATE_TEST_SUITE_P(Grid, SubmanifoldRandom,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values(3, 5),
                                            ::testing::Values(1, 2), ::testing::Values(1, 3),
                                            ::testing::Values(0.03, 0.4),
                                            ::testing::Values(0, 4)));

TEST(Submanifold, AnisotropicKernel) {
  const auto c = random_coords(600, 3, 2, {15, 9, 30}, 11);
  ConvParams p = cube_params(3, 3);
  p.kernel[0] = 1, p.kernel[2] = 5, p.dilation[1] = 3;
  check_submanifold(make_set(c, 3), p);
}

// D = 1 and D = 4 go through the same code; checked on small clouds.
TEST(Submanifold, OneAndFourDimensions) {
  const CoordSet line = make_set(random_coords(60, 1, 3, {90}, 31), 1);
  check_submanifold(line, cube_params(1, 5, 1, 2));
  check_spconv(line, cube_params(1, 3, 2, 1, 1));
  const CoordSet hyper = make_set(random_coords(900, 4, 2, {9, 7, 8, 6}, 32), 4);
  check_submanifold(hyper, cube_params(4, 3));
  check_spconv(hyper, cube_params(4, 3, 2, 1, 1));
}

TEST(Submanifold, RejectsEvenKernelAndStride) {
  const CoordSet s = make_set({0, 1, 1}, 2);
  KernelMap m;
  EXPECT_ERROR(point_conv::submanifold_map(s, cube_params(2, 2), m), "odd kernel; kernel[0] = 2");
  EXPECT_ERROR(point_conv::submanifold_map(s, cube_params(2, 3, 2), m), "stride[0] = 2");
  EXPECT_ERROR(point_conv::submanifold_map(s, cube_params(3, 3), m), "dims = 3");
  EXPECT_ERROR(point_conv::submanifold_map(s, cube_params(2, 3, 1, 0), m), "dilation[0] = 0");
}

// No wrap-around: with margin 0 a 4 x 4 grid packs into 2 bits per axis, where (0, 3) + (0, 1)
// would carry into (1, 0); the map must widen the fields and pair nothing across the edge.
TEST(Submanifold, GridBoundaryDoesNotWrap) {
  CoordSetOptions o;
  o.spatial_shape = {4, 4};
  o.margin = 0;
  const CoordSet s = make_set({0, 0, 3, 0, 1, 0, 0, 3, 3}, 2, o);
  EXPECT_EQ(s.layout.total_bits(), 4);
  KernelMap m = poisoned_map(9, 27);
  point_conv::submanifold_map(s, cube_params(2, 3), m);
  EXPECT_EQ(m.size(), 3);  // the centre only
  check_submanifold(s, cube_params(2, 3));
  check_submanifold(s, cube_params(2, 5, 1, 3));
}

// Sites at both ends of a grid that uses all 64 key bits.
TEST(Submanifold, EdgeOfThePackingRange) {
  CoordSetOptions o;
  o.spatial_shape = {65528, 65528, 65528};
  o.batch_size = 65536;
  std::vector<int32_t> c;
  std::mt19937_64 rng(3);
  std::set<Site> seen;
  while (seen.size() < 400) {
    const int32_t b = (rng() % 2) ? 65535 : 0;
    int32_t row[4] = {b, 0, 0, 0};
    for (int d = 0; d < 3; ++d)
      row[1 + d] = static_cast<int32_t>((rng() % 2) ? rng() % 3 : 65527 - rng() % 3);
    if (seen.insert(site_of(row, 3)).second) c.insert(c.end(), row, row + 4);
  }
  const CoordSet s = make_set(c, 3, o);
  check_submanifold(s, cube_params(3, 3));
  check_submanifold(s, cube_params(3, 3, 1, 4));  // the margin exactly
  KernelMap m;  // a kernel past the margin needs a 65th bit: a clear error, not a wrong map
  EXPECT_ERROR(point_conv::submanifold_map(s, cube_params(3, 5, 1, 3), m), "past the packing range");
}

TEST(Submanifold, EmptySinglePointAndOneVoxel) {
  CoordSetOptions o;
  o.spatial_shape = {8, 8, 8};
  const CoordSet empty = make_coord_set(nullptr, 0, 4, o);
  EXPECT_EQ(empty.size(), 0);
  KernelMap m = poisoned_map(27, 0);
  point_conv::submanifold_map(empty, cube_params(3, 3), m);
  EXPECT_EQ(m.offset_ptr, std::vector<int64_t>(28, 0));
  const CoordSet one = make_set({0, 7, 0, 3}, 3, o);
  check_submanifold(one, cube_params(3, 3));
  check_spconv(one, cube_params(3, 3, 2, 1, 1));
  std::vector<int32_t> same;
  for (int i = 0; i < 50; ++i) same.insert(same.end(), {1, 2, 2, 2});
  EXPECT_ERROR(make_set(same, 3, o), "coords rows 0 and 1 are the same site");
  o.dedup = true;
  const CoordSet merged = make_set(same, 3, o);
  EXPECT_EQ(merged.size(), 1);
  EXPECT_EQ(merged.inverse, std::vector<int32_t>(50, 0));
  check_submanifold(merged, cube_params(3, 5));
}

// ---------------------------------------------------------------------------- strided

// dims, kernel, stride, dilation, padding, batch
using StridedParam = std::tuple<int, int, int, int, int, int>;
class SpconvStrided : public ::testing::TestWithParam<StridedParam> {};

TEST_P(SpconvStrided, MatchesBruteForce) {
  const auto [dims, k, stride, dil, pad, batch] = GetParam();
  const std::vector<int64_t> shape = dims == 2 ? std::vector<int64_t>{41, 30}
                                               : std::vector<int64_t>{15, 21, 10};
  for (double density : {0.02, 0.3}) {
    int64_t cells = batch;
    for (int64_t e : shape) cells *= e;
    const auto c = random_coords(std::max<int64_t>(1, cells * density), dims, batch, shape,
                                 k * 7 + stride * 5 + dil * 3 + pad + batch);
    CoordSetOptions o;
    o.spatial_shape = shape;
    check_spconv(make_set(c, dims, o), cube_params(dims, k, stride, dil, pad));
  }
}

INSTANTIATE_TEST_SUITE_P(Spconv, SpconvStrided,
                         ::testing::Values(StridedParam{3, 3, 2, 1, 1, 2},
                                           StridedParam{3, 2, 2, 1, 0, 1},
                                           StridedParam{3, 3, 2, 2, 0, 3},
                                           StridedParam{3, 3, 1, 1, 0, 1},
                                           StridedParam{3, 5, 2, 1, 2, 2},
                                           StridedParam{3, 3, 3, 2, 4, 1},
                                           StridedParam{2, 3, 2, 1, 1, 3},
                                           StridedParam{2, 5, 2, 2, 1, 1},
                                           StridedParam{2, 2, 2, 1, 0, 2}));

TEST(Strided, OutputShapeAsSpconv) {
  EXPECT_EQ(point_conv::spconv_output_shape({41, 1600, 1408}, cube_params(3, 3, 2, 1, 1)),
            (std::vector<int64_t>{21, 800, 704}));
  EXPECT_EQ(point_conv::spconv_output_shape({10}, cube_params(1, 3, 1, 2, 0)),
            (std::vector<int64_t>{6}));
  EXPECT_ERROR(point_conv::spconv_output_shape({3}, cube_params(1, 5)), "output would be empty");
}

// Output sites come from per-plane bitmaps on compact grids and from sorting candidate keys
// on wide sparse grids or grids of mostly empty planes: both against brute force, 1-D to 4-D.
TEST(Strided, PlaneAndSortedSitePathsMatchBruteForce) {
  struct Case {
    std::vector<int64_t> shape;
    int64_t n;
    int batch;
  };
  for (const Case& c : {Case{{40}, 15, 2}, Case{{9, 7, 6, 5}, 300, 2}, Case{{64, 64, 64}, 3000, 1},
                        Case{{3000, 3000, 3000}, 300, 1},  // 9M-bit planes: sorted keys
                        Case{{5000, 6, 6}, 40, 3}}) {       // mostly empty planes: sorted keys
    const int dims = static_cast<int>(c.shape.size());
    CoordSetOptions o;
    o.spatial_shape = c.shape;
    const CoordSet in = make_set(random_coords(c.n, dims, c.batch, c.shape, 31), dims, o);
    for (const ConvParams& p : {cube_params(dims, 3, 2, 1, 1), cube_params(dims, 2, 2),
                                cube_params(dims, 3, 3, 2, 2)})
      check_spconv(in, p);
  }
}

TEST(Strided, CoarseGrid) {
  const std::vector<int64_t> shape{23, 16, 9};
  const auto c = random_coords(900, 3, 2, shape, 5);
  CoordSetOptions o;
  o.spatial_shape = shape;
  const CoordSet in = make_set(c, 3, o);
  for (const ConvParams& p : {cube_params(3, 2, 2), cube_params(3, 3, 2, 1, 1),
                              cube_params(3, 3, 3), cube_params(3, 1, 2)}) {
    const CoordSet out = point_conv::coarse_output_sites(in, p);
    expect_sorted_set(out);
    std::set<Site> ref;
    for (auto [site, id] : sites_of(in)) {
      for (int d = 0; d < 3; ++d) site[1 + d] /= p.stride[d];
      ref.insert(site);
    }
    std::set<Site> got;
    for (const auto& [site, id] : sites_of(out)) got.insert(site);
    EXPECT_EQ(got, ref);
    EXPECT_EQ(out.spatial_shape[0], (23 + p.stride[0] - 1) / p.stride[0]);
    KernelMap m = poisoned_map(p.volume(), p.volume() * out.size());
    point_conv::generalized_map(in, out, p, m);
    EXPECT_EQ(pairs_of(m, in.size(), out.size()), reference_pairs(in, sites_of(out), p));
  }
}

// Onto user-given outputs (own grid, own ids, sites beyond the input grid, another batch).
TEST(Generalized, OntoUserSites) {
  const auto ci = random_coords(700, 3, 2, {20, 20, 20}, 8);
  const auto co = random_coords(500, 3, 3, {25, 12, 30}, 9);
  const CoordSet in = make_set(ci, 3), out = make_set(co, 3);
  for (const ConvParams& p : {cube_params(3, 3, 1, 1, 1), cube_params(3, 3, 2, 1, 1),
                              cube_params(3, 2, 1, 3, 0), cube_params(3, 5, 1, 2, 7)}) {
    KernelMap m = poisoned_map(p.volume(), p.volume() * out.size());
    point_conv::generalized_map(in, out, p, m);
    EXPECT_EQ(pairs_of(m, in.size(), out.size()), reference_pairs(in, sites_of(out), p));
  }
  KernelMap m;
  const CoordSet empty = make_coord_set(nullptr, 0, 4);
  point_conv::generalized_map(in, empty, cube_params(3, 3), m);
  EXPECT_EQ(m.size(), 0);
  point_conv::generalized_map(empty, out, cube_params(3, 3), m);
  EXPECT_EQ(m.offset_ptr, std::vector<int64_t>(28, 0));
}

// 70 x 70 residue classes exceed the input-driven path's limit: the output-driven merge runs.
TEST(Generalized, HugeStrideFallsBackToOutputMerge) {
  const CoordSet in = make_set(random_coords(3000, 2, 2, {700, 500}, 21), 2);
  for (const ConvParams& p : {cube_params(2, 3, 70, 1, 1), cube_params(2, 3, 2, 1, 1)}) {
    const CoordSet out = point_conv::spconv_output_sites(in, p);
    KernelMap m = poisoned_map(p.volume(), p.volume() * out.size());
    point_conv::generalized_map(in, out, p, m);
    EXPECT_EQ(pairs_of(m, in.size(), out.size()), reference_pairs(in, sites_of(out), p));
  }
}

TEST(Inverse, IsTheForwardSwapped) {
  const auto c = random_coords(800, 3, 2, {16, 16, 16}, 4);
  const CoordSet in = make_set(c, 3);
  const ConvParams p = cube_params(3, 3, 2, 1, 1);
  const CoordSet out = point_conv::spconv_output_sites(in, p);
  KernelMap fwd, inv = poisoned_map(27, 27 * in.size());
  point_conv::generalized_map(in, out, p, fwd);
  point_conv::inverse_map(fwd, inv);
  // inverse conv: input = the strided output, output = the original sites; same offsets
  Pairs ref = reference_pairs(in, sites_of(out), p);
  for (auto& v : ref) {
    for (auto& [a, b] : v) std::swap(a, b);
    std::sort(v.begin(), v.end());
  }
  EXPECT_EQ(pairs_of(inv, out.size(), in.size()), ref);
  point_conv::inverse_map(fwd, fwd);  // in place
  EXPECT_EQ(pairs_of(fwd, out.size(), in.size()), ref);
}

// spconv SparseConvTranspose: new sites o = i * stride + e * dilation - padding.
TEST(Transposed, MatchesBruteForce) {
  for (int dims : {2, 3}) {
    const std::vector<int64_t> shape = dims == 2 ? std::vector<int64_t>{13, 9}
                                                 : std::vector<int64_t>{7, 11, 6};
    const CoordSet in = make_set(random_coords(150, dims, 2, shape, dims), dims);
    for (const ConvParams& p : {cube_params(dims, 3, 2, 1, 1), cube_params(dims, 2, 2),
                                cube_params(dims, 3, 1, 2, 1), cube_params(dims, 3, 3, 1, 0)}) {
      const CoordSet out = point_conv::transposed_output_sites(in, p);
      expect_sorted_set(out);
      const std::vector<int64_t> oshape = point_conv::transposed_output_shape(in.spatial_shape, p);
      std::set<Site> ref_sites;
      for (const auto& [c, id] : sites_of(in))
        for (int64_t k = 0; k < p.volume(); ++k) {
          Site o = c;
          bool ok = true;
          int64_t r = k;
          for (int d = dims - 1; d >= 0; --d) {
            const int64_t e = r % p.kernel[d];
            r /= p.kernel[d];
            o[1 + d] = c[1 + d] * p.stride[d] + e * p.dilation[d] - p.padding[d];
            ok &= o[1 + d] >= 0 && o[1 + d] < oshape[d];
          }
          if (ok) ref_sites.insert(o);
        }
      std::set<Site> got;
      for (const auto& [site, id] : sites_of(out)) got.insert(site);
      EXPECT_EQ(got, ref_sites);
      Pairs ref = reference_pairs(out, sites_of(in), p);  // (o, i): o = i * s + e * dil - pad
      for (auto& v : ref) {
        for (auto& [a, b] : v) std::swap(a, b);
        std::sort(v.begin(), v.end());
      }
      KernelMap m = poisoned_map(p.volume(), p.volume() * in.size());
      point_conv::transposed_map(in, out, p, m);
      EXPECT_EQ(pairs_of(m, in.size(), out.size()), ref);
    }
  }
}

// Same bits whatever the thread count: 16 threads cut every offset's list into several chunks
// (each finding its start by binary search), 1 thread walks each list whole.
TEST(KernelMap, SameMapsForAnyThreadCount) {
  const CoordSet s = make_set(random_coords(20000, 3, 2, {128, 128, 128}, 12), 3);
  const ConvParams sub = cube_params(3, 3), str = cube_params(3, 3, 2, 1, 1);
  const int saved = omp_get_max_threads();
  KernelMap a[2], b[2];
  CoordSet out[2];
  for (int run = 0; run < 2; ++run) {
    omp_set_num_threads(run == 0 ? 1 : 16);
    point_conv::submanifold_map(s, sub, a[run]);
    out[run] = point_conv::spconv_output_sites(s, str);
    point_conv::generalized_map(s, out[run], str, b[run]);
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(out[0].keys, out[1].keys);
  for (KernelMap* m : {a, b}) {
    EXPECT_EQ(m[0].offset_ptr, m[1].offset_ptr);
    EXPECT_EQ(m[0].in_idx, m[1].in_idx);
    EXPECT_EQ(m[0].out_idx, m[1].out_idx);
  }
  EXPECT_EQ(pairs_of(a[1], s.size(), s.size()),
            reference_pairs(s, sites_of(s), cube_params(3, 3, 1, 1, 1)));
  EXPECT_EQ(pairs_of(b[1], s.size(), out[1].size()), reference_pairs(s, sites_of(out[1]), str));
}

// ---------------------------------------------------------------------------- real scans

TEST(KittiScan, VoxelizedAt5cm) {
  const std::string path = data_dir() + "/pointclouds/kitti_pointpillars/000000.bin";
  if (!std::ifstream(path).good()) GTEST_SKIP() << "no scan at " << path;
  const auto c = kitti_voxels(path, 0.05);
  ASSERT_FALSE(c.empty());
  CoordSetOptions o;
  o.dedup = true;  // several points per voxel
  const CoordSet s = make_set(c, 3, o);
  expect_sorted_set(s);
  EXPECT_GT(s.size(), 1000);
  for (int64_t r = 0; r < s.num_rows; ++r) {  // every point lands in its voxel's site
    const auto it = std::find(s.site.begin(), s.site.end(), s.inverse[r]);
    ASSERT_NE(it, s.site.end());
    const int64_t p = it - s.site.begin();
    ASSERT_TRUE(std::equal(c.begin() + r * 4, c.begin() + r * 4 + 4, s.coords.begin() + p * 4));
    if (r > 200) break;  // a sample: std::find is linear
  }
  check_submanifold(s, cube_params(3, 3));
  check_spconv(s, cube_params(3, 3, 2, 1, 1));
  const CoordSet coarse = point_conv::coarse_output_sites(s, cube_params(3, 2, 2));
  KernelMap m;
  point_conv::generalized_map(s, coarse, cube_params(3, 2, 2), m);
  EXPECT_EQ(m.size(), s.size());  // kernel = stride: every voxel in exactly one cell
}

}  // namespace
}  // namespace sparsejit::testing
