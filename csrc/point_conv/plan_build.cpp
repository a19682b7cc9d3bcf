#include "csrc/point_conv/plan_build.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "csrc/core/csr.h"
#include "csrc/point_conv/point_conv_run.h"

namespace sparsejit::point_conv {

int64_t sites_fingerprint(const uint64_t* sorted_keys, int64_t n) {
  // Seeded with the site count (hash_words also folds n in); ">> 1": non-negative as int64.
  return static_cast<int64_t>(hash_words(sorted_keys, n, static_cast<uint64_t>(n)) >> 1);
}

const CoordSet& build_kernel_map(Kind kind, const CoordSet& in, const CoordSet* given_out,
                                 const ConvParams& p, int64_t margin, KernelMap& km,
                                 CoordSet& out_sites) {
  switch (kind) {
    case kSubm: submanifold_map(in, p, km); return in;
    case kSpconv:
      out_sites = spconv_output_sites(in, p, margin);
      generalized_map(in, out_sites, p, km);
      return out_sites;
    case kCoarse:
      out_sites = coarse_output_sites(in, p, margin);
      generalized_map(in, out_sites, p, km);
      return out_sites;
    case kTransposed:
      out_sites = transposed_output_sites(in, p, margin);
      transposed_map(in, out_sites, p, km);
      return out_sites;
    case kGeneralized:
      if (given_out == nullptr)
        throw std::invalid_argument("kind 'generalized' needs the output sites (out_coords)");
      generalized_map(in, *given_out, p, km);
      return *given_out;
  }
  throw std::invalid_argument("unknown kernel-map kind " + std::to_string(kind));
}

int64_t mark_identity(Kind kind, int64_t n_in, KernelMap& km) {
  if (kind != kSubm || km.kernel_volume() < 1) return -1;
  const int64_t c = km.kernel_volume() / 2;
  const int64_t begin = km.offset_ptr[c], end = km.offset_ptr[c + 1];
  if (end - begin != n_in) return -1;
  for (int64_t q = begin; q < end; ++q)
    if (km.in_idx[q] != km.out_idx[q]) return -1;
  for (int64_t r = 0; r < n_in; ++r)
    km.in_idx[begin + r] = km.out_idx[begin + r] = static_cast<int32_t>(r);
  return c;
}

void write_plan_head(int64_t* words, Kind kind, int64_t identity, int64_t k, int64_t m,
                     int64_t n_in, int64_t n_out, int64_t hash) {
  std::fill(words, words + kFixedWords, int64_t{0});
  const plan::StructureStamp stamp{n_out, m, n_in, hash};
  plan::write_header(words, OpKind::PointConv, kind, /*prefetch=*/0, /*param=*/identity, stamp);
  words[kWordKernelVolume] = k;
}

void write_plan(int64_t* words, Kind kind, int64_t identity, const KernelMap& km, int64_t n_in,
                int64_t n_out, int64_t hash) {
  const int64_t k = km.kernel_volume(), m = km.size();
  write_plan_head(words, kind, identity, k, m, n_in, n_out, hash);
  // Every array word is written below; only the int32 arrays' padding needs zeros.
  const PlanView v = view_words(words, k, m, n_in, n_out);
  auto mut64 = [](const int64_t* q) { return const_cast<int64_t*>(q); };
  auto mut32 = [](const int32_t* q) { return const_cast<int32_t*>(q); };
  std::copy(km.offset_ptr.begin(), km.offset_ptr.end(), mut64(v.group_ptr));
  std::copy(km.in_idx.begin(), km.in_idx.end(), mut32(v.in_idx));
  std::copy(km.out_idx.begin(), km.out_idx.end(), mut32(v.out_idx));
  if (m % 2 == 1)  // the padding int32 after each int32 array
    for (const int32_t* a : {v.in_idx, v.out_idx, v.out_row_pair, v.in_row_pair, v.pair_group})
      mut32(a)[m] = 0;
  // The two row indexes are independent serial counting sorts: one thread each.
#pragma omp parallel sections num_threads(2) if (m > 4096)
  {
#pragma omp section
    index_by_row(v.group_ptr, k, v.out_idx, n_out, mut64(v.out_row_ptr), mut32(v.out_row_pair),
                 mut32(v.pair_group));
#pragma omp section
    index_by_row(v.group_ptr, k, v.in_idx, n_in, mut64(v.in_row_ptr), mut32(v.in_row_pair),
                 nullptr);
  }
}

}  // namespace sparsejit::point_conv
