// Fused sparse attention (Torch-free, raw pointers, OpenMP): a softmax per row and head on a
// CSR pattern. Rows are targets i, stored entries p = (i, j) are their sources.
//
//   z[p, h] = scale * <q[i, h, :], k[j, h, :]> + bias[p, h]        (dot mode, Transformer)
//   z[p, h] = q[i, h, 0] + k[j, h, 0] + bias[p, h]                 (additive mode, GAT), then
//   z[p, h] = sum_d att[h, d] LeakyReLU(q[i, h, d] + k[j, h, d]) + bias[p, h]   (GATv2 mode)
//   s[p, h] = LeakyReLU(z) in additive mode, z otherwise
//   P[p, h] = softmax over row i of s[., h];   out[i, h, :] = sum_p keep(p, h) P[p, h] v[j, h, :]
//
// keep(p, h) is attention dropout: 0 with probability `dropout`, else 1 / (1 - dropout), drawn
// from a counter-based hash of (seed, p, h) so the backward regenerates the same mask without
// storing it. The forward takes a row in three passes over a per-thread buffer of the row's
// [entries, H] scores: the scores and their max m per head; the weights exp(s - m), eight at
// a time; then l = the sum of the weights and the weighted rows of v, in entry order. No
// [nnz, H] tensor is written; it saves lse = m + log(l) per (i, h). When the JIT fixes the
// sizes (float or bfloat16 storage), an entry's H heads go through each pass as one vector
// and the row's accumulator stays in registers (kVectorScores, kRegisterAcc).
//
// The backward recomputes s and P = exp(s - lse) (FlashAttention-2's recipe) with
// D[i, h] = <dout[i, h], out[i, h]>, dP = keep <dout[i], v[j]>, dS = P (dP - D):
//   pass 1, row-parallel over targets:   dq, dbias (no write conflicts), and when pass 2
//   runs, each entry's dz and dropout-scaled P as [nnz, H] scratch (8 bytes per entry and
//   head in float32, only during the backward);
//   pass 2, row-parallel over the transpose (sources): dk, dv from that scratch. Two passes
//   need no atomics and give results independent of the thread count.
// Entries whose pre-activation score is -inf (a -inf bias) are masked out of the softmax.
// Rows without (unmasked) entries give out = 0 and lse = -inf.
//
// Every pass is templated on a `Fixed<kMode, kH, kD, kDv>` policy: a value > 0 (>= 0 for the
// mode) fixes that size at compile time, 0 (-1) reads it from the Shape. The generic build
// (torch_ext/ops/attention.cpp) fixes only common q/k widths; the JIT
// (codegen/cpu_attention_spec.h) fixes all four. The summation order never depends on what is
// fixed, so JIT and generic results are bit-identical.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/common/types.h"
#include "kernels/cpu/attention_args.h"
#include "kernels/cpu/common/prefetch.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace sparsejit::attention {

// Compile-time sizes (see the header comment); the accessors fold to constants when fixed.
template <int kMode, int64_t kH, int64_t kD, int64_t kDv>
struct Fixed {
  static constexpr int64_t heads_fixed = kH;
  static constexpr int64_t qk_fixed = kD;
  static constexpr int64_t v_fixed = kDv;
  static Mode mode(const Shape& s) { return kMode >= 0 ? static_cast<Mode>(kMode) : s.mode; }
  static int64_t heads(const Shape& s) { return kH > 0 ? kH : s.heads; }
  static int64_t qk_width(const Shape& s) { return kD > 0 ? kD : s.qk_width; }
  static int64_t v_width(const Shape& s) { return kDv > 0 ? kDv : s.v_width; }
};

// Per-thread row state lives on the stack up to these sizes (registers when the JIT fixes
// H and Dv), on the heap beyond.
inline constexpr int64_t kStackHeads = 64;
inline constexpr int64_t kStackAcc = 512;

// LeakyReLU without a branch: u times a selected factor (slope where u < 0, else 1: a blend
// and a multiply, vectorizable; exact). `u < 0 ? u * slope : u` compiled to a branch on the
// sign of every element, mispredicted half the time (GATv2's score ran 3x slower than the
// dot product's). NaN stays NaN (NaN * 1), so a NaN input shows in the output.
template <typename T>
inline T leaky_select(T u, T slope) {
  const T factor = u < T(0) ? slope : T(1);
  return u * factor;
}

// slope where u < 0, else 1, without a branch: the two indicator terms (one of them 0, so
// the sum is exact). `u < 0 ? slope : 1` compiled to a compare-and-jump per element and kept
// GATv2's gradient loops scalar (~55% of its backward).
template <typename T>
inline T leaky_grad(T u, T slope) {
  return T(u >= T(0)) + slope * T(u < T(0));
}

// sum_{d < D} f(d) in eight interleaved partial sums, then a fixed tree: a floating-point
// reduction in one accumulator does not vectorize (the compiler may not reorder it), eight
// independent lanes do. The order is fixed, so results do not depend on the target.
template <int64_t kD, typename T, typename F>
inline T lane_sum(int64_t D_rt, F&& f) {
  const int64_t D = kD > 0 ? kD : D_rt;
  constexpr int64_t L = 8;
  T part[L] = {};
  const int64_t full = D - D % L;
  for (int64_t d0 = 0; d0 < full; d0 += L)
#pragma GCC unroll 8
    for (int64_t l = 0; l < L; ++l) part[l] += f(d0 + l);
  T tail = 0;
  for (int64_t d = full; d < D; ++d) tail += f(d);
  return (((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]))) +
         tail;
}

// Counter-based uniform in [0, 1) (splitmix64 finaliser): the same (seed, p, h) always draws
// the same number, in the forward and in both backward passes.
inline double uniform01(uint64_t seed, int64_t p, int64_t h, int64_t heads) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (uint64_t(p) * uint64_t(heads) + uint64_t(h) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * (1.0 / 9007199254740992.0);
}

template <typename T>
inline T keep_factor(const Shape& s, int64_t p, int64_t h) {
  if (s.dropout <= 0.0) return T(1);
  return uniform01(s.seed, p, h, s.heads) < s.dropout ? T(0) : T(1.0 / (1.0 - s.dropout));
}

// The entries' source rows (k, v; q and dout in the transposed pass) are gathered at random:
// on graphs whose rows outgrow the cache every entry waited on its loads (the accumulation
// of v[j] and the read of k[j] took ~80% of the forward on a 100k-node power-law graph). So
// each pass asks for the rows of the entry kPrefetchAhead positions further on. 12 since the
// passes run on vectors (less work per entry to hide a miss behind); against 6, three runs
// each alternated: 200k-node power-law graph, H=4 D=32 forward, float32 114 vs 126 ms and
// bfloat16 90 vs 101 ms (medians), facebook dot fwd+bwd 7.6 vs 8.1 ms.
inline constexpr int64_t kPrefetchAhead = 12;

