// Work partitions over a CSR structure. Merge-path partitioning (Merrill & Garland, SC'16)
// splits the combined sequence of row ends and stored entries into equal pieces, so both
// many empty rows and a few very long rows are shared evenly between threads.
#pragma once

#include <algorithm>
#include <cstdint>

namespace sparsejit {

struct MergeCoord {
  int64_t row;  // rows [0, row) have ended before this point
  int64_t pos;  // stored entries [0, pos) have been consumed before this point
};

// Position on the merge path at `diagonal` (0 <= diagonal <= rows + nnz).
// Invariant of the result: rowptr[row] <= pos and (row == rows or pos <= rowptr[row + 1]).
template <typename I>
inline MergeCoord merge_path_search(int64_t diagonal, const I* rowptr, int64_t rows, int64_t nnz) {
  int64_t lo = std::max<int64_t>(diagonal - nnz, 0);
  int64_t hi = std::min<int64_t>(diagonal, rows);
  while (lo < hi) {
    const int64_t pivot = (lo + hi) >> 1;
    // rowptr[pivot + 1] is the end of row `pivot`.
    if (static_cast<int64_t>(rowptr[pivot + 1]) <= diagonal - pivot - 1) {
      lo = pivot + 1;
    } else {
      hi = pivot;
    }
  }
  return {lo, diagonal - lo};
}

// The piece `part` of `parts` equal pieces of the merge path.
template <typename I>
inline void merge_path_piece(int part, int parts, const I* rowptr, int64_t rows, MergeCoord* begin,
                             MergeCoord* end) {
  const int64_t nnz = rows > 0 ? static_cast<int64_t>(rowptr[rows]) : 0;
  const int64_t total = rows + nnz;
  const int64_t per = (total + parts - 1) / parts;
  const int64_t d0 = std::min<int64_t>(per * part, total);
  const int64_t d1 = std::min<int64_t>(d0 + per, total);
  *begin = merge_path_search(d0, rowptr, rows, nnz);
  *end = merge_path_search(d1, rowptr, rows, nnz);
}

// Index of the row holding stored entry `pos` (the last row r with rowptr[r] <= pos and a
// non-empty range); requires 0 <= pos < nnz.
template <typename I>
inline int64_t row_of_position(const I* rowptr, int64_t rows, int64_t pos) {
  // upper_bound over rowptr[1..rows]: first r with rowptr[r + 1] > pos.
  const I* it = std::upper_bound(rowptr + 1, rowptr + rows + 1, static_cast<I>(pos));
  return static_cast<int64_t>(it - (rowptr + 1));
}

}  // namespace sparsejit
