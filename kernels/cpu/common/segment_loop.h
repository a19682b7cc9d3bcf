// The merge-path segment loop of the CPU kernels that reduce stored entries into rows (SpMM,
// and the gather-GEMM-scatter kernels of RGMS and sparse convolution).
//
// Each thread takes an equal piece of (row ends + stored entries), so one huge row is shared
// by all threads. Rows whole inside a piece are finished by the thread. A row cut by piece
// boundaries leaves partial results, a "head" (the end of a row that began in an earlier
// piece) and a "tail" (the start, or a middle part, of a row that ends in a later piece),
// which a short serial fix-up combines in piece order: the result does not depend on the
// thread count beyond the order of combining, which is fixed.
//
//   PartialRows<A> partials(nt, width, with_arg);
//   #pragma omp parallel num_threads(nt)
//   for_each_row_segment(t, parts, rowptr, rows, [&](i, lo, hi, piece_end, part) {
//     accumulate entries [lo, hi) of row i;
//     if (part == RowPart::Whole) write the row; else partials.save(t, part, i, acc, arg);
//   });
//   partials.fix_up(parts, combine, finish);
//
// Standard library only: the JIT compiles this file with nothing else on the include path.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/common/partition.h"

namespace sparsejit::cpu::detail {

enum class RowPart { Whole, Head, Tail };

// Calls visit(row, lo, hi, piece_end, part) for every piece of a row in thread t's share
// (of `parts`) of the merge path over rowptr: stored entries [lo, hi) of `row`. piece_end is
// the end of the share's entries (a bound for prefetching ahead).
template <typename I, typename Visit>
__attribute__((always_inline)) inline void for_each_row_segment(int t, int parts, const I* rowptr, int64_t rows,
                                 Visit&& visit) {
  MergeCoord b, e;
  merge_path_piece(t, parts, rowptr, rows, &b, &e);
  for (int64_t i = b.row; i < e.row; ++i) {
    const int64_t start = rowptr[i], end = rowptr[i + 1];
    // One call site per loop (as a hand-written loop would have): the body is inlined once.
    const bool whole = start >= b.pos;
    visit(i, whole ? start : b.pos, end, e.pos, whole ? RowPart::Whole : RowPart::Head);
  }
  if (e.row < rows) {
    const int64_t lo = std::max<int64_t>(rowptr[e.row], b.pos);
    if (e.pos > lo) visit(e.row, lo, e.pos, e.pos, RowPart::Tail);
  }
}

// The head and tail partial results of each thread (accumulators of `width` elements, and
// positions when `with_arg`), and their serial fix-up.
template <typename A>
class PartialRows {
 public:
  PartialRows(int parts, int64_t width, bool with_arg)
      : width_(width),
        with_arg_(with_arg),
        acc_(static_cast<size_t>(2 * parts * width)),
        arg_(with_arg ? static_cast<size_t>(2 * parts * width) : 0),
        row_(static_cast<size_t>(2 * parts), -1) {}

  // Keeps thread t's head or tail partial result of `row`.
  void save(int t, RowPart part, int64_t row, const A* acc, const int64_t* arg) {
    const int64_t s = slot(t, part);
    row_[s] = row;
    std::copy(acc, acc + width_, acc_.data() + s * width_);
    if (with_arg_ && arg != nullptr) std::copy(arg, arg + width_, arg_.data() + s * width_);
  }

  // In piece order, the tails of a row followed by the head that finishes it:
  // combine(run_acc, run_arg, acc, arg) merges a later partial into the running one,
  // finish(row, acc, arg) writes a completed row. Args are null without positions.
  template <typename Combine, typename Finish>
  void fix_up(int parts, Combine&& combine, Finish&& finish) const {
    std::vector<A> run(static_cast<size_t>(width_));
    std::vector<int64_t> run_arg(with_arg_ ? static_cast<size_t>(width_) : 0);
    int64_t* run_argp = with_arg_ ? run_arg.data() : nullptr;
    int64_t run_row = -1;
    for (int t = 0; t < parts; ++t) {
      for (RowPart part : {RowPart::Head, RowPart::Tail}) {
        const int64_t s = slot(t, part);
        const int64_t row = row_[s];
        if (row < 0) continue;
        const A* acc = acc_.data() + s * width_;
        const int64_t* arg = with_arg_ ? arg_.data() + s * width_ : nullptr;
        if (run_row == row) {
          combine(run.data(), run_argp, acc, arg);
        } else {
          std::copy(acc, acc + width_, run.begin());
          if (arg != nullptr) std::copy(arg, arg + width_, run_arg.begin());
        }
        if (part == RowPart::Head) {
          finish(row, run.data(), run_argp);
          run_row = -1;
        } else {
          run_row = row;
        }
      }
    }
  }

 private:
  int64_t slot(int t, RowPart part) const { return 2 * t + (part == RowPart::Tail ? 1 : 0); }

  int64_t width_;
  bool with_arg_;
  std::vector<A> acc_;
  std::vector<int64_t> arg_;
  std::vector<int64_t> row_;  // -1: no partial in the slot
};

}  // namespace sparsejit::cpu::detail