// e^r with r = x - n ln2 (Cody-Waite, two parts) on |r| <= ln2 / 2: Cephes' degree-6
// polynomial, 1 + r + r^2 p(r). V is float or a vector of floats: the same operations in the
// same order, so soft_exp and soft_exp8 agree bit for bit.
template <typename V>
inline void exp_reduced(const V& x, const V& n, V& out) {
  const V r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  out = p * r * r + r + 1.0f;
}

// exp for the softmax weights: float inline (Cody-Waite reduction to |r| <= ln2 / 2, Cephes'
// degree-6 polynomial, 2^n built in the exponent bits; within 2 ulp of expf over the float
// range, exact 0 below -103.9, +inf above 88.72, NaN kept), so the entry loops do not call
// libm per entry and head (expf was 30% of the forward); double keeps std::exp. Every
// instantiation (JIT and generic) uses it, so they stay bit-identical.
inline float soft_exp(float x) {
  if (!(x > -103.9f)) return x != x ? x : 0.0f;  // NaN stays NaN; -inf and tiny give 0
  if (x > 88.72283f) return std::numeric_limits<float>::infinity();
  const float n = __builtin_rintf(x * 1.44269504088896341f);
  float p;
  exp_reduced(x, n, p);
  // 2^n as two factors so that n down to -150 (subnormal results) stays exact.
  const int32_t ni = static_cast<int32_t>(n), n1 = ni / 2, n2 = ni - n1;
  const uint32_t b1 = static_cast<uint32_t>(n1 + 127) << 23;
  const uint32_t b2 = static_cast<uint32_t>(n2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, sizeof(s1));
  std::memcpy(&s2, &b2, sizeof(s2));
  return p * s1 * s2;
}
inline double soft_exp(double x) { return std::exp(x); }

// soft_exp on eight floats: the same operations per lane, selects in place of the early
// returns, rint as the add-and-subtract of 1.5 * 2^23 (round to nearest even, as rintf for
// |t| < 2^22). With contraction off (the JIT's flags; the baseline build has no FMA) every
// lane gives soft_exp's bits (tested against it).
typedef float exp_f8 __attribute__((vector_size(32)));
typedef int32_t exp_i8 __attribute__((vector_size(32)));

// The same on a vector of N floats (VI: N int32 lanes); soft_exp8 is its eight-lane case.
template <typename V, typename VI>
inline void soft_exp_lanes(const V& x, V& out) {
  const VI low = ~(x > -103.9f);  // NaN too
  const VI high = x > 88.72283f;
  const V zero = {};
  const V xc = (low | high) != 0 ? zero : x;
  const V t = xc * 1.44269504088896341f;
  const V n = (t + 12582912.0f) - 12582912.0f;
  V p;
  exp_reduced(xc, n, p);
  const VI ni = __builtin_convertvector(n, VI), n1 = ni / 2, n2 = ni - n1;
  const VI b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
  V s1, s2;
  std::memcpy(&s1, &b1, sizeof(s1));
  std::memcpy(&s2, &b2, sizeof(s2));
  V res = p * s1 * s2;
  res = high != 0 ? zero + std::numeric_limits<float>::infinity() : res;
  out = low != 0 ? ((x != x) != 0 ? x : zero) : res;
}

inline void soft_exp8(const exp_f8& x, exp_f8& out) { soft_exp_lanes<exp_f8, exp_i8>(x, out); }

// w[t] = soft_exp(w[t] - m[t % H]) for t < n, 0 where w[t] is -inf (a masked entry): the
// softmax weights of one row's [entries, H] scores, eight at a time for float.
template <typename T>
inline void row_weights(T* w, int64_t n, const T* m, int64_t H) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  int64_t t = 0;
  if constexpr (std::is_same_v<T, float>) {
    // With H dividing 8, every group of eight sees the same heads in the same lanes.
    exp_f8 mm_fixed{};
    const bool repeat = 8 % H == 0;
    if (repeat)
      for (int u = 0; u < 8; ++u) mm_fixed[u] = m[u % H];
    for (; t + 8 <= n; t += 8) {
      exp_f8 x, mm = mm_fixed, e;
      std::memcpy(&x, w + t, sizeof(x));
      if (!repeat)
        for (int u = 0; u < 8; ++u) mm[u] = m[(t + u) % H];
      soft_exp8(x - mm, e);
      e = x == neg_inf ? exp_f8{} : e;
      std::memcpy(w + t, &e, sizeof(e));
    }
  }
  for (; t < n; ++t) w[t] = w[t] == neg_inf ? T(0) : soft_exp(w[t] - m[t % H]);
}

using cpu::prefetch_line;  // kernels/cpu/common/prefetch.h
using cpu::prefetch_span;

// Asks for x's row (`row` elements) of the entry kPrefetchAhead positions after p, and
// v's too when given (see above).
template <typename S, typename I>
inline void prefetch_ahead(const S* x, const I* col, int64_t p, int64_t nnz, int64_t row,
                           const S* v = nullptr, int64_t v_row = 0) {
  if (p + kPrefetchAhead >= nnz) return;
  const int64_t jn = col[p + kPrefetchAhead];
  prefetch_span(x + jn * row, row);
  if (v) prefetch_span(v + jn * v_row, v_row);
}

// Pre-activation z of entry p = (i, j), head h (the dot products unroll when K fixes D).
// q and k are stored as S: T itself, or bfloat16 with T = float (widened exactly on load).
template <class K, typename T, typename S = T>
inline T pre_score(const Shape& s, const S* q, const S* k, const T* bias, int64_t i, int64_t j,
                   int64_t p, int64_t h) {
  const int64_t H = K::heads(s), D = K::qk_width(s);
  const Mode mode = K::mode(s);
  T z;
  if (mode == Mode::Dot) {
    const S* qi = q + (i * H + h) * D;
    const S* kj = k + (j * H + h) * D;
    z = T(s.scale) *
        lane_sum<K::qk_fixed, T>(D, [&](int64_t d) { return T(qi[d]) * T(kj[d]); });
  } else if (mode == Mode::GATv2) {
    const S* qi = q + (i * H + h) * D;
    const S* kj = k + (j * H + h) * D;
    const T* a = static_cast<const T*>(s.att) + h * D;
    const T slope = T(s.negative_slope);
    z = lane_sum<K::qk_fixed, T>(
        D, [&](int64_t d) { return a[d] * leaky_select<T>(T(qi[d]) + T(kj[d]), slope); });
  } else {
    z = T(q[i * H + h]) + T(k[j * H + h]);
  }
  if (bias) z += bias[p * H + h];
  return z;
}

template <class K, typename T>
inline T activate(const Shape& s, T z) {
  return K::mode(s) == Mode::Additive ? leaky_select<T>(z, T(s.negative_slope)) : z;
}

template <class K, typename T>
inline T activation_grad(const Shape& s, T z) {
  return (K::mode(s) == Mode::Additive && z < T(0)) ? T(s.negative_slope) : T(1);
}

