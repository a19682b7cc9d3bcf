// Kernel-level checks of the generated CUDA kernels, shared by the host-emulated run and the
// real GPU run (test_cuda_kernels.cpp): inputs and poisoned outputs with guard bands on both
// sides are moved to the device through a Runner, the spec's launch plan runs, and every
// output element is compared with a plain float64 reference (max / min positions exactly);
// the guard bands must come back untouched.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codegen/cuda_attention.h"
#include "codegen/cuda_filter_conv.h"
#include "codegen/cuda_launch.h"
#include "codegen/cuda_point_conv.h"
#include "codegen/cuda_spec.h"
#include "codegen/cuda_spmm.h"
#include "kernels/common/types.h"
#include "tests/cpp/test_util.h"

namespace sparsejit::codegen::checks {

using testing::Csr;
using testing::random_csr;

// Moves bytes to and from the device and runs launch plans. Uploaded copies stay valid until
// the next reset().
class Runner {
 public:
  virtual ~Runner() = default;
  virtual void* upload(const void* host, size_t bytes) = 0;
  virtual void download(void* host, const void* device, size_t bytes) = 0;
  // "" on success, else the error.
  virtual std::string run(const CudaKernelSpecBase& spec, const std::vector<CudaLaunch>& launches,
                          void* params) = 0;
  virtual void reset() = 0;
};

// ---- Scalars of every dtype, from and to double -------------------------------------------
inline float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      bits = sign | (uint32_t(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | (ax > 0x7f800000u ? 0x7e00 : 0x7c00);
  if (ax >= 0x477ff000u) return sign | 0x7c00;
  if (ax < 0x38800000u) {
    float a;
    std::memcpy(&a, &ax, 4);
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));
  }
  return sign | uint16_t((ax + 0xfffu + ((ax >> 13) & 1u) - (112u << 23)) >> 13);
}

constexpr unsigned char kPoison = 0xA7;
constexpr int64_t kGuard = 37;  // elements of poison on each side of every output

// n elements of element size `width` between guard bands; the data starts 16-byte aligned
// relative to the (256-byte aligned) device copy.
struct Bytes {
  int width = 1;
  int64_t n = 0;
  size_t offset = 0;
  std::vector<unsigned char> host;
  void* device = nullptr;

  Bytes(int w, int64_t count) : width(w), n(count) {
    offset = (kGuard * w + 15) / 16 * 16;
    host.assign(offset + static_cast<size_t>(n * w) + kGuard * w, kPoison);
  }
  unsigned char* at(int64_t i) { return host.data() + offset + i * width; }
  void* dev() { return static_cast<unsigned char*>(device) + offset; }
  void upload(Runner& r) { device = r.upload(host.data(), host.size()); }
  void download(Runner& r) { r.download(host.data(), device, host.size()); }
  bool guards_intact() const {
    for (size_t k = 0; k < offset; ++k)
      if (host[k] != kPoison) return false;
    for (size_t k = offset + n * width; k < host.size(); ++k)
      if (host[k] != kPoison) return false;
    return true;
  }
};

struct Buffer : Bytes {
  CudaScalar dtype;
  Buffer(CudaScalar d, int64_t count) : Bytes(cuda_scalar_bytes(d), count), dtype(d) {}
  void set(int64_t i, double v) {
    unsigned char* p = at(i);
    switch (dtype) {
      case CudaScalar::F32: {
        const float f = float(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case CudaScalar::F64: std::memcpy(p, &v, 8); break;
      case CudaScalar::F16: {
        const uint16_t h = float_to_half(float(v));
        std::memcpy(p, &h, 2);
        break;
      }
      case CudaScalar::BF16: {
        const bf16 b{float(v)};
        std::memcpy(p, &b.bits, 2);
        break;
      }
    }
  }
  double get(int64_t i) {
    unsigned char* p = at(i);
    switch (dtype) {
      case CudaScalar::F32: {
        float f;
        std::memcpy(&f, p, 4);
        return f;
      }
      case CudaScalar::F64: {
        double d;
        std::memcpy(&d, p, 8);
        return d;
      }
      case CudaScalar::F16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        return half_to_float(h);
      }
      case CudaScalar::BF16: {
        bf16 b;
        std::memcpy(&b.bits, p, 2);
        return float(b);
      }
    }
    return 0;
  }
};

template <typename V>
struct Typed : Bytes {
  Typed(int64_t count) : Bytes(sizeof(V), count) {}
  V get(int64_t i) {
    V v;
    std::memcpy(&v, at(i), sizeof(V));
    return v;
  }
  void set(int64_t i, V v) { std::memcpy(at(i), &v, sizeof(V)); }
};

inline void fill_random(Buffer* b, uint64_t seed, double lo = -1, double hi = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < b->n; ++i) b->set(i, u(rng));
}

