#include "torch_ext/validated.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "csrc/core/csr.h"
#include "csrc/core/owned.h"
#include "csrc/spmm/spmm_plan.h"
#include "csrc/spmm/spmm_run.h"
#include "torch_ext/common.h"

namespace sparsejit {
namespace {

// Entries per family: a lookup scans them (most recently found first), so a program holding
// thousands of live structures revalidates the least recently used instead of scanning them.
constexpr size_t kMaxEntriesPerFamily = 256;

struct Entry {
  std::vector<TensorState> states;
  std::vector<int64_t> key;
  std::shared_ptr<const void> payload;
  int64_t bytes = 0;   // the payload's estimate plus the tensors the states hold
  bool owned = false;  // every tensor owned by a live sparsejit object when it was added
                       // (csrc/core/owned.h; the owner's death removes the entry)
  uint64_t last_use = 0;

  bool expired() const {
    for (const auto& s : states)
      if (s.expired()) return true;
    return false;
  }
};

// Every family's entries under one lock: the critical sections are a short scan.
class OnceTable {
 public:
  OnceTable() {
    owned::add_release_listener([this](const std::vector<uintptr_t>& a) { release(a); });
    owned::add_table_hooks([this] { return stats(); }, [this] { clear(); });
  }

  template <typename Key>
  std::shared_ptr<const void> find(const char* family,
                                   std::initializer_list<const tx::Tensor*> ts, const Key& key) {
    for (const tx::Tensor* t : ts)
      if (!TensorState::trackable(*t)) return nullptr;
    std::lock_guard<std::mutex> g(mu_);
    auto it = families_.find(family);
    if (it == families_.end()) return nullptr;
    std::vector<Entry>& es = it->second;
    for (size_t i = 0; i < es.size(); ++i) {
      if (!same(es[i], ts, key)) continue;
      es[i].last_use = ++tick_;
      size_t at = i;
      if (i > 0) std::swap(es[i], es[--at]);  // toward the front
      return es[at].payload ? es[at].payload : found_marker();
    }
    return nullptr;
  }

  template <typename Key>
  void add(const char* family, std::initializer_list<const tx::Tensor*> ts, const Key& key,
           std::shared_ptr<const void> payload, int64_t payload_bytes) {
    Entry e;
    for (const tx::Tensor* t : ts) {
      if (!TensorState::trackable(*t)) return;
      e.states.push_back(TensorState::of(*t));
      if (e.states.back().expired()) return;  // not trackable (inference tensor): not stored
    }
    e.key.assign(key.begin(), key.end());
    e.payload = std::move(payload);
    e.bytes = payload_bytes;
    e.owned = true;
    for (const auto& st : e.states) {
      e.bytes += st.held_bytes();
      e.owned = e.owned && owned::is_owned(reinterpret_cast<const void*>(st.address()));
    }
    std::vector<Entry> dropped;  // destroyed after the lock is released
    {
      std::lock_guard<std::mutex> g(mu_);
      std::vector<Entry>& es = families_[family];
      for (auto& old : es)
        if (old.expired()) dropped.push_back(std::move(old));
      es.erase(std::remove_if(es.begin(), es.end(), [](const Entry& x) { return x.expired(); }),
               es.end());
      e.last_use = ++tick_;
      es.insert(es.begin(), std::move(e));
      if (es.size() > kMaxEntriesPerFamily) {
        dropped.push_back(std::move(es.back()));
        es.pop_back();
      }
      evict_unowned(&dropped);
    }
  }

  void release(const std::vector<uintptr_t>& addresses) {
    const std::unordered_set<uintptr_t> gone(addresses.begin(), addresses.end());
    std::vector<Entry> dropped;
    std::lock_guard<std::mutex> g(mu_);
    for (auto& [name, es] : families_) {
      auto keep = std::stable_partition(es.begin(), es.end(), [&](const Entry& e) {
        for (const auto& s : e.states)
          if (gone.count(s.address())) return false;
        return true;
      });
      for (auto it = keep; it != es.end(); ++it) dropped.push_back(std::move(*it));
      es.erase(keep, es.end());
    }
    // `dropped` releases its tensors after the lock (declared before it).
  }

  void clear() {
    std::map<std::string, std::vector<Entry>, std::less<>> dropped;
    std::lock_guard<std::mutex> g(mu_);
    dropped.swap(families_);
  }

  std::vector<owned::TableStats> stats() {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<owned::TableStats> out;
    for (const auto& [name, es] : families_) {
      owned::TableStats s;
      s.name = "ops.validated:" + name;
      for (const auto& e : es) {
        ++s.entries;
        s.owned += e.owned ? 1 : 0;
        s.bytes += e.bytes;
      }
      out.push_back(std::move(s));
    }
    return out;
  }

 private:
  static bool same_key(const Entry& e, const std::initializer_list<int64_t>& key) {
    return e.key.size() == key.size() &&
           std::equal(key.begin(), key.end(), e.key.begin());
  }
  static bool same_key(const Entry& e, const std::vector<int64_t>& key) { return e.key == key; }

  template <typename Key>
  static bool same(const Entry& e, std::initializer_list<const tx::Tensor*> ts, const Key& key) {
    if (e.states.size() != ts.size() || !same_key(e, key)) return false;
    size_t k = 0;
    for (const tx::Tensor* t : ts)
      if (!e.states[k++].matches(*t)) return false;
    return true;
  }

