#include <gtest/gtest.h>

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
