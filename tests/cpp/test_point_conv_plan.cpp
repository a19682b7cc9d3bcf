// Point-cloud plan assembly (csrc/point_conv/plan_build.h): the plan words written into a
// poisoned buffer against brute-force pairs and a plain row index, the submanifold identity,
// the header and its fingerprint (the project's one structure hash).
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "csrc/core/csr.h"
#include "csrc/point_conv/plan_build.h"
#include "csrc/point_conv/point_conv_run.h"
#include "tests/cpp/point_conv_reference.h"

namespace sparsejit::testing {
namespace {

using point_conv::cube_params;
using point_conv::Kind;
using point_conv::PlanView;

constexpr int64_t kPoison = int64_t{0x5A5A5A5A5A5A5A5A};

CoordSet make_set(const std::vector<int32_t>& c, int dims, const std::vector<int64_t>& shape,
                  int64_t batch, int64_t margin = 4) {
  point_conv::CoordSetOptions o;
  o.spatial_shape = shape;
  o.batch_size = batch;
  o.margin = margin;
  return point_conv::make_coord_set(c.data(), static_cast<int64_t>(c.size()) / (dims + 1),
                                    dims + 1, o);
}

struct Built {
  KernelMap km;
  CoordSet out_sites;
  const CoordSet* out = nullptr;
  int64_t identity = -1, hash = 0;
  std::vector<int64_t> words;
  PlanView v;
};

// The plan of `kind` through the four steps the adapter calls, into a poisoned buffer.
Built build(Kind kind, const CoordSet& in, const CoordSet* given, const ConvParams& p,
            int64_t margin) {
  Built b;
  b.out = &point_conv::build_kernel_map(kind, in, given, p, margin, b.km, b.out_sites);
  b.identity = point_conv::mark_identity(kind, in.size(), b.km);
  const int64_t k = b.km.kernel_volume(), m = b.km.size();
  b.hash = point_conv::sites_fingerprint(in.keys.data(), in.size());
  b.words.assign(point_conv::plan_words(k, m, in.size(), b.out->size()), kPoison);
  point_conv::write_plan(b.words.data(), kind, b.identity, b.km, in.size(), b.out->size(),
                         b.hash);
  b.v = point_conv::view_words(b.words.data(), k, m, in.size(), b.out->size());
  b.v.identity = b.identity;
  return b;
}

// Every word of the plan: header and stamp, the pairs as the brute-force reference pairs
// them, both row indexes and pair_group as a plain loop builds them, padding zero.
void expect_plan(const Built& b, Kind kind, const CoordSet& in, const ConvParams& p) {
  const PlanView& v = b.v;
  const int64_t n_in = in.size(), n_out = b.out->size(), m = v.m, k = v.k;
  std::string error;
  EXPECT_TRUE(plan::check_header(b.words.data(), static_cast<int64_t>(b.words.size()),
                                 OpKind::PointConv, {n_out, m, n_in, b.hash}, &error))
      << error;
  EXPECT_EQ(b.words[plan::kWordKernel], kind);
  EXPECT_EQ(b.words[plan::kWordPrefetch], 0);
  EXPECT_EQ(b.words[plan::kWordParam], b.identity);
  EXPECT_EQ(b.words[point_conv::kWordKernelVolume], p.volume());
  EXPECT_GE(b.hash, 0);
  EXPECT_EQ(b.hash, static_cast<int64_t>(hash_words(in.keys.data(), n_in,
                                                    static_cast<uint64_t>(n_in)) >> 1));
  // Pairs: the map's, which are the reference's (kind by kind: whose output sites).
  EXPECT_EQ(std::vector<int64_t>(v.group_ptr, v.group_ptr + k + 1), b.km.offset_ptr);
  Pairs got(k);
  for (int64_t g = 0; g < k; ++g) {
    for (int64_t q = v.group_ptr[g]; q < v.group_ptr[g + 1]; ++q) {
      if (kind == point_conv::kTransposed)  // outputs of a transposed map read as inputs
        got[g].push_back({v.out_idx[q], v.in_idx[q]});
      else
        got[g].push_back({v.in_idx[q], v.out_idx[q]});
    }
    std::sort(got[g].begin(), got[g].end());
  }
  ConvParams ref_p = p;  // a submanifold map's offsets are centred: padding (kernel - 1) / 2
  if (kind == point_conv::kSubm)
    for (int d = 0; d < p.dims; ++d) ref_p.padding[d] = p.dilation[d] * (p.kernel[d] - 1) / 2;
  const Pairs ref = kind == point_conv::kTransposed ? reference_pairs(*b.out, sites_of(in), p)
                                                    : reference_pairs(in, sites_of(*b.out), ref_p);
  EXPECT_TRUE(got == ref) << "kind " << kind << ": the plan's pairs are not the reference's";
  // Row indexes: pair ids of each row ascending; pair_group the group of each pair.
  auto expect_index = [&](const int32_t* rows, int64_t num_rows, const int64_t* row_ptr,
                          const int32_t* row_pair, const char* what) {
    std::vector<int64_t> ptr(num_rows + 1, 0);
    std::vector<std::vector<int32_t>> of(num_rows);
    for (int64_t q = 0; q < m; ++q) of[rows[q]].push_back(static_cast<int32_t>(q));
    for (int64_t r = 0; r < num_rows; ++r) ptr[r + 1] = ptr[r] + of[r].size();
    ASSERT_EQ(std::vector<int64_t>(row_ptr, row_ptr + num_rows + 1), ptr) << what;
    std::vector<int32_t> flat;
    for (const auto& r : of) flat.insert(flat.end(), r.begin(), r.end());
    EXPECT_EQ(std::vector<int32_t>(row_pair, row_pair + m), flat) << what;
  };
  expect_index(v.out_idx, n_out, v.out_row_ptr, v.out_row_pair, "out rows");
  expect_index(v.in_idx, n_in, v.in_row_ptr, v.in_row_pair, "in rows");
  for (int64_t g = 0; g < k; ++g)
    for (int64_t q = v.group_ptr[g]; q < v.group_ptr[g + 1]; ++q)
      EXPECT_EQ(v.pair_group[q], g) << "pair " << q;
  if (m % 2 == 1)
    for (const int32_t* a : {v.in_idx, v.out_idx, v.out_row_pair, v.in_row_pair, v.pair_group})
      EXPECT_EQ(a[m], 0) << "padding";
  // What every op call checks, and the full semantic check (identity included).
  point_conv::Pairs pairs;
  pairs.num_groups = k;
  pairs.group_ptr = v.group_ptr;
  pairs.in_idx = v.in_idx;
  pairs.out_idx = v.out_idx;
  pairs.num_in = n_in;
  pairs.num_out = n_out;
  pairs.identity_group = b.identity;
  pairs.row_ptr = v.out_row_ptr;
  pairs.row_pair = v.out_row_pair;
  pairs.pair_group = v.pair_group;
  EXPECT_EQ(point_conv::check_pairs(pairs, /*full=*/true), "");
}

TEST(PointConvPlan, SubmanifoldStoresTheCentreAsIdentity) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    const std::vector<int64_t> shape{12, 9, 7};
    const CoordSet in = make_set(random_coords(150, 3, 2, shape, seed), 3, shape, 2);
    const ConvParams p = cube_params(3, 3);
    const Built b = build(point_conv::kSubm, in, nullptr, p, 4);
    EXPECT_EQ(b.identity, 13);
    const int64_t c0 = b.v.group_ptr[13];
    for (int64_t r = 0; r < in.size(); ++r) {
      EXPECT_EQ(b.v.in_idx[c0 + r], r);
      EXPECT_EQ(b.v.out_idx[c0 + r], r);
    }
    expect_plan(b, point_conv::kSubm, in, p);
  }
}