inline double tolerance(CudaScalar d) {
  switch (d) {
    case CudaScalar::F32: return 1e-4;
    case CudaScalar::F64: return 1e-10;
    case CudaScalar::F16: return 4e-3;
    case CudaScalar::BF16: return 3e-2;
  }
  return 1e-4;
}

// The structure on the device.
template <typename I>
struct DeviceCsr {
  Typed<I> rowptr, col;
  DeviceCsr(const Csr<I>& A, Runner& r) : rowptr(A.rows + 1), col(A.nnz()) {
    for (int64_t i = 0; i <= A.rows; ++i) rowptr.set(i, A.rowptr[i]);
    for (int64_t p = 0; p < A.nnz(); ++p) col.set(p, A.col[p]);
    rowptr.upload(r);
    col.upload(r);
  }
};

// ---- Graphs ---------------------------------------------------------------------------------
template <typename I>
std::vector<std::pair<std::string, Csr<I>>> graphs() {
  std::vector<std::pair<std::string, Csr<I>>> g;
  g.push_back({"uniform", random_csr<I>(70, 50, 5, false, 1)});
  g.push_back({"powerlaw", random_csr<I>(150, 90, 6, true, 2)});
  Csr<I> empty_rows = random_csr<I>(60, 40, 3, false, 3);
  for (int64_t i = 0; i < 60; i += 3) {  // every third row emptied
    const I len = empty_rows.rowptr[i + 1] - empty_rows.rowptr[i];
    empty_rows.col.erase(empty_rows.col.begin() + empty_rows.rowptr[i],
                         empty_rows.col.begin() + empty_rows.rowptr[i + 1]);
    for (int64_t k = i + 1; k <= 60; ++k) empty_rows.rowptr[k] -= len;
  }
  g.push_back({"empty_rows", empty_rows});
  Csr<I> none;  // rows but no entries
  none.rows = 9;
  none.cols = 4;
  none.rowptr.assign(10, 0);
  g.push_back({"no_entries", none});
  Csr<I> longrows;  // empty, long, empty, long, short: rows crossing many chunks
  longrows.rows = 5;
  longrows.cols = 30;
  const int64_t lens[] = {0, 300, 0, 170, 2};
  longrows.rowptr.assign(6, 0);
  for (int k = 0; k < 5; ++k) longrows.rowptr[k + 1] = I(longrows.rowptr[k] + lens[k]);
  std::mt19937_64 rng(5);
  for (int64_t p = 0; p < longrows.rowptr[5]; ++p) longrows.col.push_back(I(rng() % 30));
  g.push_back({"long_rows", longrows});
  Csr<I> dup;  // repeated columns: max / min ties resolved to the first position
  dup.rows = 6;
  dup.cols = 3;
  dup.rowptr = {0, 4, 4, 9, 10, 10, 16};
  dup.col = {1, 1, 2, 1, 0, 0, 0, 2, 0, 2, 1, 1, 1, 1, 1, 1};
  g.push_back({"duplicates", dup});
  return g;
}

// ---- SpMM -----------------------------------------------------------------------------------
inline double activate(sparsejit::Act act, double z, double param) {
  switch (act) {
    case sparsejit::Act::Relu: return z > 0 ? z : 0;
    case sparsejit::Act::LeakyRelu: return z > 0 ? z : z * param;
    case sparsejit::Act::Elu: return z > 0 ? z : param * std::expm1(z);
    case sparsejit::Act::Gelu: return 0.5 * z * (1 + std::erf(z * 0.70710678118654752440));
    default: return z;
  }
}

// The product a * x as the kernel forms it (in the accumulator type), so that max / min
// positions compare exactly.
inline double kernel_product(CudaScalar d, double a, double x, bool with_value) {
  if (d == CudaScalar::F64) return with_value ? a * x : x;
  return with_value ? double(float(a) * float(x)) : double(float(x));
}

