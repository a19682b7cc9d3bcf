#include "csrc/point_conv/point_conv_run.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "codegen/cpu_point_conv_spec.h"
#include "codegen/cpu_jit.h"
#include "csrc/core/first_error.h"
#include "csrc/core/huge_pages.h"
#include "csrc/core/isa.h"
#include "csrc/rgms/row_tiles.h"
#include "csrc/dense/gemm.h"
#include "csrc/point_conv/register_blocked.h"

namespace sparsejit::point_conv {

const char* dataflow_name(Dataflow d) {
  switch (d) {
    case Dataflow::GatherGemmScatter: return "gather_gemm_scatter";
    case Dataflow::OutputStationary: return "output_stationary";
    default: return "auto";
  }
}

Pairs swapped(const Pairs& p, const int64_t* in_row_ptr, const int32_t* in_row_pair,
              bool unique_in_per_group) {
  Pairs s = p;
  std::swap(s.in_idx, s.out_idx);
  std::swap(s.num_in, s.num_out);
  s.row_ptr = in_row_ptr;
  s.row_pair = in_row_pair;
  s.unique_out_per_group = unique_in_per_group;
  return s;
}

void index_by_row(const int64_t* group_ptr, int64_t num_groups, const int32_t* rows,
                  int64_t num_rows, int64_t* row_ptr, int32_t* row_pair, int32_t* pair_group) {
  const int64_t m = group_ptr[num_groups];
  std::fill(row_ptr, row_ptr + num_rows + 1, 0);
  for (int64_t p = 0; p < m; ++p) ++row_ptr[rows[p] + 1];
  for (int64_t r = 0; r < num_rows; ++r) row_ptr[r + 1] += row_ptr[r];
  std::vector<int64_t> next(row_ptr, row_ptr + num_rows);
  for (int64_t p = 0; p < m; ++p) row_pair[next[rows[p]]++] = static_cast<int32_t>(p);
  if (pair_group != nullptr)
    for (int64_t g = 0; g < num_groups; ++g)
      for (int64_t p = group_ptr[g]; p < group_ptr[g + 1]; ++p)
        pair_group[p] = static_cast<int32_t>(g);
}

namespace {

// Branch-free range checks (they vectorize); where a failure is, is looked up only then.
uint32_t out_of_range(const int32_t* a, int64_t n, int64_t bound) {
  const uint32_t b = static_cast<uint32_t>(bound);
  uint32_t bad = 0;
  for (int64_t q = 0; q < n; ++q) bad |= static_cast<uint32_t>(a[q]) >= b;
  return bad;
}

// A row index [rows + 1] from 0 to m, never decreasing: "" or what is wrong.
std::string check_row_ptr(const int64_t* ptr, int64_t rows, int64_t m) {
  if (ptr[0] != 0 || ptr[rows] != m) return "row index does not cover the pairs";
  uint32_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) bad |= ptr[r + 1] < ptr[r];
  return bad ? "row index or pair groups out of range" : "";
}

// What check_pairs and check_pairs_both_ways check first: group_ptr from 0 and never
// decreasing, every input and output index in range, the identity group's size.
std::string check_groups_and_indices(const Pairs& p) {
  if (p.num_groups < 0 || p.group_ptr == nullptr) return "no groups";
  if (p.group_ptr[0] != 0) return "group_ptr[0] must be 0";
  for (int64_t g = 0; g < p.num_groups; ++g)
    if (p.group_ptr[g + 1] < p.group_ptr[g])
      return "group_ptr decreases at group " + std::to_string(g);
  const int64_t m = p.size();
  if (out_of_range(p.in_idx, m, p.num_in))
    return "an input index is outside [0, " + std::to_string(p.num_in) + ")";
  if (out_of_range(p.out_idx, m, p.num_out))
    return "an output index is outside [0, " + std::to_string(p.num_out) + ")";
  if (p.identity_group >= 0 &&
      (p.identity_group >= p.num_groups || p.num_in != p.num_out ||
       p.group_ptr[p.identity_group + 1] - p.group_ptr[p.identity_group] != p.num_in))
    return "the identity group does not cover every row once";
  return {};
}

}  // namespace

