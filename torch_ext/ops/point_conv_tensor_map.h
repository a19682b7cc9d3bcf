// The submanifold kernel map built with tensor ops on the coordinates' own device (the CUDA
// conv_plan: torch_ext/ops/point_conv_cuda.inc), word for word the plan the CPU core builds
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

#include "csrc/plan/plan_header.h"
#include "csrc/point_conv/coords.h"
#include "csrc/point_conv/kernel_map.h"
#include "csrc/point_conv/plan_layout.h"

namespace sparsejit::point_conv_tensor {

// keys [n] int64 ascending, delta [k] int64 (uint64 bits) -> int32 [k, n]: the position of
// keys[q] + delta[o] (unsigned, wrapping) in keys, or -1.
using KeySearch =
    std::function<tx::Tensor(const tx::Tensor& keys, const tx::Tensor& delta, int64_t k)>;

inline uint64_t mix(uint64_t h, uint64_t v) {  // as conv_plan_cpu's fingerprint
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h * 0xBF58476D1CE4E5B9ull;
}

// Row index of `rows` (int32 [M], values in [0, num_rows)): row_ptr int64 [num_rows + 1] and
// row_pair int32 [M], pair ids ascending within each row (index_by_row's counting sort).
inline std::pair<tx::Tensor, tx::Tensor> row_index(const tx::Tensor& rows, int64_t num_rows) {
  const tx::Tensor order = std::get<1>(tx::sort(rows, /*stable=*/true, 0, false));
  const tx::Tensor counts = tx::bincount(rows, {}, num_rows);
  const tx::Tensor ptr = tx::cat({tx::zeros({1}, counts.options()), counts.cumsum(0)});
  return {ptr, order.to(tx::kInt)};
}

// The plan (int64 words) and output coordinates of a submanifold conv, or nullopt when the
// input must take the CPU path: coordinates outside the grid or batch, duplicate sites
// (the CPU core's error names the rows), or keys needing all 64 bits (signed sort order).
inline std::optional<std::tuple<tx::Tensor, tx::Tensor>> subm_plan(
    const tx::Tensor& coords, const std::vector<int64_t>& shape, int64_t batch_size,
    const point_conv::ConvParams& p, int64_t margin, const KeySearch& search) {
  const int dims = p.dims;
  const int64_t n = coords.size(0);
  if (n > INT32_MAX) return std::nullopt;
  int64_t lo[point_conv::kMaxDims], hi[point_conv::kMaxDims];
  for (int d = 0; d < dims; ++d) {
    lo[d] = -margin;
    hi[d] = shape[d] - 1 + margin;
  }
  point_conv::KeyLayout lay;
  try {
    lay = point_conv::make_key_layout(dims, batch_size, lo, hi);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
  if (lay.total_bits() > 63) return std::nullopt;
  const tx::Tensor c = coords.to(tx::kLong);
  const tx::Tensor b = c.select(1, 0);
  tx::Tensor bad = (b < 0) | (b >= batch_size);
  tx::Tensor keys = lay.batch_bits > 0 ? b * (int64_t{1} << lay.batch_shift) : tx::zeros_like(b);
  for (int d = 0; d < dims; ++d) {
    const tx::Tensor x = c.select(1, 1 + d);
    bad = bad | (x < 0) | (x >= shape[d]);
    keys = keys + (x - lay.lo[d]) * (int64_t{1} << lay.shift[d]);
  }
  auto [sorted, perm] = tx::sort(keys, /*stable=*/true, 0, false);
  const tx::Tensor dup = n > 1 ? (sorted.narrow(0, 1, n - 1) == sorted.narrow(0, 0, n - 1)).any()
                               : tx::zeros({}, bad.options());
  const tx::Tensor flags = tx::stack({n > 0 ? bad.any() : tx::zeros({}, bad.options()), dup});
  if (flags.any().item<bool>()) return std::nullopt;  // sync: invalid input -> CPU errors

  const int64_t K = p.volume(), center = (K - 1) / 2;
  std::vector<int64_t> delta(center);
  for (int64_t k = 0; k < center; ++k) {
    int64_t e[point_conv::kMaxDims], rem = k;
    for (int d = dims - 1; d >= 0; --d) {
      e[d] = rem % p.kernel[d];
      rem /= p.kernel[d];
    }
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
  const int64_t m = group_ptr[K];
  uint64_t h = mix(0, static_cast<uint64_t>(n));
  for (int64_t q = 0; q < n; ++q) h = mix(h, static_cast<uint64_t>(hw[center + q]));

  std::vector<tx::Tensor> ins{in_lo}, outs{out_lo};
  const tx::Tensor ar = tx::arange(n, i32);
  ins.push_back(ar);
  outs.push_back(ar);
  for (int64_t k = center + 1; k < K; ++k) {  // map(-delta) = map(delta) swapped
    const int64_t src = K - 1 - k;
    ins.push_back(out_lo.narrow(0, group_ptr[src], count[src]));
    outs.push_back(in_lo.narrow(0, group_ptr[src], count[src]));
  }
  const tx::Tensor in_idx = tx::cat(ins), out_idx = tx::cat(outs);
  auto [out_ptr, out_pair] = row_index(out_idx, n);
  auto [in_ptr, in_pair] = row_index(in_idx, n);
  const tx::Tensor gp = tx::tensor(group_ptr, tx::kLong).to(c.device());
  const tx::Tensor pair_group =
      tx::searchsorted(gp.narrow(0, 1, K), tx::arange(m, i64), /*out_int32=*/true, /*right=*/true);

  using point_conv::kArrays;
  tx::Tensor plan = tx::zeros({point_conv::plan_words(K, m, n, n)}, i64);
  std::vector<int64_t> head(point_conv::kFixedWords, 0);
  plan::StructureStamp stamp{n, m, n, static_cast<int64_t>(h >> 1)};
  plan::write_header(head.data(), OpKind::PointConv, point_conv::kSubm, 0, center, stamp);
  head[point_conv::kWordKernelVolume] = K;
  plan.narrow(0, 0, point_conv::kFixedWords).copy_(tx::tensor(head, tx::kLong));
  const tx::Tensor src[] = {gp, in_idx, out_idx, out_ptr, out_pair, in_ptr, in_pair, pair_group};
  int64_t word = point_conv::kFixedWords;
  for (size_t a = 0; a < sizeof(kArrays) / sizeof(kArrays[0]); ++a) {
    const int64_t len = kArrays[a].length(K, m, n, n);
    const int64_t words = point_conv::array_words(kArrays[a], K, m, n, n);
    tx::Tensor dst = plan.narrow(0, word, words);
    if (kArrays[a].int32) dst = dst.view(tx::kInt).narrow(0, 0, len);
    dst.copy_(src[a]);
    word += words;
  }
  return std::make_tuple(plan, coords.to(tx::kInt).clone());
}

}  // namespace sparsejit::point_conv_tensor
