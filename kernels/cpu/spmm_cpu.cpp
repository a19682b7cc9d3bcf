// The precompiled generic SpMM: the loop nest of spmm_kernel.h with run-time sizes and
// activation, prefetching gathered rows 16 entries ahead. Used when the JIT is off, unavailable, or not worth it for a problem.
#include <atomic>
#include <stdexcept>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/spmm_kernel.h"

namespace sparsejit::cpu {

namespace {
std::atomic<int64_t> g_min_parallel_work{32768};

template <Reduce R, typename T, typename I>
void spmm_values_dispatch(const SpmmArgs& a, const I* rowptr, const I* col, const T* values,
                          const T* x, T* out, int64_t* arg) {
  using detail::spmm_run;
  if (values == nullptr || a.value_heads == 0) {
    spmm_run<T, I, R, 0, -1, -1, Act::Runtime, 16>(a, rowptr, col, values, x, out, arg);
  } else if (a.value_heads == 1) {
    spmm_run<T, I, R, 1, -1, -1, Act::Runtime, 16>(a, rowptr, col, values, x, out, arg);
  } else {
    spmm_run<T, I, R, 2, -1, -1, Act::Runtime, 16>(a, rowptr, col, values, x, out, arg);
  }
}

}  // namespace

int64_t min_parallel_work() { return g_min_parallel_work.load(std::memory_order_relaxed); }
void set_min_parallel_work(int64_t work) { g_min_parallel_work.store(work); }

template <typename T, typename I>
void spmm(const SpmmArgs& a, const I* rowptr, const I* col, const T* values, const T* x, T* out,
          int64_t* arg) {
  // Enum values are checked here, once per call: activate() runs per element inside the
  // parallel region, where nothing may throw.
  if (a.act == Act::Runtime)
    throw std::invalid_argument("SpmmArgs::act must name an activation, not Act::Runtime");
  act_name(a.act);  // throws std::invalid_argument naming an unknown value
  switch (a.reduce) {
    case Reduce::Sum: return spmm_values_dispatch<Reduce::Sum>(a, rowptr, col, values, x, out, arg);
    case Reduce::Mean: return spmm_values_dispatch<Reduce::Mean>(a, rowptr, col, values, x, out, arg);
    case Reduce::Max: return spmm_values_dispatch<Reduce::Max>(a, rowptr, col, values, x, out, arg);
    case Reduce::Min: return spmm_values_dispatch<Reduce::Min>(a, rowptr, col, values, x, out, arg);
    default: sparsejit::detail::bad_enum("reduce", static_cast<int>(a.reduce));
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
