#include "torch_ext/validated.h"

#include <map>
#include <memory>
#include <string>

#include <mutex>
#include <optional>
#include <vector>

#include "csrc/core/csr.h"
#include "csrc/spmm/spmm_plan.h"
#include "csrc/spmm/spmm_run.h"
#include "torch_ext/common.h"

namespace sparsejit {
namespace {


struct Entry {
  TensorState a, b;
  int64_t param = 0;
  plan::StructureStamp stamp;
};

// A few dozen live structures cover real programs (a model has a handful of graphs). On the
// stable ABI an entry holds its tensors alive (validated.h): fewer entries bound what a
// mini-batch loop (a new structure every step) keeps after its steps are done.
#ifdef SPARSEJIT_STABLE_ABI
constexpr size_t kMaxEntries = 16;
#else
constexpr size_t kMaxEntries = 64;
#endif

class Table {
 public:
  bool find(const tx::Tensor& a, const tx::Tensor* b, int64_t param, plan::StructureStamp* out) {
    std::lock_guard<std::mutex> g(mu_);
    for (size_t i = 0; i < entries_.size(); ++i) {
      Entry& e = entries_[i];
      if (e.param == param && e.a.matches(a) && (b == nullptr || e.b.matches(*b))) {
        if (out) *out = e.stamp;
        if (i > 0) std::swap(entries_[i], entries_[i - 1]);  // move toward the front
        return true;
      }
    }
    return false;
  }
  void add(const tx::Tensor& a, const tx::Tensor* b, int64_t param,
           const plan::StructureStamp& stamp) {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<Entry> kept;
    kept.reserve(entries_.size() + 1);
    Entry e{TensorState::of(a), b ? TensorState::of(*b) : TensorState{}, param, stamp};
    kept.push_back(std::move(e));
    for (auto& old : entries_) {
      if (kept.size() >= kMaxEntries) break;
      if (!old.a.expired()) kept.push_back(std::move(old));
    }
    entries_.swap(kept);
  }

 private:
  std::mutex mu_;
  std::vector<Entry> entries_;
};

Table& structures() {
  static Table t;
  return t;
}
Table& bucketed_plans() {
  static Table t;
  return t;
}

// Entries of several tensors each (validated_once), most recent first.
class MultiTable {
 public:
  bool find(const std::vector<tx::Tensor>& ts, int64_t param,
            std::shared_ptr<const void>* payload = nullptr) {
    std::lock_guard<std::mutex> g(mu_);
    for (size_t i = 0; i < entries_.size(); ++i) {
      const auto& e = entries_[i];
      if (e.param != param || e.states.size() != ts.size()) continue;
      bool all = true;
      for (size_t k = 0; k < ts.size() && all; ++k) all = e.states[k].matches(ts[k]);
      if (all) {
        if (payload) *payload = e.payload;
        if (i > 0) std::swap(entries_[i], entries_[i - 1]);
        return true;
      }
    }
    return false;
  }
  void add(const std::vector<tx::Tensor>& ts, int64_t param,
           std::shared_ptr<const void> payload = nullptr) {
    std::lock_guard<std::mutex> g(mu_);
    MultiEntry e;
    e.param = param;
    e.payload = std::move(payload);
    for (const auto& t : ts) e.states.push_back(TensorState::of(t));
    std::vector<MultiEntry> kept;
    kept.push_back(std::move(e));
    for (auto& old : entries_) {
      if (kept.size() >= kMaxEntries) break;
      bool live = true;
      for (const auto& st : old.states) live = live && !st.expired();
      if (live) kept.push_back(std::move(old));
    }
    entries_.swap(kept);
  }

 private:
  struct MultiEntry {
    std::vector<TensorState> states;
    int64_t param = 0;
    std::shared_ptr<const void> payload;  // derived_once's result
  };
  std::mutex mu_;
  std::vector<MultiEntry> entries_;
};

}  // namespace

namespace {
MultiTable& multi_table(const std::string& family) {
  static std::mutex mu;
  static std::map<std::string, MultiTable>* tables = new std::map<std::string, MultiTable>();
  std::lock_guard<std::mutex> g(mu);
  return (*tables)[family];
}
}  // namespace

std::shared_ptr<const void> derived_once(
    const char* family, const std::vector<tx::Tensor>& tensors, int64_t param,
    const std::function<std::shared_ptr<const void>()>& build) {
  MultiTable& table = multi_table(std::string("derived:") + family);
  bool track = true;
  for (const auto& t : tensors) track = track && TensorState::trackable(t);
  std::shared_ptr<const void> hit;
  if (track && table.find(tensors, param, &hit)) return hit;
  auto made = build();
  if (track) table.add(tensors, param, made);
  return made;
}

void validated_once(const char* family, const std::vector<tx::Tensor>& tensors, int64_t param,
                    const std::function<void()>& validate) {
  MultiTable* table = &multi_table(family);
  bool track = true;
  for (const auto& t : tensors) track = track && TensorState::trackable(t);
  if (track && table->find(tensors, param)) return;
  validate();
  if (track) table->add(tensors, param);
}

plan::StructureStamp checked_structure(const tx::Tensor& rowptr, const tx::Tensor& col,
                                       int64_t num_cols, const char* op) {
  SJ_CHECK_VALUE(num_cols >= 0, "sparsejit.", op, ": num_cols must be >= 0; got ", num_cols);
  const bool track = TensorState::trackable(rowptr) && TensorState::trackable(col);
  plan::StructureStamp stamp;
  if (track && structures().find(rowptr, &col, num_cols, &stamp)) return stamp;
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
  stamp = plan::stamp_of(index, rp.data_ptr(), cl.data_ptr(), rows, num_cols);
  if (track) structures().add(rowptr, &col, num_cols, stamp);
  return stamp;
}

void checked_bucketed_plan(const tx::Tensor& plan_tensor, const tx::Tensor& words,
                           const plan::StructureStamp& stamp) {
  const bool track = TensorState::trackable(plan_tensor);
  if (track && bucketed_plans().find(plan_tensor, nullptr, stamp.hash, nullptr)) return;
  plan::SpmmPlan p;
  std::string err;
  SJ_CHECK_VALUE(plan::decode(words.data_ptr<int64_t>(), words.numel(), stamp, &p, &err),
                    "sparsejit.spmm: plan: ", err);
  if (p.kernel != plan::Kernel::Bucketed) return;
  SJ_CHECK_VALUE(plan::validate_bucketed_arrays(p, stamp, &err), "sparsejit.spmm: plan: ",
                    err);
  if (track) bucketed_plans().add(plan_tensor, nullptr, stamp.hash, stamp);
}

}  // namespace sparsejit
