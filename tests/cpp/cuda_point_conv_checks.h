// Kernel-level checks of the point-cloud convolution's CUDA kernels (kernels/cuda/point_conv.cuh),
// run by test_cuda_kernels.cpp in the host emulation and on a GPU through the same Runner:
// the gather against a bitwise copy and the ordered row reduction against a float64 sum in pair
// order, outputs poisoned with guard bands, on random pair sets: many pairs per source row
// (duplicates), the last source row, no pairs at all, one pair, and a dense cluster (every pair
// into one output row); the kernel-map search against std::lower_bound; and the
// output-stationary implicit GEMM (with its neighbour map) against a float64 sum over the map.
#pragma once

#include "codegen/cuda_point_conv.h"
#include "tests/cpp/cuda_kernel_checks.h"

namespace sparsejit::codegen::checks {

// Pairs of a plan: src_row[e] (gathered source row) and out_row[e] (where the product goes),
// with the plan's row index (row_ptr, row_pair: pair ids per output row, increasing).
struct PairSet {
  std::string name;
  int64_t n_src = 0, n_out = 0;
  std::vector<int64_t> src_row, out_row;
  std::vector<int64_t> row_ptr, row_pair;
};

inline PairSet make_pairs(std::string name, int64_t n_src, int64_t n_out, int64_t m,
                          uint64_t seed, bool cluster) {
  PairSet p;
  p.name = std::move(name);
  p.n_src = n_src;
  p.n_out = n_out;
  std::mt19937_64 rng(seed);
  for (int64_t e = 0; e < m; ++e) {
    // Sources skewed towards a few rows, and the last row always used when m > 1.
    int64_t s = e == 1 ? n_src - 1 : int64_t(rng() % n_src);
    if (rng() % 3 == 0) s = s % 3 % n_src;
    p.src_row.push_back(s);
    p.out_row.push_back(cluster ? n_out / 2 : int64_t(rng() % n_out));
  }
  p.row_ptr.assign(n_out + 1, 0);
  for (int64_t r : p.out_row) ++p.row_ptr[r + 1];
  for (int64_t r = 0; r < n_out; ++r) p.row_ptr[r + 1] += p.row_ptr[r];
  p.row_pair.assign(m, 0);
  std::vector<int64_t> fill(p.row_ptr.begin(), p.row_ptr.end() - 1);
  for (int64_t e = 0; e < m; ++e) p.row_pair[fill[p.out_row[e]]++] = e;
  return p;
}

inline std::vector<PairSet> pair_sets() {
  return {make_pairs("random", 23, 17, 60, 41, false),
          make_pairs("empty", 5, 6, 0, 42, false),
          make_pairs("one_pair", 1, 1, 1, 43, false),
          make_pairs("dense_cluster", 9, 4, 45, 44, true)};
}

template <typename I>
void check_point_conv_typed(Runner& r, const CudaPointConvSpec& s) {
  const int64_t C = s.channels;
  for (const PairSet& ps : pair_sets()) {
    for (bool with_bias : {false, true}) {
      SCOPED_TRACE(s.name() + " on " + ps.name + (with_bias ? " with bias" : ""));
      r.reset();
      const int64_t m = static_cast<int64_t>(ps.src_row.size());
      // gather: src [n_src, C] by src_row -> g [m, C]
      Buffer src(s.dtype, ps.n_src * C), g(s.dtype, m * C);
      fill_random(&src, 51);
      Typed<I> idx(m), pair(m);
      Typed<long long> row_ptr(ps.n_out + 1);
      for (int64_t e = 0; e < m; ++e) idx.set(e, static_cast<I>(ps.src_row[e]));
      for (int64_t e = 0; e < m; ++e) pair.set(e, static_cast<I>(ps.row_pair[e]));
      for (int64_t i = 0; i <= ps.n_out; ++i) row_ptr.set(i, ps.row_ptr[i]);
      src.upload(r);
      g.upload(r);
      idx.upload(r);
      pair.upload(r);
      row_ptr.upload(r);
      cuda::PointConvParams gp{src.dev(), idx.dev(), nullptr, nullptr, g.dev(), m};
      if (m > 0) ASSERT_EQ(r.run(s, {plan_point_conv_gather_launch(s, m)}, &gp), "");
      g.download(r);
      int bad = 0;
      for (int64_t e = 0; e < m && bad < 5; ++e)
        for (int64_t c = 0; c < C; ++c)
          if (std::memcmp(g.at(e * C + c), src.at(ps.src_row[e] * C + c), g.width) != 0) {
            ADD_FAILURE() << "gathered[" << e << ", " << c << "] is not src[" << ps.src_row[e]
                          << ", " << c << "]";
            ++bad;
          }
      EXPECT_TRUE(g.guards_intact());
      // rows: products [m, C] reduced into [n_out, C] through the row index.
      Buffer prod(s.dtype, m * C), bias(s.dtype, C), out(s.dtype, ps.n_out * C);
      fill_random(&prod, 52, -2, 2);
      fill_random(&bias, 53);
      prod.upload(r);
      bias.upload(r);
      out.upload(r);
      cuda::PointConvParams rp{prod.dev(), pair.dev(), reinterpret_cast<const long long*>(row_ptr.dev()),
                               with_bias ? bias.dev() : nullptr, out.dev(), ps.n_out};
      ASSERT_EQ(r.run(s, {plan_point_conv_rows_launch(s, ps.n_out)}, &rp), "");
      out.download(r);
      for (int64_t i = 0; i < ps.n_out; ++i)
        for (int64_t c = 0; c < C && bad < 10; ++c) {
          double ref = with_bias ? bias.get(c) : 0.0;
          for (int64_t e = ps.row_ptr[i]; e < ps.row_ptr[i + 1]; ++e)
            ref += prod.get(ps.row_pair[e] * C + c);
          if (s.act == Act::Relu) ref = std::max(ref, 0.0);
          const double got = out.get(i * C + c);
          const double deg = double(ps.row_ptr[i + 1] - ps.row_ptr[i]);
          if (!(std::abs(got - ref) <= tolerance(s.dtype) * (1 + std::abs(ref) + deg))) {
            ADD_FAILURE() << "out[" << i << ", " << c << "] = " << got << ", expected " << ref;
            ++bad;
          }
        }
      EXPECT_TRUE(out.guards_intact());
    }
  }
}

// Sorted unique keys and queries: random (with the top bit set on some), none, one, and a dense
// run of consecutive keys; deltas 0, +1, -1 (wrapping), a field-sized step and one past every key.
struct KeySet {
  std::string name;
  std::vector<uint64_t> keys, query;
};

inline std::vector<KeySet> key_sets() {
  std::vector<KeySet> v;
  std::mt19937_64 rng(61);
  KeySet a{"random", {}, {}};
  for (int i = 0; i < 50; ++i) a.keys.push_back(i % 7 == 0 ? rng() : rng() % 4096);
  std::sort(a.keys.begin(), a.keys.end());
  a.keys.erase(std::unique(a.keys.begin(), a.keys.end()), a.keys.end());
  for (size_t i = 0; i < a.keys.size(); i += 2) a.query.push_back(a.keys[i]);
  for (int i = 0; i < 20; ++i) a.query.push_back(rng() % 4096);
  v.push_back(a);
  v.push_back({"no_keys", {}, {1, 2, 3}});
  v.push_back({"one_key", {77}, {77, 76, 78}});
  KeySet d{"dense_run", {}, {}};
  for (uint64_t k = 100; k < 164; ++k) d.keys.push_back(k);
  d.query = d.keys;
  v.push_back(d);
  return v;
}

template <typename I>
void check_point_map_typed(Runner& r, const CudaPointMapSpec& s) {
  const std::vector<uint64_t> deltas = {0, 1, ~uint64_t{0}, 16, uint64_t{1} << 40, 4095};
  for (const KeySet& ks : key_sets()) {
    SCOPED_TRACE(s.name() + " on " + ks.name);
    r.reset();
    const int64_t nk = ks.keys.size(), nq = ks.query.size(), k = deltas.size();
    Typed<uint64_t> keys(nk), query(nq), delta(k);
    Typed<I> found(k * nq);
    for (int64_t i = 0; i < nk; ++i) keys.set(i, ks.keys[i]);
    for (int64_t i = 0; i < nq; ++i) query.set(i, ks.query[i]);
    for (int64_t i = 0; i < k; ++i) delta.set(i, deltas[i]);
    keys.upload(r);
    query.upload(r);
    delta.upload(r);
    found.upload(r);
    cuda::PointMapParams p{static_cast<const unsigned long long*>(keys.dev()),
                           static_cast<const unsigned long long*>(query.dev()),
                           static_cast<const unsigned long long*>(delta.dev()), found.dev(), nk,
                           nq, k, 0};
    ASSERT_EQ(r.run(s, {plan_point_map_launch(s, k, nq)}, &p), "");
    found.download(r);
    int bad = 0;
    for (int64_t o = 0; o < k; ++o)
      for (int64_t q = 0; q < nq && bad < 5; ++q) {
        const uint64_t target = ks.query[q] + deltas[o];
        auto it = std::lower_bound(ks.keys.begin(), ks.keys.end(), target);
        const int64_t ref = it != ks.keys.end() && *it == target ? it - ks.keys.begin() : -1;
        const int64_t got = static_cast<int64_t>(found.get(o * nq + q));
        if (got != ref) {
          ADD_FAILURE() << "found[" << o << ", " << q << "] = " << got << ", expected " << ref;
          ++bad;
        }
      }
    EXPECT_TRUE(found.guards_intact());
  }
}

// A kernel map for the implicit GEMM: at most one pair per (output row, offset), sources skewed
// towards a few rows; pairs in group-major order, as plans store them.
struct OffsetMap {
  std::string name;
  int64_t n_src = 0, n_out = 0, k = 0;
  std::vector<int32_t> src, dst, group;
};

inline OffsetMap make_offset_map(std::string name, int64_t n_src, int64_t n_out, int64_t k,
                                 double density, uint64_t seed, bool skewed) {
  OffsetMap m{std::move(name), n_src, n_out, k, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t g = 0; g < k; ++g)
    for (int64_t r = 0; r < n_out; ++r) {
      // skewed: one row uses every offset, the others only offset 0 now and then.
      const bool take = skewed ? (r == n_out / 2 || (g == 0 && u(rng) < 0.1)) : u(rng) < density;
      if (!take || n_src == 0) continue;
      int64_t sr = int64_t(rng() % n_src);
      if (rng() % 3 == 0) sr = sr % 2;
      if (m.src.empty()) sr = n_src - 1;  // the last source row is used
      m.src.push_back(static_cast<int32_t>(sr));
      m.dst.push_back(static_cast<int32_t>(r));
      m.group.push_back(static_cast<int32_t>(g));
    }
  return m;
}

inline std::vector<OffsetMap> offset_maps() {
  return {make_offset_map("random", 40, 150, 5, 0.4, 71, false),
          make_offset_map("no_pairs", 7, 9, 3, 0.0, 72, false),
          make_offset_map("one_row", 1, 1, 1, 1.0, 73, false),
          make_offset_map("no_rows", 4, 0, 2, 1.0, 74, false),
          make_offset_map("skewed", 30, 130, 27, 0.0, 75, true)};
}

// The implicit GEMM against a float64 sum over the map, outputs poisoned with guard bands; the
// neighbour map itself against the pairs.
inline void check_point_conv_implicit(Runner& r, const CudaPointConvImplicitSpec& s) {
  const int64_t CI = s.c_in, CO = s.c_out;
  for (const OffsetMap& om : offset_maps()) {
    for (bool with_bias : {false, true}) {
      SCOPED_TRACE(s.name() + " on " + om.name + (with_bias ? " with bias" : ""));
      r.reset();
      const int64_t m = static_cast<int64_t>(om.src.size()), K = om.k;
      Buffer x(s.dtype, om.n_src * CI), w(s.dtype, K * CI * CO), bias(s.dtype, CO),
          out(s.dtype, om.n_out * CO);
      fill_random(&x, 81);
      fill_random(&w, 82);
      fill_random(&bias, 83);
      Typed<int32_t> nbr(om.n_out * K), src(m), dst(m), group(m);
      for (int64_t i = 0; i < om.n_out * K; ++i) nbr.set(i, -1);
      for (int64_t e = 0; e < m; ++e) {
        src.set(e, om.src[e]);
        dst.set(e, om.dst[e]);
        group.set(e, om.group[e]);
      }
      for (Bytes* b : std::initializer_list<Bytes*>{&x, &w, &bias, &out, &nbr, &src, &dst, &group})
        b->upload(r);
      cuda::PointConvImplicitParams p{x.dev(),
                                      w.dev(),
                                      with_bias ? bias.dev() : nullptr,
                                      out.dev(),
                                      static_cast<int*>(nbr.dev()),
                                      static_cast<const int*>(src.dev()),
                                      static_cast<const int*>(dst.dev()),
                                      static_cast<const int*>(group.dev()),
                                      om.n_out,
                                      K,
                                      m,
                                      0};
      std::vector<CudaLaunch> launches;
      if (m > 0) launches.push_back(plan_point_conv_nbr_launch(s, m));
      if (om.n_out > 0) launches.push_back(plan_point_conv_implicit_launch(s, om.n_out));
      if (!launches.empty()) ASSERT_EQ(r.run(s, launches, &p), "");
      nbr.download(r);
      out.download(r);
      int bad = 0;
      std::vector<int32_t> ref_nbr(om.n_out * K, -1);
      for (int64_t e = 0; e < m; ++e) ref_nbr[om.dst[e] * K + om.group[e]] = om.src[e];
      for (int64_t i = 0; i < om.n_out * K && bad < 5; ++i)
        if (nbr.get(i) != ref_nbr[i]) {
          ADD_FAILURE() << "nbr[" << i << "] = " << nbr.get(i) << ", expected " << ref_nbr[i];
          ++bad;
        }
      EXPECT_TRUE(nbr.guards_intact());
      for (int64_t row = 0; row < om.n_out; ++row)
        for (int64_t co = 0; co < CO && bad < 10; ++co) {
          double ref = with_bias ? bias.get(co) : 0.0, mag = std::abs(ref);
          for (int64_t g = 0; g < K; ++g) {
            const int32_t sr = ref_nbr[row * K + g];
            if (sr < 0) continue;
            for (int64_t ci = 0; ci < CI; ++ci) {
              const double wv = s.trans_w ? w.get((g * CO + co) * CI + ci)
                                          : w.get((g * CI + ci) * CO + co);
              const double t = x.get(sr * CI + ci) * wv;
              ref += t;
              mag += std::abs(t);
            }
          }
          if (s.act == Act::Relu) ref = std::max(ref, 0.0);
          const double got = out.get(row * CO + co);
          if (!(std::abs(got - ref) <= tolerance(s.dtype) * (1 + mag))) {
            ADD_FAILURE() << "out[" << row << ", " << co << "] = " << got << ", expected " << ref;
            ++bad;
          }
        }
      EXPECT_TRUE(out.guards_intact());
    }
  }
}

// The check of whichever of the three point-conv specs `base` is.
inline void check_point_conv(Runner& r, const CudaKernelSpecBase& base) {
  if (const auto* s = dynamic_cast<const CudaPointConvImplicitSpec*>(&base)) {
    check_point_conv_implicit(r, *s);
  } else if (const auto* s = dynamic_cast<const CudaPointMapSpec*>(&base)) {
    with_index(s->index, [&](auto i) { check_point_map_typed<decltype(i)>(r, *s); });
  } else if (const auto* s = dynamic_cast<const CudaPointConvSpec*>(&base)) {
    with_index(s->index, [&](auto i) { check_point_conv_typed<decltype(i)>(r, *s); });
  } else {
    ADD_FAILURE() << base.name() << ": no check for this spec family";
  }
}

}  // namespace sparsejit::codegen::checks