std::string check_pairs(const Pairs& p, bool full) {
  if (std::string err = check_groups_and_indices(p); !err.empty()) return err;
  const int64_t m = p.size();
  if (p.row_ptr != nullptr) {
    if (std::string err = check_row_ptr(p.row_ptr, p.num_out, m); !err.empty()) return err;
    uint32_t bad = out_of_range(p.row_pair, m, m);
    if (p.pair_group != nullptr) bad |= out_of_range(p.pair_group, m, p.num_groups);
    if (bad) return "row index or pair groups out of range";
  }
  if (!full) return {};
  if (p.identity_group >= 0)
    for (int64_t r = 0; r < p.num_in; ++r)
      if (p.in_idx[p.group_ptr[p.identity_group] + r] != r ||
          p.out_idx[p.group_ptr[p.identity_group] + r] != r)
        return "the identity group is not the identity";
  if (p.row_ptr != nullptr) {
    for (int64_t r = 0; r < p.num_out; ++r)
      for (int64_t q = p.row_ptr[r]; q < p.row_ptr[r + 1]; ++q)
        if (p.out_idx[p.row_pair[q]] != r) return "row index inconsistent with the pairs";
    if (p.pair_group != nullptr)
      for (int64_t g = 0; g < p.num_groups; ++g)
        for (int64_t q = p.group_ptr[g]; q < p.group_ptr[g + 1]; ++q)
          if (p.pair_group[q] != g) return "pair_group inconsistent with group_ptr";
  }
  return {};
}

std::string check_pairs_both_ways(const Pairs& p, const int64_t* in_row_ptr,
                                  const int32_t* in_row_pair) {
  if (std::string err = check_groups_and_indices(p); !err.empty()) return err;
  const bool rows = p.row_ptr != nullptr;
  if (rows != (in_row_ptr != nullptr) || rows != (p.row_pair != nullptr) ||
      rows != (in_row_pair != nullptr))
    return "row index of one direction only";
  if (!rows) return {};
  const int64_t m = p.size();
  if (std::string err = check_row_ptr(p.row_ptr, p.num_out, m); !err.empty()) return err;
  if (std::string err = check_row_ptr(in_row_ptr, p.num_in, m); !err.empty()) return err;
  uint32_t bad = out_of_range(p.row_pair, m, m) | out_of_range(in_row_pair, m, m);
  if (p.pair_group != nullptr) bad |= out_of_range(p.pair_group, m, p.num_groups);
  return bad ? "row index or pair groups out of range" : "";
}

namespace {

// The output-stationary dataflow needs the pairs indexed by out row, with their groups.
bool row_indexed(const Pairs& p) {
  return p.row_ptr != nullptr && (p.pair_group != nullptr || p.size() == 0);
}

using detail::init_rows;
using detail::relu_rows;
using detail::os_tile;
using detail::wgrad_group;

// Rows per tile of the gathered buffers: both buffers in about 128 KiB (L2).
template <typename T>
int64_t tile_rows(int64_t c_in, int64_t c_out) {
  const int64_t budget = (int64_t{128} << 10) / static_cast<int64_t>(sizeof(T));
  return std::clamp<int64_t>(budget / std::max<int64_t>(1, c_in + c_out), 16, 2048);
}

// Tiles go through dense::sgemm (oneDNN when built with it). Before main opened oneDNN with
// RTLD_DEEPBIND, dnnl_sgemm returned "unimplemented" here once torch was loaded (docs/RGMS.md).
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  dense::sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a,
                 int64_t lda, const double* b, int64_t ldb, double beta, double* c,
                 int64_t ldc) {
  dense::dgemm(ta, tb, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc);
}

// W[g] as [c_in, c_out] rows, as the output-stationary rows read it: w itself, or (trans_w)
// a transposed copy in `buf`.
template <typename T>
const T* weights_by_input(const Pairs& p, const T* w, bool trans_w, int64_t ci, int64_t co,
                          std::vector<T>& buf) {
  if (!trans_w) return w;
  buf.resize(p.num_groups * ci * co);
  for (int64_t g = 0; g < p.num_groups; ++g)
    for (int64_t c = 0; c < ci; ++c)
      for (int64_t j = 0; j < co; ++j) buf[(g * ci + c) * co + j] = w[(g * co + j) * ci + c];
  return buf.data();
}

// The gather-GEMM-scatter tiles multiply by W[g], or (trans_w: the feature gradient) by
// W[g]^T. dense::sgemm's micro-kernel takes no transposes: where it would run these tiles
// (float32, its widths), W^T is copied out once per call (G * c_in * c_out values, against
// pairs * c_in * c_out multiply-adds) and the tiles multiply it untransposed. Sets `w` and
// returns whether the tiles still transpose.
template <typename T>
bool tile_weights(const Pairs& p, const PointConvArgs<T>& a, std::vector<T>& buf, const T*& w) {
  w = a.w;
  if (!a.trans_w || !std::is_same_v<T, float> || !dense::gemm_ukernel_takes(a.c_out, a.c_in))
    return a.trans_w;
  w = weights_by_input(p, a.w, true, a.c_in, a.c_out, buf);
  return false;
}

