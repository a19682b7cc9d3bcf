// An exception must not leave an OpenMP parallel region (std::terminate): the work inside
// one runs through guard(), which keeps the first exception thrown, and the caller rethrows
// it after the region. Shared by the parallel passes of csrc/rgms, csrc/point_conv and csrc/dense.
#pragma once

#include <exception>
#include <mutex>
#include <utility>

namespace sparsejit {

struct FirstError {
  std::exception_ptr error;
  std::mutex mutex;

  template <typename Fn>
  void guard(Fn&& fn) {
    try {
      std::forward<Fn>(fn)();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!error) error = std::current_exception();
    }
  }
  void rethrow() {
    if (error) std::rethrow_exception(error);
  }
};

}  // namespace sparsejit