// float vectors of N lanes (GCC's vector extension; N a power of two).
template <int64_t N>
struct FloatVec {
  typedef float type __attribute__((vector_size(N * sizeof(float))));
  typedef int32_t itype __attribute__((vector_size(N * sizeof(int32_t))));
  typedef uint32_t utype __attribute__((vector_size(N * sizeof(uint32_t))));
  typedef uint16_t htype __attribute__((vector_size(N * sizeof(uint16_t))));
};

// Storage the vector paths read: float, or bfloat16 widened exactly (its bits in the high
// half of a float, as bf16's conversion).
template <typename S>
inline constexpr bool kFloatLanes = std::is_same_v<S, float> || std::is_same_v<S, bf16>;

template <typename V, typename S>
inline void load_lanes(V& out, const S* p) {
  if constexpr (std::is_same_v<S, float>) {
    std::memcpy(&out, p, sizeof(out));
  } else {
    constexpr int64_t N = sizeof(V) / sizeof(float);
    using U16 = typename FloatVec<N>::htype;
    using U32 = typename FloatVec<N>::utype;
    U16 h;
    std::memcpy(&h, p, sizeof(h));
    const U32 w = __builtin_convertvector(h, U32) << 16;
    std::memcpy(&out, &w, sizeof(out));
  }
}

// The passes take an entry's H heads as one vector when K fixes H to 1, 2, 4 or 8 (float
// computation; float or bfloat16 storage in the forward).
template <class K, typename T, typename S>
inline constexpr bool kVectorScores =
    std::is_same_v<T, float> && kFloatLanes<S> && K::heads_fixed > 0 &&
    K::heads_fixed <= 8 && (K::heads_fixed & (K::heads_fixed - 1)) == 0;

// Pass 3 keeps the row's accumulator in registers, as vectors of kAccWidth lanes, when K
// fixes H and Dv and they fit: 8 zmm with AVX-512, 8 ymm (half the register file) below.
// Through acc in memory every entry waited on the previous entry's store (~20% of GAT's
// forward); as an array of floats the compiler split it into scalars.
#ifdef __AVX512F__
inline constexpr int64_t kRegisterFloats = 128;
#else
inline constexpr int64_t kRegisterFloats = 64;
#endif
template <int64_t kDv>
inline constexpr int64_t kAccWidth = kDv % 16 == 0 ? 16 : kDv % 8 == 0 ? 8 : kDv % 4 == 0 ? 4 : 0;
template <class K, typename T, typename S>
inline constexpr bool kRegisterAcc = std::is_same_v<T, float> && kFloatLanes<S> &&
                                     K::heads_fixed > 0 && K::v_fixed > 0 &&
                                     kAccWidth<(K::v_fixed > 0 ? K::v_fixed : 1)> > 0 &&
                                     K::heads_fixed * K::v_fixed <= kRegisterFloats;

// sum_{d < kD} f(h, d) for the kH heads of one entry as one vector, each head summed in
// lane_sum's order: eight partial sums, then ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7))
// + 0. f8(h, d0, term) writes the eight terms d0..d0+7 of head h (kD a multiple of 8). The trees
// of four heads run side by side after a 4x4 transpose of the halves' sums. Written head by
// head into a vector, the sums went through the stack and the vector load that followed
// stalled on the four stores.
template <int64_t kH, int64_t kD, typename F>
inline typename FloatVec<kH>::type head_sums(F&& f8) {
  static_assert(kD % 8 == 0, "eight lanes per step");
  using V4 = typename FloatVec<4>::type;
  using VH = typename FloatVec<kH>::type;
  V4 half[kH];  // per head: [p0 + p4, p1 + p5, p2 + p6, p3 + p7]
  for (int64_t h = 0; h < kH; ++h) {
    exp_f8 part{};
    for (int64_t d0 = 0; d0 < kD; d0 += 8) {
      exp_f8 term;
      f8(h, d0, term);
      part += term;
    }
    half[h] = __builtin_shufflevector(part, part, 0, 1, 2, 3) +
              __builtin_shufflevector(part, part, 4, 5, 6, 7);
  }
  // Four heads' (q0 + q2) + (q1 + q3), lane h for head h.
  auto four = [&](int64_t h0) {
    const V4 t0 = __builtin_shufflevector(half[h0], half[h0 + 1], 0, 4, 1, 5);
    const V4 t1 = __builtin_shufflevector(half[h0], half[h0 + 1], 2, 6, 3, 7);
    const V4 t2 = __builtin_shufflevector(half[h0 + 2], half[h0 + 3], 0, 4, 1, 5);
    const V4 t3 = __builtin_shufflevector(half[h0 + 2], half[h0 + 3], 2, 6, 3, 7);
    const V4 c0 = __builtin_shufflevector(t0, t2, 0, 1, 4, 5);
    const V4 c1 = __builtin_shufflevector(t0, t2, 2, 3, 6, 7);
    const V4 c2 = __builtin_shufflevector(t1, t3, 0, 1, 4, 5);
    const V4 c3 = __builtin_shufflevector(t1, t3, 2, 3, 6, 7);
    return (c0 + c2) + (c1 + c3);
  };
  VH out;
  if constexpr (kH == 8) {
    const V4 lo = four(0), hi = four(4);
    out = __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7);
  } else if constexpr (kH == 4) {
    out = four(0);
  } else {
    for (int64_t h = 0; h < kH; ++h)
      out[h] = (half[h][0] + half[h][2]) + (half[h][1] + half[h][3]);
  }
  return out + VH{};  // lane_sum's "+ tail" (0 here): -0 becomes +0 there too
}

// <x[h, :], y[h, :]> per head (rows of kD floats).
template <int64_t kH, int64_t kD, typename S>
inline typename FloatVec<kH>::type head_dots(const S* x, const S* y) {
  return head_sums<kH, kD>([&](int64_t h, int64_t d0, exp_f8& term) {
    exp_f8 a, b;
    load_lanes(a, x + h * kD + d0);
    load_lanes(b, y + h * kD + d0);
    term = a * b;
  });
}

// The q/k widths the vector passes take: 1 (additive scores) or a multiple of 8 (dot and
// GATv2, through head_sums).
template <class K>
inline constexpr bool kLaneWidth = K::qk_fixed == 1 || (K::qk_fixed > 0 && K::qk_fixed % 8 == 0);

// Whether entry_scores takes this call's score form (K with kLaneWidth): additive scores
// with D = 1, dot and GATv2 with the wider D.
template <class K>
inline bool scores_on_lanes(const Shape& s) {
  return (K::mode(s) == Mode::Additive) == (K::qk_fixed == 1);
}