// ---- gather-GEMM-scatter ------------------------------------------------------------------

// Row gathers and scatter-adds through the row-loop family RGMS uses (csrc/rgms/row_tiles.h:
// JIT-specialized to the row width when the pass is big enough, generic otherwise).
template <typename T>
void gather_tile(rows::TileFn fn, const T* x, int64_t c, const int32_t* idx, const T* scale,
                 int64_t n, T* buf) {
  rows::gather_rows(fn, x, c, 0, c, idx, scale, n, buf);
}

template <typename T>
void scatter_add_tile(rows::TileFn fn, const T* buf, int64_t c, const int32_t* idx, int64_t n,
                      T* y) {
  rows::scatter_add_rows(fn, buf, c, idx, n, y, c);
}

template <typename T>
void run_gather_gemm_scatter(const Pairs& p, const PointConvArgs<T>& a) {
  const int64_t ci = a.c_in, co = a.c_out, tile = tile_rows<T>(ci, co);
  std::vector<T> w_buf;
  const T* w;
  const bool trans_w = tile_weights(p, a, w_buf, w);
  const int64_t wstride = ci * co, ldw = trans_w ? ci : co;
  std::vector<T> group_prod;  // [largest group, co], only when out rows repeat in a group
  if (!p.unique_out_per_group) {
    int64_t largest = 0;
    for (int64_t g = 0; g < p.num_groups; ++g)
      largest = std::max(largest, p.group_ptr[g + 1] - p.group_ptr[g]);
    group_prod.resize(static_cast<size_t>(largest) * co);
  }
  const rows::TileFn gfn = rows::tile_fn<T>(ci, p.size() * ci);
  const rows::TileFn sfn = rows::tile_fn<T>(co, p.size() * co);
  FirstError errors;
#pragma omp parallel
  {
    std::vector<T> xbuf(tile * ci), ybuf(tile * co);
    if (!a.accumulate) {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < p.num_out; ++r) init_rows(a, r, r + 1);
    }
    for (int64_t g = 0; g < p.num_groups; ++g) {
      const int64_t p0 = p.group_ptr[g], n = p.group_ptr[g + 1] - p0;
      const T* wg = w + g * wstride;
      const int64_t tiles = (n + tile - 1) / tile;
      if (g == p.identity_group && a.scale == nullptr) {
        // Centre offset: rows map to themselves, Y[r0:r1] += X[r0:r1] @ W, no gather.
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; ++t) {
          const int64_t r0 = t * tile, m = std::min(tile, n - r0);
          errors.guard([&] {
            gemm(false, trans_w, m, co, ci, a.x + r0 * ci, ci, wg, ldw, T(1), a.y + r0 * co, co);
          });
        }
        continue;
      }
      if (p.unique_out_per_group) {
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tiles; ++t) {
          const int64_t q0 = p0 + t * tile, m = std::min(tile, p0 + n - q0);
          gather_tile(gfn, a.x, ci, p.in_idx + q0, a.scale ? a.scale + q0 : nullptr, m,
                      xbuf.data());
          errors.guard([&] {
            gemm(false, trans_w, m, co, ci, xbuf.data(), ci, wg, ldw, T(0), ybuf.data(), co);
          });
          scatter_add_tile(sfn, ybuf.data(), co, p.out_idx + q0, m, a.y);
        }
      } else {
        // Out rows may repeat within the group: the group's products in parallel into a shared
        // buffer, then one thread adds them in pair order (deterministic, no conflicts).
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tiles; ++t) {
          const int64_t q0 = p0 + t * tile, m = std::min(tile, p0 + n - q0);
          gather_tile(gfn, a.x, ci, p.in_idx + q0, a.scale ? a.scale + q0 : nullptr, m,
                      xbuf.data());
          errors.guard([&] {
            gemm(false, trans_w, m, co, ci, xbuf.data(), ci, wg, ldw, T(0),
                 group_prod.data() + (q0 - p0) * co, co);
          });
        }
#pragma omp single
        scatter_add_tile(sfn, group_prod.data(), co, p.out_idx + p0, n, a.y);
      }
    }
    if (a.relu) {  // every group has added into the rows (the loops above end in barriers)
#pragma omp for schedule(static)
      for (int64_t r = 0; r < p.num_out; ++r) relu_rows(a, r, r + 1);
    }
  }
  errors.rethrow();
}

