#include "csrc/core/huge_pages.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace sparsejit {
namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kDefaultMiB = 4;  // two huge pages: one lies inside any such buffer

// "always [madvise] never": advice is honoured unless the bracketed mode is "never".
bool os_allows_thp() {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  if (!f || !std::getline(f, s)) return false;
  return s.find("[never]") == std::string::npos;
#else
  return false;
#endif
}

std::size_t compute_threshold() {
  std::size_t mib = kDefaultMiB;
  if (const char* v = std::getenv("SPARSEJIT_HUGE_PAGES")) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (end != v && *end == '\0') mib = static_cast<std::size_t>(n);  // else: default
  }
  if (mib == 0 || !os_allows_thp()) return 0;
  return mib << 20;
}

std::atomic<std::size_t>& threshold_slot() {
  static std::atomic<std::size_t> t{compute_threshold()};
  return t;
}

#if defined(__linux__) && defined(MADV_HUGEPAGE)
// Advises the huge pages of [lo, hi) (2 MiB-aligned) none of whose base pages is resident yet;
// returns whether it advised any. Where mincore fails, advises the whole range.
bool advise_fresh(std::uintptr_t lo, std::uintptr_t hi) {
  static const std::size_t page = [] {
    const long p = sysconf(_SC_PAGESIZE);
    return p > 0 && kHugePage % static_cast<std::size_t>(p) == 0 ? static_cast<std::size_t>(p)
                                                                   : std::size_t{4096};
  }();
  const std::size_t per_huge = kHugePage / page;
  thread_local std::vector<unsigned char> resident;
  resident.resize((hi - lo) / page);
  if (mincore(reinterpret_cast<void*>(lo), hi - lo, resident.data()) != 0)
    return madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE) == 0;
  bool any = false;
  std::size_t run = 0;  // fresh huge pages ending at the current one
  const std::size_t n = (hi - lo) / kHugePage;
  for (std::size_t h = 0; h <= n; ++h) {
    bool fresh = h < n;
    for (std::size_t i = h * per_huge; fresh && i < (h + 1) * per_huge; ++i)
      fresh = (resident[i] & 1) == 0;
    if (fresh) {
      ++run;
    } else if (run > 0) {
      const std::uintptr_t a = lo + (h - run) * kHugePage;
      any |= madvise(reinterpret_cast<void*>(a), run * kHugePage, MADV_HUGEPAGE) == 0;
      run = 0;
    }
  }
  return any;
}
#endif

}  // namespace

std::size_t huge_page_threshold() { return threshold_slot().load(std::memory_order_relaxed); }

std::size_t set_huge_page_threshold(std::size_t bytes) {
  if (bytes != 0 && !os_allows_thp()) bytes = 0;
  return threshold_slot().exchange(bytes, std::memory_order_relaxed);
}

bool advise_huge_pages(void* p, std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const std::size_t t = huge_page_threshold();
  if (t == 0 || bytes < t || p == nullptr) return false;
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t lo = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const std::uintptr_t hi = (begin + bytes) & ~(kHugePage - 1);
  if (hi <= lo) return false;
  return advise_fresh(lo, hi);
#else
  (void)p;
  (void)bytes;
  return false;
#endif
}

}  // namespace sparsejit
