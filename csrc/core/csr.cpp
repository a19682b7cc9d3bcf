#include "csrc/core/csr.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <sstream>
#include <type_traits>

#include <omp.h>

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

namespace {

// Counting sorts of at least this many items run on several threads.
constexpr int64_t kParallelSortItems = 32768;

// A stable counting sort of m items into n buckets, on up to omp_get_max_threads() threads
// (per-thread histograms over contiguous item ranges, so every bucket keeps item order and
// the result is the same on any number of threads). The caller supplies the two passes:
//   count(k0, k1, h): h[key(k)]++ for every item k in [k0, k1); returns the first item whose
//                     key is out of range (not counted), or k1;
//   place(k0, k1, next): for every item k in [k0, k1) in order, q = next[key(k)]++ is its
//                        position.
// ptr[n + 1] gets the bucket starts. Returns -1, or the first bad item (then nothing is
// placed). Each thread's histogram costs O(n), so threads are added only while the items
// outnumber the buckets they would zero.
template <typename Count, typename Place>
int64_t counting_sort(int64_t m, int64_t n, int64_t* ptr, Count count, Place place) {
  int want = m >= kParallelSortItems ? omp_get_max_threads() : 1;
  while (want > 1 && static_cast<int64_t>(want) * n > 2 * m) --want;
  if (want <= 1) {
    std::fill(ptr, ptr + n + 1, int64_t{0});
    const int64_t bad = count(int64_t{0}, m, ptr + 1);
    if (bad < m) return bad;
    for (int64_t v = 0; v < n; ++v) ptr[v + 1] += ptr[v];
    place(int64_t{0}, m, ptr);  // each bucket's counter ends at the next bucket's start
    std::memmove(ptr + 1, ptr, static_cast<size_t>(n) * sizeof(int64_t));
    ptr[0] = 0;
    return -1;
  }
  std::unique_ptr<int64_t[]> hist(new int64_t[static_cast<size_t>(want) * n]);
  std::vector<int64_t> block(static_cast<size_t>(want) + 1, 0);
  int64_t first_bad = m;
#pragma omp parallel num_threads(want)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    int64_t* h = hist.get() + static_cast<size_t>(t) * n;
    std::fill(h, h + n, int64_t{0});
    const int64_t k0 = m * t / nt, k1 = m * (t + 1) / nt;
    const int64_t bad = count(k0, k1, h);
    if (bad < k1) {
#pragma omp critical(sparsejit_counting_sort)
      first_bad = std::min(first_bad, bad);
    }
#pragma omp barrier
    // Bucket starts: each thread sums a range of buckets over every histogram, then turns
    // its range into running offsets (bucket-major, thread-minor: earlier items first).
    const int64_t v0 = n * t / nt, v1 = n * (t + 1) / nt;
    int64_t sum = 0;
    for (int64_t v = v0; v < v1; ++v)
      for (int u = 0; u < nt; ++u) sum += hist[static_cast<size_t>(u) * n + v];
    block[t + 1] = sum;
#pragma omp barrier
    int64_t off = 0;
    for (int u = 0; u < t; ++u) off += block[u + 1];
    for (int64_t v = v0; v < v1; ++v) {
      ptr[v] = off;
      for (int u = 0; u < nt; ++u) {
        int64_t& c = hist[static_cast<size_t>(u) * n + v];
        const int64_t here = c;
        c = off;
        off += here;
      }
    }
#pragma omp barrier
    if (first_bad == m) place(k0, k1, h);
  }
  if (first_bad < m) return first_bad;
  ptr[n] = m;
  return -1;
}

}  // namespace

template <typename I>
void csr_transpose(const I* rowptr, const I* col, int64_t rows, int64_t cols, I* t_rowptr,
                   I* t_col, I* t_perm) {
  const int64_t nnz = rowptr[rows];
  std::vector<int64_t> start_;  // the starts, where t_rowptr cannot hold them
  int64_t* start = nullptr;
  if constexpr (std::is_same_v<I, int64_t>) {
    start = t_rowptr;
  } else {
    start_.resize(static_cast<size_t>(cols) + 1);
    start = start_.data();
  }
  counting_sort(
      nnz, cols, start,
      [col](int64_t p0, int64_t p1, int64_t* h) {
        for (int64_t p = p0; p < p1; ++p) h[col[p]]++;  // validated by the caller
        return p1;
      },
      [rowptr, col, rows, t_col, t_perm](int64_t p0, int64_t p1, int64_t* next) {
        if (p0 >= p1) return;
        // The row holding entry p0 (rowptr[i] <= p0 < rowptr[i + 1]).
        int64_t i = std::upper_bound(rowptr, rowptr + rows + 1, static_cast<I>(p0)) - rowptr - 1;
        for (; i < rows && rowptr[i] < p1; ++i) {
          const int64_t hi = std::min<int64_t>(rowptr[i + 1], p1);
          for (int64_t p = std::max<int64_t>(rowptr[i], p0); p < hi; ++p) {
            const int64_t q = next[col[p]]++;
            t_col[q] = static_cast<I>(i);
            t_perm[q] = static_cast<I>(p);
          }
        }
      });
  if constexpr (!std::is_same_v<I, int64_t>)
    for (int64_t c = 0; c <= cols; ++c) t_rowptr[c] = static_cast<I>(start[c]);
}