// y[r, 0:co] += the product rows of r's pairs (prod[row_pair[q] * co], q in r's range), in
// pair order, for rows [r0, r1). Widths 16, 32, 64 and 128 get copies with the row length
// known at compile time, and the loop has copies for AVX-512 and AVX2 (SJ_TARGET_V4 / V3,
// picked by isa_tier(); the library's baseline build adds 4 floats at a time): the same
// additions in the same order, the same bits.
template <typename T, int W>
inline __attribute__((always_inline)) void sum_pair_rows_w(const Pairs& p, const T* prod,
                                                           int64_t co_rt, int64_t r0,
                                                           int64_t r1, T* y) {
  const int64_t co = W > 0 ? W : co_rt;
  for (int64_t r = r0; r < r1; ++r) {
    T* __restrict yr = y + r * co;
    for (int64_t q = p.row_ptr[r]; q < p.row_ptr[r + 1]; ++q) {
      const T* __restrict src = prod + static_cast<int64_t>(p.row_pair[q]) * co;
      for (int64_t j = 0; j < co; ++j) yr[j] += src[j];
    }
  }
}

template <typename T>
inline __attribute__((always_inline)) void sum_pair_rows_any(const Pairs& p, const T* prod,
                                                             int64_t co, int64_t r0,
                                                             int64_t r1, T* y) {
  switch (co) {
    case 16: return sum_pair_rows_w<T, 16>(p, prod, co, r0, r1, y);
    case 32: return sum_pair_rows_w<T, 32>(p, prod, co, r0, r1, y);
    case 64: return sum_pair_rows_w<T, 64>(p, prod, co, r0, r1, y);
    case 128: return sum_pair_rows_w<T, 128>(p, prod, co, r0, r1, y);
    default: return sum_pair_rows_w<T, 0>(p, prod, co, r0, r1, y);
  }
}

template <typename T>
SJ_TARGET_V4 void sum_pair_rows_v4(const Pairs& p, const T* prod, int64_t co, int64_t r0,
                                   int64_t r1, T* y) {
  sum_pair_rows_any<T>(p, prod, co, r0, r1, y);
}
template <typename T>
SJ_TARGET_V3 void sum_pair_rows_v3(const Pairs& p, const T* prod, int64_t co, int64_t r0,
                                   int64_t r1, T* y) {
  sum_pair_rows_any<T>(p, prod, co, r0, r1, y);
}
template <typename T>
void sum_pair_rows_base(const Pairs& p, const T* prod, int64_t co, int64_t r0, int64_t r1,
                        T* y) {
  sum_pair_rows_any<T>(p, prod, co, r0, r1, y);
}

template <typename T>
void sum_pair_rows(const Pairs& p, const T* prod, int64_t co, int64_t r0, int64_t r1, T* y) {
  SJ_ISA_CALL(sum_pair_rows, <T>(p, prod, co, r0, r1, y))
}

// With a row index: every (group, tile) product goes to its own rows of a [M, C_out] buffer
// (all tiles of all groups in parallel, one barrier), then each out row sums its pairs'
// products in row-index order: no scatter conflicts, deterministic, two parallel phases.
template <typename T>
void run_gemm_then_reduce(const Pairs& p, const PointConvArgs<T>& a) {
  const int64_t ci = a.c_in, co = a.c_out, tile = tile_rows<T>(ci, co);
  std::vector<T> w_buf;
  const T* w;
  const bool trans_w = tile_weights(p, a, w_buf, w);
  const int64_t wstride = ci * co, ldw = trans_w ? ci : co;
  struct Task { int64_t g, q0, m; };
  std::vector<Task> tasks;
  for (int64_t g = 0; g < p.num_groups; ++g)
    for (int64_t q0 = p.group_ptr[g]; q0 < p.group_ptr[g + 1]; q0 += tile)
      tasks.push_back({g, q0, std::min(tile, p.group_ptr[g + 1] - q0)});
  // Every row of the buffer is written by its tile's GEMM (beta 0): no zero fill. It is often
  // above glibc's mmap threshold, so a fresh mapping every call: advised for huge pages like
  // sparsejit's large outputs (KITTI 000000 at 10 cm, 128 channels: a 39 MiB buffer, ~10k
  // page faults a call, 42 -> 15 ms for the forward).
  const size_t prod_size = static_cast<size_t>(p.size()) * co;
  std::unique_ptr<T[]> prod_buf(new T[prod_size]);
  advise_huge_pages(prod_buf.get(), prod_size * sizeof(T));
  T* const prod = prod_buf.get();
  const int64_t num_tasks = static_cast<int64_t>(tasks.size());
  const rows::TileFn gfn = rows::tile_fn<T>(ci, p.size() * ci);
  FirstError errors;
#pragma omp parallel
  {
    std::vector<T> xbuf(tile * ci);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < num_tasks; ++t) {
      const Task& k = tasks[t];
      const T* wg = w + k.g * wstride;
      const T* xs;
      if (k.g == p.identity_group && a.scale == nullptr) {
        xs = a.x + (k.q0 - p.group_ptr[k.g]) * ci;  // centre offset: rows in order, no gather
      } else {
        gather_tile(gfn, a.x, ci, p.in_idx + k.q0, a.scale ? a.scale + k.q0 : nullptr, k.m,
                    xbuf.data());
        xs = xbuf.data();
      }
      errors.guard([&] {
        gemm(false, trans_w, k.m, co, ci, xs, ci, wg, ldw, T(0), prod + k.q0 * co, co);
      });
    }
#pragma omp for schedule(dynamic, 256)
    for (int64_t r = 0; r < p.num_out; ++r) {
      if (!a.accumulate) init_rows(a, r, r + 1);
      sum_pair_rows(p, prod, co, r, r + 1, a.y);
      if (a.relu) relu_rows(a, r, r + 1);
    }
  }
  errors.rethrow();
}