// z of entry (i, j) for every head, as pre_score computes it per head (bias not added); qi
// and kj are the entry's rows of q and k (scores_on_lanes holds).
template <class K, typename S>
inline typename FloatVec<K::heads_fixed>::type entry_scores(const Shape& s, const S* qi,
                                                             const S* kj) {
  constexpr int64_t kH = K::heads_fixed, kD = K::qk_fixed;
  using VH = typename FloatVec<kH>::type;
  if (K::mode(s) == Mode::Additive) {
    VH a, b;
    load_lanes(a, qi);
    load_lanes(b, kj);
    return a + b;
  }
  if constexpr (kD > 0 && kD % 8 == 0) {
    if (K::mode(s) == Mode::Dot) return float(s.scale) * head_dots<kH, kD>(qi, kj);
    const float* att = static_cast<const float*>(s.att);
    const exp_f8 slope = exp_f8{} + float(s.negative_slope), one = exp_f8{} + 1.0f;
    return head_sums<kH, kD>([&](int64_t h, int64_t d0, exp_f8& term) {
      exp_f8 a, x, y;
      std::memcpy(&a, att + h * kD + d0, sizeof(a));
      load_lanes(x, qi + h * kD + d0);
      load_lanes(y, kj + h * kD + d0);
      const exp_f8 u = x + y;
      term = a * (u * (u < 0.0f ? slope : one));  // att * leaky_select(q + k)
    });
  }
  return VH{};  // not reached: scores_on_lanes
}

// activation_grad per lane: the slope where an additive score is negative, else 1 (the
// activated score is z times it: leaky_select).
template <class K, typename VH>
inline VH activation_grad_lanes(const Shape& s, const VH& z) {
  const VH one = VH{} + 1.0f;
  if (K::mode(s) != Mode::Additive) return one;
  return z < 0.0f ? VH{} + float(s.negative_slope) : one;
}

// S: the storage of q, k, v and out (T, or bfloat16 with T = float: widened on load, the
// output rounded to nearest even once per element); bias, att and lse are T.
template <class K, typename T, typename I, typename S = T>
void forward(const Shape& shape, const I* rowptr, const I* col, const S* q, const S* k,
             const S* v, const T* bias, S* out, T* lse) {
  // A local copy: the stores of the score loop cannot alias it, so its fields stay in
  // registers instead of being reloaded per entry.
  const Shape s = shape;
  const int64_t H = K::heads(s), Dv = K::v_width(s);
  const T neg_inf = -std::numeric_limits<T>::infinity();
#pragma omp parallel num_threads(s.threads) if (s.rows * H > 256)
  {
    // m (the row's max per head), l (the sum of its weights) and the row's accumulator: on the
    // stack when small, so that with H and Dv fixed they can stay in registers.
    T m_st[kStackHeads], l_st[kStackHeads];
    alignas(64) T acc_st[kStackAcc];
    std::vector<T> heap(H > kStackHeads ? 2 * H : 0);
    T* m = H > kStackHeads ? heap.data() : m_st;
    T* l = H > kStackHeads ? heap.data() + H : l_st;
    const bool acc_on_stack = H * Dv <= kStackAcc;
    // A wide row accumulates in place in out when out holds T, else in a T buffer.
    constexpr bool same = std::is_same_v<S, T>;
    std::vector<T> acc_heap(!same && !acc_on_stack ? H * Dv : 0);
    std::vector<T> row;  // one row's [entries, H] scores, then its weights
    const int64_t nnz = rowptr[s.rows], Dk = K::qk_width(s);
#pragma omp for schedule(dynamic, 64)
    for (int64_t i = 0; i < s.rows; ++i) {
      T* acc;
      if constexpr (same)
        acc = acc_on_stack ? acc_st : out + i * H * Dv;
      else
        acc = acc_on_stack ? acc_st : acc_heap.data();
      std::fill(acc, acc + H * Dv, T(0));
      std::fill(m, m + H, neg_inf);
      std::fill(l, l + H, T(0));
      // Three passes over a per-thread buffer of the row's [entries, H] scores. An online
      // softmax (one pass, the accumulator rescaled when the max grows) put an exp and a
      // rescale check on every entry's critical path; here the exps are independent and
      // eight wide, and each pass gathers one tensor's rows (k, then v). Measured against
      // the online forward: GAT 1.31x, dot and GATv2 1.3-1.9x.
      const int64_t p0 = rowptr[i], len = rowptr[i + 1] - p0;
      if (static_cast<int64_t>(row.size()) < len * H) row.resize(len * H);
      T* __restrict w = row.data();
      // Pass 1: every entry's score and the row's max per head (a masked entry, score -inf,
      // stays out of the softmax; a NaN score does not move the max).
      bool done = false;
      if constexpr (kVectorScores<K, T, S> && kLaneWidth<K>) {
        if (scores_on_lanes<K>(s)) {
          // H fixed (the JIT): an entry's H scores as one H-lane vector, the same operations
          // per lane as the scalar loop below (score, bias, activation, the -inf mask).
          constexpr int64_t kH = K::heads_fixed, kD = K::qk_fixed;
          using VH = typename FloatVec<kH>::type;
          VH mv = VH{} + neg_inf;
          const S* qi = q + i * kH * kD;
          for (int64_t t = 0; t < len; ++t) {
            const int64_t p = p0 + t;
            prefetch_ahead(k, col, p, nnz, kH * kD);
            VH z = entry_scores<K, S>(s, qi, k + col[p] * kH * kD);
            if (bias) {
              VH bv;
              std::memcpy(&bv, bias + p * kH, sizeof(bv));
              z = z + bv;
            }
            VH sc = z * activation_grad_lanes<K>(s, z);
            sc = z == neg_inf ? VH{} + neg_inf : sc;
            std::memcpy(w + t * kH, &sc, sizeof(sc));
            mv = sc > mv ? sc : mv;
          }
          for (int64_t h = 0; h < kH; ++h) m[h] = mv[h];
          done = true;
        }
      } else if constexpr (std::is_same_v<T, float>) {
        if (H <= 8) {  // the max on vector lanes (registers), one lane per head
          exp_f8 mv, scv;
          for (int u = 0; u < 8; ++u) mv[u] = neg_inf;
          for (int64_t t = 0; t < len; ++t) {
            const int64_t p = p0 + t, j = col[p];
            prefetch_ahead(k, col, p, nnz, H * Dk);
            for (int u = 0; u < 8; ++u) scv[u] = neg_inf;
            for (int64_t h = 0; h < H; ++h) {
              const T z = pre_score<K, T, S>(s, q, k, bias, i, j, p, h);
              const T sc = z == neg_inf ? neg_inf : activate<K>(s, z);
              w[t * H + h] = sc;
              scv[h] = sc;
            }
            mv = scv > mv ? scv : mv;
          }
          for (int64_t h = 0; h < H; ++h) m[h] = mv[h];
          done = true;
        }
      }
      for (int64_t t = 0; t < len && !done; ++t) {
        const int64_t p = p0 + t, j = col[p];
        prefetch_ahead(k, col, p, nnz, H * Dk);
        for (int64_t h = 0; h < H; ++h) {
          const T z = pre_score<K, T, S>(s, q, k, bias, i, j, p, h);
          const T sc = z == neg_inf ? neg_inf : activate<K>(s, z);
          w[t * H + h] = sc;
          m[h] = sc > m[h] ? sc : m[h];
        }
      }
      // Pass 2: the weights exp(score - max), eight at a time.
      row_weights(w, len * H, m, H);
      // Pass 3: the sums and the weighted rows of v, in entry order (with H and Dv fixed
      // and small, in registers: see kRegisterAcc).
      if constexpr (kRegisterAcc<K, T, S>) {
        constexpr int64_t kH = K::heads_fixed, kDv = K::v_fixed, kW = kAccWidth<kDv>;
        constexpr int64_t kN = kH * kDv / kW;  // vectors in the accumulator
        using VW = typename FloatVec<kW>::type;
        VW a[kN];
        for (int64_t r = 0; r < kN; ++r) a[r] = VW{};
        T lr[kH] = {};
        for (int64_t t = 0; t < len; ++t) {
          const int64_t p = p0 + t;
          prefetch_ahead(v, col, p, nnz, kH * kDv);
          const S* vj = v + col[p] * kH * kDv;
#pragma GCC unroll 8
          for (int64_t h = 0; h < kH; ++h) {
            const T wt = w[t * kH + h];
            lr[h] += wt;
            const T wk = wt * keep_factor<T>(s, p, h);
            if (wk != T(0)) {
#pragma GCC unroll 64
              for (int64_t r = 0; r < kDv / kW; ++r) {
                VW x;
                load_lanes(x, vj + h * kDv + r * kW);
                a[h * (kDv / kW) + r] += wk * x;
              }
            }
          }
        }
        std::memcpy(acc, a, sizeof(a));
        std::memcpy(l, lr, sizeof(lr));
      } else {
        for (int64_t t = 0; t < len; ++t) {
          const int64_t p = p0 + t;
          prefetch_ahead(v, col, p, nnz, H * Dv);
          const S* vj = v + col[p] * H * Dv;
          for (int64_t h = 0; h < H; ++h) {
            const T wt = w[t * H + h];
            l[h] += wt;
            const T wk = wt * keep_factor<T>(s, p, h);
            if (wk != T(0)) {
              T* a = acc + h * Dv;
              for (int64_t d = 0; d < Dv; ++d) a[d] += wk * T(vj[h * Dv + d]);
            }
          }
        }
      }
      S* o = out + i * H * Dv;
      for (int64_t h = 0; h < H; ++h) {
        if (l[h] != T(0)) {  // > 0, or NaN from a NaN score: the NaN reaches out and lse
          const T inv = T(1) / l[h];
          for (int64_t d = 0; d < Dv; ++d) o[h * Dv + d] = S(acc[h * Dv + d] * inv);
          lse[i * H + h] = m[h] + std::log(l[h]);
        } else {
          for (int64_t d = 0; d < Dv; ++d) o[h * Dv + d] = S(T(0));
          lse[i * H + h] = neg_inf;
        }
      }
    }
  }
}