struct SpmmInputs {
  Buffer x, vals, bias;
  bool with_bias;
  double scale, param;
};

template <typename I>
void spmm_reference(const CudaSpmmSpec& s, const Csr<I>& A, SpmmInputs& in,
                    std::vector<double>* out, std::vector<long long>* arg) {
  const int64_t H = s.heads, F = s.features, HF = H * F;
  const bool extremum = s.reduce == Reduce::Max || s.reduce == Reduce::Min;
  out->assign(A.rows * HF, 0.0);
  arg->assign(A.rows * HF, -1);
  for (int64_t i = 0; i < A.rows; ++i) {
    const int64_t lo = A.rowptr[i], hi = A.rowptr[i + 1];
    for (int64_t f = 0; f < HF; ++f) {
      double acc = s.reduce == Reduce::Max ? -INFINITY : s.reduce == Reduce::Min ? INFINITY : 0.0;
      long long best = -1;
      for (int64_t p = lo; p < hi; ++p) {
        const double a = s.value_mode == 0   ? 1.0
                         : s.value_mode == 1 ? in.vals.get(p)
                                             : in.vals.get(p * H + f / F);
        const double xv = in.x.get(int64_t(A.col[p]) * HF + f);
        if (!extremum) {
          acc += a * xv;
          continue;
        }
        const double m = kernel_product(s.dtype, a, xv, s.value_mode != 0);
        if (s.reduce == Reduce::Max ? m > acc : m < acc) {
          acc = m;
          best = p;
        }
      }
      double r = 0;
      if (hi > lo) r = s.reduce == Reduce::Mean ? acc / double(hi - lo) : acc;
      // scale and the activation parameter reach the kernels as float (as in SpmmArgs).
      r = r * double(float(in.scale));
      if (in.with_bias) r += in.bias.get(f);
      (*out)[i * HF + f] = activate(s.act, r, double(float(in.param)));
      (*arg)[i * HF + f] = hi > lo && extremum ? best : -1;
    }
  }
}

template <typename I>
void check_spmm(Runner& r, const CudaSpmmSpec& s, int64_t chunk) {
  for (auto& [gname, A] : graphs<I>()) {
    SCOPED_TRACE(s.name() + " on " + gname + ", chunk " + std::to_string(chunk));
    r.reset();
    const int64_t H = s.heads, F = s.features, HF = H * F, nnz = A.nnz();
    const bool arg_out = s.reduce == Reduce::Max || s.reduce == Reduce::Min;
    SpmmInputs in{Buffer(s.dtype, A.cols * HF),
                  Buffer(s.dtype, nnz * (s.value_mode == 2 ? H : 1)),
                  Buffer(s.dtype, HF),
                  s.act != sparsejit::Act::None,
                  s.act == sparsejit::Act::None ? 1.0 : 0.75,
                  s.act == sparsejit::Act::Elu ? 1.0 : 0.1};
    fill_random(&in.x, 11, -2, 2);
    fill_random(&in.vals, 12, 0.2, 1.5);
    fill_random(&in.bias, 13);
    if (gname == "duplicates") {  // equal values everywhere: ties
      for (int64_t i = 0; i < in.x.n; ++i) in.x.set(i, double((i * 7) % 3));
      for (int64_t i = 0; i < in.vals.n; ++i) in.vals.set(i, 1.0);
    }
    Buffer out(s.dtype, A.rows * HF);
    Typed<long long> arg(A.rows * HF);
    DeviceCsr<I> dA(A, r);
    in.x.upload(r);
    in.vals.upload(r);
    in.bias.upload(r);
    out.upload(r);
    arg.upload(r);

    CudaSpmmChoice choice;
    choice.spec = s;
    choice.chunk = chunk;
    const SpmmLaunchPlan plan = plan_spmm_launch(choice, A.rows, nnz);
    Bytes ws(1, static_cast<int64_t>(plan.workspace_bytes));
    std::fill(ws.at(0), ws.at(0) + plan.zero_bytes, 0);
    ws.upload(r);

    cuda::SpmmParams p{};
    p.rowptr = dA.rowptr.dev();
    p.col = dA.col.dev();
    p.values = s.value_mode ? in.vals.dev() : nullptr;
    p.x = in.x.dev();
    p.bias = in.with_bias ? in.bias.dev() : nullptr;
    p.out = out.dev();
    p.arg = arg_out ? static_cast<long long*>(arg.dev()) : nullptr;
    p.rows = A.rows;
    p.nnz = nnz;
    p.scale = float(in.scale);
    p.act_param = float(in.param);
    bind_spmm_workspace(plan, choice, ws.dev(), &p);
    const std::string err = r.run(s, plan.launches, &p);
    ASSERT_EQ(err, "");
    out.download(r);
    arg.download(r);

    std::vector<double> ref;
    std::vector<long long> ref_arg;
    spmm_reference(s, A, in, &ref, &ref_arg);
    double mag = 1;
    for (double v : ref) mag = std::max(mag, std::abs(v));
    const double tol = tolerance(s.dtype);
    int bad = 0;
    for (int64_t e = 0; e < A.rows * HF && bad < 5; ++e) {
      const double got = out.get(e);
      if (!(std::abs(got - ref[e]) <= tol * (mag + std::abs(ref[e])))) {
        ADD_FAILURE() << "out[" << e / HF << ", " << e % HF << "] = " << got << ", expected "
                      << ref[e];
        ++bad;
      }
      if (arg_out && arg.get(e) != ref_arg[e]) {
        ADD_FAILURE() << "arg[" << e / HF << ", " << e % HF << "] = " << arg.get(e) << ", expected "
                      << ref_arg[e];
        ++bad;
      }
    }
    EXPECT_TRUE(out.guards_intact()) << "a kernel wrote outside the output";
    if (arg_out) {
      EXPECT_TRUE(arg.guards_intact()) << "a kernel wrote outside the positions";
    } else {
      EXPECT_TRUE(std::all_of(arg.host.begin(), arg.host.end(), [](unsigned char b) {
        return b == kPoison;
      })) << "sum / mean wrote positions";
    }
  }
}