TEST(PointConvPlan, StridedCoarseTransposedAndGeneralizedKinds) {
  const std::vector<int64_t> shape{10, 11, 6};
  const CoordSet in = make_set(random_coords(90, 3, 2, shape, 7), 3, shape, 2);
  const ConvParams p = cube_params(3, 3, 2, 1, 1);
  for (Kind kind : {point_conv::kSpconv, point_conv::kCoarse, point_conv::kTransposed}) {
    const Built b = build(kind, in, nullptr, p, 4);
    EXPECT_EQ(b.identity, -1);
    EXPECT_GT(b.out->size(), 0);
    expect_plan(b, kind, in, p);
  }
  // Generalized: onto user-given sites (here a subset of the inputs, another row order).
  std::vector<int32_t> sub;
  for (int64_t r = in.size() - 1; r >= 0; r -= 3)
    sub.insert(sub.end(), in.coords.begin() + r * 4, in.coords.begin() + r * 4 + 4);
  const CoordSet given = make_set(sub, 3, {}, 2);
  const ConvParams q = cube_params(3, 3);
  const Built g = build(point_conv::kGeneralized, in, &given, q, 4);
  EXPECT_EQ(g.out, &given);
  EXPECT_EQ(g.identity, -1);  // only submanifold maps store an identity
  expect_plan(g, point_conv::kGeneralized, in, q);
}

