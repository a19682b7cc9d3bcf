// The RGMS plan layout: the one owner of its word positions. The Torch adapter
// (torch_ext/ops/rgms.cpp) builds and reads plans through it, and Python reads it from
// `_core.plan_layout()["rgms"]` instead of restating it.
//
// A plan is one int64 tensor: the common header (csrc/plan/plan_header.h, OpKind::Rgms;
// kWordKernel = 0, kWordParam = R, the number of relations; stamp rows = targets, nnz = E
// stored entries, cols = sources, hash = fingerprint of the arrays below), then the arrays of
// kArrays in order (their meaning: csrc/rgms/rgms_plan.h):
//
//   rel_ptr [R + 1], grp_ptr [E + 1], grp_dst [E], src [E], perm [E]
//
// so a plan has plan_words(R, E) = kFixedWords + 4E + R + 2 words, and E follows from its
// length and R (which the ops take from W's first dimension and check against the header).
#pragma once

#include <cstdint>

#include "csrc/plan/plan_header.h"

namespace sparsejit::rgms {

constexpr int64_t kFixedWords = plan::kHeaderWords;  // words before the arrays

// One array of the plan: its name and its length for (R, E).
struct PlanArray {
  const char* name;
  int64_t (*length)(int64_t r, int64_t e);
};

inline constexpr PlanArray kArrays[] = {
    {"rel_ptr", [](int64_t r, int64_t) { return r + 1; }},
    {"grp_ptr", [](int64_t, int64_t e) { return e + 1; }},
    {"grp_dst", [](int64_t, int64_t e) { return e; }},
    {"src", [](int64_t, int64_t e) { return e; }},
    {"perm", [](int64_t, int64_t e) { return e; }},
};
constexpr int kNumArrays = sizeof(kArrays) / sizeof(kArrays[0]);

// Total words of a plan for R relations and E entries.
inline int64_t plan_words(int64_t r, int64_t e) {
  int64_t w = kFixedWords;
  for (const PlanArray& a : kArrays) w += a.length(r, e);
  return w;
}

// E for a plan of `words` words and R relations, or -1 when no E gives that length.
inline int64_t entries_of(int64_t words, int64_t r) {
  const int64_t rest = words - plan_words(r, 0);
  const int64_t per_entry = plan_words(r, 1) - plan_words(r, 0);
  return rest >= 0 && rest % per_entry == 0 ? rest / per_entry : -1;
}

// First word of each array.
inline void array_offsets(int64_t r, int64_t e, int64_t (&at)[kNumArrays]) {
  int64_t word = kFixedWords;
  for (int i = 0; i < kNumArrays; ++i) {
    at[i] = word;
    word += kArrays[i].length(r, e);
  }
}

// Pointers into a plan's words (W: int64_t or const int64_t).
template <typename W>
struct PlanWords {
  W *rel_ptr, *grp_ptr, *grp_dst, *src, *perm;
};

template <typename W>
PlanWords<W> view_words(W* words, int64_t r, int64_t e) {
  int64_t at[kNumArrays];
  array_offsets(r, e, at);
  return {words + at[0], words + at[1], words + at[2], words + at[3], words + at[4]};
}

// The structure stamp of a plan's arrays (O(R + E)): sizes, and the fingerprint of every
// array word after the header.
plan::StructureStamp stamp_plan(const int64_t* words, int64_t r, int64_t e, int64_t num_dst,
                                int64_t num_src);

// Stamps a plan whose arrays are written: its kFixedWords header words (OpKind::Rgms, R,
// stamp_plan over the arrays). The one way both devices' builders finish a plan.
void write_plan_head(int64_t* words, int64_t r, int64_t e, int64_t num_dst, int64_t num_src);

}  // namespace sparsejit::rgms