// ---- output-stationary -------------------------------------------------------------------

}  // namespace

// Rows share their weight loads once the weights are well beyond L1 and stream from L2. On the
// AVX-512 EPYC (32 KiB L1), cached forward on KITTI and ScanNet, 27 offsets: 64 channels
// (432 KiB of weights) 1.13-1.46x, 128 channels 1.08-1.42x; 32 channels (108 KiB) 0.93-1.17x
// (slower on the sparser 5 cm scans), 16 channels (27 KiB) 0.7-0.9x: hence 4 x L1.
int64_t os_rows_together(int64_t num_groups, int64_t c_in, int64_t c_out, int64_t elem_bytes) {
  return num_groups * c_in * c_out * elem_bytes > 4 * cpu_l1d_bytes() ? 4 : 1;
}

namespace {

// The output-stationary rows JIT-compiled for (c_in, c_out) with storage `dtype` (bf16:
// float weights and accumulation), or nullptr (JIT off, a width it does not take, or a pass
// too small to pay for a compile: then the ahead-of-time rows).
codegen::EntryFn os_jit_fn(const Pairs& p, int64_t c_in, int64_t c_out, ScalarKind dtype) {
  const int64_t elem_bytes = dtype == ScalarKind::F64 ? 8 : 4;  // of the arithmetic
  if (!detail::os_jit_worth(p, c_in, c_out, elem_bytes)) return nullptr;
  codegen::CpuPointConvSpec spec;
  spec.dtype = dtype;
  spec.c_in = c_in;
  spec.c_out = c_out;
  spec.rows = os_rows_together(p.num_groups, c_in, c_out, elem_bytes);
  return codegen::CpuJit::instance().lookup(spec);
}

constexpr int64_t kOsTile = 256;  // out rows per task

// Tiles of kOsTile out rows in parallel through the JIT's entry `fn`, or (null) the
// ahead-of-time rows; W already as [G, c_in, c_out].
// `w_pairs`: bfloat16 storage only, W as bfloat16 channel pairs (ConvOsLaunch::w_pairs) or null.
template <typename T>
void os_tiles(const Pairs& p, const PointConvArgs<T>& a, const T* w, codegen::EntryFn fn,
              const uint16_t* w_pairs = nullptr) {
  const int64_t tiles = (p.num_out + kOsTile - 1) / kOsTile;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t r0 = t * kOsTile, r1 = std::min(p.num_out, r0 + kOsTile);
    if (fn != nullptr) {
      cpu::ConvOsLaunch l = detail::os_launch(p, a, w, r0, r1);
      l.w_pairs = w_pairs;
      fn(&l);
    } else {
      os_tile(p, a, w, r0, r1);
    }
  }
}

template <typename T>
void run_output_stationary(const Pairs& p, const PointConvArgs<T>& a) {
  std::vector<T> wt;
  const T* w = weights_by_input(p, a.w, a.trans_w, a.c_in, a.c_out, wt);
  // The JIT's rows take no per-pair scale (kernels/cpu/point_conv_kernel.h): with one, the
  // ahead-of-time rows.
  os_tiles(p, a, w,
           a.scale != nullptr
               ? nullptr
               : os_jit_fn(p, a.c_in, a.c_out, sizeof(T) == 4 ? ScalarKind::F32 : ScalarKind::F64));
}

// ---- weight gradient ---------------------------------------------------------------------