// Everything the backward needs about one entry (p = (i, j), head h): the derivative of the
// loss w.r.t. its pre-activation z, and its dropout-scaled probability (for dv).
template <class K, typename T>
inline void entry_grad(const Shape& s, const T* q, const T* k, const T* v, const T* bias,
                       const T* lse, const T* delta, const T* dout, int64_t i, int64_t j,
                       int64_t p, int64_t h, T* dz, T* pk) {
  const int64_t H = K::heads(s), Dv = K::v_width(s);
  const T z = pre_score<K>(s, q, k, bias, i, j, p, h);
  if (z == -std::numeric_limits<T>::infinity()) {  // masked: no weight, no gradient
    *dz = T(0);
    *pk = T(0);
    return;
  }
  const T prob = soft_exp(activate<K>(s, z) - lse[i * H + h]);
  const T keep = keep_factor<T>(s, p, h);
  T dp = 0;
  if (keep != T(0)) {
    const T* g = dout + (i * H + h) * Dv;
    const T* vj = v + (j * H + h) * Dv;
    dp = keep * lane_sum<K::v_fixed, T>(Dv, [&](int64_t d) { return g[d] * vj[d]; });
  }
  *dz = prob * (dp - delta[i * H + h]) * activation_grad<K>(s, z);
  *pk = prob * keep;
}

// delta[i, h] = <dout[i, h], out[i, h]>.
template <class K, typename T>
void row_delta(const Shape& s, const T* out, const T* dout, T* delta) {
  const int64_t n = s.rows * K::heads(s), Dv = K::v_width(s);
#pragma omp parallel for num_threads(s.threads) schedule(static) if (n * Dv > 32768)
  for (int64_t r = 0; r < n; ++r) {
    delta[r] = lane_sum<K::v_fixed, T>(
        Dv, [&](int64_t d) { return out[r * Dv + d] * dout[r * Dv + d]; });
  }
}

// d(score)/d(q[i]) (= d/d(k[j]) up to the scale) of entry (i, j), head h, times dz, added
// to g[0:D]; in GATv2 mode also dz * LeakyReLU(q + k) to datt[0:D] when datt is given.
// The gradient rows never alias the inputs (separate buffers): __restrict lets the
// compiler vectorize these loops (without it they ran as scalar load-add-store chains, ~55%
// of GATv2's backward).
template <class K, typename T>
inline void add_score_grad(const Shape& s, const T* __restrict other, const T* __restrict qi,
                           const T* __restrict kj, T dz, T* __restrict g,
                           T* __restrict datt, int64_t h) {
  const int64_t D = K::qk_width(s);
  const Mode mode = K::mode(s);
  if (mode == Mode::Dot) {
    const T c = dz * T(s.scale);
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) g[d] += c * other[d];
  } else if (mode == Mode::GATv2) {
    const T* a = static_cast<const T*>(s.att) + h * D;
    const T slope = T(s.negative_slope);
    if (g)
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) {
        const T u = qi[d] + kj[d];
        g[d] += dz * a[d] * leaky_grad<T>(u, slope);
      }
    if (datt)
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) datt[d] += dz * leaky_select<T>(qi[d] + kj[d], slope);
  } else {
    g[0] += dz;
  }
}

// Pass 1, over targets: dq [rows, H, D], dbias [nnz, H] and (GATv2) datt [H, D]; each may be
// null. datt is summed over every entry: one partial sum per block of kRowBlock rows (blocks
// are fixed, whatever the thread count or schedule), then the blocks in order, so datt is
// deterministic.
inline constexpr int64_t kRowBlock = 64;

