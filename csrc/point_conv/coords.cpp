#include "csrc/point_conv/coords.h"

#include <omp.h>

#include <algorithm>
#include <climits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace sparsejit::point_conv {
namespace {

int bit_width(uint64_t v) { return v == 0 ? 0 : 64 - __builtin_clzll(v); }

std::string site_string(const int32_t* row, int dims) {
  std::string s = "(batch " + std::to_string(row[0]);
  for (int d = 0; d < dims; ++d) s += ", " + std::to_string(row[1 + d]);
  return s + ")";
}

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

void check_options(int dims, const CoordSetOptions& o) {
  if (!o.spatial_shape.empty() && static_cast<int>(o.spatial_shape.size()) != dims)
    fail("spatial_shape has " + std::to_string(o.spatial_shape.size()) +
         " entries; coords have " + std::to_string(dims) + " spatial columns");
  for (size_t d = 0; d < o.spatial_shape.size(); ++d)
    if (o.spatial_shape[d] <= 0 || o.spatial_shape[d] > INT32_MAX)
      fail("spatial_shape[" + std::to_string(d) + "] = " + std::to_string(o.spatial_shape[d]) +
           " must lie in [1, 2^31 - 1]");
  if (o.batch_size < 0) fail("batch_size = " + std::to_string(o.batch_size) + " is negative");
  if (o.margin < 0 || o.margin > (int64_t{1} << 30))
    fail("margin = " + std::to_string(o.margin) + " must lie in [0, 2^30]");
}

// One serial pass: the first bad entry is the one reported. Returns per-axis max and the
// largest batch id (as the last element).
std::vector<int64_t> validate_rows(const int32_t* coords, int64_t n, int dims,
                                   const CoordSetOptions& o) {
  std::vector<int64_t> max(dims + 1, -1);
  const int w = dims + 1;
  for (int64_t r = 0; r < n; ++r) {
    const int32_t* row = coords + r * w;
    auto at = [r](int col) {  // built only on failure
      return "coords[" + std::to_string(r) + ", " + std::to_string(col) + "] = ";
    };
    if (row[0] < 0) fail(at(0) + std::to_string(row[0]) + " is a negative batch index");
    if (o.batch_size > 0 && row[0] >= o.batch_size)
      fail(at(0) + std::to_string(row[0]) + " is out of range for batch_size " +
           std::to_string(o.batch_size));
    max[dims] = std::max<int64_t>(max[dims], row[0]);
    for (int d = 0; d < dims; ++d) {
      const int32_t v = row[1 + d];
      if (v < 0)
        fail(at(1 + d) + std::to_string(v) +
             " is negative; coordinates must be >= 0 (shift the cloud first)");
      if (!o.spatial_shape.empty() && v >= o.spatial_shape[d])
        fail(at(1 + d) + std::to_string(v) + " is outside spatial_shape[" +
             std::to_string(d) + "] = " + std::to_string(o.spatial_shape[d]));
      max[d] = std::max<int64_t>(max[d], v);
    }
  }
  return max;
}

// Packs, sorts and gathers: everything of a CoordSet but duplicate handling.
void pack_and_sort(const int32_t* coords, int64_t n, CoordSet& s, std::vector<int32_t>& rows) {
  const int w = s.width();
  s.keys.resize(n);
  rows.resize(n);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    s.keys[r] = s.layout.pack(coords + r * w);
    rows[r] = static_cast<int32_t>(r);
  }
  radix_sort_pairs(s.keys, rows, s.layout.total_bits());
}

void gather_coords(const int32_t* coords, const std::vector<int32_t>& rows, int w,
                   std::vector<int32_t>& out) {
  const int64_t n = static_cast<int64_t>(rows.size());
  out.resize(n * w);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < n; ++p)
    std::copy_n(coords + int64_t{rows[p]} * w, w, out.data() + p * w);
}