  // Entries whose tensors no live object owns are kept within the unowned budget, least
  // recently used out first (the newest entry too, when it alone is over).
  void evict_unowned(std::vector<Entry>* dropped) {
    const int64_t budget = owned::unowned_budget_bytes();
    int64_t total = 0;
    for (const auto& [name, es] : families_)
      for (const auto& e : es)
        if (!e.owned) total += e.bytes;
    while (total > budget) {
      std::vector<Entry>* home = nullptr;
      size_t at = 0;
      uint64_t oldest = ~uint64_t{0};
      for (auto& [name, es] : families_)
        for (size_t i = 0; i < es.size(); ++i)
          if (es[i].last_use < oldest && es[i].bytes > 0 && !es[i].owned) {
            oldest = es[i].last_use;
            home = &es;
            at = i;
          }
      if (home == nullptr) break;
      total -= (*home)[at].bytes;
      dropped->push_back(std::move((*home)[at]));
      home->erase(home->begin() + static_cast<std::ptrdiff_t>(at));
    }
  }

  // What find() returns for an entry without a payload (a validation that passed).
  static const std::shared_ptr<const void>& found_marker() {
    static const std::shared_ptr<const void> marker = std::make_shared<int>(0);
    return marker;
  }
  std::mutex mu_;
  uint64_t tick_ = 0;
  std::map<std::string, std::vector<Entry>, std::less<>> families_;
};

OnceTable& table() {
  static OnceTable* t = new OnceTable();  // never destroyed: finalizers may run at exit
  return *t;
}

// A stamp as a payload.
std::shared_ptr<const void> stamp_payload(const plan::StructureStamp& s) {
  return std::make_shared<plan::StructureStamp>(s);
}

}  // namespace

std::shared_ptr<const void> once_find(const char* family,
                                      std::initializer_list<const tx::Tensor*> tensors,
                                      std::initializer_list<int64_t> key) {
  return table().find(family, tensors, key);
}
void once_add(const char* family, std::initializer_list<const tx::Tensor*> tensors,
              std::initializer_list<int64_t> key, std::shared_ptr<const void> payload,
              int64_t payload_bytes) {
  table().add(family, tensors, key, std::move(payload), payload_bytes);
}
std::shared_ptr<const void> once_find(const char* family,
                                      std::initializer_list<const tx::Tensor*> tensors,
                                      const std::vector<int64_t>& key) {
  return table().find(family, tensors, key);
}
void once_add(const char* family, std::initializer_list<const tx::Tensor*> tensors,
              const std::vector<int64_t>& key, std::shared_ptr<const void> payload,
              int64_t payload_bytes) {
  table().add(family, tensors, key, std::move(payload), payload_bytes);
}

std::shared_ptr<const void> derived_once(const char* family, const tx::Tensor& tensor,
                                         int64_t param, const std::function<Derived()>& build) {
  if (auto hit = table().find(family, {&tensor}, std::initializer_list<int64_t>{param}))
    return hit;
  Derived made = build();
  table().add(family, {&tensor}, std::initializer_list<int64_t>{param}, made.data, made.bytes);
  return made.data;
}

void validated_once(const char* family, const tx::Tensor& tensor, int64_t param,
                    const std::function<void()>& validate) {
  if (table().find(family, {&tensor}, std::initializer_list<int64_t>{param})) return;
  validate();
  table().add(family, {&tensor}, std::initializer_list<int64_t>{param}, nullptr, 0);
}

plan::StructureStamp checked_structure(const tx::Tensor& rowptr, const tx::Tensor& col,
                                       int64_t num_cols, const char* op) {
  SJ_CHECK_VALUE(num_cols >= 0, "sparsejit.", op, ": num_cols must be >= 0; got ", num_cols);
  if (auto hit = table().find("structure", {&rowptr, &col}, std::initializer_list<int64_t>{num_cols}))
    return *std::static_pointer_cast<const plan::StructureStamp>(hit);
  const tx::Tensor rp = rowptr.to(tx::kCPU).contiguous();
  const tx::Tensor cl = col.to(tx::kCPU).contiguous();
  const int64_t rows = rp.numel() - 1;
  const IndexKind index = index_kind(rp);
  ValidationResult r;
  if (index == IndexKind::I32) {
    r = validate_csr<int32_t>(ptr<int32_t>(rp), rp.numel(), ptr<int32_t>(cl), cl.numel(),
                              num_cols);
  } else {
    r = validate_csr<int64_t>(ptr<int64_t>(rp), rp.numel(), ptr<int64_t>(cl), cl.numel(),
                              num_cols);
  }
  SJ_CHECK_VALUE(r.ok, "sparsejit.", op, ": invalid CSR structure: ", r.message);
  const plan::StructureStamp stamp =
      plan::stamp_of(index, rp.data_ptr(), cl.data_ptr(), rows, num_cols);
  table().add("structure", {&rowptr, &col}, std::initializer_list<int64_t>{num_cols},
              stamp_payload(stamp), sizeof(stamp));
  return stamp;
}

void checked_bucketed_plan(const tx::Tensor& plan_tensor, const tx::Tensor& words,
                           const plan::StructureStamp& stamp) {
  const auto key = std::initializer_list<int64_t>{static_cast<int64_t>(stamp.hash)};
  if (table().find("bucketed_plan", {&plan_tensor}, key)) return;
  plan::SpmmPlan p;
  std::string err;
  SJ_CHECK_VALUE(plan::decode(words.data_ptr<int64_t>(), words.numel(), stamp, &p, &err),
                    "sparsejit.spmm: plan: ", err);
  if (p.kernel != plan::Kernel::Bucketed) return;
  SJ_CHECK_VALUE(plan::validate_bucketed_arrays(p, stamp, &err), "sparsejit.spmm: plan: ",
                    err);
  table().add("bucketed_plan", {&plan_tensor}, key, nullptr, 0);
}

}  // namespace sparsejit
