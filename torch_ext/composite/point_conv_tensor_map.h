// The submanifold kernel map built with tensor ops on the coordinates' own device (the CUDA
// point_conv_plan: torch_ext/ops/point_conv_cuda.inc), word for word the plan the CPU core builds
// (csrc/point_conv/kernel_map.cpp, plan layout csrc/point_conv/plan_layout.h):
//   keys    the coordinates packed into the CPU's 64-bit keys (same KeyLayout), sorted
//           (stable, so equal keys would keep row order; duplicates are refused);
//   search  for each offset below the centre, every sorted key shifted by the offset's key
//           difference searched in the sorted keys (the caller's kernel: NVRTC on CUDA);
//   pairs   hits compacted in (offset, sorted position) order, which is the CPU merge's
//           order; offsets past the centre are the mirrored ones swapped, the centre is the
//           identity (r, r);
//   index   both row indexes by a stable sort of the rows (pair ids ascending within a row),
//           pair_group by a search in group_ptr.
// Host syncs: one for the validity flags (invalid input goes to the CPU core, whose error
// names the row), one for the pair count (nonzero), one for the per-offset counts and the
// sorted keys (the plan's fingerprint is a serial hash over them, computed on the host).
#pragma once

#include "torch_ext/tensor_api.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "csrc/point_conv/coords.h"
#include "csrc/point_conv/kernel_map.h"
#include "csrc/point_conv/merge_detail.h"
#include "csrc/point_conv/plan_build.h"
#include "csrc/point_conv/plan_layout.h"
#include "torch_ext/common.h"