// Sorted keys with runs of equal keys -> unique keys. Sites are numbered by first occurrence
// (the stable sort puts each run's smallest row first), so without duplicates site == row.
// On return `rows` holds the first row of each unique site, `s.site` its number.
void merge_duplicates(CoordSet& s, std::vector<int32_t>& rows) {
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<int32_t> run_first(n), rank(n, -1);
  for (int64_t p = 0; p < n; ++p)
    run_first[p] = (p == 0 || s.keys[p] != s.keys[p - 1]) ? rows[p] : run_first[p - 1];
  for (int64_t p = 0; p < n; ++p) rank[run_first[p]] = 0;  // mark first rows
  int32_t next = 0;
  for (int64_t r = 0; r < n; ++r)
    if (rank[r] == 0) rank[r] = next++;
  s.inverse.resize(n);
  for (int64_t p = 0; p < n; ++p) s.inverse[rows[p]] = rank[run_first[p]];
  int64_t u = 0;
  s.site.clear();
  for (int64_t p = 0; p < n; ++p) {
    if (p > 0 && s.keys[p] == s.keys[p - 1]) continue;
    s.keys[u] = s.keys[p];
    rows[u++] = rows[p];
    s.site.push_back(rank[rows[p]]);
  }
  s.keys.resize(u);
  rows.resize(u);
}

void reject_duplicates(const CoordSet& s, const std::vector<int32_t>& rows,
                       const int32_t* coords) {
  const int64_t n = static_cast<int64_t>(rows.size());
  for (int64_t p = 1; p < n; ++p)
    if (s.keys[p] == s.keys[p - 1])
      fail("coords rows " + std::to_string(rows[p - 1]) + " and " + std::to_string(rows[p]) +
           " are the same site " + site_string(coords + int64_t{rows[p]} * s.width(), s.dims) +
           "; remove duplicates or build with dedup = true");
}

}  // namespace

int KeyLayout::total_bits() const {
  int t = batch_bits;
  for (int d = 0; d < dims; ++d) t += axis_bits[d];
  return t;
}

KeyLayout make_key_layout(int dims, int64_t batch_size, const int64_t* lo, const int64_t* hi) {
  if (dims < 1 || dims > kMaxDims)
    fail("dims = " + std::to_string(dims) + " must lie in [1, " + std::to_string(kMaxDims) + "]");
  KeyLayout l;
  l.dims = dims;
  l.batch_size = std::max<int64_t>(batch_size, 1);
  l.batch_bits = bit_width(static_cast<uint64_t>(l.batch_size - 1));
  int shift = 0;
  std::string need = "batch " + std::to_string(l.batch_bits);
  for (int d = dims - 1; d >= 0; --d) {  // axis D-1 in the lowest bits
    l.lo[d] = lo[d];
    l.axis_bits[d] = bit_width(static_cast<uint64_t>(std::max<int64_t>(hi[d] - lo[d], 0)));
    l.shift[d] = l.axis_bits[d] == 0 ? 0 : shift;  // a 0-bit field is always 0: no shift by 64
    shift += l.axis_bits[d];
  }
  for (int d = 0; d < dims; ++d)
    need += ", axis " + std::to_string(d) + " [" + std::to_string(lo[d]) + ", " +
            std::to_string(hi[d]) + "] " + std::to_string(l.axis_bits[d]);
  if (shift + l.batch_bits > 64)
    fail("coordinates past the packing range: a 64-bit key cannot hold them (bits needed: " +
         need + "; total " + std::to_string(shift + l.batch_bits) +
         "); reduce the grid extent or the batch size");
  l.batch_shift = l.batch_bits == 0 ? 0 : shift;
  return l;
}