// ---- SDDMM and edge softmax -----------------------------------------------------------------
template <typename I>
void check_sddmm(Runner& r, const CudaSddmmSpec& s) {
  for (auto& [gname, A] : graphs<I>()) {
    SCOPED_TRACE(s.name() + " on " + gname);
    r.reset();
    const int64_t H = s.heads, F = s.features, HF = H * F, nnz = A.nnz();
    Buffer q(s.dtype, A.rows * HF), k(s.dtype, A.cols * HF), out(s.dtype, nnz * H);
    fill_random(&q, 21);
    fill_random(&k, 22);
    DeviceCsr<I> dA(A, r);
    q.upload(r);
    k.upload(r);
    out.upload(r);
    cuda::SddmmParams p{dA.rowptr.dev(), dA.col.dev(), q.dev(), k.dev(), out.dev(), A.rows, nnz};
    if (nnz > 0) {
      ASSERT_EQ(r.run(s, {plan_sddmm_launch(s, nnz)}, &p), "");
    }
    out.download(r);
    int bad = 0;
    for (int64_t i = 0; i < A.rows; ++i)
      for (int64_t e = A.rowptr[i]; e < A.rowptr[i + 1]; ++e)
        for (int64_t h = 0; h < H && bad < 5; ++h) {
          double dot = 0;
          for (int64_t f = 0; f < F; ++f)
            dot += q.get(i * HF + h * F + f) * k.get(int64_t(A.col[e]) * HF + h * F + f);
          const double got = out.get(e * H + h);
          if (!(std::abs(got - dot) <=
                tolerance(s.dtype) * (1 + std::abs(dot) + std::sqrt(double(F))))) {
            ADD_FAILURE() << "s[" << e << ", " << h << "] = " << got << ", expected " << dot;
            ++bad;
          }
        }
    EXPECT_TRUE(out.guards_intact());
  }
}

