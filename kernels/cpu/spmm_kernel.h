// SpMM loop nest, written once and instantiated twice: with run-time sizes for the
// precompiled generic kernel (spmm_cpu.cpp), and with compile-time sizes, reduce, value mode,
// activation and prefetch distance by the JIT (codegen/), where the constants let the
// compiler unroll and vectorize the feature loops for the host's own instruction set.
//
// Y[i] = epilogue(reduce_{p in row i} a_p * X[col[p]]) on the shared building blocks of
// kernels/cpu/common: the merge-path segment loop (segment_loop.h: equal pieces of row ends +
// stored entries per thread, rows cut by piece boundaries finished by an ordered fix-up), the
// reductions (reduce.h), the fused epilogue (epilogue.h) and vector loads (vec.h). What is
// SpMM's own is the per-entry accumulation below: a scalar a_p times a gathered row of X.
//
// Only the standard library and sparsejit's Torch-free headers are included: the JIT
// compiles this file with nothing else on the include path.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/common/epilogue.h"
#include "kernels/cpu/common/reduce.h"
#include "kernels/cpu/common/segment_loop.h"
#include "kernels/cpu/common/vec.h"
#include "kernels/cpu/spmm_args.h"

namespace sparsejit::cpu::detail {

// Positions of the extrema found by a values-only pass over entries [lo, hi): every
// accumulation starts from the identity, so the extremum's position is the first entry whose
// value equals it (ties: the first wins, as with a strict comparison). The entries are walked
// backwards with an unconditional 32-bit select (the last write is the first match), which
// vectorizes like the values; tracking 64-bit positions inside the values pass did not, and
// mispredicted on every update (about 10x slower). Only run when a gradient needs them.
template <int VMODE, int64_t kH, int64_t kF, typename T, typename I>
inline void find_positions(int64_t lo, int64_t hi, const I* __restrict col,
                           const T* __restrict values, const T* __restrict x, int64_t H_rt,
                           int64_t F_rt, const acc_t<T>* __restrict acc,
                           int64_t* __restrict argacc) {
  using A = acc_t<T>;
  const int64_t H = size_or<kH>(H_rt), F = size_or<kF>(F_rt), HF = H * F;
  thread_local std::vector<int32_t> rel;
  rel.assign(static_cast<size_t>(HF), -1);
  int32_t* __restrict r32 = rel.data();
  for (int64_t p = hi - 1; p >= lo; --p) {
    const int32_t offset = static_cast<int32_t>(p - lo);
    const T* __restrict xr = x + static_cast<int64_t>(col[p]) * HF;
    for (int64_t h = 0; h < H; ++h) {
      A a = A(1);
      if constexpr (VMODE == 1) a = A(values[p]);
      if constexpr (VMODE == 2) a = A(values[p * H + h]);
      const A* __restrict ah = acc + h * F;
      const T* __restrict xh = xr + h * F;
      int32_t* __restrict rh = r32 + h * F;
      int64_t f = 0;
      if constexpr (std::is_same_v<A, float>) {
        // The same select on whole vectors (GCC left the scalar form as a compare and a
        // conditional move per element): a float compare gives an int32 lane mask.
        using V = typename VecOf<float>::type;
        using VI = Vec<int32_t, kVecBytes>;
        constexpr int64_t L = VecOf<float>::kLanes;
        const V av = V{} + a;
        const VI offv = VI{} + offset;
        for (; f + L <= F; f += L) {
          const V v = av * load_vec<T, float>(xh + f);
          V accv;
          VI r;
          __builtin_memcpy(&accv, ah + f, sizeof(V));
          __builtin_memcpy(&r, rh + f, sizeof(VI));
          const VI m = v == accv;
          r = (m & offv) | (~m & r);
          __builtin_memcpy(rh + f, &r, sizeof(VI));
        }
      }
      for (; f < F; ++f) rh[f] = a * A(xh[f]) == ah[f] ? offset : rh[f];
    }
  }
  for (int64_t f = 0; f < HF; ++f) argacc[f] = r32[f] < 0 ? int64_t(-1) : lo + r32[f];
}

// VMODE: 0 = no values (all ones), 1 = one value per entry, 2 = one value per entry and head.
template <Reduce R, int VMODE, int64_t kH, int64_t kF, int kPrefetch, typename T, typename I>
inline void accumulate(int64_t lo, int64_t hi, const I* __restrict col, const T* __restrict values,
                       const T* __restrict x, int64_t H_rt, int64_t F_rt, int64_t hi_bound,
                       acc_t<T>* __restrict acc, int64_t* __restrict argacc) {
  using A = acc_t<T>;
  const int64_t H = size_or<kH>(H_rt), F = size_or<kF>(F_rt), HF = H * F;
  for (int64_t p = lo; p < hi; ++p) {
    if constexpr (kPrefetch > 0) {
      // Random rows of X dominate the memory traffic: ask for them a few entries early.
      if (p + kPrefetch < hi_bound) {
        const char* next =
            reinterpret_cast<const char*>(x + static_cast<int64_t>(col[p + kPrefetch]) * HF);
        const int64_t lines = std::min<int64_t>((HF * sizeof(T) + 63) / 64, 16);
#pragma GCC unroll 16
        for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(next + 64 * l, 0, 3);
      }
    }
    const T* __restrict xr = x + static_cast<int64_t>(col[p]) * HF;
    for (int64_t h = 0; h < H; ++h) {
      A a = A(1);
      if constexpr (VMODE == 1) a = A(values[p]);
      if constexpr (VMODE == 2) a = A(values[p * H + h]);
      A* __restrict ah = acc + h * F;
      const T* __restrict xh = xr + h * F;
      if constexpr (R == Reduce::Sum || R == Reduce::Mean) {
        if constexpr (VMODE == 0) {
          for (int64_t f = 0; f < F; ++f) ah[f] += A(xh[f]);
        } else {
          for (int64_t f = 0; f < F; ++f) ah[f] += a * A(xh[f]);
        }
      } else {
        // Values only here (a float select, which vectorizes); positions in a second pass.
        // Written as the (ah < v ? v : ah) pattern that GCC maps to vector max / min
        // instructions (same NaN and tie behaviour: the accumulator is kept).
        for (int64_t f = 0; f < F; ++f) {
          const A v = a * A(xh[f]);
          if constexpr (R == Reduce::Max) {
            ah[f] = ah[f] < v ? v : ah[f];
          } else {
            ah[f] = v < ah[f] ? v : ah[f];
          }
        }
      }
    }
  }
  if constexpr (R == Reduce::Max || R == Reduce::Min) {
    if (argacc != nullptr) {
      find_positions<VMODE, kH, kF>(lo, hi, col, values, x, H_rt, F_rt, acc, argacc);
    }
  }
}

// ---- Register-blocked accumulation for compile-time row widths (JIT) -------------------
// The row's accumulators live in vector registers for the whole stored-entry loop (GCC
// vector extensions, the target's native width: VecOf in common/vec.h), instead of being
// loaded and stored for every entry.
// True when the register-blocked path applies: compile-time width and (for per-head values)
// heads aligned to whole vectors.
template <Reduce R, int VMODE, int64_t kH, int64_t kF, typename A>
constexpr bool kVectorPath = kH > 0 && kF > 0 && kH * kF <= 1024 &&
                             (VMODE != 2 || kF % VecOf<A>::kLanes == 0);

// Accumulators per register tile: what fits in the register file next to the loaded X
// vector, the broadcast value and a product (16 registers without AVX-512, 32 with it).
#ifndef SPARSEJIT_TILE_VECTORS
#define SPARSEJIT_TILE_VECTORS (kVecBytes == 64 ? 24 : 12)
#endif
inline constexpr int64_t kMaxTileVectors = SPARSEJIT_TILE_VECTORS;

// One register tile: vectors [kV0, kV0 + kNVt) of the row, plus the kRem trailing scalars
// when kLast. Each output element still sees the entries in order, so the result is the
// same bit for bit as the plain loop's. kDirect: the registers start from the reduce's
// identity instead of `acc`, and the result (times `mscale`, for mean) goes straight to
// `acc` as the finished output row, which saves a reset pass and a copy per row.
template <Reduce R, int VMODE, int64_t kH, int64_t kF, int kPrefetch, int64_t kV0, int64_t kNVt,
          bool kLast, bool kDirect, typename T, typename I>
inline void accumulate_tile(int64_t lo, int64_t hi, const I* __restrict col,
                            const T* __restrict values, const T* __restrict x, int64_t hi_bound,
                            acc_t<T>* __restrict acc, acc_t<T> mscale) {
  using A = acc_t<T>;
  using V = typename VecOf<A>::type;
  constexpr int64_t kHF = kH * kF;
  constexpr int kL = VecOf<A>::kLanes;
  constexpr int64_t kNV = kHF / kL;
  constexpr int64_t kRem = kLast ? kHF % kL : 0;
  constexpr int64_t kOff = kV0 * kL;  // first element of the tile
  V r[kNVt > 0 ? kNVt : 1];
  A t[kRem > 0 ? kRem : 1];
  if constexpr (kDirect) {
    const A id = reduce_identity<R, A>();
#pragma GCC unroll 64
    for (int64_t v = 0; v < kNVt; ++v) r[v] = V{} + id;
#pragma GCC unroll 64
    for (int64_t k = 0; k < kRem; ++k) t[k] = id;
  } else {
#pragma GCC unroll 64
    for (int64_t v = 0; v < kNVt; ++v) __builtin_memcpy(&r[v], acc + kOff + v * kL, sizeof(V));
#pragma GCC unroll 64
    for (int64_t k = 0; k < kRem; ++k) t[k] = acc[kNV * kL + k];
  }
  for (int64_t p = lo; p < hi; ++p) {
    if constexpr (kPrefetch > 0) {
      if (p + kPrefetch < hi_bound) {
        const char* next = reinterpret_cast<const char*>(
            x + static_cast<int64_t>(col[p + kPrefetch]) * kHF + kOff);
        constexpr int64_t kBytes = (kNVt * kL + kRem) * static_cast<int64_t>(sizeof(T));
        constexpr int64_t kLines = (kBytes + 63) / 64;
#pragma GCC unroll 16
        for (int64_t l = 0; l < kLines; ++l) __builtin_prefetch(next + 64 * l, 0, 3);
      }
    }
    const T* __restrict xr = x + static_cast<int64_t>(col[p]) * kHF;
    if constexpr (VMODE == 2) {
      constexpr int64_t kPerHead = kF / kL;
#pragma GCC unroll 64
      for (int64_t v = 0; v < kNVt; ++v)
        r[v] = fold<R>(r[v], A(values[p * kH + (kV0 + v) / kPerHead]) *
                                 load_vec<T, A>(xr + kOff + v * kL));
    } else {
      A a = A(1);
      if constexpr (VMODE == 1) a = A(values[p]);
#pragma GCC unroll 64
      for (int64_t v = 0; v < kNVt; ++v) {
        if constexpr (VMODE == 0) {
          r[v] = fold<R>(r[v], load_vec<T, A>(xr + kOff + v * kL));
        } else {
          r[v] = fold<R>(r[v], a * load_vec<T, A>(xr + kOff + v * kL));
        }
      }
#pragma GCC unroll 64
      for (int64_t k = 0; k < kRem; ++k) t[k] = fold<R>(t[k], a * A(xr[kNV * kL + k]));
    }
  }
  if constexpr (kDirect && R == Reduce::Mean) {
#pragma GCC unroll 64
    for (int64_t v = 0; v < kNVt; ++v) r[v] = r[v] * mscale;
#pragma GCC unroll 64
    for (int64_t k = 0; k < kRem; ++k) t[k] = t[k] * mscale;
  }
#pragma GCC unroll 64
  for (int64_t v = 0; v < kNVt; ++v) __builtin_memcpy(acc + kOff + v * kL, &r[v], sizeof(V));
#pragma GCC unroll 64
  for (int64_t k = 0; k < kRem; ++k) acc[kNV * kL + k] = t[k];
}

// Register tiles of balanced size over the row (F * H elements), one after the other.
template <Reduce R, int VMODE, int64_t kH, int64_t kF, int kPrefetch, int64_t kV0, bool kDirect,
          typename T, typename I>
inline void accumulate_tiles(int64_t lo, int64_t hi, const I* __restrict col,
                             const T* __restrict values, const T* __restrict x,
                             int64_t hi_bound, acc_t<T>* __restrict acc, acc_t<T> mscale) {
  constexpr int64_t kNV = kH * kF / VecOf<acc_t<T>>::kLanes;
  constexpr int64_t kTiles = kNV > 0 ? (kNV + kMaxTileVectors - 1) / kMaxTileVectors : 1;
  constexpr int64_t kTileV = kNV > 0 ? (kNV + kTiles - 1) / kTiles : 0;
  constexpr int64_t kNVt = kTileV < kNV - kV0 ? kTileV : kNV - kV0;
  constexpr bool kLast = kV0 + kNVt >= kNV;
  accumulate_tile<R, VMODE, kH, kF, kPrefetch, kV0, kNVt, kLast, kDirect>(
      lo, hi, col, values, x, hi_bound, acc, mscale);
  if constexpr (!kLast) {
    accumulate_tiles<R, VMODE, kH, kF, kPrefetch, kV0 + kNVt, kDirect>(lo, hi, col, values, x,
                                                                       hi_bound, acc, mscale);
  }
}

template <Reduce R, int VMODE, int64_t kH, int64_t kF, int kPrefetch, typename T, typename I>
inline void accumulate_vec(int64_t lo, int64_t hi, const I* __restrict col,
                           const T* __restrict values, const T* __restrict x, int64_t hi_bound,
                           acc_t<T>* __restrict acc, int64_t* __restrict argacc) {
  accumulate_tiles<R, VMODE, kH, kF, kPrefetch, 0, false>(lo, hi, col, values, x, hi_bound, acc,
                                                         acc_t<T>(1));
  if constexpr (R == Reduce::Max || R == Reduce::Min) {
    if (argacc != nullptr) {
      find_positions<VMODE, kH, kF>(lo, hi, col, values, x, kH, kF, acc, argacc);
    }
  }
}

// Dispatches to the register-blocked loop when it applies, else the plain one.
template <Reduce R, int VMODE, int64_t kH, int64_t kF, int kPrefetch, typename T, typename I>
inline void accumulate_any(int64_t lo, int64_t hi, const I* __restrict col,
                           const T* __restrict values, const T* __restrict x, int64_t H_rt,
                           int64_t F_rt, int64_t hi_bound, acc_t<T>* __restrict acc,
                           int64_t* __restrict argacc) {
  if constexpr (kVectorPath<R, VMODE, kH, kF, acc_t<T>>) {
    accumulate_vec<R, VMODE, kH, kF, kPrefetch>(lo, hi, col, values, x, hi_bound, acc, argacc);
  } else {
    accumulate<R, VMODE, kH, kF, kPrefetch>(lo, hi, col, values, x, H_rt, F_rt, hi_bound, acc,
                                            argacc);
  }
}

// The epilogue parameters of an SpMM launch.
inline Epilogue epilogue_of(const SpmmArgs& a) {
  Epilogue e;
  e.act = a.act;
  e.act_param = a.act_param;
  e.scale = a.scale;
  e.bias = a.bias;
  return e;
}

template <typename T, typename I, Reduce R, int VMODE, int64_t kH, int64_t kF, Act kAct,
          int kPrefetch>
void spmm_run(const SpmmArgs& a, const I* rowptr, const I* col, const T* values, const T* x,
              T* out, int64_t* arg) {
  using A = acc_t<T>;
  constexpr int64_t kHF = kH > 0 && kF > 0 ? kH * kF : -1;
  const int64_t rows = a.rows, H = size_or<kH>(a.heads), F = size_or<kF>(a.features);
  const int64_t HF = H * F;
  if (rows == 0) return;
  const int64_t nnz = rowptr[rows];
  // Extremum positions (for the gradient of max / min) only when the caller asked for them.
  const bool with_arg = (R == Reduce::Max || R == Reduce::Min) && arg != nullptr;
  // Whole rows go straight from registers to the output when there is nothing else to do
  // with them (no epilogue, no positions) and the output type is the accumulator type.
  constexpr bool kDirectPath = kVectorPath<R, VMODE, kH, kF, A> && std::is_same_v<T, A>;

  const Epilogue ep = epilogue_of(a);
  const bool epilogue = ep.active();
  const bool direct = kDirectPath && !with_arg && !epilogue;
  // Small problems are not worth waking threads for.
  const int64_t work = (rows + nnz) * std::max<int64_t>(HF, 1);
  int nt = std::max(1, a.num_threads);
  if (work < a.min_parallel_work) nt = 1;

  PartialRows<A> partials(nt, HF, with_arg);
  int parts_used = nt;

  // Row i of the (possibly decomposed) structure is output row orow(i).
  const int64_t* __restrict out_rows = a.out_rows;
  auto orow = [out_rows](int64_t i) { return out_rows != nullptr ? out_rows[i] : i; };
  auto finish = [&](int64_t i, int64_t degree, const A* acc, const int64_t* argacc) {
    if (epilogue) {
      write_row<R, kAct, true, kHF, T>(ep, orow(i), degree, acc, argacc, HF, out, arg);
    } else {
      write_row<R, kAct, false, kHF, T>(ep, orow(i), degree, acc, argacc, HF, out, arg);
    }
  };

#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    const int parts = omp_get_num_threads();
#pragma omp single
    parts_used = parts;
    std::vector<A> acc_vec(static_cast<size_t>(HF) + 16);
    std::vector<int64_t> argacc_vec(with_arg ? static_cast<size_t>(HF) : 0);
    A* __restrict acc = acc_vec.data();
    int64_t* __restrict argacc = with_arg ? argacc_vec.data() : nullptr;
    auto reset = [&] {
      for (int64_t f = 0; f < HF; ++f) acc[f] = reduce_identity<R, A>();
      if (with_arg) std::fill(argacc_vec.begin(), argacc_vec.end(), int64_t(-1));
    };

    // The row loop must compile as if written out here: always_inline, and the pointers the
    // entry loop reads captured by value (by reference they become addressable and are
    // reloaded after each row's output stores).
    auto visit = [&, col, values, x, out, out_rows](int64_t i, int64_t lo, int64_t hi,
                                                     int64_t piece_end, RowPart part)
        __attribute__((always_inline)) {
      if constexpr (kDirectPath) {
        if (direct && part == RowPart::Whole) {  // a whole row: straight into the output
          T* o = out + (out_rows != nullptr ? out_rows[i] : i) * HF;
          if (hi > lo) {
            const A mscale = R == Reduce::Mean ? A(1) / A(hi - lo) : A(1);
            accumulate_tiles<R, VMODE, kH, kF, kPrefetch, 0, true>(lo, hi, col, values, x,
                                                                   piece_end, o, mscale);
          } else {
            for (int64_t f = 0; f < kHF; ++f) o[f] = T(0);
          }
          return;
        }
      }
      reset();
      accumulate_any<R, VMODE, kH, kF, kPrefetch>(lo, hi, col, values, x, H, F, piece_end, acc,
                                                  argacc);
      if (part == RowPart::Whole) {
        finish(i, hi - lo, acc, argacc);
      } else {
        partials.save(t, part, i, acc, argacc);
      }
    };
    for_each_row_segment(t, parts, rowptr, rows, visit);
  }

  // Serial fix-up of the rows cut by piece boundaries.
  partials.fix_up(
      parts_used,
      [&](A* run, int64_t* run_arg, const A* other, const int64_t* other_arg) {
        combine<R, A>(run, run_arg, other, other_arg, HF);
      },
      [&](int64_t i, const A* acc, const int64_t* argacc) {
        finish(i, rowptr[i + 1] - rowptr[i], acc, argacc);
      });
}

}  // namespace sparsejit::cpu::detail
