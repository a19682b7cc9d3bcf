// The fused attention kernel's pieces every pass shares (kernels/cpu/attention_kernel.h): the
// compile-time size policy, scores and their activation, the softmax weights' exp (scalar and
// on vectors), dropout, prefetching, and the per-entry head vectors (vectors of
// kernels/cpu/common/vec.h). Standard library only: the JIT compiles it (embedded in the
// library as text, CMakeLists.txt's SPARSEJIT_JIT_HEADERS).
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
#include "kernels/cpu/common/vec.h"

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
using exp_f8 = cpu::detail::Vec<float, 32>;
using exp_i8 = cpu::detail::Vec<int32_t, 32>;

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

// Float and int32 vectors of N lanes: kernels/cpu/common/vec.h's GCC vectors.
template <int64_t N>
using F32Lanes = cpu::detail::Vec<float, static_cast<int>(4 * N)>;
template <int64_t N>
using I32Lanes = cpu::detail::Vec<int32_t, static_cast<int>(4 * N)>;
using cpu::detail::load_lanes;  // float, or bfloat16 widened exactly

// Storage the vector paths read: float, or bfloat16 widened exactly (its bits in the high
// half of a float, as bf16's conversion).
template <typename S>
inline constexpr bool kFloatLanes = std::is_same_v<S, float> || std::is_same_v<S, bf16>;

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
inline F32Lanes<kH> head_sums(F&& f8) {
  static_assert(kD % 8 == 0, "eight lanes per step");
  using V4 = F32Lanes<4>;
  using VH = F32Lanes<kH>;
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
inline F32Lanes<kH> head_dots(const S* x, const S* y) {
  return head_sums<kH, kD>([&](int64_t h, int64_t d0, exp_f8& term) {
    exp_f8 a, b;
    a = load_lanes<exp_f8, float>(x + h * kD + d0);
    b = load_lanes<exp_f8, float>(y + h * kD + d0);
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
inline F32Lanes<K::heads_fixed> entry_scores(const Shape& s, const S* qi,
                                                             const S* kj) {
  constexpr int64_t kH = K::heads_fixed, kD = K::qk_fixed;
  using VH = F32Lanes<kH>;
  if (K::mode(s) == Mode::Additive) {
    VH a, b;
    a = load_lanes<VH, float>(qi);
    b = load_lanes<VH, float>(kj);
    return a + b;
  }
  if constexpr (kD > 0 && kD % 8 == 0) {
    if (K::mode(s) == Mode::Dot) return float(s.scale) * head_dots<kH, kD>(qi, kj);
    const float* att = static_cast<const float*>(s.att);
    const exp_f8 slope = exp_f8{} + float(s.negative_slope), one = exp_f8{} + 1.0f;
    return head_sums<kH, kD>([&](int64_t h, int64_t d0, exp_f8& term) {
      exp_f8 a, x, y;
      std::memcpy(&a, att + h * kD + d0, sizeof(a));
      x = load_lanes<exp_f8, float>(qi + h * kD + d0);
      y = load_lanes<exp_f8, float>(kj + h * kD + d0);
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

}  // namespace sparsejit::attention
