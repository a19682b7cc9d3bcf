// Internal to csrc/point_conv: the pieces both merge strategies share (work split, assembly of the
// per-offset pair lists, galloping search). Not part of the API.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "csrc/point_conv/kernel_map.h"

namespace sparsejit::point_conv::detail {

// One piece of work: the pairs of offset k found walking positions [p0, p1) of a sorted list.
struct MergeTask {
  int64_t k = 0, p0 = 0, p1 = 0;
  std::vector<int32_t> ins, outs;
};

// A list [begin, end) to walk for offset k.
struct Span {
  int64_t k, begin, end;
};

// Cuts the spans into chunks so that every thread gets several tasks; a task's pairs come out
// in the walked list's order and tasks stay in (offset, chunk) order.
std::vector<MergeTask> make_tasks(const std::vector<Span>& spans);

// Fills `out` from per-offset pair counts and the tasks (in order); resizes without clearing.
// Offsets whose count exceeds their tasks' pairs are left for the caller to fill.
void assemble_map(const std::vector<MergeTask>& tasks, const std::vector<int64_t>& count,
                  KernelMap& out);

void check_params(const ConvParams& p, int dims);
void offset_vector(const ConvParams& p, int64_t k, int64_t* e);  // e_d in [0, kernel_d)
bool same_layout(const KeyLayout& a, const KeyLayout& b);

// First position >= j of sorted a[0, n) holding a value >= key: exponential steps from j,
// then a binary search, so sparse queries cost O(log gap) instead of O(gap).
inline int64_t gallop(const uint64_t* a, int64_t j, int64_t n, uint64_t key) {
  int64_t lo = j, step = 1;
  while (j < n && a[j] < key) {
    lo = j + 1;
    j += step;
    step *= 2;
  }
  return std::lower_bound(a + lo, a + std::min(j, n), key) - a;
}

// Strided maps (some stride > 1), input-driven: see strided_map.cpp. Returns false when the
// stride has too many residue classes for this path (the caller then merges output-driven).
bool strided_map(const CoordSet& in, const CoordSet& out_sites, const ConvParams& p,
                 KernelMap& out);

}  // namespace sparsejit::point_conv::detail