namespace sparsejit::point_conv_tensor {

// keys [n] int64 ascending, delta [k] int64 (uint64 bits) -> int32 [k, n]: the position of
// keys[q] + delta[o] (unsigned, wrapping) in keys, or -1.
using KeySearch =
    std::function<tx::Tensor(const tx::Tensor& keys, const tx::Tensor& delta, int64_t k)>;

// Row index of `rows` (int32 [M], values in [0, num_rows)): row_ptr int64 [num_rows + 1] and
// row_pair int32 [M], pair ids ascending within each row (index_by_row's counting sort).
inline std::pair<tx::Tensor, tx::Tensor> row_index(const tx::Tensor& rows, int64_t num_rows) {
  const tx::Tensor order = std::get<1>(tx::sort(rows, /*stable=*/true, 0, false));
  const tx::Tensor counts = tx::bincount(rows, {}, num_rows);
  const tx::Tensor ptr = tx::cat({tx::zeros({1}, counts.options()), counts.cumsum(0)});
  return {ptr, order.to(tx::kInt)};
}

// The input sites packed into the CPU's keys (csrc/point_conv/coords.h: the grid layout with
// the call's margin) and sorted; nullopt when the input must take the CPU path: coordinates
// outside the grid or batch, duplicate sites (the CPU core's error names the rows), or keys
// needing all 64 bits (signed sort order). One sync: the validity flags.
struct SortedSites {
  point_conv::KeyLayout lay;
  tx::Tensor c;       // int64 [n, 1 + D], the caller's row order
  tx::Tensor sorted;  // int64 [n] keys ascending
  tx::Tensor perm;    // int64 [n]: row of each sorted key (the CPU's CoordSet::site)
};

inline std::optional<SortedSites> sort_sites(const tx::Tensor& coords,
                                             const std::vector<int64_t>& shape,
                                             int64_t batch_size, int dims, int64_t margin) {
  const int64_t n = coords.size(0);
  if (n > INT32_MAX) return std::nullopt;
  int64_t lo[point_conv::kMaxDims], hi[point_conv::kMaxDims];
  for (int d = 0; d < dims; ++d) {
    lo[d] = -margin;
    hi[d] = shape[d] - 1 + margin;
  }
  SortedSites s;
  try {
    s.lay = point_conv::make_key_layout(dims, batch_size, lo, hi);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
  const point_conv::KeyLayout& lay = s.lay;
  if (lay.total_bits() > 63) return std::nullopt;
  s.c = coords.to(tx::kLong);
  const tx::Tensor b = s.c.select(1, 0);
  tx::Tensor bad = (b < 0) | (b >= batch_size);
  tx::Tensor keys = lay.batch_bits > 0 ? b * (int64_t{1} << lay.batch_shift) : tx::zeros_like(b);
  for (int d = 0; d < dims; ++d) {
    const tx::Tensor x = s.c.select(1, 1 + d);
    bad = bad | (x < 0) | (x >= shape[d]);
    keys = keys + (x - lay.lo[d]) * (int64_t{1} << lay.shift[d]);
  }
  std::tie(s.sorted, s.perm) = tx::sort(keys, /*stable=*/true, 0, false);
  const tx::Tensor& sorted = s.sorted;
  const tx::Tensor flags =
      tx::stack({n > 0 ? bad.any() : tx::zeros({}, bad.options()), has_duplicates(sorted)});
  if (flags.any().item<bool>()) return std::nullopt;  // sync: invalid input -> CPU errors
  return s;
}

// The sorted keys (int64 here) as the core's uint64 keys: the same bits, for the plan's
// fingerprint (csrc/point_conv/plan_build.h sites_fingerprint, as the CPU core's plans).
inline const uint64_t* as_keys(const int64_t* sorted_keys) {
  return reinterpret_cast<const uint64_t*>(sorted_keys);
}

// The plan tensor from its pairs (in_idx / out_idx int32 [M], grouped by offset as group_ptr
// says), the header written as the CPU does; the row indexes and pair_group follow from them.
inline tx::Tensor write_plan(point_conv::Kind kind, int64_t identity,
                             const std::vector<int64_t>& group_ptr, int64_t n_in, int64_t n_out,
                             int64_t hash, const tx::Tensor& in_idx, const tx::Tensor& out_idx) {
  using point_conv::kArrays;
  const int64_t K = static_cast<int64_t>(group_ptr.size()) - 1, m = group_ptr[K];
  const auto i64 = in_idx.options().dtype(tx::kLong);
  const tx::Tensor gp = tx::tensor(group_ptr, tx::kLong).to(in_idx.device());
  auto [out_ptr, out_pair] = row_index(out_idx, n_out);
  auto [in_ptr, in_pair] = row_index(in_idx, n_in);
  const tx::Tensor pair_group =
      tx::searchsorted(gp.narrow(0, 1, K), tx::arange(m, i64), /*out_int32=*/true, /*right=*/true);
  const tx::Tensor src[] = {gp, in_idx, out_idx, out_ptr, out_pair, in_ptr, in_pair, pair_group};
  tx::Tensor plan = tx::zeros({point_conv::plan_words(K, m, n_in, n_out)}, i64);
  std::vector<int64_t> head(point_conv::kFixedWords, 0);
  point_conv::write_plan_head(head.data(), kind, identity, K, m, n_in, n_out, hash);
  plan.narrow(0, 0, point_conv::kFixedWords).copy_(tx::tensor(head, tx::kLong));
  int64_t word = point_conv::kFixedWords;
  for (size_t a = 0; a < sizeof(kArrays) / sizeof(kArrays[0]); ++a) {
    const int64_t len = kArrays[a].length(K, m, n_in, n_out);
    const int64_t words = point_conv::array_words(kArrays[a], K, m, n_in, n_out);
    tx::Tensor dst = plan.narrow(0, word, words);
    if (kArrays[a].int32) dst = dst.view(tx::kInt).narrow(0, 0, len);
    if (len > 0) dst.copy_(src[a]);
    word += words;
  }
  return plan;
}

// The plan (int64 words) and output coordinates of a submanifold conv, or nullopt when the
// input must take the CPU path (see sort_sites).
inline std::optional<std::tuple<tx::Tensor, tx::Tensor>> subm_plan(
    const tx::Tensor& coords, const std::vector<int64_t>& shape, int64_t batch_size,
    const point_conv::ConvParams& p, int64_t margin, const KeySearch& search) {
  const int dims = p.dims;
  const int64_t n = coords.size(0);
  auto sites = sort_sites(coords, shape, batch_size, dims, margin);
  if (!sites.has_value()) return std::nullopt;
  const point_conv::KeyLayout& lay = sites->lay;
  const tx::Tensor& c = sites->c;
  const tx::Tensor& sorted = sites->sorted;
  const tx::Tensor& perm = sites->perm;

  const int64_t K = p.volume(), center = (K - 1) / 2;
  std::vector<int64_t> delta(center);
  for (int64_t k = 0; k < center; ++k) {
    int64_t e[point_conv::kMaxDims];
    point_conv::detail::offset_vector(p, k, e);
    for (int d = 0; d < dims; ++d)
      e[d] = e[d] * p.dilation[d] - p.dilation[d] * (p.kernel[d] - 1) / 2;
    delta[k] = static_cast<int64_t>(lay.offset(e));
  }
  const auto i32 = c.options().dtype(tx::kInt);
  const auto i64 = c.options().dtype(tx::kLong);
  tx::Tensor in_lo = tx::empty({0}, i32), out_lo = tx::empty({0}, i32);
  tx::Tensor counts_lo = tx::zeros({center}, i64);
  if (center > 0 && n > 0) {
    const tx::Tensor delta_t = tx::tensor(delta, tx::kLong).to(c.device());
    const tx::Tensor found = search(sorted, delta_t, center);  // [center, n]
    const tx::Tensor hits = tx::nonzero(found >= 0);           // sync: the pair count
    const tx::Tensor ks = hits.select(1, 0), qs = hits.select(1, 1);
    const tx::Tensor js = found.reshape({-1}).index_select(0, ks * n + qs).to(tx::kLong);
    out_lo = perm.index_select(0, qs).to(tx::kInt);
    in_lo = perm.index_select(0, js).to(tx::kInt);
    counts_lo = tx::bincount(ks, {}, center);
  }
  // sync: the per-offset counts and the sorted keys (the fingerprint).
  const tx::Tensor host = tx::cat({counts_lo, sorted}).cpu();
  const int64_t* hw = host.const_data_ptr<int64_t>();
  std::vector<int64_t> count(K), group_ptr(K + 1, 0);
  for (int64_t k = 0; k < center; ++k) count[k] = count[K - 1 - k] = hw[k];
  count[center] = n;
  for (int64_t k = 0; k < K; ++k) group_ptr[k + 1] = group_ptr[k] + count[k];
  const int64_t h = point_conv::sites_fingerprint(as_keys(hw + center), n);

  std::vector<tx::Tensor> ins{in_lo}, outs{out_lo};
  const tx::Tensor ar = tx::arange(n, i32);
  ins.push_back(ar);
  outs.push_back(ar);
  for (int64_t k = center + 1; k < K; ++k) {  // map(-delta) = map(delta) swapped
    const int64_t src = K - 1 - k;
    ins.push_back(out_lo.narrow(0, group_ptr[src], count[src]));
    outs.push_back(in_lo.narrow(0, group_ptr[src], count[src]));
  }
  const tx::Tensor plan = write_plan(point_conv::kSubm, center, group_ptr, n, n, h,
                                     tx::cat(ins), tx::cat(outs));
  return std::make_tuple(plan, coords.to(tx::kInt).clone());
}

// keys [n] ascending -> int32 [k, n]: the KeySearch of subm_plan with ATen's searchsorted (the
// CPU route of the device-generic builders; CUDA uses its NVRTC binary search).
inline tx::Tensor search_keys_with_tensor_ops(const tx::Tensor& keys, const tx::Tensor& delta,
                                              int64_t k) {
  const int64_t n = keys.numel();  // > 0 (subm_plan's caller)
  const tx::Tensor target =
      (delta.reshape({k, 1}).expand({k, n}) + keys.reshape({1, n}).expand({k, n})).reshape({-1});
  const auto [pos, hit] = sorted_lookup(keys, target);
  return ((pos + 1) * hit.to(tx::kLong) - 1).to(tx::kInt).reshape({k, n});
}

// Strided, coarse, transposed and generalized maps with tensor ops, word for word the CPU
// core's plan and output coordinates (csrc/point_conv/output_sites.cpp,
// strided_map.cpp, kernel_map.cpp):
//   tables  per axis d, host-built: for each kernel tap e and input coordinate x, the output
//           coordinate it reaches (strided: o = (x - t) / s when s divides x - t; transposed:
//           o = x * s + t; t = e * dilation - padding) or -1 outside the output grid, and that
//           coordinate's key field;
//   reach   for every (offset, sorted input) the candidate output key, from the tables by
//           index_select ([K, n]; valid when every axis is);
//   sites   spconv / transposed: the unique valid candidates (every reached site in the
//           output grid, sorted = key order); coarse: the unique floor(x / s); generalized:
//           the caller's rows (checked as the CPU checks them, sorted by key to be searched);
//   pairs   candidates found among the sites, in (offset, sorted input) order. For one offset
//           the output coordinate grows with the input on every axis, so this is also the
//           output order: the order of the CPU's input-driven strided merge and of its
//           output-driven merge alike (and of the transposed map's swapped one);
//   index   as subm_plan.
// Host syncs: the validity flags, the candidate count (nonzero), the site count, the pair
// count, and the per-offset counts with the sorted input keys (the fingerprint); generalized:
// the output sites' checks and extent, and their duplicate flag, instead of the two counts. nullopt
// (the CPU builds it and raises its errors) for invalid input, an empty output grid, a kernel
// wider than 64, tables over 2^24 entries, or keys needing all 64 bits.
inline std::optional<std::tuple<tx::Tensor, tx::Tensor>> strided_plan(
    const tx::Tensor& coords, const std::vector<int64_t>& shape, int64_t batch_size,
    point_conv::Kind kind, const point_conv::ConvParams& p, int64_t margin,
    const std::optional<tx::Tensor>& out_coords = std::nullopt) {
  const int dims = p.dims;
  const bool transposed = kind == point_conv::kTransposed, coarse = kind == point_conv::kCoarse;
  const bool given = kind == point_conv::kGeneralized;
  std::vector<int64_t> out_shape(dims);
  tx::Tensor oc;  // generalized: the caller's output sites, int64
  if (given) {
    // The output sites are the caller's rows (site id = row): checked like the CPU's
    // coord_set (batch ids, non-negative int32 coordinates, no duplicates below); the grid
    // is their extent, max + 1 per axis.
    if (!out_coords.has_value() || out_coords->dim() != 2 || out_coords->size(1) != dims + 1 ||
        !tx::isIntegralType(out_coords->scalar_type(), /*includeBool=*/false) ||
        out_coords->device() != coords.device() || out_coords->size(0) > INT32_MAX)
      return std::nullopt;
    oc = out_coords->to(tx::kLong).contiguous();
    const int64_t no = oc.size(0);
    if (no > 0) {
      const tx::Tensor b = oc.select(1, 0);
      tx::Tensor bad = (b < 0) | (b >= batch_size);
      std::vector<tx::Tensor> v;
      for (int d = 0; d < dims; ++d) {
        const tx::Tensor x = oc.select(1, 1 + d);
        bad = bad | (x < 0) | (x > double(INT32_MAX));
        v.push_back(x.max().reshape({1}));
      }
      v.insert(v.begin(), bad.any().to(tx::kLong).reshape({1}));
      const tx::Tensor h = tx::cat(v).cpu();  // sync: the checks and the extent
      const int64_t* hw = h.const_data_ptr<int64_t>();
      if (hw[0] != 0) return std::nullopt;
      for (int d = 0; d < dims; ++d) out_shape[d] = std::max<int64_t>(hw[1 + d] + 1, 1);
    } else {
      for (int d = 0; d < dims; ++d) out_shape[d] = 1;
    }
  }
  try {
    if (kind == point_conv::kSpconv) {
      out_shape = point_conv::spconv_output_shape(shape, p);
    } else if (transposed) {
      out_shape = point_conv::transposed_output_shape(shape, p);
    } else if (coarse) {
      for (int d = 0; d < dims; ++d) out_shape[d] = (shape[d] + p.stride[d] - 1) / p.stride[d];
    }
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
  for (int d = 0; d < dims; ++d)
    if ((!coarse && !given && p.kernel[d] > 64) || p.kernel[d] * shape[d] > (int64_t{1} << 24))
      return std::nullopt;
  auto sites = sort_sites(coords, shape, batch_size, dims, margin);
  if (!sites.has_value()) return std::nullopt;
  point_conv::KeyLayout olay;  // the output sites' layout (coord_set_from_keys')
  {
    int64_t lo[point_conv::kMaxDims], hi[point_conv::kMaxDims];
    for (int d = 0; d < dims; ++d) {
      lo[d] = -margin;
      hi[d] = out_shape[d] - 1 + margin;
    }
    try {
      olay = point_conv::make_key_layout(dims, batch_size, lo, hi);
    } catch (const std::invalid_argument&) {
      return std::nullopt;
    }
    if (olay.total_bits() > 63) return std::nullopt;
  }
  const int64_t n = coords.size(0), K = p.volume();
  const auto dev = coords.device();
  const auto i32 = sites->c.options().dtype(tx::kInt);
  const auto i64 = sites->c.options().dtype(tx::kLong);
  const tx::Tensor cs = sites->c.index_select(0, sites->perm);  // coordinates in key order
  // Per axis: output coordinate and key field per (tap, x), and each offset's tap.
  // (coarse: one more "tap", the last, for its sites floor(x / s)).
  std::vector<tx::Tensor> coord_tab(dims), key_tab(dims), tap_of(dims);
  for (int d = 0; d < dims; ++d) {
    const int64_t kd = p.kernel[d], taps = kd + (coarse ? 1 : 0), sd = p.stride[d];
    std::vector<int64_t> oc(taps * shape[d], -1), ok(taps * shape[d], -1);
    for (int64_t e = 0; e < taps; ++e)
      for (int64_t x = 0; x < shape[d]; ++x) {
        const int64_t t = e * p.dilation[d] - p.padding[d];
        int64_t o = -1;
        if (e == kd) {
          o = x / sd;  // coarse sites
        } else if (transposed) {
          o = x * sd + t;
        } else if (((x - t) % sd + sd) % sd == 0) {
          o = (x - t) / sd;  // exact
        }
        if (o < 0 || o >= out_shape[d]) continue;
        oc[e * shape[d] + x] = o;
        ok[e * shape[d] + x] = (o - olay.lo[d]) << olay.shift[d];
      }
    coord_tab[d] = tx::tensor(oc, tx::kLong).to(dev);
    key_tab[d] = tx::tensor(ok, tx::kLong).to(dev);
  }
  {
    std::vector<std::vector<int64_t>> tap(dims, std::vector<int64_t>(K));
    for (int64_t k = 0; k < K; ++k) {
      int64_t e[point_conv::kMaxDims];
      point_conv::detail::offset_vector(p, k, e);
      for (int d = 0; d < dims; ++d) tap[d][k] = e[d] * shape[d];
    }
    for (int d = 0; d < dims; ++d) tap_of[d] = tx::tensor(tap[d], tx::kLong).to(dev);
  }
  const tx::Tensor batch_key =
      olay.batch_bits > 0 ? cs.select(1, 0) * (int64_t{1} << olay.batch_shift)
                          : tx::zeros({n}, i64);
  // Candidate output key of (offset k, sorted input q), or -1: [K, n].
  tx::Tensor cand = batch_key.reshape({1, n}).expand({K, n}).contiguous(), valid;
  for (int d = 0; d < dims; ++d) {
    const tx::Tensor idx = (tap_of[d].reshape({K, 1}).expand({K, n}) +
                            cs.select(1, 1 + d).reshape({1, n}).expand({K, n}))
                               .reshape({-1});
    const tx::Tensor f = key_tab[d].index_select(0, idx).reshape({K, n});
    valid = d == 0 ? f >= 0.0 : valid.logical_and(f >= 0.0);
    cand = cand + f;
  }
  // Output sites: sorted unique keys, and their coordinates from a representative candidate
  // (generalized: the caller's rows sorted by key, site_row[j] the row of sorted site j).
  tx::Tensor site_keys, site_coords, site_row;
  if (given) {
    const int64_t no = oc.size(0);
    tx::Tensor keys = olay.batch_bits > 0 ? oc.select(1, 0) * (int64_t{1} << olay.batch_shift)
                                          : tx::zeros({no}, i64);
    for (int d = 0; d < dims; ++d)
      keys = keys + (oc.select(1, 1 + d) - olay.lo[d]) * (int64_t{1} << olay.shift[d]);
    std::tie(site_keys, site_row) = tx::sort(keys, /*stable=*/true, 0, false);
    if (has_duplicates(site_keys).item<bool>())
      return std::nullopt;  // sync: duplicate output sites (the CPU names the rows)
    site_coords = oc.to(tx::kInt);  // a new tensor (oc is int64), not the caller's
  } else {
    tx::Tensor src_keys, src_k, src_q;  // the candidate keys the sites are made of
    if (coarse) {  // floor(x / s) of every input: the extra tap of the tables
      src_keys = batch_key;
      for (int d = 0; d < dims; ++d)
        src_keys = src_keys + key_tab[d].index_select(
                                  0, cs.select(1, 1 + d) + p.kernel[d] * shape[d]);
      src_k = tx::zeros({n}, i64);
      src_q = tx::arange(n, i64);
    } else {
      const tx::Tensor hits = tx::nonzero(valid);  // sync: the candidate count
      src_k = hits.select(1, 0);
      src_q = hits.select(1, 1);
      src_keys = cand.reshape({-1}).index_select(0, src_k * n + src_q);
    }
    auto [sk, order] = tx::sort(src_keys, /*stable=*/true, 0, false);
    const tx::Tensor at = tx::nonzero(run_starts(sk)).reshape({-1});  // sync: the site count
    site_keys = sk.index_select(0, at);
    const tx::Tensor rep = order.index_select(0, at);
    const tx::Tensor rk = src_k.index_select(0, rep), rq = src_q.index_select(0, rep);
    std::vector<tx::Tensor> cols{cs.select(1, 0).index_select(0, rq)};
    for (int d = 0; d < dims; ++d) {
      const tx::Tensor tap = coarse ? tx::zeros_like(rk) + p.kernel[d] * shape[d]
                                    : tap_of[d].index_select(0, rk);
      cols.push_back(coord_tab[d].index_select(0, tap + cs.select(1, 1 + d).index_select(0, rq)));
    }
    site_coords = tx::stack(cols, 1).to(tx::kInt);
  }
  const int64_t n_out = site_keys.numel();
  // Pairs: candidates found among the sites, in (offset, sorted input) order.
  tx::Tensor in_idx = tx::empty({0}, i32), out_idx = tx::empty({0}, i32);
  tx::Tensor counts = tx::zeros({K}, i64);
  if (n_out > 0 && n > 0) {
    const auto [pos, hit] = sorted_lookup(site_keys, cand.reshape({-1}));
    const tx::Tensor found = valid.reshape({-1}).logical_and(hit);
    const tx::Tensor hits = tx::nonzero(found.reshape({K, n}));  // sync: the pair count
    const tx::Tensor ks = hits.select(1, 0), qs = hits.select(1, 1);
    in_idx = sites->perm.index_select(0, qs).to(tx::kInt);
    out_idx = pos.index_select(0, ks * n + qs);
    if (given) out_idx = site_row.index_select(0, out_idx);
    out_idx = out_idx.to(tx::kInt);
    counts = tx::bincount(ks, {}, K);
  }
  // sync: the per-offset counts and the sorted input keys (the fingerprint).
  const tx::Tensor host = tx::cat({counts, sites->sorted}).cpu();
  const int64_t* hw = host.const_data_ptr<int64_t>();
  std::vector<int64_t> group_ptr(K + 1, 0);
  for (int64_t k = 0; k < K; ++k) group_ptr[k + 1] = group_ptr[k] + hw[k];
  const int64_t h = point_conv::sites_fingerprint(as_keys(hw + K), n);
  return std::make_tuple(write_plan(kind, -1, group_ptr, n, n_out, h, in_idx, out_idx),
                         site_coords);
}

}  // namespace sparsejit::point_conv_tensor