template <typename I>
void check_softmax(Runner& r, const CudaEdgeSoftmaxSpec& s) {
  const bool backward = s.backward;
  for (auto& [gname, A] : graphs<I>()) {
    SCOPED_TRACE(s.name() + " on " + gname);
    r.reset();
    const int64_t H = s.heads, nnz = A.nnz();
    Buffer y(s.dtype, nnz * H), g(s.dtype, nnz * H), out(s.dtype, nnz * H);
    fill_random(&y, 31, backward ? 0.0 : -4.0, backward ? 1.0 : 4.0);
    fill_random(&g, 32);
    if (!backward) {  // a masked (-inf) entry in the first row with two or more entries
      for (int64_t i = 0; i < A.rows; ++i)
        if (A.rowptr[i + 1] - A.rowptr[i] >= 2) {
          for (int64_t h = 0; h < H; ++h) y.set((int64_t(A.rowptr[i]) + 1) * H + h, -INFINITY);
          break;
        }
    }
    DeviceCsr<I> dA(A, r);
    y.upload(r);
    g.upload(r);
    out.upload(r);
    cuda::SoftmaxParams p{dA.rowptr.dev(), y.dev(), backward ? g.dev() : nullptr,
                          out.dev(),       A.rows,  0};
    ASSERT_EQ(r.run(s, {plan_edge_softmax_launch(s, A.rows)}, &p), "");
    out.download(r);
    int bad = 0;
    for (int64_t i = 0; i < A.rows; ++i) {
      const int64_t lo = A.rowptr[i], hi = A.rowptr[i + 1];
      for (int64_t h = 0; h < H; ++h) {
        double mx = -INFINITY, sum = 0, dot = 0;
        for (int64_t e = lo; e < hi; ++e) mx = std::max(mx, y.get(e * H + h));
        for (int64_t e = lo; e < hi; ++e) sum += std::exp(y.get(e * H + h) - mx);
        for (int64_t e = lo; e < hi; ++e) dot += g.get(e * H + h) * y.get(e * H + h);
        for (int64_t e = lo; e < hi && bad < 5; ++e) {
          const double yv = y.get(e * H + h);
          const double ref = backward ? yv * (g.get(e * H + h) - dot) : std::exp(yv - mx) / sum;
          const double got = out.get(e * H + h);
          const bool both_nan = std::isnan(got) && std::isnan(ref);
          if (!both_nan && !(std::abs(got - ref) <= 2 * tolerance(s.dtype) * (1 + std::abs(ref)))) {
            ADD_FAILURE() << "out[" << e << ", " << h << "] = " << got << ", expected " << ref;
            ++bad;
          }
        }
      }
    }
    EXPECT_TRUE(out.guards_intact());
  }
}

template <typename I>
void check_attention(Runner& r, const CudaAttentionSpec& s);  // cuda_attention_checks.h
// tests/cpp/cuda_point_conv_checks.h
inline void check_point_conv(Runner& r, const CudaKernelSpecBase& s);
}  // namespace sparsejit::codegen::checks

#include "tests/cpp/cuda_filter_conv_checks.h"

namespace sparsejit::codegen::checks {

// Calls f<int32_t>() or f<int64_t>() for the spec's index type.
template <class F>
void with_index(IndexKind ix, F&& f) {
  if (ix == IndexKind::I32) {
    f(int32_t(0));
  } else {
    f(int64_t(0));
  }
}

// Runs the check matching the spec's family (SpMM: with a small and a larger chunk).
inline void check_spec(Runner& r, const CudaKernelSpecBase& base) {
  ASSERT_EQ(base.validate(), "") << base.name();
  if (const auto* s = dynamic_cast<const CudaSpmmSpec*>(&base)) {
    for (int64_t chunk : {int64_t(8), int64_t(64)}) {
      if (s->strategy == CudaStrategy::RowGroup && chunk != 8) continue;
      with_index(s->index, [&](auto i) { check_spmm<decltype(i)>(r, *s, chunk); });
    }
  } else if (const auto* s = dynamic_cast<const CudaSddmmSpec*>(&base)) {
    with_index(s->index, [&](auto i) { check_sddmm<decltype(i)>(r, *s); });
  } else if (const auto* s = dynamic_cast<const CudaEdgeSoftmaxSpec*>(&base)) {
    with_index(s->index, [&](auto i) { check_softmax<decltype(i)>(r, *s); });
  } else if (const auto* s = dynamic_cast<const CudaAttentionSpec*>(&base)) {
    with_index(s->index, [&](auto i) { check_attention<decltype(i)>(r, *s); });
  } else if (const auto* s = dynamic_cast<const CudaFilterConvSpec*>(&base)) {
    check_filter_conv(r, *s);
  } else {
    check_point_conv(r, base);  // the three point-conv specs
  }
}

}  // namespace sparsejit::codegen::checks

#include "tests/cpp/cuda_attention_checks.h"