// add_score_grad on one vector of lanes of head h: dz times d(score)/d(q) (= d/d(k) up to
// the scale) added to g when want_g, and in GATv2 mode dz * LeakyReLU(q + k) to da when
// want_da; `other` is k's lanes for dq, q's for dk. The same operations per lane, in the
// same order, as the scalar function. (References, not pointers: the sums stay registers.)
template <typename VD, typename T>
inline void score_grad_lanes(Mode mode, T dz, T scale, const T* other, const T* qi,
                             const T* kj, const T* att, const VD& slope, const VD& one, VD& g,
                             bool want_g, VD& da, bool want_da) {
  if (mode == Mode::Dot) {
    VD o;
    std::memcpy(&o, other, sizeof(o));
    g += (dz * scale) * o;
    return;
  }
  VD qv, kv;
  std::memcpy(&qv, qi, sizeof(qv));
  std::memcpy(&kv, kj, sizeof(kv));
  const VD u = qv + kv;
  if (want_g) {
    VD av;
    std::memcpy(&av, att, sizeof(av));
    const VD lg = (u >= T(0) ? one : VD{}) + slope * (u < T(0) ? one : VD{});  // leaky_grad
    g += dz * av * lg;
  }
  if (want_da) da += dz * (u * (u < T(0) ? slope : one));  // leaky_select
}

// Pass 1 with H fixed to 1, 2, 4 or 8 and the q/k width fixed (kLaneWidth), float: an
// entry's heads on vectors (score, weight through soft_exp_lanes, dp, dz), dq's row summed in
// registers (and in GATv2 mode with datt wanted, datt's block sum): per lane and element the
// same operations, in the same order, as entry_grad and add_score_grad. Per head and entry,
// a scalar exp with its branches and dq's add through memory had made this pass ~45% of a
// GAT layer's attention time.
template <class K, typename T, typename I>
void backward_rows_lanes(const Shape& s, const I* rowptr, const I* col, const T* q, const T* k,
                         const T* v, const T* bias, const T* lse, const T* delta,
                         const T* dout, T* dq, T* dbias, T* datt, T* dz_out, T* pk_out) {
  constexpr int64_t kH = K::heads_fixed, kD = K::qk_fixed;
  // dq's row and datt's block: one lane per head in additive mode (D = 1, in dqa), else
  // [H, D] as vectors of kWd lanes.
  constexpr int64_t kWd = kD == 1 ? 1 : kAccWidth<kD>, kRd = kD / kWd;
  constexpr int64_t kNd = kD == 1 ? 1 : kH * kRd;
  using VH = typename FloatVec<kH>::type;
  using VI = typename FloatVec<kH>::itype;
  using VD = typename FloatVec<kWd>::type;
  const Mode mode = K::mode(s);
  const int64_t Dv = K::v_width(s), nnz = rowptr[s.rows];
  const int64_t blocks = (s.rows + kRowBlock - 1) / kRowBlock;
  std::vector<T> datt_blocks(datt ? blocks * kH * kD : 0, T(0));
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const T scale = T(s.scale);
  const VH one = VH{} + T(1);
  const VD slope_d = VD{} + T(s.negative_slope), one_d = VD{} + T(1);
  const T* att = static_cast<const T*>(s.att);
  const bool drop = s.dropout > 0.0;
#pragma omp parallel for num_threads(s.threads) schedule(dynamic, 1) if (s.rows * kH > 256)
  for (int64_t b = 0; b < blocks; ++b) {
    VD da[kNd];
    for (int64_t r = 0; r < kNd; ++r) da[r] = VD{};
    for (int64_t i = b * kRowBlock; i < std::min(s.rows, (b + 1) * kRowBlock); ++i) {
      VD g[kNd];
      for (int64_t r = 0; r < kNd; ++r) g[r] = VD{};
      VH dqa = VH{}, lv, dl;
      std::memcpy(&lv, lse + i * kH, sizeof(lv));
      std::memcpy(&dl, delta + i * kH, sizeof(dl));
      const T* qi = q + i * kH * kD;
      const T* gi = dout + i * kH * Dv;
      for (int64_t p = rowptr[i]; p < rowptr[i + 1]; ++p) {
        const int64_t j = col[p];
        prefetch_ahead(k, col, p, nnz, kH * kD, v, kH * Dv);
        const T* kj = k + j * kH * kD;
        VH z = entry_scores<K, T>(s, qi, kj);
        if (bias) {
          VH bv;
          std::memcpy(&bv, bias + p * kH, sizeof(bv));
          z = z + bv;
        }
        const VI masked = z == neg_inf;
        const VH ag = activation_grad_lanes<K>(s, z);
        VH prob;
        soft_exp_lanes<VH, VI>(z * ag - lv, prob);  // activate: z * ag
        VH keep = one, dp;
        if (drop)
          for (int64_t h = 0; h < kH; ++h) keep[h] = keep_factor<T>(s, p, h);
        const T* vj = v + j * kH * Dv;
        if constexpr (K::v_fixed > 0 && K::v_fixed % 8 == 0) {
          dp = keep * head_dots<kH, K::v_fixed>(gi, vj);
          dp = keep != T(0) ? dp : VH{};
        } else {
          for (int64_t h = 0; h < kH; ++h)
            dp[h] = keep[h] != T(0) ? keep[h] * lane_sum<K::v_fixed, T>(Dv, [&](int64_t d) {
              return gi[h * Dv + d] * vj[h * Dv + d];
            })
                                    : T(0);
        }
        VH dz = prob * (dp - dl) * ag;
        VH pk = prob * keep;
        dz = masked != 0 ? VH{} : dz;
        pk = masked != 0 ? VH{} : pk;
        if (dbias) std::memcpy(dbias + p * kH, &dz, sizeof(dz));
        if (dz_out) {
          std::memcpy(dz_out + p * kH, &dz, sizeof(dz));
          std::memcpy(pk_out + p * kH, &pk, sizeof(pk));
        }
        if constexpr (kD == 1) {
          dqa += dz;  // additive: d(score)/d(q) = 1
        } else {
          if (!dq && !datt) continue;
#pragma GCC unroll 8
          for (int64_t h = 0; h < kH; ++h)
#pragma GCC unroll 16
            for (int64_t r = 0; r < kRd; ++r) {
              const int64_t o = h * kD + r * kWd;
              score_grad_lanes(mode, dz[h], scale, kj + o, qi + o, kj + o, att + o, slope_d,
                               one_d, g[h * kRd + r], dq != nullptr, da[h * kRd + r],
                               datt != nullptr);
            }
        }
      }
      if (dq) {
        if constexpr (kD == 1)
          std::memcpy(dq + i * kH, &dqa, sizeof(dqa));
        else
          std::memcpy(dq + i * kH * kD, g, sizeof(g));
      }
    }
    if (datt && kD > 1) std::memcpy(datt_blocks.data() + b * kH * kD, da, sizeof(da));
  }
  if (datt) {
    std::fill(datt, datt + kH * kD, T(0));
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t t = 0; t < kH * kD; ++t) datt[t] += datt_blocks[b * kH * kD + t];
  }
}