template <typename T>
void run_weight_grad(const Pairs& p, const T* x, int64_t ci, const T* dy, int64_t co,
                     const T* scale, T* dw, bool registers) {
  const int64_t tile = tile_rows<T>(ci, co);
  const rows::TileFn xfn = rows::tile_fn<T>(ci, p.size() * ci);
  const rows::TileFn yfn = rows::tile_fn<T>(co, p.size() * co);
  FirstError errors;
#pragma omp parallel
  {
    std::vector<T> xbuf(tile * ci), ybuf(tile * co);
#pragma omp for schedule(dynamic, 1)
    for (int64_t g = 0; g < p.num_groups; ++g) {
      T* dwg = dw + g * ci * co;
      std::fill(dwg, dwg + ci * co, T(0));
      const int64_t p0 = p.group_ptr[g], n = p.group_ptr[g + 1] - p0;
      // Channel widths with a register-resident kernel: rank-1 updates, no buffers.
      if (registers && wgrad_group(p, x, ci, dy, co, scale, dwg, g)) continue;
      if (g == p.identity_group && scale == nullptr) {
        errors.guard([&] { gemm(true, false, ci, co, n, x, ci, dy, co, T(0), dwg, co); });
        continue;
      }
      for (int64_t q0 = p0; q0 < p0 + n; q0 += tile) {
        const int64_t m = std::min(tile, p0 + n - q0);
        gather_tile(xfn, x, ci, p.in_idx + q0, scale ? scale + q0 : nullptr, m, xbuf.data());
        gather_tile(yfn, dy, co, p.out_idx + q0, static_cast<const T*>(nullptr), m,
                    ybuf.data());
        errors.guard([&] {
          gemm(true, false, ci, co, m, xbuf.data(), ci, ybuf.data(), co, T(1), dwg, co);
        });
      }
    }
  }
  errors.rethrow();
}

// Output-stationary keeps the output row in vector registers and streams W[g] for every
// pair, so it wins while all of W (K * c_in * c_out) stays in (half of) L2 and a register
// kernel exists for c_out. Measured (2 threads, oneDNN tiles, subm 3x3x3 on KITTI / ScanNet /
// random at 5 cm; benchmarks/bench_sparse_conv.py, 1 MiB L2): output-stationary 1.0-3.5x
// faster up to 64 x 64 (442 KiB of float32 weights), gather-GEMM-scatter up to 2.2x faster
// at 128 x 128 (1.7 MiB). Without a register kernel the row loop is plain C++: the GEMM path
// then. Beyond that, gather-GEMM-scatter's [M, c_out] products buffer decides: once it is
// far beyond L3 it streams through DRAM twice. 128 -> 128 channels, AVX-512 EPYC (32 MiB L3),
// cached forward: buffers of 12-39 MiB (random, KITTI) gather-GEMM-scatter 1.2-1.6x faster;
// 88-104 MiB (ScanNet) output-stationary 1.5-1.8x faster. Hence twice the L3.
bool os_by_weights(const Pairs& p, int64_t c_in, int64_t c_out, int64_t elem_bytes) {
  const bool weights_in_l2 = p.num_groups * c_in * c_out * elem_bytes <= cpu_l2_bytes() / 2;
  const int64_t l3 = cpu_l3_bytes();
  const bool buffer_in_dram = l3 > 0 && p.size() * c_out * elem_bytes > 2 * l3;
  return (weights_in_l2 || buffer_in_dram) && detail::os_has_registers(p, c_in, c_out, elem_bytes);
}

}  // namespace

Dataflow choose_dataflow(const Pairs& p, int64_t c_in, int64_t c_out, int64_t elem_bytes) {
  if (!row_indexed(p)) return Dataflow::GatherGemmScatter;
  if (!os_by_weights(p, c_in, c_out, elem_bytes)) return Dataflow::GatherGemmScatter;
  // Since the products buffer is written without zero-filling it first (and advised onto
  // huge pages), gather-GEMM-scatter also wins at 32 and 64 channels while that buffer stays
  // in L3. Cached float32 forward, 2 threads, AVX-512 EPYC (32 MiB L3), best of three
  // alternated rounds, gather-GEMM-scatter over output-stationary: 32 -> 32 channels
  // 0.64-0.95 on KITTI, random, Open3D and ScanNet at 5 and 10 cm (buffers 0.9-26 MiB; once
  // 1.03 on ScanNet at 10 cm); 64 -> 64 0.82-0.96 on KITTI, random and Open3D (1.8-19 MiB),
  // 1.39-1.56 on ScanNet (44-52 MiB); at 16 channels output-stationary won on all but the
  // random cloud (GEMMs that narrow run far below the machine's rate).
  const int64_t l3 = cpu_l3_bytes();
  const bool buffer_in_l3 = l3 > 0 && p.size() * c_out * elem_bytes <= l3;
  if (c_in >= 32 && c_out >= 32 && buffer_in_l3) return Dataflow::GatherGemmScatter;
  return Dataflow::OutputStationary;
}

