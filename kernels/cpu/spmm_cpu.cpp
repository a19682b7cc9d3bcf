// Generic CPU SpMM: Y[i] = reduce_{p in row i} (a_p * X[col[p]]), merge-path partitioned.
//
// Each thread takes an equal piece of the merge path (row ends + stored entries). Rows that
// end inside a piece and start inside it are finished and written directly. A row cut by a
// piece boundary leaves partial results ("head": the end of a row that began in an earlier
// piece; "tail": the start of a row that ends in a later piece) that a short serial fix-up
// combines in order, so a single huge row is shared by all threads.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <vector>

#include "csrc/core/partition.h"
#include "kernels/cpu/kernels.h"

namespace sparsejit::cpu {

namespace {
std::atomic<int64_t> g_min_parallel_work{32768};
}  // namespace

int64_t min_parallel_work() { return g_min_parallel_work.load(std::memory_order_relaxed); }
void set_min_parallel_work(int64_t work) { g_min_parallel_work.store(work); }

namespace {

template <Reduce R, typename A>
constexpr A reduce_identity() {
  if constexpr (R == Reduce::Max) return -std::numeric_limits<A>::infinity();
  if constexpr (R == Reduce::Min) return std::numeric_limits<A>::infinity();
  return A(0);
}

// VMODE: 0 = no values (all ones), 1 = one value per entry, 2 = one value per entry and head.
template <Reduce R, int VMODE, typename T, typename I>
inline void accumulate(int64_t lo, int64_t hi, const I* __restrict col, const T* __restrict values,
                       const T* __restrict x, int64_t H, int64_t F, acc_t<T>* __restrict acc,
                       int64_t* __restrict argacc) {
  using A = acc_t<T>;
  const int64_t HF = H * F;
  for (int64_t p = lo; p < hi; ++p) {
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
        int64_t* __restrict gh = argacc + h * F;
        for (int64_t f = 0; f < F; ++f) {
          const A v = a * A(xh[f]);
          const bool better = (R == Reduce::Max) ? (v > ah[f]) : (v < ah[f]);
          ah[f] = better ? v : ah[f];
          gh[f] = better ? p : gh[f];
        }
      }
    }
  }
}

template <Reduce R, typename A>
inline void combine(A* __restrict acc, int64_t* __restrict argacc, const A* __restrict other,
                    const int64_t* __restrict other_arg, int64_t HF) {
  if constexpr (R == Reduce::Sum || R == Reduce::Mean) {
    for (int64_t f = 0; f < HF; ++f) acc[f] += other[f];
  } else {
    // `other` covers later positions: on ties the earlier position (already in acc) wins.
    for (int64_t f = 0; f < HF; ++f) {
      const bool better = (R == Reduce::Max) ? (other[f] > acc[f]) : (other[f] < acc[f]);
      if (better) {
        acc[f] = other[f];
        argacc[f] = other_arg[f];
      }
    }
  }
}

template <Reduce R, typename T>
inline void write_row(int64_t i, int64_t degree, const acc_t<T>* __restrict acc,
                      const int64_t* __restrict argacc, int64_t HF, T* __restrict out,
                      int64_t* __restrict arg) {
  using A = acc_t<T>;
  T* __restrict o = out + i * HF;
  if constexpr (R == Reduce::Sum) {
    for (int64_t f = 0; f < HF; ++f) o[f] = T(acc[f]);
  } else if constexpr (R == Reduce::Mean) {
    const A scale = degree > 0 ? A(1) / A(degree) : A(0);
    for (int64_t f = 0; f < HF; ++f) o[f] = T(acc[f] * scale);
  } else {
    int64_t* __restrict g = arg + i * HF;
    if (degree == 0) {
      for (int64_t f = 0; f < HF; ++f) {
        o[f] = T(0.0f);
        g[f] = -1;
      }
    } else {
      for (int64_t f = 0; f < HF; ++f) {
        o[f] = T(acc[f]);
        g[f] = argacc[f];
      }
    }
  }
}

struct Partial {
  int64_t row = -1;
  int64_t count = 0;
};

