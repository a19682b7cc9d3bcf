// RGMS plan (Torch-free): a typed structure -- edges (src, dst, relation) -- grouped by
// relation, then by target, so each relation's entries form a CSR over its distinct targets.
//
//   rel_ptr[R + 1]  groups of relation r: rel_ptr[r] .. rel_ptr[r + 1]
//   grp_ptr[E + 1]  entries of group g: grp_ptr[g] .. grp_ptr[g + 1] (first G + 1 used;
//                   padded with E so the arrays' sizes depend only on E, not on the data)
//   grp_dst[E]      target row of group g (first G used; padded with 0)
//   src[E]          source of each sorted entry
//   perm[E]         edge id (position in the input) of each sorted entry (for values)
//
// Within one relation the targets are strictly increasing, so a relation's groups can be
// scattered into the output in parallel without races (rgms_forward.cpp relies on it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace sparsejit::rgms {

struct CheckResult {
  bool ok = true;
  std::string message;
};

// Relation ids must lie in [0, R); edge endpoints in [0, num_dst) / [0, num_src).
inline CheckResult check_typed_edges(const int64_t* src, const int64_t* dst, const int64_t* etype,
                                     int64_t e, int64_t num_src, int64_t num_dst, int64_t r) {
  for (int64_t i = 0; i < e; ++i) {
    if (etype[i] < 0 || etype[i] >= r) {
      return {false, "edge_type[" + std::to_string(i) + "] = " + std::to_string(etype[i]) +
                         " is out of range for num_relations = " + std::to_string(r)};
    }
    if (src[i] < 0 || src[i] >= num_src) {
      return {false, "edge_index[0, " + std::to_string(i) + "] = " + std::to_string(src[i]) +
                         " is out of range for " + std::to_string(num_src) + " source nodes"};
    }
    if (dst[i] < 0 || dst[i] >= num_dst) {
      return {false, "edge_index[1, " + std::to_string(i) + "] = " + std::to_string(dst[i]) +
                         " is out of range for " + std::to_string(num_dst) + " target nodes"};
    }
  }
  return {};
}

// Builds the plan arrays (sizes above) from checked edges: a stable counting sort by target,
// then a stable counting sort by relation, O(E + num_dst + R). Returns G.
inline int64_t build_plan(const int64_t* src, const int64_t* dst, const int64_t* etype, int64_t e,
                          int64_t num_dst, int64_t r, int64_t* rel_ptr, int64_t* grp_ptr,
                          int64_t* grp_dst, int64_t* src_out, int64_t* perm) {
  std::vector<int64_t> by_dst(e), cnt(static_cast<size_t>(std::max(num_dst, r)) + 1, 0);
  for (int64_t i = 0; i < e; ++i) ++cnt[dst[i] + 1];
  for (int64_t v = 0; v < num_dst; ++v) cnt[v + 1] += cnt[v];
  for (int64_t i = 0; i < e; ++i) by_dst[cnt[dst[i]]++] = i;
  std::fill(cnt.begin(), cnt.end(), 0);
  for (int64_t i = 0; i < e; ++i) ++cnt[etype[i] + 1];
  for (int64_t k = 0; k < r; ++k) cnt[k + 1] += cnt[k];
  for (int64_t k = 0; k < e; ++k) {
    const int64_t i = by_dst[k];
    perm[cnt[etype[i]]++] = i;
  }
  // Groups: runs of equal (relation, target) in sorted order.
  int64_t g = 0;
  int64_t k = 0;
  for (int64_t rel = 0; rel < r; ++rel) {
    rel_ptr[rel] = g;
    while (k < e && etype[perm[k]] == rel) {
      const int64_t t = dst[perm[k]];
      grp_ptr[g] = k;
      grp_dst[g] = t;
      while (k < e && etype[perm[k]] == rel && dst[perm[k]] == t) {
        src_out[k] = src[perm[k]];
        ++k;
      }
      ++g;
    }
  }
  rel_ptr[r] = g;
  for (int64_t i = g; i <= e; ++i) grp_ptr[i] = e;
  for (int64_t i = g; i < e; ++i) grp_dst[i] = 0;
  return g;
}

// The invariants an op relies on, checked on a plan handed to a raw op: O(R + G + E)
// integer work, small next to the O(E x F) gather.
inline CheckResult check_plan(const int64_t* rel_ptr, int64_t r, const int64_t* grp_ptr,
                              const int64_t* grp_dst, const int64_t* src, const int64_t* perm,
                              int64_t e, int64_t num_dst, int64_t num_src) {
  if (rel_ptr[0] != 0) return {false, "rel_ptr[0] must be 0"};
  for (int64_t k = 0; k < r; ++k) {
    if (rel_ptr[k + 1] < rel_ptr[k]) {
      return {false, "rel_ptr decreases at position " + std::to_string(k + 1)};
    }
  }
  const int64_t g = rel_ptr[r];
  if (g > e) return {false, "rel_ptr[-1] = " + std::to_string(g) + " exceeds the entries"};
  if (grp_ptr[0] != 0 || grp_ptr[g] != e) {
    return {false, "grp_ptr must start at 0 and reach the number of entries at group G"};
  }
  for (int64_t i = 0; i < g; ++i) {
    if (grp_ptr[i + 1] <= grp_ptr[i]) {
      return {false, "grp_ptr must increase strictly over groups; position " +
                         std::to_string(i + 1)};
    }
    if (grp_dst[i] < 0 || grp_dst[i] >= num_dst) {
      return {false, "grp_dst[" + std::to_string(i) + "] is out of range"};
    }
  }
  for (int64_t k = 0; k < r; ++k) {
    for (int64_t i = rel_ptr[k] + 1; i < rel_ptr[k + 1]; ++i) {
      if (grp_dst[i] <= grp_dst[i - 1]) {
        return {false, "grp_dst must increase strictly within relation " + std::to_string(k)};
      }
    }
  }
  for (int64_t p = 0; p < e; ++p) {
    if (src[p] < 0 || src[p] >= num_src) {
      return {false, "src[" + std::to_string(p) + "] = " + std::to_string(src[p]) +
                         " is out of range for " + std::to_string(num_src) + " rows of x"};
    }
    if (perm[p] < 0 || perm[p] >= e) {
      return {false, "perm[" + std::to_string(p) + "] is out of range"};
    }
  }
  return {};
}

}  // namespace sparsejit::rgms
