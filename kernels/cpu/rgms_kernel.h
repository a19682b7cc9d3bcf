// RGMS loops (Torch-free, raw pointers, OpenMP): the gather/reduce and scatter steps around
// each relation's dense product. Group g of relation r covers sorted entries
// grp_ptr[g] .. grp_ptr[g + 1], all with target grp_dst[g] (csrc/rgms/rgms_plan.h).
//
// The coefficient of entry p in group g is values[perm[p]] (1 without values), times
// 1 / |group| for reduce = mean (R-GCN's c_{i,r}).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace sparsejit::rgms {

struct GroupRange {
  const int64_t* grp_ptr;
  const int64_t* grp_dst;
  const int64_t* src;
  const int64_t* perm;
  int64_t g0, g1;  // this relation's groups
  bool mean;
};

template <typename T>
inline T entry_coef(const GroupRange& gr, const T* values, int64_t g, int64_t p) {
  T c = values ? values[gr.perm[p]] : T(1);
  if (gr.mean) c /= T(gr.grp_ptr[g + 1] - gr.grp_ptr[g]);
  return c;
}

// agg[g - g0, :] = sum_p coef_p * x[src_p, :] over the group's entries.
template <typename T>
void gather_reduce(const GroupRange& gr, const T* values, const T* x, int64_t f, T* agg) {
#pragma omp parallel for schedule(static) if ((gr.g1 - gr.g0) * f > 32768)
  for (int64_t g = gr.g0; g < gr.g1; ++g) {
    T* out = agg + (g - gr.g0) * f;
    std::memset(out, 0, sizeof(T) * f);
    for (int64_t p = gr.grp_ptr[g]; p < gr.grp_ptr[g + 1]; ++p) {
      const T c = entry_coef(gr, values, g, p);
      const T* row = x + gr.src[p] * f;
      for (int64_t j = 0; j < f; ++j) out[j] += c * row[j];
    }
  }
}

// y[grp_dst[g], :] += m[g - g0, :]. Targets are distinct within a relation: no races.
template <typename T>
void scatter_add_rows(const GroupRange& gr, const T* m, int64_t f, T* y) {
#pragma omp parallel for schedule(static) if ((gr.g1 - gr.g0) * f > 32768)
  for (int64_t g = gr.g0; g < gr.g1; ++g) {
    const T* in = m + (g - gr.g0) * f;
    T* out = y + gr.grp_dst[g] * f;
    for (int64_t j = 0; j < f; ++j) out[j] += in[j];
  }
}

// out[g - g0, :] = y[grp_dst[g], :].
template <typename T>
void gather_rows(const GroupRange& gr, const T* y, int64_t f, T* out) {
#pragma omp parallel for schedule(static) if ((gr.g1 - gr.g0) * f > 32768)
  for (int64_t g = gr.g0; g < gr.g1; ++g) {
    std::memcpy(out + (g - gr.g0) * f, y + gr.grp_dst[g] * f, sizeof(T) * f);
  }
}

// dx[src_p, :] += coef_p * dagg[g - g0, :]. Sources repeat across groups, so threads split
// the feature columns instead of the entries (no two threads write one element); narrow
// rows (or few entries) run on one thread.
template <typename T>
void scatter_entries(const GroupRange& gr, const T* values, const T* dagg, int64_t f, T* dx) {
  const int64_t entries = gr.g1 > gr.g0 ? gr.grp_ptr[gr.g1] - gr.grp_ptr[gr.g0] : 0;
#pragma omp parallel if (entries * f > 32768 && f >= 16)
  {
#ifdef _OPENMP
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
#else
    const int64_t nt = 1, t = 0;
#endif
    // Column ranges in multiples of 8 elements, so threads do not share a cache line's
    // worth of floats more than necessary.
    const int64_t chunks = (f + 7) / 8;
    const int64_t j0 = std::min(f, (chunks * t / nt) * 8);
    const int64_t j1 = std::min(f, (chunks * (t + 1) / nt) * 8);
    for (int64_t g = gr.g0; g < gr.g1 && j0 < j1; ++g) {
      const T* in = dagg + (g - gr.g0) * f;
      for (int64_t p = gr.grp_ptr[g]; p < gr.grp_ptr[g + 1]; ++p) {
        const T c = entry_coef(gr, values, g, p);
        T* out = dx + gr.src[p] * f;
        for (int64_t j = j0; j < j1; ++j) out[j] += c * in[j];
      }
    }
  }
}

// dvalues[perm_p] = scale_g * <x[src_p, :], dagg[g - g0, :]> (scale_g = 1 / |group| for
// mean). Each entry writes its own slot.
template <typename T>
void values_grad(const GroupRange& gr, const T* x, const T* dagg, int64_t f, T* dvalues) {
#pragma omp parallel for schedule(static) if ((gr.g1 - gr.g0) * f > 32768)
  for (int64_t g = gr.g0; g < gr.g1; ++g) {
    const T* d = dagg + (g - gr.g0) * f;
    const T scale = gr.mean ? T(1) / T(gr.grp_ptr[g + 1] - gr.grp_ptr[g]) : T(1);
    for (int64_t p = gr.grp_ptr[g]; p < gr.grp_ptr[g + 1]; ++p) {
      const T* row = x + gr.src[p] * f;
      T acc = 0;
      for (int64_t j = 0; j < f; ++j) acc += row[j] * d[j];
      dvalues[gr.perm[p]] = scale * acc;
    }
  }
}

}  // namespace sparsejit::rgms