template <Reduce R, int VMODE, typename T, typename I>
void spmm_impl(const SpmmArgs& a, const I* rowptr, const I* col, const T* values, const T* x,
               T* out, int64_t* arg) {
  using A = acc_t<T>;
  const int64_t rows = a.rows, H = a.heads, F = a.features, HF = H * F;
  if (rows == 0) return;
  const int64_t nnz = rowptr[rows];
  constexpr bool kArg = (R == Reduce::Max || R == Reduce::Min);
  // Small problems are not worth waking threads for.
  const int64_t work = (rows + nnz) * std::max<int64_t>(HF, 1);
  int nt = std::max(1, a.num_threads);
  if (work < min_parallel_work()) nt = 1;

  std::vector<A> slot_acc(static_cast<size_t>(2 * nt * HF));
  std::vector<int64_t> slot_arg(kArg ? static_cast<size_t>(2 * nt * HF) : 0);
  std::vector<Partial> heads(nt), tails(nt);
  int parts_used = nt;

#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    const int parts = omp_get_num_threads();
#pragma omp single
    parts_used = parts;
    MergeCoord b, e;
    merge_path_piece(t, parts, rowptr, rows, &b, &e);
    std::vector<A> acc(static_cast<size_t>(HF));
    std::vector<int64_t> argacc(kArg ? static_cast<size_t>(HF) : 0);
    auto reset = [&] {
      std::fill(acc.begin(), acc.end(), reduce_identity<R, A>());
      if constexpr (kArg) std::fill(argacc.begin(), argacc.end(), int64_t(-1));
    };
    auto save = [&](Partial& slot, A* sacc, int64_t* sarg, int64_t row, int64_t count) {
      slot.row = row;
      slot.count = count;
      std::copy(acc.begin(), acc.end(), sacc);
      if constexpr (kArg) std::copy(argacc.begin(), argacc.end(), sarg);
    };
    A* head_acc = slot_acc.data() + (2 * t) * HF;
    A* tail_acc = slot_acc.data() + (2 * t + 1) * HF;
    int64_t* head_arg = kArg ? slot_arg.data() + (2 * t) * HF : nullptr;
    int64_t* tail_arg = kArg ? slot_arg.data() + (2 * t + 1) * HF : nullptr;

    for (int64_t i = b.row; i < e.row; ++i) {
      const int64_t start = rowptr[i], end = rowptr[i + 1];
      const int64_t lo = std::max<int64_t>(start, b.pos);
      reset();
      accumulate<R, VMODE, T, I>(lo, end, col, values, x, H, F, acc.data(), argacc.data());
      if (start < b.pos) {
        save(heads[t], head_acc, head_arg, i, end - lo);  // began in an earlier piece
      } else {
        write_row<R, T>(i, end - start, acc.data(), argacc.data(), HF, out, arg);
      }
    }
    if (e.row < rows) {
      const int64_t lo = std::max<int64_t>(rowptr[e.row], b.pos);
      if (e.pos > lo) {
        reset();
        accumulate<R, VMODE, T, I>(lo, e.pos, col, values, x, H, F, acc.data(), argacc.data());
        save(tails[t], tail_acc, tail_arg, e.row, e.pos - lo);
      }
    }
  }

  // Serial fix-up, in piece order: tails of a row are followed by the head that finishes it.
  std::vector<A> run(static_cast<size_t>(HF));
  std::vector<int64_t> run_arg(kArg ? static_cast<size_t>(HF) : 0);
  int64_t run_row = -1;
  for (int t = 0; t < parts_used; ++t) {
    const A* h_acc = slot_acc.data() + (2 * t) * HF;
    const int64_t* h_arg = kArg ? slot_arg.data() + (2 * t) * HF : nullptr;
    const A* t_acc = slot_acc.data() + (2 * t + 1) * HF;
    const int64_t* t_arg = kArg ? slot_arg.data() + (2 * t + 1) * HF : nullptr;
    if (heads[t].row >= 0) {
      const int64_t i = heads[t].row;
      if (run_row == i) {
        combine<R, A>(run.data(), run_arg.data(), h_acc, h_arg, HF);
      } else {
        std::copy(h_acc, h_acc + HF, run.begin());
        if constexpr (kArg) std::copy(h_arg, h_arg + HF, run_arg.begin());
      }
      write_row<R, T>(i, rowptr[i + 1] - rowptr[i], run.data(), run_arg.data(), HF, out, arg);
      run_row = -1;
    }
    if (tails[t].row >= 0) {
      if (run_row == tails[t].row) {
        combine<R, A>(run.data(), run_arg.data(), t_acc, t_arg, HF);
      } else {
        run_row = tails[t].row;
        std::copy(t_acc, t_acc + HF, run.begin());
        if constexpr (kArg) std::copy(t_arg, t_arg + HF, run_arg.begin());
      }
    }
  }
}

template <Reduce R, typename T, typename I>
void spmm_values_dispatch(const SpmmArgs& a, const I* rowptr, const I* col, const T* values,
                          const T* x, T* out, int64_t* arg) {
  if (values == nullptr || a.value_heads == 0) {
    spmm_impl<R, 0>(a, rowptr, col, values, x, out, arg);
  } else if (a.value_heads == 1) {
    spmm_impl<R, 1>(a, rowptr, col, values, x, out, arg);
  } else {
    spmm_impl<R, 2>(a, rowptr, col, values, x, out, arg);
  }
}

}  // namespace

template <typename T, typename I>
void spmm(const SpmmArgs& a, const I* rowptr, const I* col, const T* values, const T* x, T* out,
          int64_t* arg) {
  switch (a.reduce) {
    case Reduce::Sum: return spmm_values_dispatch<Reduce::Sum>(a, rowptr, col, values, x, out, arg);
    case Reduce::Mean: return spmm_values_dispatch<Reduce::Mean>(a, rowptr, col, values, x, out, arg);
    case Reduce::Max: return spmm_values_dispatch<Reduce::Max>(a, rowptr, col, values, x, out, arg);
    case Reduce::Min: return spmm_values_dispatch<Reduce::Min>(a, rowptr, col, values, x, out, arg);
  }
}

#define SPARSEJIT_INSTANTIATE_SPMM(T, I) \
  template void spmm<T, I>(const SpmmArgs&, const I*, const I*, const T*, const T*, T*, int64_t*);

SPARSEJIT_INSTANTIATE_SPMM(float, int32_t)
SPARSEJIT_INSTANTIATE_SPMM(float, int64_t)
SPARSEJIT_INSTANTIATE_SPMM(double, int32_t)
SPARSEJIT_INSTANTIATE_SPMM(double, int64_t)
SPARSEJIT_INSTANTIATE_SPMM(bf16, int32_t)
SPARSEJIT_INSTANTIATE_SPMM(bf16, int64_t)

}  // namespace sparsejit::cpu