CoordSet make_coord_set(const int32_t* coords, int64_t n, int64_t width,
                        const CoordSetOptions& options) {
  if (width < 2 || width > kMaxDims + 1)
    fail("coords has width " + std::to_string(width) +
         "; expected 1 + D columns (batch index, then D = 1..4 coordinates)");
  if (n < 0 || n > INT32_MAX)
    fail("coords has " + std::to_string(n) + " rows; at most 2^31 - 1 are supported");
  const int dims = static_cast<int>(width - 1);
  check_options(dims, options);
  const std::vector<int64_t> max = validate_rows(coords, n, dims, options);

  CoordSet s;
  s.dims = dims;
  s.num_rows = n;
  s.batch_size = options.batch_size > 0 ? options.batch_size : std::max<int64_t>(max[dims] + 1, 1);
  s.spatial_shape = options.spatial_shape;
  if (s.spatial_shape.empty())
    for (int d = 0; d < dims; ++d) s.spatial_shape.push_back(std::max<int64_t>(max[d] + 1, 1));
  int64_t lo[kMaxDims], hi[kMaxDims];
  for (int d = 0; d < dims; ++d) {
    lo[d] = -options.margin;
    hi[d] = s.spatial_shape[d] - 1 + options.margin;
  }
  s.layout = make_key_layout(dims, s.batch_size, lo, hi);

  std::vector<int32_t> rows;
  pack_and_sort(coords, n, s, rows);
  if (options.dedup) {
    merge_duplicates(s, rows);
  } else {
    reject_duplicates(s, rows, coords);
    s.site = rows;
  }
  gather_coords(coords, rows, s.width(), s.coords);
  return s;
}

CoordSet coord_set_from_keys(std::vector<uint64_t> keys, const KeyLayout& layout,
                             const std::vector<int64_t>& spatial_shape, bool sorted_unique) {
  CoordSet s;
  s.dims = layout.dims;
  s.batch_size = layout.batch_size;
  s.spatial_shape = spatial_shape;
  s.layout = layout;
  if (!sorted_unique) {
    std::vector<int32_t> unused(keys.size(), 0);
    radix_sort_pairs(keys, unused, layout.total_bits());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  }
  s.keys = std::move(keys);
  const int64_t n = s.size();
  const int w = s.width();
  s.num_rows = n;
  s.coords.resize(n * w);
  s.site.resize(n);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < n; ++p) {
    layout.unpack(s.keys[p], s.coords.data() + p * w);
    s.site[p] = static_cast<int32_t>(p);  // generated sites are numbered in key order
  }
  return s;
}

std::vector<uint64_t> repack_keys(const CoordSet& set, const KeyLayout& layout) {
  const int64_t n = set.size();
  const int w = set.width();
  std::vector<uint64_t> keys(n);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < n; ++p) keys[p] = layout.pack(set.coords.data() + p * w);
  return keys;
}

void radix_sort_pairs(std::vector<uint64_t>& keys, std::vector<int32_t>& values, int key_bits) {
  const int64_t n = static_cast<int64_t>(keys.size());
  if (n < 4096) {  // small sets: a comparison sort beats the histogram passes
    std::vector<int64_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(),
                     [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });
    std::vector<uint64_t> k(n);
    std::vector<int32_t> v(n);
    for (int64_t i = 0; i < n; ++i) k[i] = keys[idx[i]], v[i] = values[idx[i]];
    keys.swap(k);
    values.swap(v);
    return;
  }
  constexpr int kDigitBits = 11;
  constexpr int64_t kRadix = int64_t{1} << kDigitBits;
  const int threads = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), n / 4096 + 1));
  std::vector<uint64_t> k2(n);
  std::vector<int32_t> v2(n);
  std::vector<int64_t> count(threads * kRadix);
  for (int shift = 0; shift < key_bits; shift += kDigitBits) {
    std::fill(count.begin(), count.end(), 0);
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num();
      const int64_t b = n * t / threads, e = n * (t + 1) / threads;
      int64_t* c = count.data() + t * kRadix;
      for (int64_t i = b; i < e; ++i) ++c[(keys[i] >> shift) & (kRadix - 1)];
#pragma omp barrier
#pragma omp single
      {  // exclusive scan in (digit, thread) order keeps the sort stable
        int64_t run = 0;
        for (int64_t dgt = 0; dgt < kRadix; ++dgt)
          for (int tt = 0; tt < threads; ++tt) {
            const int64_t x = count[tt * kRadix + dgt];
            count[tt * kRadix + dgt] = run;
            run += x;
          }
      }
      for (int64_t i = b; i < e; ++i) {
        const int64_t pos = c[(keys[i] >> shift) & (kRadix - 1)]++;
        k2[pos] = keys[i];
        v2[pos] = values[i];
      }
    }
    keys.swap(k2);
    values.swap(v2);
  }
}

}  // namespace sparsejit::point_conv
