#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "csrc/core/csr.h"
#include "kernels/cpu/common/partition.h"
#include "tests/cpp/test_util.h"

namespace sparsejit {
namespace {

TEST(ValidateCsr, AcceptsValid) {
  std::vector<int64_t> rowptr{0, 2, 2, 3}, col{0, 4, 1};
  EXPECT_TRUE(validate_csr(rowptr.data(), 4, col.data(), 3, 5).ok);
}

TEST(ValidateCsr, EmptyMatrix) {
  std::vector<int32_t> rowptr{0};
  EXPECT_TRUE(validate_csr<int32_t>(rowptr.data(), 1, nullptr, 0, 0).ok);
}

TEST(ValidateCsr, NamesOutOfRangeIndex) {
  std::vector<int64_t> rowptr{0, 2, 3}, col{0, 9001, 1};
  auto r = validate_csr(rowptr.data(), 3, col.data(), 3, 5000);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.message.find("indices[1] = 9001"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("5000 columns"), std::string::npos) << r.message;
}

TEST(ValidateCsr, NamesDecreasingIndptr) {
  std::vector<int64_t> rowptr{0, 3, 2, 3}, col{0, 1, 2};
  auto r = validate_csr(rowptr.data(), 4, col.data(), 3, 3);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.message.find("indptr[2] = 2"), std::string::npos) << r.message;
}

TEST(ValidateCsr, NamesBadFirstAndLast) {
  std::vector<int64_t> rowptr{1, 2}, col{0, 1};
  EXPECT_NE(validate_csr(rowptr.data(), 2, col.data(), 2, 3).message.find("indptr[0]"),
            std::string::npos);
  std::vector<int64_t> rowptr2{0, 1};
  auto r = validate_csr(rowptr2.data(), 2, col.data(), 2, 3);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.message.find("indptr[1] = 1"), std::string::npos) << r.message;
}

TEST(Transpose, MatchesDenseTranspose) {
  for (uint64_t seed = 1; seed < 6; ++seed) {
    auto a = testing::random_csr<int32_t>(37, 23, 3.0, seed % 2 == 0, seed);
    std::vector<int32_t> trp(a.cols + 1), tcol(a.nnz()), tperm(a.nnz());
    csr_transpose(a.rowptr.data(), a.col.data(), a.rows, a.cols, trp.data(), tcol.data(),
                  tperm.data());
    std::vector<int> dense(a.rows * a.cols, 0), dense_t(a.rows * a.cols, 0);
    for (int64_t i = 0; i < a.rows; ++i)
      for (int64_t p = a.rowptr[i]; p < a.rowptr[i + 1]; ++p) dense[i * a.cols + a.col[p]]++;
    for (int64_t j = 0; j < a.cols; ++j)
      for (int64_t q = trp[j]; q < trp[j + 1]; ++q) {
        dense_t[tcol[q] * a.cols + j]++;
        EXPECT_EQ(a.col[tperm[q]], j);  // perm points back at an entry of column j
        if (q > trp[j]) EXPECT_LE(tcol[q - 1], tcol[q]);  // stable order
      }
    EXPECT_EQ(dense, dense_t);
  }
}

// The counting sorts split their items over threads: every thread count must give the same
// arrays as a plain single-pass reference, bit for bit.
class ThreadCount {
 public:
  explicit ThreadCount(int t) : saved_(omp_get_max_threads()) { omp_set_num_threads(t); }
  ~ThreadCount() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

template <typename I>
void reference_transpose(const testing::Csr<I>& a, std::vector<I>& trp, std::vector<I>& tcol,
                         std::vector<I>& tperm) {
  trp.assign(a.cols + 1, 0);
  for (int64_t p = 0; p < a.nnz(); ++p) trp[a.col[p] + 1]++;
  for (int64_t c = 0; c < a.cols; ++c) trp[c + 1] += trp[c];
  std::vector<I> next(trp.begin(), trp.end() - 1);
  tcol.assign(a.nnz(), -1);
  tperm.assign(a.nnz(), -1);
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t p = a.rowptr[i]; p < a.rowptr[i + 1]; ++p) {
      const I q = next[a.col[p]]++;
      tcol[q] = static_cast<I>(i);
      tperm[q] = static_cast<I>(p);
    }
}

