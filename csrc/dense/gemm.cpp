// Dense products: small single-threaded tiles on oneDNN's brgemm micro-kernel as PyTorch
// exports it, else oneDNN's sgemm when available, else a built-in register-blocked kernel.
#include "csrc/dense/gemm.h"

#include "csrc/core/isa.h"

#define SPARSEJIT_ISA_NS packed_base
#include "csrc/dense/gemm_packed.h"
#undef SPARSEJIT_ISA_NS

#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef SPARSEJIT_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.h>

#include <mutex>
#endif

namespace sparsejit::dense {
namespace {

void check_gemm_args(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda,
                     int64_t ldb, int64_t ldc) {
  if (m < 0 || n < 0 || k < 0)
    throw std::invalid_argument("gemm: negative size (m=" + std::to_string(m) +
                                ", n=" + std::to_string(n) + ", k=" + std::to_string(k) + ")");
  const int64_t need_a = std::max<int64_t>(1, ta ? m : k);
  const int64_t need_b = std::max<int64_t>(1, tb ? k : n);
  if (lda < need_a) throw std::invalid_argument("gemm: lda=" + std::to_string(lda) + " < " + std::to_string(need_a));
  if (ldb < need_b) throw std::invalid_argument("gemm: ldb=" + std::to_string(ldb) + " < " + std::to_string(need_b));
  if (ldc < std::max<int64_t>(1, n))
    throw std::invalid_argument("gemm: ldc=" + std::to_string(ldc) + " < " + std::to_string(n));
}

// C = alpha * op(A) op(B) + beta * C. Rows of C in blocks of 4, columns in the compiler's
// vector width (the inner loop over j vectorizes); op(B) rows are contiguous when !tb.
template <typename T>
void gemm_ref(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
              int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  auto A = [&](int64_t i, int64_t p) { return ta ? a[p * lda + i] : a[i * lda + p]; };
  constexpr int64_t NB = 64;
  T acc[4][NB];
  for (int64_t j0 = 0; j0 < n; j0 += NB) {
    const int64_t nb = std::min(NB, n - j0);
    for (int64_t i0 = 0; i0 < m; i0 += 4) {
      const int64_t mb = std::min<int64_t>(4, m - i0);
      for (int64_t ii = 0; ii < 4; ++ii)
        for (int64_t jj = 0; jj < NB; ++jj) acc[ii][jj] = T(0);
      for (int64_t p = 0; p < k; ++p) {
        if (tb) {
          for (int64_t ii = 0; ii < mb; ++ii) {
            const T av = A(i0 + ii, p);
            for (int64_t jj = 0; jj < nb; ++jj) acc[ii][jj] += av * b[(j0 + jj) * ldb + p];
          }
        } else {
          const T* brow = b + p * ldb + j0;
          for (int64_t ii = 0; ii < mb; ++ii) {
            const T av = A(i0 + ii, p);
            for (int64_t jj = 0; jj < nb; ++jj) acc[ii][jj] += av * brow[jj];
          }
        }
      }
      for (int64_t ii = 0; ii < mb; ++ii) {
        T* crow = c + (i0 + ii) * ldc + j0;
        if (beta == T(0)) {
          for (int64_t jj = 0; jj < nb; ++jj) crow[jj] = alpha * acc[ii][jj];
        } else {
          for (int64_t jj = 0; jj < nb; ++jj) crow[jj] = alpha * acc[ii][jj] + beta * crow[jj];
        }
      }
    }
  }
}


// The packed 4 x 16 kernel, compiled twice (gemm_packed.h): for the baseline ISA here and
// for AVX2 + FMA in gemm_avx2.cpp; the CPU picks at run time.
}  // namespace

// gemm_avx2.cpp (compiled with -mavx2 -mfma).
void packed_avx2_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                      const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

namespace {

void sgemm_packed(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                  float* c, int64_t ldc) {
  // Small per-thread scratch reused across calls (the tile products call this per tile).
  thread_local std::vector<float> pa, pb;
  const int64_t n16 = (n + 15) / 16 * 16;
  pb.assign(size_t(std::max<int64_t>(1, k * n16)), 0.f);
  for (int64_t p = 0; p < k; ++p)
    for (int64_t j = 0; j < n; ++j) pb[p * n16 + j] = tb ? b[j * ldb + p] : b[p * ldb + j];
  const float* ap = a;
  int64_t lda_p = lda;
  if (ta) {
    pa.resize(size_t(std::max<int64_t>(1, m * k)));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < k; ++p) pa[i * k + p] = a[p * lda + i];
    ap = pa.data();
    lda_p = std::max<int64_t>(1, k);
  }
  if (cpu_has_avx2_fma()) {
    packed_avx2_gemm(m, n, k, alpha, ap, lda_p, pb.data(), n16, beta, c, ldc);
  } else {
    packed_base::packed_gemm(m, n, k, alpha, ap, lda_p, pb.data(), n16, beta, c, ldc);
  }
}

}  // namespace

