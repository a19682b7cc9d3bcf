// Output sites of strided, coarse-grid and transposed convolutions (see kernel_map.h).
#include <omp.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "csrc/point_conv/kernel_map.h"
#include "csrc/point_conv/merge_detail.h"

namespace sparsejit::point_conv {

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

// Output sites plane by plane (a plane = one batch id and one coordinate on axis 0), already
// sorted and unique, without sorting candidate keys. The inputs are sorted by (batch, axis 0,
// ...), so the inputs reaching plane (b, o) form one contiguous window, found by binary search:
// strided i_0 in [o*s - p, o*s - p + d(k-1)], transposed i_0 in [(o + p - d(k-1)) / s,
// (o + p) / s]. Each window marks its sites in a bitmap over the other axes (row-major, last
// axis fastest = key order), read back in order. Returns false (nothing done) when the planes'
// bitmaps would cost more than sorting the candidates.
bool plane_sites(const CoordSet& in, const ConvParams& p, const std::vector<int64_t>& shape,
                 bool transposed, const KeyLayout& layout, const AxisReach* reach,
                 std::vector<uint64_t>& keys) {
  const int dims = p.dims, w = in.width();
  const int64_t n = in.size();
  int64_t plane_bits = 1, stride_of[kMaxDims] = {0, 0, 0, 0};
  for (int d = dims - 1; d >= 1; --d) {
    stride_of[d] = plane_bits;
    plane_bits *= shape[d];
    if (plane_bits > (int64_t{1} << 22)) return false;
  }
  const int64_t words = (plane_bits + 63) / 64;
  const int64_t s0 = p.stride[0], d0 = p.dilation[0], k0 = p.kernel[0], p0 = p.padding[0];
  const int64_t planes = in.batch_size * shape[0];
  if (planes > 4 * n + 1024) return false;  // mostly empty planes: sorting candidates is cheaper
  std::vector<int64_t> begin(planes), end(planes);
  auto before = [&](int64_t q, int64_t b, int64_t x) {  // sorted input q precedes (b, x0 = x)
    const int32_t* r = in.coords.data() + q * w;
    return r[0] < b || (r[0] == b && r[1] < x);
  };
  auto floor_div = [](int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); };
  // Both window ends grow with the plane (b, o): one sequential sweep finds them all.
  int64_t scan_words = 0, qb = 0, qe = 0;
  for (int64_t pl = 0; pl < planes; ++pl) {
    const int64_t b = pl / shape[0], o = pl % shape[0];
    int64_t lo, hi;  // input axis-0 window [lo, hi]
    if (transposed) {
      lo = -floor_div(-(o + p0 - d0 * (k0 - 1)), s0);
      hi = floor_div(o + p0, s0);
    } else {
      lo = o * s0 - p0;
      hi = lo + d0 * (k0 - 1);
    }
    while (qb < n && before(qb, b, lo)) ++qb;
    qe = std::max(qe, qb);
    while (qe < n && before(qe, b, hi + 1)) ++qe;
    begin[pl] = qb;
    end[pl] = hi < lo ? qb : qe;
    if (end[pl] > begin[pl]) scan_words += words;
  }
  // A bitmap word per plane read back costs about what sorting one candidate key does; the
  // candidates number at least the inputs.
  if (scan_words > 8 * std::max<int64_t>(n, 1024)) return false;
  // Per axis d >= 1 and input coordinate x: the plane-linear offsets (o_d * stride_of[d]) of
  // the outputs x reaches on that axis; axes past dims have the single offset 0, so the
  // marking below is always three nested loops.
  constexpr int kOther = kMaxDims - 1;
  std::vector<int64_t> tab[kOther];
  std::vector<int32_t> tab_n[kOther];
  int64_t tab_w[kOther];
  for (int j = 0; j < kOther; ++j) {
    const int d = j + 1;
    if (d >= dims) {
      tab[j] = {0};
      tab_n[j] = {1};
      tab_w[j] = 0;  // every coordinate reads entry 0
      continue;
    }
    const AxisReach& a = reach[d];
    int64_t widest = 1;
    for (const auto& v : a.shifts) widest = std::max<int64_t>(widest, v.size());
    const int64_t extent = in.spatial_shape[d];
    if (extent > (int64_t{1} << 24)) return false;
    tab_w[j] = widest;
    tab[j].assign(extent * widest, 0);
    tab_n[j].assign(extent, 0);
    for (int64_t x = 0; x < extent; ++x) {
      const int64_t base = (x / a.div) * a.mul;
      for (int64_t c : a.shifts[x % a.div])
        if (base + c >= 0 && base + c < shape[d])
          tab[j][x * widest + tab_n[j][x]++] = (base + c) * stride_of[d];
    }
  }
  const int threads = omp_get_max_threads();
  const int64_t chunks = std::min<int64_t>(planes, 8 * threads);
  std::vector<std::vector<uint64_t>> part(chunks);
#pragma omp parallel
  {
    std::vector<uint64_t> bits(words, 0);
#pragma omp for schedule(dynamic, 1)
    for (int64_t ch = 0; ch < chunks; ++ch) {
      std::vector<uint64_t>& out = part[ch];
      for (int64_t pl = planes * ch / chunks; pl < planes * (ch + 1) / chunks; ++pl) {
        if (end[pl] == begin[pl]) continue;
        const int64_t b = pl / shape[0], o = pl % shape[0];
        bool any = false;
        for (int64_t q = begin[pl]; q < end[pl]; ++q) {
          const int32_t* row = in.coords.data() + q * w;
          const AxisReach& a0 = reach[0];
          bool hit = false;
          for (int64_t c : a0.shifts[row[1] % a0.div]) hit |= (row[1] / a0.div) * a0.mul + c == o;
          if (!hit) continue;
          int64_t x[kOther];
          for (int j = 0; j < kOther; ++j) x[j] = 1 + j < dims ? row[2 + j] : 0;
          const int32_t n1 = tab_n[0][x[0]], n2 = tab_n[1][x[1]], n3 = tab_n[2][x[2]];
          const int64_t* t1 = tab[0].data() + x[0] * tab_w[0];
          const int64_t* t2 = tab[1].data() + x[1] * tab_w[1];
          const int64_t* t3 = tab[2].data() + x[2] * tab_w[2];
          any |= n1 * n2 * n3 > 0;
          for (int32_t i1 = 0; i1 < n1; ++i1)
            for (int32_t i2 = 0; i2 < n2; ++i2)
              for (int32_t i3 = 0; i3 < n3; ++i3) {
                const int64_t lin = t1[i1] + t2[i2] + t3[i3];
                bits[lin >> 6] |= uint64_t{1} << (lin & 63);
              }
        }
        if (!any) continue;
        int64_t site[kMaxDims + 1] = {b, o};
        for (int64_t wd = 0; wd < words; ++wd) {
          uint64_t word = bits[wd];
          bits[wd] = 0;
          while (word) {
            int64_t lin = wd * 64 + __builtin_ctzll(word);
            word &= word - 1;
            for (int d = dims - 1; d >= 1; --d) {
              site[1 + d] = lin % shape[d];
              lin /= shape[d];
            }
            out.push_back(layout.pack(site));
          }
        }
      }
    }
  }
  size_t total = 0;
  for (const auto& v : part) total += v.size();
  keys.clear();
  keys.reserve(total);
  for (const auto& v : part) keys.insert(keys.end(), v.begin(), v.end());
  return true;
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
  if (plane_sites(in, p, shape, transposed, layout, reach, keys))
    return coord_set_from_keys(std::move(keys), layout, shape, /*sorted_unique=*/true);
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

}  // namespace sparsejit::point_conv