template <typename T>
Dataflow gather_gemm_scatter(const Pairs& p, const PointConvArgs<T>& a, Dataflow d) {
  if (d == Dataflow::Auto) d = choose_dataflow(p, a.c_in, a.c_out, sizeof(T));
  if (d == Dataflow::OutputStationary && !row_indexed(p)) d = Dataflow::GatherGemmScatter;
  if (a.c_out == 0 || p.num_out == 0) return d;
  if (a.c_in == 0 || p.size() == 0) {
    if (!a.accumulate) init_rows(a, 0, p.num_out);
    if (a.relu) relu_rows(a, 0, p.num_out);
    return d;
  }
  if (d == Dataflow::OutputStationary)
    run_output_stationary(p, a);
  else if (p.row_ptr != nullptr)
    run_gemm_then_reduce(p, a);
  else
    run_gather_gemm_scatter(p, a);
  return d;
}

namespace {

// Whether the bfloat16 rows multiply channel pairs (vdpbf16ps): bfloat16 weights, at least one
// pair, and a CPU with AVX512-BF16 / AMX-BF16.
bool bf16_channel_pairs(int64_t c_in, bool weights_bf16) {
  return weights_bf16 && c_in >= 2 && cpu_has_bf16_dot();
}

}  // namespace

Dataflow choose_dataflow_bf16(const Pairs& p, int64_t c_in, int64_t c_out, bool weights_bf16) {
  if (!row_indexed(p)) return Dataflow::GatherGemmScatter;
  // The bfloat16 rows keep output-stationary wherever the weights alone would pick it (the
  // float32 rule's carve-out for gather-GEMM-scatter was measured on float32 only).
  if (os_by_weights(p, c_in, c_out, sizeof(float))) return Dataflow::OutputStationary;
  if (!bf16_channel_pairs(c_in, weights_bf16) ||
      !detail::os_has_registers(p, c_in, c_out, sizeof(float)))
    return Dataflow::GatherGemmScatter;
  // Channel pairs on vdpbf16ps stream half the weight bytes with a quarter of the
  // instructions, while gather-GEMM-scatter would run on float32 copies. Measured on the
  // AVX-512 EPYC (1 MiB L2), KITTI 000000, 128 -> 128 channels (884 KiB of bfloat16 weights),
  // cached forward: output-stationary 8.6-8.7 ms at 5 cm and 11.6-11.8 ms at 10 cm; the
  // float32 forward (gather-GEMM-scatter) 9.9-10.4 and 15-19 ms, before the conversions. So
  // output-stationary while the bfloat16 weights fit in L2.
  return p.num_groups * c_in * c_out * 2 <= cpu_l2_bytes() ? Dataflow::OutputStationary
                                                           : Dataflow::GatherGemmScatter;
}

bool output_stationary_bf16(const Pairs& p, const PointConvArgs<float>& a, Dataflow d,
                            bool weights_bf16) {
  if (d == Dataflow::Auto) d = choose_dataflow_bf16(p, a.c_in, a.c_out, weights_bf16);
  if (d != Dataflow::OutputStationary || !row_indexed(p) || a.c_in == 0 || a.c_out == 0 ||
      p.num_out == 0 || p.size() == 0 || a.accumulate || a.scale != nullptr)
    return false;
  const codegen::EntryFn fn = os_jit_fn(p, a.c_in, a.c_out, ScalarKind::BF16);
  if (fn == nullptr) return false;
  std::vector<float> wt;
  const float* w = weights_by_input(p, a.w, a.trans_w, a.c_in, a.c_out, wt);
  // Channel pairs for CPUs with AVX512-BF16: W[g][2k + h][j] at [g][k][j][1 - h] (the rows
  // swap the halves of X's words to match). The values are bfloat16 exactly (weights_bf16),
  // so their high halves are the bits (no rounding).
  std::vector<uint16_t> pairs;
  if (bf16_channel_pairs(a.c_in, weights_bf16)) {
    const int64_t ci = a.c_in, co = a.c_out, np = ci / 2;
    pairs.resize(static_cast<size_t>(p.num_groups * np * co * 2));
#pragma omp parallel for schedule(static) if (p.num_groups * ci * co >= (int64_t{1} << 16))
    for (int64_t g = 0; g < p.num_groups; ++g)
      for (int64_t k = 0; k < np; ++k)
        for (int64_t h = 0; h < 2; ++h) {
          const float* src = w + (g * ci + 2 * k + h) * co;
          uint16_t* dst = pairs.data() + (g * np + k) * co * 2 + (1 - h);
          for (int64_t j = 0; j < co; ++j) {
            uint32_t u;
            std::memcpy(&u, src + j, sizeof(u));
            dst[2 * j] = static_cast<uint16_t>(u >> 16);
          }
        }
  }
  os_tiles(p, a, w, fn, pairs.empty() ? nullptr : pairs.data());
  return true;
}