void sgemm_builtin(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                   float* c, int64_t ldc) {
  check_gemm_args(ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  sgemm_packed(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

#ifdef SPARSEJIT_WITH_ONEDNN
namespace {

// oneDNN is opened at first use with RTLD_DEEPBIND, not linked: PyTorch carries its own
// oneDNN inside libtorch_cpu, and both define the same weak template symbols (the
// std::call_once state of oneDNN's GEMM JIT initialisation among them). Linked normally,
// libdnnl's references bind to torch's copies, so once torch has run a matmul libdnnl's
// sgemm finds its kernels uninitialised and returns dnnl_unimplemented. DEEPBIND makes
// libdnnl resolve its own symbols first.
// AddressSanitizer refuses RTLD_DEEPBIND; sanitizer builds load no Torch, so plain binding is
// right there.
#if defined(__SANITIZE_ADDRESS__)
constexpr int kDeepBind = 0;
#else
constexpr int kDeepBind = RTLD_DEEPBIND;
#endif

struct OneDnn {
  using SgemmFn = dnnl_status_t (*)(char, char, dnnl_dim_t, dnnl_dim_t, dnnl_dim_t, float,
                                    const float*, dnnl_dim_t, const float*, dnnl_dim_t, float,
                                    float*, dnnl_dim_t);
  using VersionFn = const dnnl_version_t* (*)();
  using Bf16GemmFn = dnnl_status_t (*)(char, char, dnnl_dim_t, dnnl_dim_t, dnnl_dim_t, float,
                                       const uint16_t*, dnnl_dim_t, const uint16_t*, dnnl_dim_t,
                                       float, float*, dnnl_dim_t);
  SgemmFn sgemm = nullptr;
  Bf16GemmFn gemm_bf16 = nullptr;  // dnnl_gemm_bf16bf16f32 (oneDNN >= 1.2), or null
  VersionFn version = nullptr;
  std::string error;
};

const OneDnn& onednn() {
  static OneDnn lib = [] {
    OneDnn l;
    const char* names[] = {SPARSEJIT_ONEDNN_LIB, "libdnnl.so.3", "libdnnl.so.2", "libdnnl.so"};
    void* h = nullptr;
    for (const char* name : names) {
      h = dlopen(name, RTLD_NOW | RTLD_LOCAL | kDeepBind);
      if (h) break;
      const char* e = dlerror();
      if (l.error.empty() && e) l.error = e;
    }
    if (!h) return l;
    l.sgemm = reinterpret_cast<OneDnn::SgemmFn>(dlsym(h, "dnnl_sgemm"));
    l.version = reinterpret_cast<OneDnn::VersionFn>(dlsym(h, "dnnl_version"));
    l.gemm_bf16 = reinterpret_cast<OneDnn::Bf16GemmFn>(dlsym(h, "dnnl_gemm_bf16bf16f32"));
    if (!l.sgemm || !l.version) {
      l.sgemm = nullptr;
      l.error = "dnnl_sgemm / dnnl_version not found in the oneDNN library";
    }
    return l;
  }();
  return lib;
}

}  // namespace
#endif

// ---- oneDNN's brgemm micro-kernel, as PyTorch ships it ------------------------------------
//
// PyTorch's CPU builds carry oneDNN with its ukernel API and export a float32 entry,
// at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, add_C, A, B, C, is_vnni): one
// single-threaded C[M, N] (+)= A[M, K] B[K, N], row-major, B unpacked, a kernel generated per
// shape (oneDNN's AVX2 / AVX-512 code, as this CPU has it) and cached per thread. It is found
// at run time in the libtorch_cpu already loaded, by its mangled name, which encodes the
// signature: a torch whose entry differs is simply not found. No torch in the process (the C++
// tests), or SPARSEJIT_GEMM_UKERNEL=0: the paths below run as before.
namespace {

using UkernelFn = void (*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                           const float*, const float*, float*, bool);

// The bfloat16 entry (at::BFloat16 is a 16-bit struct, passed by pointer like bf16 here).
using UkernelBf16Fn = void (*)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                               const bf16*, const bf16*, float*, bool);

void* torch_symbol(const char* name) {
  void* h = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
  if (h == nullptr) return nullptr;
  void* f = dlsym(h, name);
  dlclose(h);  // only the reference RTLD_NOLOAD took: torch stays loaded
  return f;
}

UkernelFn torch_ukernel() {
  static const UkernelFn fn =
      reinterpret_cast<UkernelFn>(torch_symbol("_ZN2at6native7cpublas6brgemmEllllllbPKfS3_Pfb"));
  return fn;
}

UkernelBf16Fn torch_ukernel_bf16() {
  static const UkernelBf16Fn fn = reinterpret_cast<UkernelBf16Fn>(
      torch_symbol("_ZN2at6native7cpublas6brgemmEllllllbPKN3c108BFloat16ES5_Pfb"));
  return fn;
}

// -1: not decided yet (SPARSEJIT_GEMM_UKERNEL, default on); 0 / 1 afterwards.
std::atomic<int> g_ukernel{-1};

bool ukernel_enabled() {
  int v = g_ukernel.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* env = std::getenv("SPARSEJIT_GEMM_UKERNEL");
    v = (env != nullptr && std::string(env) == "0") ? 0 : 1;
    g_ukernel.store(v, std::memory_order_relaxed);
  }
  return v == 1 && torch_ukernel() != nullptr;
}

// Widths up to which the micro-kernel ran sparsejit's products faster than oneDNN's sgemm
// (AMD EPYC Zen 4, oneDNN at AVX-512 and held to AVX2; benchmarks/RESULTS.md, "oneDNN's
// brgemm micro-kernel"): a Linear's row blocks on two threads at 0.71-0.93 of the time for
// K <= 64 and N <= 128, but 1.06-1.16 for K = 128 (alone on one thread, in cache, it tied or
// won there: the difference is streaming A from memory); wider products keep the sgemm.
constexpr int64_t kUkernelMaxN = 128, kUkernelMaxK = 64;
// Rows per call. Kernels are generated per M, so M takes few values: blocks of 256 rows, then
// the remainder in halving blocks (128, 64, ..., 1): at most 9 kernels per (N, K, ld's).
constexpr int64_t kUkernelRows = 256;

bool ukernel_widths(int64_t n, int64_t k) {
  return k > 0 && n <= kUkernelMaxN && k <= kUkernelMaxK && ukernel_enabled();
}

bool ukernel_fits(bool ta, bool tb, int64_t n, int64_t k, float alpha, float beta) {
  return !ta && !tb && alpha == 1.f && (beta == 0.f || beta == 1.f) &&
         (omp_in_parallel() || omp_get_max_threads() == 1) && ukernel_widths(n, k);
}

// Calls fn(rows, first row) over m rows in the few row counts above.
template <typename F>
void by_row_blocks(int64_t m, F&& fn) {
  int64_t i = 0;
  for (; i + kUkernelRows <= m; i += kUkernelRows) fn(kUkernelRows, i);
  for (int64_t rows = kUkernelRows / 2; rows >= 1; rows /= 2) {
    if (m - i < rows) continue;
    fn(rows, i);
    i += rows;
  }
}

void ukernel_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, bool add_c, float* c, int64_t ldc) {
  const UkernelFn fn = torch_ukernel();
  by_row_blocks(m, [&](int64_t rows, int64_t i) {
    fn(rows, n, k, lda, ldb, ldc, add_c, a + i * lda, b, c + i * ldc, false);
  });
}

// Set once torch's bfloat16 entry has refused a call (its oneDNN held below AVX-512 by
// ONEDNN_MAX_CPU_ISA, or torch.backends.mkldnn disabled: it then throws rather than
// multiply VNNI-packed data): the process keeps oneDNN's bfloat16 GEMM from then on.
std::atomic<bool> g_bf16_ukernel_refused{false};

}  // namespace