TEST(PointConvPlan, EmptyAndOneSite) {
  const std::vector<int64_t> shape{8, 8};
  const CoordSet none = make_set({}, 2, shape, 1);
  const Built e = build(point_conv::kSubm, none, nullptr, cube_params(2, 3), 4);
  EXPECT_EQ(e.v.m, 0);
  EXPECT_EQ(e.words.size(), static_cast<size_t>(point_conv::plan_words(9, 0, 0, 0)));
  // An empty centre pairs all zero sites with themselves: the identity, with nothing in it.
  EXPECT_EQ(e.identity, 4);
  expect_plan(e, point_conv::kSubm, none, cube_params(2, 3));
  const CoordSet one = make_set({0, 3, 5}, 2, shape, 1);
  const Built s = build(point_conv::kSubm, one, nullptr, cube_params(2, 3), 4);
  EXPECT_EQ(s.v.m, 1);  // odd M: every int32 array padded
  expect_plan(s, point_conv::kSubm, one, cube_params(2, 3));
  const Built t = build(point_conv::kSpconv, one, nullptr, cube_params(2, 3, 2, 1, 1), 4);
  expect_plan(t, point_conv::kSpconv, one, cube_params(2, 3, 2, 1, 1));
}

TEST(PointConvPlan, SkewedSitesOneDenseCornerManyLoners) {
  // A full 6x6x6 block in one corner and scattered single sites: groups of very different
  // sizes, rows with 27 pairs next to rows with one.
  std::vector<int32_t> c;
  for (int x = 0; x < 6; ++x)
    for (int y = 0; y < 6; ++y)
      for (int z = 0; z < 6; ++z) c.insert(c.end(), {0, x, y, z});
  for (int i = 0; i < 20; ++i) c.insert(c.end(), {0, 10 + 2 * i, 30, 2 * (i % 9) + 10});
  const std::vector<int64_t> shape{60, 40, 40};
  const CoordSet in = make_set(c, 3, shape, 1);
  for (int64_t kernel : {3, 5}) {
    const ConvParams p = cube_params(3, kernel);
    const Built b = build(point_conv::kSubm, in, nullptr, p, 4);
    EXPECT_EQ(b.identity, p.volume() / 2);
    expect_plan(b, point_conv::kSubm, in, p);
  }
}

TEST(PointConvPlan, FingerprintIsTheSetsNotTheRowOrder) {
  const std::vector<int64_t> shape{16, 16};
  std::vector<int32_t> c = random_coords(40, 2, 1, shape, 11);
  const CoordSet a = make_set(c, 2, shape, 1);
  std::vector<int32_t> rev;  // the same sites, rows reversed
  for (int64_t r = static_cast<int64_t>(c.size()) / 3 - 1; r >= 0; --r)
    rev.insert(rev.end(), c.begin() + 3 * r, c.begin() + 3 * r + 3);
  const CoordSet b = make_set(rev, 2, shape, 1);
  EXPECT_EQ(point_conv::sites_fingerprint(a.keys.data(), a.size()),
            point_conv::sites_fingerprint(b.keys.data(), b.size()));
  std::vector<int32_t> fewer = c;  // one site less
  fewer.resize(fewer.size() - 3);
  const CoordSet d = make_set(fewer, 2, shape, 1);
  EXPECT_NE(point_conv::sites_fingerprint(a.keys.data(), a.size()),
            point_conv::sites_fingerprint(d.keys.data(), d.size()));
  // The same keys packed with another margin are other keys: another fingerprint.
  const CoordSet wide = make_set(c, 2, shape, 1, /*margin=*/9);
  EXPECT_NE(point_conv::sites_fingerprint(a.keys.data(), a.size()),
            point_conv::sites_fingerprint(wide.keys.data(), wide.size()));
}

TEST(PointConvPlan, GeneralizedWithoutOutputSitesIsAnError) {
  const std::vector<int64_t> shape{8, 8};
  const CoordSet in = make_set({0, 1, 1, 0, 2, 2}, 2, shape, 1);
  KernelMap km;
  CoordSet out;
  try {
    point_conv::build_kernel_map(point_conv::kGeneralized, in, nullptr, cube_params(2, 3), 4, km,
                                 out);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("out_coords"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sparsejit::testing