WgradPath choose_wgrad_path(const Pairs& p, int64_t c_in, int64_t c_out) {
  (void)p;
  // Measured with sj.tune on KITTI, ScanNet and random clouds (2 threads, oneDNN tiles): the
  // register rank-1 updates win at 16 -> 16 channels (they re-read dY once per block of input
  // channels, which only pays off while rows are short); from 32 channels the gathered tiles
  // through the GEMM were 1.2-1.7x faster (the weight gradient alone).
  return c_in <= 16 && c_out <= 16 ? WgradPath::Registers : WgradPath::Gemm;
}

bool weight_grad_bf16(const Pairs& p, const uint16_t* x, int64_t ci, const uint16_t* dy,
                      int64_t co, float* dw, WgradPath path) {
  if (path == WgradPath::Auto) path = choose_wgrad_path(p, ci, co);
  if (path != WgradPath::Gemm || !dense::gemm_bf16_native()) return false;
  if (ci == 0 || co == 0 || p.num_groups == 0) return true;  // nothing to write
  const int64_t tile = tile_rows<uint16_t>(ci, co);
  const bf16* xb = reinterpret_cast<const bf16*>(x);
  const bf16* yb = reinterpret_cast<const bf16*>(dy);
  FirstError errors;
#pragma omp parallel
  {
    std::vector<bf16> xbuf(tile * ci), ybuf(tile * co);
#pragma omp for schedule(dynamic, 1)
    for (int64_t g = 0; g < p.num_groups; ++g) {
      float* dwg = dw + g * ci * co;
      const int64_t p0 = p.group_ptr[g], n = p.group_ptr[g + 1] - p0;
      if (n == 0) {
        std::fill(dwg, dwg + ci * co, 0.f);
        continue;
      }
      if (g == p.identity_group) {  // (r, r) for every row: X and dY as they are
        errors.guard([&] {
          dense::gemm_bf16(true, false, ci, co, n, 1.f, xb, ci, yb, co, 0.f, dwg, co);
        });
        continue;
      }
      for (int64_t q0 = p0; q0 < p0 + n; q0 += tile) {
        const int64_t m = std::min(tile, p0 + n - q0);
        for (int64_t j = 0; j < m; ++j) {
          std::memcpy(&xbuf[j * ci], xb + static_cast<int64_t>(p.in_idx[q0 + j]) * ci,
                      ci * sizeof(bf16));
          std::memcpy(&ybuf[j * co], yb + static_cast<int64_t>(p.out_idx[q0 + j]) * co,
                      co * sizeof(bf16));
        }
        errors.guard([&] {
          dense::gemm_bf16(true, false, ci, co, m, 1.f, xbuf.data(), ci, ybuf.data(), co,
                           q0 == p0 ? 0.f : 1.f, dwg, co);
        });
      }
    }
  }
  errors.rethrow();
  return true;
}

template <typename T>
void weight_grad(const Pairs& p, const T* x, int64_t c_in, const T* dy, int64_t c_out,
                 const T* scale, T* dw, WgradPath path) {
  if (c_in == 0 || c_out == 0 || p.num_groups == 0) return;
  if (path == WgradPath::Auto) path = choose_wgrad_path(p, c_in, c_out);
  run_weight_grad(p, x, c_in, dy, c_out, scale, dw, path == WgradPath::Registers);
}

template Dataflow gather_gemm_scatter<float>(const Pairs&, const PointConvArgs<float>&, Dataflow);
template Dataflow gather_gemm_scatter<double>(const Pairs&, const PointConvArgs<double>&, Dataflow);
template void weight_grad<float>(const Pairs&, const float*, int64_t, const float*, int64_t,
                                 const float*, float*, WgradPath);
template void weight_grad<double>(const Pairs&, const double*, int64_t, const double*, int64_t,
                                  const double*, double*, WgradPath);

}  // namespace sparsejit::point_conv
