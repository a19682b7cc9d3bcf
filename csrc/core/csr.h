// Compressed sparse row structures: validation, transpose, row statistics.
// Torch-free: raw pointers and sizes only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sparsejit {

// Result of validating a CSR structure. `ok == false` carries a message that names the
// argument, the position and the bad value, ready to be raised to the user.
struct ValidationResult {
  bool ok = true;
  std::string message;
};

// Checks rowptr (size rows+1, rowptr[0] == 0, non-decreasing, rowptr[rows] == nnz) and
// col (every entry in [0, cols)). O(rows + nnz), parallel over entries.
template <typename I>
ValidationResult validate_csr(const I* rowptr, int64_t rowptr_len, const I* col, int64_t nnz,
                              int64_t cols);

// Transpose of a CSR structure (equivalently CSR -> CSC). Outputs:
//   t_rowptr[cols + 1], t_col[nnz] (original row of each transposed entry),
//   t_perm[nnz] (original CSR position of each transposed entry).
// Stable: within a transposed row, entries keep increasing original row order.
template <typename I>
void csr_transpose(const I* rowptr, const I* col, int64_t rows, int64_t cols, I* t_rowptr,
                   I* t_col, I* t_perm);

// CSR with rows = targets of an edge list (src[k] -> dst[k], k < e, nodes in [0, n)):
// entries sorted by (target, source), ties in edge order; rowptr[n + 1], col[e] (the source
// of each entry), perm[e] (the edge of each entry). A counting sort on the target, then each
// row sorted by source (insertion sort for short rows), O(n + e) on bounded rows.
// Returns -1, or the first edge with an endpoint outside [0, n) (outputs then undefined).
int64_t csr_from_edges(const int64_t* src, const int64_t* dst, int64_t e, int64_t n,
                       int64_t* rowptr, int64_t* col, int64_t* perm);

// GCN's normalised adjacency D^-1/2 (A + I) D^-1/2 of an unweighted edge list, as PyG's
// gcn_norm builds it: the structure is csr_from_edges of the e edges followed by one loop
// (v, v) per node (perm indexes that list: loops are e + v); an existing self-loop stays an
// entry of value 0 and every node gets an added loop of weight 1, so d_v = 1 + the number of
// v's incoming edges that are not self-loops; values[q] = d_row^-1/2 d_col^-1/2, computed
// in float64 (the float32 overload rounds each value once, to the same bits as converting).
// rowptr[n + 1], col / perm / values[e + n]. Returns -1 or the first bad edge.
int64_t gcn_adjacency(const int64_t* src, const int64_t* dst, int64_t e, int64_t n,
                      int64_t* rowptr, int64_t* col, int64_t* perm, double* values);
int64_t gcn_adjacency(const int64_t* src, const int64_t* dst, int64_t e, int64_t n,
                      int64_t* rowptr, int64_t* col, int64_t* perm, float* values);

// Per-structure inspector statistics used by planners and shown to users.
struct RowStats {
  int64_t rows = 0, cols = 0, nnz = 0;
  int64_t empty_rows = 0;
  int64_t max_row = 0;
  double mean_row = 0, std_row = 0;
  double skew = 0;  // max_row / mean_row (1 for perfectly regular rows)
  // histogram[k] counts rows whose length lies in [2^(k-1), 2^k) (k = 0: empty rows).
  std::vector<int64_t> log2_histogram;
};

template <typename I>
RowStats row_stats(const I* rowptr, int64_t rows, int64_t cols);

// 64-bit fingerprint of the index arrays and the shape (order-sensitive word hashing).
template <typename I>
uint64_t fingerprint(const I* rowptr, int64_t rows, const I* col, int64_t nnz, int64_t cols);

// The word hash under `fingerprint`, for structures that are not one CSR (a point cloud's
// sorted keys): every word of data[0, n) and n, order-sensitive, chained from `seed`. The
// project's one structure hash: plans stamp what it returns (I: int32_t, int64_t, uint64_t).
template <typename I>
uint64_t hash_words(const I* data, int64_t n, uint64_t seed);

}  // namespace sparsejit