bool gemm_ukernel() { return ukernel_enabled(); }

bool gemm_ukernel_takes(int64_t n, int64_t k) { return ukernel_widths(n, k); }

bool gemm_bf16_ukernel_takes(int64_t n) {
  return n >= 1 && n <= 64 && cpu_has_avx512_bf16() && !cpu_has_amx() && ukernel_enabled() &&
         torch_ukernel_bf16() != nullptr &&
         !g_bf16_ukernel_refused.load(std::memory_order_relaxed);
}

int64_t bf16_vnni_ld(int64_t n) { return std::max<int64_t>(16, (n + 15) / 16 * 16); }

int64_t bf16_vnni_size(int64_t k, int64_t n) { return (k + 1) / 2 * bf16_vnni_ld(n) * 2; }

void pack_bf16_vnni(const bf16* b, int64_t k, int64_t n, int64_t ldb, bf16* out) {
  const int64_t ld = bf16_vnni_ld(n);
  for (int64_t p = 0; p < (k + 1) / 2; ++p) {
    bf16* o = out + p * ld * 2;
    for (int64_t j = 0; j < ld; ++j) {
      const bool in_n = j < n;
      o[2 * j] = in_n ? b[(2 * p) * ldb + j] : bf16(0.f);
      o[2 * j + 1] = in_n && 2 * p + 1 < k ? b[(2 * p + 1) * ldb + j] : bf16(0.f);
    }
  }
}