TEST(Transpose, EveryThreadCountMatchesTheReference) {
  struct Case { int64_t rows, cols; double avg; bool power_law; };
  // Sizes below and above the parallel threshold (32768 entries), a matrix with more columns
  // than entries (fewer threads), empty and one-entry matrices, and a skewed one (one column
  // holding most entries).
  const Case cases[] = {{0, 0, 0, false},      {1, 1, 1, false},       {3, 5, 0, false},
                        {400, 300, 6, false},   {5000, 3000, 12, false}, {3000, 40000, 12, true},
                        {20000, 500, 5, true},  {70000, 200000, 1, false}};
  uint64_t seed = 11;
  for (const auto& c : cases) {
    auto a = testing::random_csr<int64_t>(c.rows, c.cols, c.avg, c.power_law, ++seed);
    if (c.rows == 1 && c.cols == 1) {
      a.rowptr = {0, 1};
      a.col = {0};
    }
    if (c.cols == 500)  // skew: two thirds of the entries in column 7
      for (size_t p = 0; p < a.col.size(); ++p)
        if (p % 3 != 2) a.col[p] = 7;
    std::vector<int64_t> want_rp, want_col, want_perm;
    reference_transpose(a, want_rp, want_col, want_perm);
    for (int threads : {1, 2, 3, 4}) {
      ThreadCount tc(threads);
      std::vector<int64_t> trp(a.cols + 1, -7), tcol(a.nnz(), -7), tperm(a.nnz(), -7);
      csr_transpose(a.rowptr.data(), a.col.data(), a.rows, a.cols, trp.data(), tcol.data(),
                    tperm.data());
      EXPECT_EQ(trp, want_rp) << c.rows << "x" << c.cols << ", " << threads << " threads";
      EXPECT_EQ(tcol, want_col) << c.rows << "x" << c.cols << ", " << threads << " threads";
      EXPECT_EQ(tperm, want_perm) << c.rows << "x" << c.cols << ", " << threads << " threads";
    }
  }
}

TEST(CsrFromEdges, EveryThreadCountMatchesAStableSort) {
  std::mt19937_64 rng(5);
  for (int64_t n : {1, 50, 3000, 40000}) {
    for (int64_t e : {0, 1, 2000, 90000}) {
      std::vector<int64_t> src(e), dst(e);
      std::uniform_int_distribution<int64_t> node(0, n - 1);
      for (int64_t k = 0; k < e; ++k) {
        src[k] = node(rng);
        dst[k] = k % 3 == 0 ? 0 : node(rng);  // row 0 is a hub: a third of the edges
      }
      std::vector<int64_t> order(e);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
        return dst[x] != dst[y] ? dst[x] < dst[y] : src[x] < src[y];
      });
      std::vector<int64_t> want_col(e);
      for (int64_t q = 0; q < e; ++q) want_col[q] = src[order[q]];
      for (int threads : {1, 2, 3}) {
        ThreadCount tc(threads);
        std::vector<int64_t> rp(n + 1, -7), col(e, -7), perm(e, -7);
        ASSERT_EQ(csr_from_edges(src.data(), dst.data(), e, n, rp.data(), col.data(),
                                 perm.data()), -1);
        EXPECT_EQ(perm, order) << n << " nodes, " << e << " edges, " << threads << " threads";
        EXPECT_EQ(col, want_col);
        for (int64_t v = 0; v < n; ++v)
          for (int64_t q = rp[v]; q < rp[v + 1]; ++q) ASSERT_EQ(dst[perm[q]], v);
        EXPECT_EQ(rp[n], e);
      }
    }
  }
}

TEST(CsrFromEdges, NamesTheFirstBadEdgeOnEveryThreadCount) {
  const int64_t n = 100, e = 100000;
  std::vector<int64_t> src(e), dst(e);
  for (int64_t k = 0; k < e; ++k) src[k] = k % n, dst[k] = (k * 7) % n;
  src[70000] = n;   // in the second half
  dst[30001] = -1;  // the first bad edge, in the first half
  src[99999] = 5 * n;
  for (int threads : {1, 2, 3, 4}) {
    ThreadCount tc(threads);
    std::vector<int64_t> rp(n + 1), col(e), perm(e);
    EXPECT_EQ(csr_from_edges(src.data(), dst.data(), e, n, rp.data(), col.data(), perm.data()),
              30001) << threads << " threads";
  }
}

TEST(GcnAdjacency, EveryThreadCountGivesTheSameBits) {
  std::mt19937_64 rng(9);
  const int64_t n = 30000, e = 60000;
  std::vector<int64_t> src(e), dst(e);
  std::uniform_int_distribution<int64_t> node(0, n - 1);
  for (int64_t k = 0; k < e; ++k) {
    src[k] = node(rng);
    dst[k] = k % 4 == 0 ? src[k] : node(rng);  // a quarter are old self-loops
  }
  std::vector<int64_t> rp1(n + 1), col1(e + n), perm1(e + n);
  std::vector<double> val1(e + n);
  {
    ThreadCount tc(1);
    ASSERT_EQ(gcn_adjacency(src.data(), dst.data(), e, n, rp1.data(), col1.data(), perm1.data(),
                            val1.data()), -1);
  }
  // Spot-check the formula: d_v = 1 + incoming edges that are not self-loops.
  std::vector<double> deg(n, 1.0);
  for (int64_t k = 0; k < e; ++k)
    if (src[k] != dst[k]) deg[dst[k]] += 1.0;
  for (int64_t v = 0; v < n; v += 997)
    for (int64_t q = rp1[v]; q < rp1[v + 1]; ++q) {
      const bool old_loop = perm1[q] < e && col1[q] == v;
      if (old_loop)
        EXPECT_EQ(val1[q], 0.0);
      else
        EXPECT_NEAR(val1[q], 1.0 / std::sqrt(deg[v] * deg[col1[q]]), 1e-12);
    }
  for (int threads : {2, 3, 4}) {
    ThreadCount tc(threads);
    std::vector<int64_t> rp(n + 1, -7), col(e + n, -7), perm(e + n, -7);
    std::vector<double> val(e + n, -7.0);
    ASSERT_EQ(gcn_adjacency(src.data(), dst.data(), e, n, rp.data(), col.data(), perm.data(),
                            val.data()), -1);
    EXPECT_EQ(rp, rp1) << threads << " threads";
    EXPECT_EQ(col, col1);
    EXPECT_EQ(perm, perm1);
    EXPECT_EQ(val, val1);
  }
}