namespace {

// The CSR of the edge list k -> (src_of(k), dst_of(k)), k < m, in (target, source, edge)
// order: a counting sort on the target (entries of a row in edge order), then each row
// sorted by source, stably, and handed to row_done(v) while it is in cache. Returns -1 or
// the first bad edge.
template <typename Src, typename Dst, typename RowDone>
int64_t build_csr(Src src_of, Dst dst_of, int64_t m, int64_t n, int64_t* rowptr, int64_t* col,
                  int64_t* perm, RowDone row_done) {
  // The passes capture by value: stores through col / perm cannot then alias what they read.
  const int64_t bad = counting_sort(
      m, n, rowptr,
      [src_of, dst_of, n](int64_t k0, int64_t k1, int64_t* h) {
        for (int64_t k = k0; k < k1; ++k) {
          const uint64_t s = static_cast<uint64_t>(src_of(k)), d = static_cast<uint64_t>(dst_of(k));
          if (s >= static_cast<uint64_t>(n) || d >= static_cast<uint64_t>(n)) return k;
          h[d]++;
        }
        return k1;
      },
      [src_of, dst_of, col, perm](int64_t k0, int64_t k1, int64_t* next) {
        for (int64_t k = k0; k < k1; ++k) {
          const int64_t q = next[dst_of(k)]++;
          perm[q] = k;
          col[q] = src_of(k);
        }
      });
  if (bad >= 0) return bad;
  // Sorting the rows is most of the work for sampled subgraphs (rows of 10-25 sources in
  // random order): worth a parallel region from a few tens of thousands of entries.
#pragma omp parallel for schedule(dynamic, 1024) if (m > 16384)
  for (int64_t v = 0; v < n; ++v) {
    const int64_t lo = rowptr[v], len = rowptr[v + 1] - lo;
    int64_t* c = col + lo;
    int64_t* p = perm + lo;
    if (len < 2 || std::is_sorted(c, c + len)) {
      row_done(v);
      continue;
    }
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
    row_done(v);
  }
  return -1;
}

}  // namespace

int64_t csr_from_edges(const int64_t* src, const int64_t* dst, int64_t e, int64_t n,
                       int64_t* rowptr, int64_t* col, int64_t* perm) {
  return build_csr([src](int64_t k) { return src[k]; }, [dst](int64_t k) { return dst[k]; }, e,
                   n, rowptr, col, perm, [](int64_t) {});
}

namespace {

template <typename V>
int64_t gcn_adjacency_impl(const int64_t* src, const int64_t* dst, int64_t e, int64_t n,
                           int64_t* rowptr, int64_t* col, int64_t* perm, V* values) {
  // The list: the e edges, then the loops (v, v) as edges e + v.
  auto src_of = [src, e](int64_t k) { return k < e ? src[k] : k - e; };
  auto dst_of = [dst, e](int64_t k) { return k < e ? dst[k] : k - e; };
  // Degrees with weight 1 per edge, 0 per old self-loop, 1 per added loop: row v holds v's
  // incoming edges and its added loop, so d_v is its length less its old self-loops
  // (counted as each row leaves the sort).
  std::vector<double> dinv_(static_cast<size_t>(n));
  double* dinv = dinv_.data();
  const int64_t bad = build_csr(src_of, dst_of, e + n, n, rowptr, col, perm,
                                [rowptr, col, perm, e, dinv](int64_t v) {
                                  const int64_t lo = rowptr[v], hi = rowptr[v + 1];
                                  int64_t d = hi - lo;
                                  for (int64_t q = lo; q < hi; ++q) d -= perm[q] < e && col[q] == v;
                                  dinv[v] = 1.0 / std::sqrt(static_cast<double>(d));
                                });
  if (bad >= 0) return bad;
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

// Two words folded by one 64x64 -> 128-bit multiply, the halves xored (wyhash's step).
inline uint64_t fold(uint64_t a, uint64_t b) {
  const unsigned __int128 r = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
}

template <typename I>
uint64_t hash_range(const I* data, int64_t n, uint64_t h) {
  // Four independent lanes, each folding two words per multiply (one word against a lane
  // constant, the other against the lane), then the lanes, the tail and the length through
  // the splitmix finalizer: ~0.3 ns per index, order-sensitive.
  constexpr uint64_t kLane[4] = {0xa0761d6478bd642full, 0xe7037ed1a0b428dbull,
                                 0x8ebc6af09c88c6e3ull, 0x589965cc75374cc3ull};
  constexpr uint64_t kWord[4] = {0x1d8e4e27c47d124full, 0xd6e8feb86659fd93ull,
                                 0xc2b2ae3d27d4eb4full, 0x9fb21c651e98df25ull};
  uint64_t lane[4] = {h ^ kLane[0], h ^ kLane[1], h ^ kLane[2], h ^ kLane[3]};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 4; ++l)
      lane[l] = fold(static_cast<uint64_t>(data[i + 2 * l]) ^ kWord[l],
                     static_cast<uint64_t>(data[i + 2 * l + 1]) ^ lane[l]);
  uint64_t tail = mix64(h, static_cast<uint64_t>(n));
  for (; i < n; ++i) tail = mix64(tail, static_cast<uint64_t>(data[i]));
  return mix64(mix64(mix64(lane[0], lane[1]), mix64(lane[2], lane[3])), tail);
}

}  // namespace

template <typename I>
uint64_t hash_words(const I* data, int64_t n, uint64_t seed) {
  return hash_range(data, n, seed);
}

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
template uint64_t hash_words<int32_t>(const int32_t*, int64_t, uint64_t);
template uint64_t hash_words<int64_t>(const int64_t*, int64_t, uint64_t);
template uint64_t hash_words<uint64_t>(const uint64_t*, int64_t, uint64_t);

}  // namespace sparsejit
