#include "csrc/core/csr.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace sparsejit {

template <typename I>
ValidationResult validate_csr(const I* rowptr, int64_t rowptr_len, const I* col, int64_t nnz,
                              int64_t cols) {
  ValidationResult r;
  auto fail = [&](std::string msg) {
    r.ok = false;
    r.message = std::move(msg);
    return r;
  };
  if (rowptr_len < 1) return fail("indptr must have at least one entry (rows + 1); got size 0");
  if (cols < 0) {
    std::ostringstream os;
    os << "number of columns must be >= 0; got " << cols;
    return fail(os.str());
  }
  if (rowptr[0] != 0) {
    std::ostringstream os;
    os << "indptr[0] must be 0; got " << static_cast<int64_t>(rowptr[0]);
    return fail(os.str());
  }
  const int64_t rows = rowptr_len - 1;
  for (int64_t i = 0; i < rows; ++i) {
    if (rowptr[i + 1] < rowptr[i]) {
      std::ostringstream os;
      os << "indptr must be non-decreasing; indptr[" << i + 1
         << "] = " << static_cast<int64_t>(rowptr[i + 1]) << " < indptr[" << i
         << "] = " << static_cast<int64_t>(rowptr[i]);
      return fail(os.str());
    }
  }
  if (static_cast<int64_t>(rowptr[rows]) != nnz) {
    std::ostringstream os;
    os << "indptr[" << rows << "] = " << static_cast<int64_t>(rowptr[rows])
       << " must equal the number of stored entries (indices has " << nnz << " entries)";
    return fail(os.str());
  }
  // Find the first bad column in parallel; report the smallest position.
  int64_t first_bad = nnz;
#pragma omp parallel for reduction(min : first_bad) schedule(static)
  for (int64_t p = 0; p < nnz; ++p) {
    const int64_t c = col[p];
    if ((c < 0 || c >= cols) && p < first_bad) first_bad = p;
  }
  if (first_bad < nnz) {
    std::ostringstream os;
    os << "indices[" << first_bad << "] = " << static_cast<int64_t>(col[first_bad])
       << " is out of range for " << cols << " columns";
    return fail(os.str());
  }
  return r;
}

template <typename I>
void csr_transpose(const I* rowptr, const I* col, int64_t rows, int64_t cols, I* t_rowptr,
                   I* t_col, I* t_perm) {
  const int64_t nnz = rowptr[rows];
  std::vector<int64_t> count(cols + 1, 0);
  for (int64_t p = 0; p < nnz; ++p) count[col[p] + 1]++;
  for (int64_t c = 0; c < cols; ++c) count[c + 1] += count[c];
  for (int64_t c = 0; c <= cols; ++c) t_rowptr[c] = static_cast<I>(count[c]);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t p = rowptr[i]; p < rowptr[i + 1]; ++p) {
      const int64_t q = count[col[p]]++;
      t_col[q] = static_cast<I>(i);
      t_perm[q] = static_cast<I>(p);
    }
  }
}

namespace {

// The CSR of the edge list k -> (src_of(k), dst_of(k)), k < m, in (target, source, edge)
// order: a counting sort on the target (entries of a row in edge order, the range checked on
// the way), then each row sorted by source, stably. Returns -1 or the first bad edge.
template <typename Src, typename Dst>
int64_t build_csr(Src src_of, Dst dst_of, int64_t m, int64_t n, int64_t* rowptr, int64_t* col,
                  int64_t* perm) {
  std::fill(rowptr, rowptr + n + 1, int64_t{0});
  for (int64_t k = 0; k < m; ++k) {
    const uint64_t s = static_cast<uint64_t>(src_of(k)), d = static_cast<uint64_t>(dst_of(k));
    if (s >= static_cast<uint64_t>(n) || d >= static_cast<uint64_t>(n)) return k;
    rowptr[d + 1]++;
  }
  for (int64_t v = 0; v < n; ++v) rowptr[v + 1] += rowptr[v];
  std::vector<int64_t> next(rowptr, rowptr + n);
  for (int64_t k = 0; k < m; ++k) {
    const int64_t q = next[dst_of(k)]++;
    perm[q] = k;
    col[q] = src_of(k);
  }
  // Sorting the rows is most of the work for sampled subgraphs (rows of 10-25 sources in
  // random order): worth a parallel region from a few tens of thousands of entries.
#pragma omp parallel for schedule(dynamic, 1024) if (m > 16384)
  for (int64_t v = 0; v < n; ++v) {
    const int64_t lo = rowptr[v], len = rowptr[v + 1] - lo;
    int64_t* c = col + lo;
    int64_t* p = perm + lo;
    if (len < 2 || std::is_sorted(c, c + len)) continue;
    if (len <= 32) {  // insertion sort: stable, and fast on the short rows most graphs have
      for (int64_t a = 1; a < len; ++a) {
        const int64_t cv = c[a], pv = p[a];
        int64_t b = a;
        for (; b > 0 && c[b - 1] > cv; --b) {
          c[b] = c[b - 1];
          p[b] = p[b - 1];
        }
        c[b] = cv;
        p[b] = pv;
      }
    } else {  // (source, edge) pairs: edges ascend within the row, so this is stable
      std::vector<std::pair<int64_t, int64_t>> kv(static_cast<size_t>(len));
      for (int64_t a = 0; a < len; ++a) kv[a] = {c[a], p[a]};
      std::sort(kv.begin(), kv.end());
      for (int64_t a = 0; a < len; ++a) {
        c[a] = kv[a].first;
        p[a] = kv[a].second;
      }
    }
  }
  return -1;
}

}  // namespace