TEST(RowStats, Histogram) {
  std::vector<int64_t> rowptr{0, 0, 1, 3, 7, 7};
  auto s = row_stats(rowptr.data(), 5, 10);
  EXPECT_EQ(s.nnz, 7);
  EXPECT_EQ(s.empty_rows, 2);
  EXPECT_EQ(s.max_row, 4);
  ASSERT_EQ(s.log2_histogram.size(), 4u);
  EXPECT_EQ(s.log2_histogram[0], 2);  // empty
  EXPECT_EQ(s.log2_histogram[1], 1);  // length 1
  EXPECT_EQ(s.log2_histogram[2], 1);  // length 2..3
  EXPECT_EQ(s.log2_histogram[3], 1);  // length 4..7
}

TEST(Fingerprint, ChangesWithStructure) {
  std::vector<int64_t> rowptr{0, 2, 3}, col{0, 1, 1}, col2{0, 1, 0};
  EXPECT_EQ(fingerprint(rowptr.data(), 2, col.data(), 3, 2),
            fingerprint(rowptr.data(), 2, col.data(), 3, 2));
  EXPECT_NE(fingerprint(rowptr.data(), 2, col.data(), 3, 2),
            fingerprint(rowptr.data(), 2, col2.data(), 3, 2));
  EXPECT_NE(fingerprint(rowptr.data(), 2, col.data(), 3, 2),
            fingerprint(rowptr.data(), 2, col.data(), 3, 3));
}

// The stamp that binds plans to structures: every small edit of a structure (one index
// changed by one, two neighbours swapped, in the multiply lanes and in the tail; an entry
// added) must give a new fingerprint, for both index widths.
template <typename I>
void expect_small_edits_change_the_fingerprint() {
  const int64_t rows = 40;
  auto a = testing::random_csr<I>(rows, 60, 6.0, false, 3);
  while (a.nnz() % 8 != 5) {  // a tail after the 8-index blocks
    a.col.push_back(static_cast<I>(a.nnz() % 60));
    a.rowptr[rows]++;
  }
  const int64_t nnz = a.nnz();
  std::set<uint64_t> seen;
  auto fp = [&](const std::vector<I>& col, int64_t n) {
    return fingerprint(a.rowptr.data(), rows, col.data(), n, a.cols);
  };
  seen.insert(fp(a.col, nnz));
  size_t made = 1;
  for (int64_t p = 0; p < nnz; ++p) {
    for (int d : {-1, 1}) {
      auto c = a.col;
      c[p] = static_cast<I>(c[p] + d);
      seen.insert(fp(c, nnz));
      ++made;
    }
    if (p + 1 < nnz && a.col[p] != a.col[p + 1]) {
      auto c = a.col;
      std::swap(c[p], c[p + 1]);
      seen.insert(fp(c, nnz));
      ++made;
    }
  }
  EXPECT_EQ(seen.size(), made);
  // Prefixes of an all-zero array differ by length alone.
  std::vector<I> zeros(64, 0);
  std::set<uint64_t> by_len;
  for (int64_t n = 0; n <= 64; ++n)
    by_len.insert(fingerprint(a.rowptr.data(), rows, zeros.data(), n, a.cols));
  EXPECT_EQ(by_len.size(), 65u);
}

TEST(Fingerprint, SmallEditsChangeIt) {
  expect_small_edits_change_the_fingerprint<int32_t>();
  expect_small_edits_change_the_fingerprint<int64_t>();
}

// Every piece boundary satisfies the merge-path invariant and pieces tile the path.
TEST(MergePath, PiecesTileThePath) {
  for (uint64_t seed = 1; seed < 8; ++seed) {
    auto a = testing::random_csr<int64_t>(50 + seed * 7, 40, 4.0, true, seed);
    for (int parts : {1, 2, 3, 7, 64, 1000}) {
      MergeCoord prev{0, 0};
      for (int t = 0; t < parts; ++t) {
        MergeCoord b, e;
        merge_path_piece(t, parts, a.rowptr.data(), a.rows, &b, &e);
        EXPECT_EQ(b.row, prev.row);
        EXPECT_EQ(b.pos, prev.pos);
        EXPECT_LE(a.rowptr[e.row], e.pos);
        if (e.row < a.rows) EXPECT_LE(e.pos, a.rowptr[e.row + 1]);
        prev = e;
      }
      EXPECT_EQ(prev.row, a.rows);
      EXPECT_EQ(prev.pos, a.nnz());
    }
  }
}

}  // namespace
}  // namespace sparsejit
