// Output sites of strided, coarse-grid and transposed convolutions (see kernel_map.h).
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "csrc/conv/kernel_map.h"
#include "csrc/conv/merge_detail.h"

namespace sparsejit::conv {

using detail::check_params;

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

}  // namespace

std::vector<int64_t> spconv_output_shape(const std::vector<int64_t>& in_shape,
                                         const ConvParams& p) {
  check_params(p, static_cast<int>(in_shape.size()));
  std::vector<int64_t> out(in_shape.size());
  for (int d = 0; d < p.dims; ++d) {
    const int64_t span = in_shape[d] + 2 * p.padding[d] - p.dilation[d] * (p.kernel[d] - 1) - 1;
    if (span < 0)
      fail("spatial_shape[" + std::to_string(d) + "] = " + std::to_string(in_shape[d]) +
           " is smaller than the dilated kernel " +
           std::to_string(p.dilation[d] * (p.kernel[d] - 1) + 1) + " with padding " +
           std::to_string(p.padding[d]) + ": the output would be empty");
    out[d] = span / p.stride[d] + 1;
  }
  return out;
}

namespace {

KeyLayout grid_layout(const CoordSet& in, const std::vector<int64_t>& shape, int64_t margin) {
  int64_t lo[kMaxDims], hi[kMaxDims];
  for (int d = 0; d < in.dims; ++d) {
    lo[d] = -margin;
    hi[d] = shape[d] - 1 + margin;
  }
  return make_key_layout(in.dims, in.batch_size, lo, hi);
}

// How an input coordinate i reaches outputs along one axis, with t = e * dilation - padding:
// o = (i / div) * mul + c for each c in shifts[i % div]. Strided (i = o * s + t): div = s,
// mul = 1, and the offsets with t = r (mod s) give c = (r - t) / s for residue r. Transposed
// (o = i * s + t): div = 1, mul = s, c = t. Precomputed so that the per-site loop divides once
// per axis instead of once per offset.
struct AxisReach {
  int64_t div = 1, mul = 1;
  std::vector<std::vector<int64_t>> shifts;
};

AxisReach axis_reach(const ConvParams& p, int d, bool transposed) {
  AxisReach a;
  const int64_t s = p.stride[d];
  (transposed ? a.mul : a.div) = s;
  a.shifts.resize(a.div);
  for (int64_t e = 0; e < p.kernel[d]; ++e) {
    const int64_t t = e * p.dilation[d] - p.padding[d];
    const int64_t r = transposed ? 0 : ((t % s) + s) % s;
    a.shifts[r].push_back(transposed ? t : (r - t) / s);
  }
  return a;
}

// Keys of every output site one input site reaches (the cartesian product of the axes).
void site_outputs(const int32_t* row, const AxisReach* reach, const std::vector<int64_t>& shape,
                  int dims, const KeyLayout& layout, std::vector<uint64_t>& keys) {
  int64_t lists[kMaxDims][64];
  int n[kMaxDims];
  for (int d = 0; d < dims; ++d) {
    const AxisReach& a = reach[d];
    const int64_t base = (row[1 + d] / a.div) * a.mul;
    n[d] = 0;
    for (int64_t c : a.shifts[row[1 + d] % a.div])
      if (base + c >= 0 && base + c < shape[d]) lists[d][n[d]++] = base + c;
    if (n[d] == 0) return;
  }
  int idx[kMaxDims] = {0, 0, 0, 0};
  for (;;) {  // odometer over the per-axis lists, last axis fastest
    int64_t site[kMaxDims + 1] = {row[0]};
    for (int d = 0; d < dims; ++d) site[1 + d] = lists[d][idx[d]];
    keys.push_back(layout.pack(site));
    int d = dims - 1;
    while (d >= 0 && ++idx[d] == n[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

// Every output site some input reaches, sorted and unique.
CoordSet reached_sites(const CoordSet& in, const ConvParams& p, const std::vector<int64_t>& shape,
                       bool transposed, int64_t margin) {
  for (int d = 0; d < p.dims; ++d)
    if (p.kernel[d] > 64)
      fail("kernel[" + std::to_string(d) + "] = " + std::to_string(p.kernel[d]) + " exceeds 64");
  const KeyLayout layout = grid_layout(in, shape, margin);
  AxisReach reach[kMaxDims];
  for (int d = 0; d < p.dims; ++d) reach[d] = axis_reach(p, d, transposed);
  std::vector<uint64_t> keys;
#pragma omp parallel
  {
    std::vector<uint64_t> local;
#pragma omp for schedule(static) nowait
    for (int64_t q = 0; q < in.size(); ++q)
      site_outputs(in.coords.data() + q * in.width(), reach, shape, p.dims, layout, local);
#pragma omp critical
    keys.insert(keys.end(), local.begin(), local.end());  // order is irrelevant: sorted next
  }
  return coord_set_from_keys(std::move(keys), layout, shape);
}

}  // namespace

CoordSet spconv_output_sites(const CoordSet& in, const ConvParams& p, int64_t margin) {
  return reached_sites(in, p, spconv_output_shape(in.spatial_shape, p), false, margin);
}

std::vector<int64_t> transposed_output_shape(const std::vector<int64_t>& in_shape,
                                             const ConvParams& p) {
  check_params(p, static_cast<int>(in_shape.size()));
  std::vector<int64_t> out(in_shape.size());
  for (int d = 0; d < p.dims; ++d) {
    out[d] = (in_shape[d] - 1) * p.stride[d] - 2 * p.padding[d] +
             p.dilation[d] * (p.kernel[d] - 1) + 1;
    if (out[d] <= 0)
      fail("transposed conv output would be empty: spatial_shape[" + std::to_string(d) +
           "] = " + std::to_string(in_shape[d]) + " with padding " +
           std::to_string(p.padding[d]) + " gives " + std::to_string(out[d]));
  }
  return out;
}

CoordSet transposed_output_sites(const CoordSet& in, const ConvParams& p, int64_t margin) {
  return reached_sites(in, p, transposed_output_shape(in.spatial_shape, p), true, margin);
}

CoordSet coarse_output_sites(const CoordSet& in, const ConvParams& p, int64_t margin) {
  check_params(p, in.dims);
  std::vector<int64_t> shape(in.dims);
  for (int d = 0; d < in.dims; ++d)
    shape[d] = (in.spatial_shape[d] + p.stride[d] - 1) / p.stride[d];
  const KeyLayout layout = grid_layout(in, shape, margin);
  std::vector<uint64_t> keys(in.size());
  const int w = in.width();
#pragma omp parallel for schedule(static)
  for (int64_t q = 0; q < in.size(); ++q) {
    int64_t site[kMaxDims + 1] = {in.coords[q * w]};
    for (int d = 0; d < in.dims; ++d) site[1 + d] = in.coords[q * w + 1 + d] / p.stride[d];
    keys[q] = layout.pack(site);
  }
  return coord_set_from_keys(std::move(keys), layout, shape);
}

}  // namespace sparsejit::conv