bool gemm_bf16_vnni(int64_t m, int64_t n, int64_t k, const bf16* a, int64_t lda,
                    const bf16* b_packed, float* c, int64_t ldc, bool add_c) {
  if (!gemm_bf16_ukernel_takes(n)) return false;
  check_gemm_args(false, false, m, n, k, lda, n, ldc);
  if (m == 0) return true;
  if (k == 0) {
    for (int64_t i = 0; i < m && !add_c; ++i) std::fill_n(c + i * ldc, n, 0.f);
    return true;
  }
  const UkernelBf16Fn fn = torch_ukernel_bf16();
  const int64_t ld = bf16_vnni_ld(n);
  try {
    by_row_blocks(m, [&](int64_t rows, int64_t i) {
      fn(rows, n, k, lda, ld, ldc, add_c, a + i * lda, b_packed, c + i * ldc, true);
    });
  } catch (const std::exception&) {
    // Refused before writing C (its checks come first): the caller multiplies another way.
    g_bf16_ukernel_refused.store(true, std::memory_order_relaxed);
    return false;
  }
  return true;
}

bool set_gemm_ukernel(bool on) {
  const bool was = ukernel_enabled();
  g_ukernel.store(on ? 1 : 0, std::memory_order_relaxed);
  return was;
}

void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  check_gemm_args(ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (ukernel_fits(ta, tb, n, k, alpha, beta)) {
    ukernel_gemm(m, n, k, a, lda, b, ldb, beta == 1.f, c, ldc);
    return;
  }
#ifdef SPARSEJIT_WITH_ONEDNN
  if (k > 0 && onednn().sgemm) {
    const dnnl_status_t st = onednn().sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda,
                                        b, ldb, beta, c, ldc);
    if (st == dnnl_success) return;
    throw std::runtime_error("gemm: oneDNN dnnl_sgemm failed with status " + std::to_string(int(st)) +
                             " (m=" + std::to_string(m) + ", n=" + std::to_string(n) +
                             ", k=" + std::to_string(k) + ")");
  }
#endif
  sgemm_packed(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

bool gemm_bf16_native() {
#ifdef SPARSEJIT_WITH_ONEDNN
  return cpu_has_bf16_dot() && onednn().sgemm && onednn().gemm_bf16;
#else
  return false;
#endif
}

void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
               const bf16* a, int64_t lda, const bf16* b, int64_t ldb, float beta, float* c,
               int64_t ldc) {
  check_gemm_args(ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // C = beta * C (oneDNN leaves C undefined here)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.f ? 0.f : beta * c[i * ldc + j];
    return;
  }
#ifdef SPARSEJIT_WITH_ONEDNN
  if (onednn().sgemm && onednn().gemm_bf16) {
    // bf16 is layout-compatible with the library's uint16_t bfloat16 (kernels/common/types.h).
    const dnnl_status_t st = onednn().gemm_bf16(
        ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, reinterpret_cast<const uint16_t*>(a),
        lda, reinterpret_cast<const uint16_t*>(b), ldb, beta, c, ldc);
    if (st == dnnl_success) return;
    throw std::runtime_error("gemm: oneDNN dnnl_gemm_bf16bf16f32 failed with status " +
                             std::to_string(int(st)) + " (m=" + std::to_string(m) +
                             ", n=" + std::to_string(n) + ", k=" + std::to_string(k) + ")");
  }
#endif
  throw std::runtime_error("gemm_bf16: oneDNN's dnnl_gemm_bf16bf16f32 is not available");
}

void dgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
           int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  check_gemm_args(ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  gemm_ref<double>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

const char* gemm_backend() {
#ifdef SPARSEJIT_WITH_ONEDNN
  static const std::string name = [] {
    if (!onednn().sgemm) return "builtin (oneDNN not loaded: " + onednn().error + ")";
    const dnnl_version_t* v = onednn().version();
    return "onednn " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
           std::to_string(v->patch);
  }();
  return name.c_str();
#else
  return "builtin";
#endif
}

}  // namespace sparsejit::dense