int64_t csr_from_edges(const int64_t* src, const int64_t* dst, int64_t e, int64_t n,
                       int64_t* rowptr, int64_t* col, int64_t* perm) {
  return build_csr([src](int64_t k) { return src[k]; }, [dst](int64_t k) { return dst[k]; }, e,
                   n, rowptr, col, perm);
}

namespace {

template <typename V>
int64_t gcn_adjacency_impl(const int64_t* src, const int64_t* dst, int64_t e, int64_t n,
                           int64_t* rowptr, int64_t* col, int64_t* perm, V* values) {
  // The list: the e edges, then the loops (v, v) as edges e + v.
  auto src_of = [src, e](int64_t k) { return k < e ? src[k] : k - e; };
  auto dst_of = [dst, e](int64_t k) { return k < e ? dst[k] : k - e; };
  const int64_t bad = build_csr(src_of, dst_of, e + n, n, rowptr, col, perm);
  if (bad >= 0) return bad;
  // Degrees with weight 1 per edge, 0 per old self-loop, 1 per added loop.
  std::vector<double> dinv(static_cast<size_t>(n), 1.0);
  for (int64_t k = 0; k < e; ++k)
    if (src[k] != dst[k]) dinv[dst[k]] += 1.0;
  for (int64_t v = 0; v < n; ++v) dinv[v] = 1.0 / std::sqrt(dinv[v]);
  // Products in double, rounded once to V (as computing in double and converting would).
#pragma omp parallel for schedule(dynamic, 2048) if (e + n > 16384)
  for (int64_t v = 0; v < n; ++v) {
    for (int64_t q = rowptr[v]; q < rowptr[v + 1]; ++q) {
      const bool old_loop = perm[q] < e && col[q] == v;
      values[q] = static_cast<V>(old_loop ? 0.0 : dinv[v] * dinv[col[q]]);
    }
  }
  return -1;
}

}  // namespace

int64_t gcn_adjacency(const int64_t* src, const int64_t* dst, int64_t e, int64_t n,
                      int64_t* rowptr, int64_t* col, int64_t* perm, double* values) {
  return gcn_adjacency_impl(src, dst, e, n, rowptr, col, perm, values);
}

int64_t gcn_adjacency(const int64_t* src, const int64_t* dst, int64_t e, int64_t n,
                      int64_t* rowptr, int64_t* col, int64_t* perm, float* values) {
  return gcn_adjacency_impl(src, dst, e, n, rowptr, col, perm, values);
}

template <typename I>
RowStats row_stats(const I* rowptr, int64_t rows, int64_t cols) {
  RowStats s;
  s.rows = rows;
  s.cols = cols;
  s.nnz = rows > 0 ? static_cast<int64_t>(rowptr[rows]) : 0;
  s.log2_histogram.assign(1, 0);
  double sum = 0, sumsq = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t len = rowptr[i + 1] - rowptr[i];
    s.max_row = std::max(s.max_row, len);
    sum += static_cast<double>(len);
    sumsq += static_cast<double>(len) * static_cast<double>(len);
    size_t bucket = 0;
    if (len == 0) {
      s.empty_rows++;
    } else {
      int64_t v = len;
      while (v > 0) {
        v >>= 1;
        bucket++;
      }
    }
    if (s.log2_histogram.size() <= bucket) s.log2_histogram.resize(bucket + 1, 0);
    s.log2_histogram[bucket]++;
  }
  if (rows > 0) {
    s.mean_row = sum / static_cast<double>(rows);
    s.std_row = std::sqrt(std::max(0.0, sumsq / static_cast<double>(rows) - s.mean_row * s.mean_row));
    s.skew = s.mean_row > 0 ? static_cast<double>(s.max_row) / s.mean_row : 0.0;
  }
  return s;
}

namespace {

// Word-at-a-time mixing (splitmix64 finalizer), order-sensitive: ~1 ns per index.
inline uint64_t mix64(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

template <typename I>
uint64_t hash_range(const I* data, int64_t n, uint64_t h) {
  // Four independent lanes keep the multiplier pipeline busy; combined at the end.
  uint64_t lane[4] = {h, h ^ 0x1234567ull, h ^ 0x89abcdefull, h ^ 0x13579bdfull};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int l = 0; l < 4; ++l) lane[l] = mix64(lane[l], static_cast<uint64_t>(data[i + l]));
  for (; i < n; ++i) lane[0] = mix64(lane[0], static_cast<uint64_t>(data[i]));
  return mix64(mix64(lane[0], lane[1]), mix64(lane[2], lane[3]));
}

}  // namespace

template <typename I>
uint64_t fingerprint(const I* rowptr, int64_t rows, const I* col, int64_t nnz, int64_t cols) {
  uint64_t h = mix64(mix64(mix64(0x5350524a49545346ull, rows), cols), nnz);
  h = hash_range(rowptr, rows + 1, h);
  return hash_range(col, nnz, h);
}

#define SPARSEJIT_INSTANTIATE_CSR(I)                                                       \
  template ValidationResult validate_csr<I>(const I*, int64_t, const I*, int64_t, int64_t); \
  template void csr_transpose<I>(const I*, const I*, int64_t, int64_t, I*, I*, I*);        \
  template RowStats row_stats<I>(const I*, int64_t, int64_t);                              \
  template uint64_t fingerprint<I>(const I*, int64_t, const I*, int64_t, int64_t);

SPARSEJIT_INSTANTIATE_CSR(int32_t)
SPARSEJIT_INSTANTIATE_CSR(int64_t)

}  // namespace sparsejit
