#include "csrc/core/owned.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

namespace sparsejit::owned {
namespace {

struct Registry {
  std::mutex mu;
  std::unordered_map<uintptr_t, int64_t> counts;
  std::vector<Listener> listeners;
  std::vector<std::function<std::vector<TableStats>()>> stats;
  std::vector<std::function<void()>> clears;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: finalizers may run at exit
  return *r;
}

int64_t env_budget() {
  const char* v = std::getenv("SPARSEJIT_CACHE_BYTES");
  if (v != nullptr && *v != '\0') {
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    if (end != v && *end == '\0' && n >= 0) return n;
  }
  // An eighth of the physical memory, at least 512 MiB.
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const int64_t eighth = pages > 0 && page > 0 ? int64_t(pages) * page / 8 : 0;
  return std::max<int64_t>(eighth, int64_t{512} << 20);
}

std::atomic<int64_t>& budget() {
  static std::atomic<int64_t> b{env_budget()};
  return b;
}

}  // namespace

void own(const std::vector<uintptr_t>& addresses) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  for (uintptr_t a : addresses)
    if (a != 0) ++r.counts[a];
}

void disown(const std::vector<uintptr_t>& addresses) {
  Registry& r = registry();
  std::vector<uintptr_t> released;
  std::vector<Listener> listeners;
  {
    std::lock_guard<std::mutex> g(r.mu);
    for (uintptr_t a : addresses) {
      auto it = r.counts.find(a);
      if (it == r.counts.end()) continue;
      if (--it->second <= 0) {
        r.counts.erase(it);
        released.push_back(a);
      }
    }
    if (released.empty()) return;
    listeners = r.listeners;
  }
  for (const auto& l : listeners) l(released);
}

bool is_owned(const void* address) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  return r.counts.count(reinterpret_cast<uintptr_t>(address)) != 0;
}

int64_t owned_count() {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  return static_cast<int64_t>(r.counts.size());
}

void add_release_listener(Listener listener) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  r.listeners.push_back(std::move(listener));
}

void add_table_hooks(std::function<std::vector<TableStats>()> stats, std::function<void()> clear) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  r.stats.push_back(std::move(stats));
  r.clears.push_back(std::move(clear));
}

std::vector<TableStats> table_stats() {
  std::vector<std::function<std::vector<TableStats>()>> hooks;
  {
    std::lock_guard<std::mutex> g(registry().mu);
    hooks = registry().stats;
  }
  std::vector<TableStats> out;
  for (const auto& h : hooks)
    for (auto& s : h()) out.push_back(std::move(s));
  return out;
}

void clear_tables() {
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard<std::mutex> g(registry().mu);
    hooks = registry().clears;
  }
  for (const auto& h : hooks) h();
}

int64_t cache_budget_bytes() { return budget().load(std::memory_order_relaxed); }

void set_cache_budget_bytes(int64_t bytes) {
  budget().store(bytes < 0 ? env_budget() : bytes, std::memory_order_relaxed);
}

}  // namespace sparsejit::owned