template <class K, typename T, typename I>
void backward_rows(const Shape& s, const I* rowptr, const I* col, const T* q, const T* k,
                   const T* v, const T* bias, const T* lse, const T* delta, const T* dout,
                   T* dq, T* dbias, T* datt, T* dz_out = nullptr, T* pk_out = nullptr) {
  const int64_t H = K::heads(s), D = K::qk_width(s);
  const Mode mode = K::mode(s);
  if constexpr (kVectorScores<K, T, T> && kLaneWidth<K>) {
    // dq's row in registers (with datt in GATv2 mode, datt's block sum too): it must fit.
    const int64_t sums = (mode == Mode::GATv2 && datt ? 2 : 1) * K::heads_fixed * K::qk_fixed;
    if (scores_on_lanes<K>(s) && sums <= kRegisterFloats) {
      backward_rows_lanes<K, T, I>(s, rowptr, col, q, k, v, bias, lse, delta, dout, dq, dbias,
                                   datt, dz_out, pk_out);
      return;
    }
  }
  const int64_t blocks = (s.rows + kRowBlock - 1) / kRowBlock;
  std::vector<T> datt_blocks(datt ? blocks * H * D : 0, T(0));
  const int64_t nnz = rowptr[s.rows], Dv = K::v_width(s);
#pragma omp parallel for num_threads(s.threads) schedule(dynamic, 1) if (s.rows * H > 256)
  for (int64_t b = 0; b < blocks; ++b) {
    T* dal = datt ? datt_blocks.data() + b * H * D : nullptr;
    for (int64_t i = b * kRowBlock; i < std::min(s.rows, (b + 1) * kRowBlock); ++i) {
      T* dqi = dq ? dq + i * H * D : nullptr;
      if (dqi) std::fill(dqi, dqi + H * D, T(0));
      for (int64_t p = rowptr[i]; p < rowptr[i + 1]; ++p) {
        const int64_t j = col[p];
        prefetch_ahead(k, col, p, nnz, H * D, v, H * Dv);
        for (int64_t h = 0; h < H; ++h) {
          T dz, pk;
          entry_grad<K>(s, q, k, v, bias, lse, delta, dout, i, j, p, h, &dz, &pk);
          if (dbias) dbias[p * H + h] = dz;
          if (dz_out) {
            dz_out[p * H + h] = dz;
            pk_out[p * H + h] = pk;
          }
          if (!dqi && !dal) continue;
          if (mode == Mode::Additive) {
            dqi[h] += dz;
            continue;
          }
          const T* qi = q + (i * H + h) * D;
          const T* kj = k + (j * H + h) * D;
          add_score_grad<K>(s, kj, qi, kj, dz, dqi ? dqi + h * D : nullptr,
                            dal ? dal + h * D : nullptr, h);
        }
      }
    }
  }
  if (datt) {
    std::fill(datt, datt + H * D, T(0));
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t t = 0; t < H * D; ++t) datt[t] += datt_blocks[b * H * D + t];
  }
}

// Pass 2, over sources through the transpose (t_rowptr over sources, t_col = target of each
// transposed entry, t_perm = its position in the forward CSR): dk and dv (either may be null).
// With dz_in / pk_in (written by backward_rows) each entry's dz and probability are read,
// not recomputed. Returns true when t_perm held a position outside [0, nnz) (those entries
// are skipped).
// Pass 2's prefetch: the rows (dout's, and q's when given) and the scratch (dz_in, pk_in:
// when given) of the transposed entry kPrefetchAhead positions after t; indices out of
// range are left alone (the pass reports them).
template <typename T, typename I>
inline void prefetch_transposed(int64_t t, int64_t nnz, const I* t_col, const I* t_perm,
                                int64_t rows, const T* dout, int64_t dout_row, const T* q,
                                int64_t q_row, const T* dz_in, const T* pk_in, int64_t H) {
  if (t + kPrefetchAhead >= nnz) return;
  const int64_t in = t_col[t + kPrefetchAhead], pn = t_perm[t + kPrefetchAhead];
  if (in >= 0 && in < rows) {
    prefetch_span(dout + in * dout_row, dout_row);
    if (q) prefetch_span(q + in * q_row, q_row);
  }
  if (dz_in && pn >= 0 && pn < nnz) {
    prefetch_line(dz_in + pn * H);
    prefetch_line(pk_in + pn * H);
  }
}

// Pass 2 from pass 1's scratch with H and Dv fixed (and in dot and GATv2 mode D) and the
// source's dv [H, Dv] and dk (additive: [H]; else [H, D]) in registers, in entry order as
// below, instead of through memory where every entry waited on the previous one's store.
template <class K, typename T, typename I>
inline constexpr bool kVectorCols =
    kVectorScores<K, T, T> && kRegisterAcc<K, T, T> && kLaneWidth<K> &&
    (K::qk_fixed == 1 || K::heads_fixed * (K::qk_fixed + K::v_fixed) <= kRegisterFloats);

template <class K, typename T, typename I>
bool backward_cols_vector(const Shape& s, const I* t_rowptr, const I* t_col, const I* t_perm,
                          int64_t nnz, const T* q, const T* k, const T* dout, T* dk, T* dv,
                          const T* dz_in, const T* pk_in) {
  constexpr int64_t kH = K::heads_fixed, kDv = K::v_fixed, kW = kAccWidth<kDv>;
  constexpr int64_t kN = kH * kDv / kW;
  // dk's rows: one lane per head in additive mode (D = 1), else D per head.
  constexpr int64_t kD = K::qk_fixed, kWd = kD == 1 ? 1 : kAccWidth<kD>, kRd = kD / kWd;
  constexpr int64_t kNd = kD == 1 ? 1 : kH * kRd;
  using VH = typename FloatVec<kH>::type;
  using VW = typename FloatVec<kW>::type;
  using VD = typename FloatVec<kWd>::type;
  const Mode mode = K::mode(s);
  const T scale = T(s.scale);
  const VD slope_d = VD{} + T(s.negative_slope), one_d = VD{} + T(1);
  const T* att = static_cast<const T*>(s.att);
  bool bad = false;
#pragma omp parallel for num_threads(s.threads) schedule(dynamic, 64) if (s.cols * kH > 256) \
    reduction(|| : bad)
  for (int64_t j = 0; j < s.cols; ++j) {
    VW a[kN];
    for (int64_t r = 0; r < kN; ++r) a[r] = VW{};
    VD dkr[kNd];
    for (int64_t r = 0; r < kNd; ++r) dkr[r] = VD{};
    VH dka = VH{};
    const T* kj = k + j * kH * kD;
    for (int64_t t = t_rowptr[j]; t < t_rowptr[j + 1]; ++t) {
      const int64_t i = t_col[t], p = t_perm[t];
      prefetch_transposed(t, nnz, t_col, t_perm, s.rows, dout, kH * kDv, dk ? q : nullptr,
                          kH * kD, dz_in, pk_in, kH);
      if (p < 0 || p >= nnz) {
        bad = true;
        continue;
      }
      VH dz, pk;
      std::memcpy(&dz, dz_in + p * kH, sizeof(dz));
      std::memcpy(&pk, pk_in + p * kH, sizeof(pk));
      if (dv) {
        const T* g = dout + i * kH * kDv;
#pragma GCC unroll 8
        for (int64_t h = 0; h < kH; ++h) {
          if (pk[h] == T(0)) continue;
#pragma GCC unroll 64
          for (int64_t r = 0; r < kDv / kW; ++r) {
            VW x;
            std::memcpy(&x, g + h * kDv + r * kW, sizeof(x));
            a[h * (kDv / kW) + r] += pk[h] * x;
          }
        }
      }
      if (!dk) continue;
      if constexpr (kD == 1) {
        dka += dz;
      } else {
        const T* qi = q + i * kH * kD;
#pragma GCC unroll 8
        for (int64_t h = 0; h < kH; ++h)
#pragma GCC unroll 16
          for (int64_t r = 0; r < kRd; ++r) {
            const int64_t o = h * kD + r * kWd;
            VD unused;
            score_grad_lanes(mode, dz[h], scale, qi + o, qi + o, kj + o, att + o, slope_d, one_d,
                             dkr[h * kRd + r], true, unused, false);
          }
      }
    }
    if (dv) std::memcpy(dv + j * kH * kDv, a, sizeof(a));
    if (dk) {
      if constexpr (kD == 1)
        std::memcpy(dk + j * kH, &dka, sizeof(dka));
      else
        std::memcpy(dk + j * kH * kD, dkr, sizeof(dkr));
    }
  }
  return bad;
}

