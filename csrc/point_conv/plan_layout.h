// The point-cloud convolution's plan layout: the one owner of its word positions. Plans are
// assembled through it (csrc/point_conv/plan_build.h), the Torch adapter
// (torch_ext/ops/point_conv.cpp) reads them through it, and Python reads it from
// `_core.plan_layout()["point_conv"]` / `_core.point_conv_plan_view()` instead of restating it.
//
// A plan is int64 words: the common header (csrc/plan/plan_header.h, OpKind::PointConv;
// kWordKernel = kind, kWordParam = identity group or -1, stamp rows = n_out, nnz = M pairs,
// cols = n_in, hash = sites_fingerprint of the input coordinate keys), then word kWordKernelVolume =
// K, then the arrays of kArrays in order: group_ptr [K + 1] int64, in_idx / out_idx [M] int32,
// out_row_ptr [n_out + 1] int64, out_row_pair [M] int32, in_row_ptr [n_in + 1] int64,
// in_row_pair [M] int32, pair_group [M] int32 (each int32 array padded to whole words).
#pragma once

#include <cstdint>

#include "csrc/plan/plan_header.h"

namespace sparsejit::point_conv {

constexpr int kWordKernelVolume = plan::kHeaderWords;  // K
constexpr int kFixedWords = plan::kHeaderWords + 1;    // words before the arrays

// Kernel-map kinds (the header's kernel word).
enum Kind : int64_t { kSubm = 0, kSpconv = 1, kCoarse = 2, kTransposed = 3, kGeneralized = 4 };

inline int64_t words32(int64_t n) { return (n + 1) / 2; }

// One array of the plan: name, element width, and its length for (K, M, n_in, n_out).
struct PlanArray {
  const char* name;
  bool int32;
  int64_t (*length)(int64_t k, int64_t m, int64_t n_in, int64_t n_out);
};

inline constexpr PlanArray kArrays[] = {
    {"group_ptr", false, [](int64_t k, int64_t, int64_t, int64_t) { return k + 1; }},
    {"in_idx", true, [](int64_t, int64_t m, int64_t, int64_t) { return m; }},
    {"out_idx", true, [](int64_t, int64_t m, int64_t, int64_t) { return m; }},
    {"out_row_ptr", false, [](int64_t, int64_t, int64_t, int64_t n_out) { return n_out + 1; }},
    {"out_row_pair", true, [](int64_t, int64_t m, int64_t, int64_t) { return m; }},
    {"in_row_ptr", false, [](int64_t, int64_t, int64_t n_in, int64_t) { return n_in + 1; }},
    {"in_row_pair", true, [](int64_t, int64_t m, int64_t, int64_t) { return m; }},
    {"pair_group", true, [](int64_t, int64_t m, int64_t, int64_t) { return m; }},
};

// Words the array takes (int32 arrays padded to whole words).
inline int64_t array_words(const PlanArray& a, int64_t k, int64_t m, int64_t n_in,
                           int64_t n_out) {
  const int64_t n = a.length(k, m, n_in, n_out);
  return a.int32 ? words32(n) : n;
}

// Total words of a plan.
inline int64_t plan_words(int64_t k, int64_t m, int64_t n_in, int64_t n_out) {
  int64_t w = kFixedWords;
  for (const PlanArray& a : kArrays) w += array_words(a, k, m, n_in, n_out);
  return w;
}

// Pointers into a plan's words.
struct PlanView {
  int64_t k = 0, m = 0, n_in = 0, n_out = 0, identity = -1;
  const int64_t* group_ptr;
  const int32_t *in_idx, *out_idx;
  const int64_t* out_row_ptr;
  const int32_t* out_row_pair;
  const int64_t* in_row_ptr;
  const int32_t *in_row_pair, *pair_group;
};

template <typename W>
PlanView view_words(W* w, int64_t k, int64_t m, int64_t n_in, int64_t n_out) {
  PlanView v;
  v.k = k, v.m = m, v.n_in = n_in, v.n_out = n_out;
  const void* at[sizeof(kArrays) / sizeof(kArrays[0])];
  int64_t word = kFixedWords;
  for (size_t i = 0; i < sizeof(kArrays) / sizeof(kArrays[0]); ++i) {
    at[i] = w + word;
    word += array_words(kArrays[i], k, m, n_in, n_out);
  }
  v.group_ptr = static_cast<const int64_t*>(at[0]);
  v.in_idx = static_cast<const int32_t*>(at[1]);
  v.out_idx = static_cast<const int32_t*>(at[2]);
  v.out_row_ptr = static_cast<const int64_t*>(at[3]);
  v.out_row_pair = static_cast<const int32_t*>(at[4]);
  v.in_row_ptr = static_cast<const int64_t*>(at[5]);
  v.in_row_pair = static_cast<const int32_t*>(at[6]);
  v.pair_group = static_cast<const int32_t*>(at[7]);
  return v;
}

}  // namespace sparsejit::point_conv