template <class K, typename T, typename I>
bool backward_cols(const Shape& s, const I* t_rowptr, const I* t_col, const I* t_perm,
                   int64_t nnz, const T* q, const T* k, const T* v, const T* bias, const T* lse,
                   const T* delta, const T* dout, T* dk, T* dv, const T* dz_in = nullptr,
                   const T* pk_in = nullptr) {
  const int64_t H = K::heads(s), D = K::qk_width(s), Dv = K::v_width(s);
  const Mode mode = K::mode(s);
  if constexpr (kVectorCols<K, T, I>) {
    if (dz_in && scores_on_lanes<K>(s))
      return backward_cols_vector<K, T, I>(s, t_rowptr, t_col, t_perm, nnz, q, k, dout, dk, dv,
                                           dz_in, pk_in);
  }
  bool bad = false;
#pragma omp parallel for num_threads(s.threads) schedule(dynamic, 64) if (s.cols * H > 256) \
    reduction(|| : bad)
  for (int64_t j = 0; j < s.cols; ++j) {
    T* dkj = dk ? dk + j * H * D : nullptr;
    T* dvj = dv ? dv + j * H * Dv : nullptr;
    if (dkj) std::fill(dkj, dkj + H * D, T(0));
    if (dvj) std::fill(dvj, dvj + H * Dv, T(0));
    for (int64_t t = t_rowptr[j]; t < t_rowptr[j + 1]; ++t) {
      const int64_t i = t_col[t], p = t_perm[t];
      prefetch_transposed(t, nnz, t_col, t_perm, s.rows, dout, H * Dv, dk ? q : nullptr, H * D,
                          dz_in, pk_in, H);
      if (p < 0 || p >= nnz) {
        bad = true;
        continue;
      }
      for (int64_t h = 0; h < H; ++h) {
        T dz, pk;
        if (dz_in) {
          dz = dz_in[p * H + h];
          pk = pk_in[p * H + h];
        } else {
          entry_grad<K>(s, q, k, v, bias, lse, delta, dout, i, j, p, h, &dz, &pk);
        }
        if (dvj && pk != T(0)) {
          const T* __restrict g = dout + (i * H + h) * Dv;
          T* __restrict dvh = dvj + h * Dv;
#pragma omp simd
          for (int64_t d = 0; d < Dv; ++d) dvh[d] += pk * g[d];
        }
        if (!dkj) continue;
        if (mode == Mode::Additive) {
          dkj[h] += dz;
          continue;
        }
        const T* qi = q + (i * H + h) * D;
        const T* kj = k + (j * H + h) * D;
        add_score_grad<K>(s, qi, qi, kj, dz, dkj + h * D, static_cast<T*>(nullptr), h);
      }
    }
  }
  return bad;
}

// Runs the launch's phase (the JIT's entry point and the generic path both come here). With
// S = bfloat16 (T = float) only the forward exists: q, k, v and out in bfloat16, bias, att and
// lse in float (the backward runs in float32 on converted tensors).
template <class K, typename T, typename I, typename S = T>
void run(AttentionLaunch& l) {
  const Shape& s = l.shape;
  auto ix = [](const void* p) { return static_cast<const I*>(p); };
  if constexpr (!std::is_same_v<S, T>) {
    static_assert(std::is_same_v<T, float> && std::is_same_v<S, sparsejit::bf16>,
                  "narrow storage is bfloat16 with float computation");
    if (l.phase == Phase::Forward)
      forward<K, T, I, S>(s, ix(l.rowptr), ix(l.col), static_cast<const S*>(l.q),
                          static_cast<const S*>(l.k), static_cast<const S*>(l.v),
                          static_cast<const T*>(l.bias), static_cast<S*>(l.out),
                          static_cast<T*>(l.lse_out));
    return;
  } else {
    auto c = [](const void* p) { return static_cast<const T*>(p); };
    auto w = [](void* p) { return static_cast<T*>(p); };
    switch (l.phase) {
      case Phase::Forward:
        forward<K, T, I>(s, ix(l.rowptr), ix(l.col), c(l.q), c(l.k), c(l.v), c(l.bias),
                         w(l.out), w(l.lse_out));
        return;
      case Phase::RowDelta:
        row_delta<K, T>(s, c(l.out), c(l.dout), w(l.delta_out));
        return;
      case Phase::BackwardRows:
        backward_rows<K, T, I>(s, ix(l.rowptr), ix(l.col), c(l.q), c(l.k), c(l.v), c(l.bias),
                               c(l.lse), c(l.delta), c(l.dout), w(l.dq), w(l.dbias), w(l.datt),
                               w(l.dz), w(l.pk));
        return;
      case Phase::BackwardCols:
        l.bad_perm = backward_cols<K, T, I>(s, ix(l.t_rowptr), ix(l.t_col), ix(l.t_perm), l.nnz,
                                            c(l.q), c(l.k), c(l.v), c(l.bias), c(l.lse),
                                            c(l.delta), c(l.dout), w(l.dk), w(l.dv), c(l.dz),
                                            c(l.pk));
        return;
    }
  }
}

}  // namespace sparsejit::attention
