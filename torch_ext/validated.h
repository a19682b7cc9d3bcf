// Validation of raw op inputs that is done once per tensor contents, not once per call.
//
// A raw op cannot trust its index arrays (a wrong column reads outside X), but checking every
// column costs O(nnz) per call. So the first call with given tensors validates them fully
// (csrc/core/csr.h: every invariant, errors naming position and value) and records the result
// (a structure's stamp, a family's derived data) in one process-wide table of entries keyed by
// the tensors' states and a few integers; later calls with the same live tensors at the same
// versions find it. A tensor modified in place bumps its version and is validated again.
// Writes that bypass PyTorch's version counter (through .numpy() or a raw data pointer) are not
// seen, as for autograd's own checks. Inference tensors have no version counter: they are
// validated on every call.
//
// What an entry keeps alive: on the ATen backend nothing (weak references). On the stable ABI
// (no weak references) its tensors: an entry whose tensors a live sparsejit object owns
// (csrc/core/owned.h: Python registers a structure's arrays while it lives) stays until that
// object dies and is dropped then; any other entry (a raw call with the caller's tensors, a
// graph torch.compile builds on every call) is kept within an eighth of the cache budget
// (SPARSEJIT_CACHE_BYTES), least recently used first out. sparsejit.clear_caches() empties the
// table; `python -m sparsejit.info` shows it.
#pragma once

#include "torch_ext/tensor_api.h"

#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <vector>

#include "csrc/plan/plan_header.h"

namespace sparsejit {

#ifndef SPARSEJIT_STABLE_ABI
// One tensor as it was when validated: the same TensorImpl (weakly held), data, size and
// version mean the same contents.
using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

struct TensorState {  // shared by the validation tables here and filter_conv's setup cache
  std::optional<WeakImpl> impl;
  const void* data = nullptr;
  int64_t numel = -1;
  uint32_t version = 0;

  static bool trackable(const tx::Tensor& t) { return !t.is_inference(); }
  static TensorState of(const tx::Tensor& t) {
    TensorState s;
    s.impl.emplace(t.getIntrusivePtr());
    s.data = t.data_ptr();
    s.numel = t.numel();
    s.version = t._version();
    return s;
  }
  bool matches(const tx::Tensor& t) const {
    if (!impl) return false;
    const auto live = impl->lock();
    return live.get() == t.unsafeGetTensorImpl() && data == t.data_ptr() &&
           numel == t.numel() && version == t._version();
  }
  bool expired() const { return !impl || impl->expired(); }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(data); }
  int64_t held_bytes() const { return 0; }  // a weak reference keeps nothing alive
};
#else
// The stable ABI has no TensorImpl identity, weak reference or version counter: the state
// holds a strong reference (so the memory at `data` cannot be freed and reused while the
// entry lives: a tensor with the same data, sizes, strides and dtype then reads the same
// elements), and the version comes from aten::_version through the dispatcher (a view
// shares its base's counter). Entries keep their tensors alive until they leave the table
// (most-recent-first, bounded): the price of having no weak reference. An inference tensor
// (no version counter) gives an empty state, which never matches: validated on every call.
// Cost on a hit: one dispatcher call (the version) per tensor, after the cheap comparisons.
struct TensorState {
  std::optional<tx::Tensor> held;
  const void* data = nullptr;
  std::vector<int64_t> sizes, strides;
  tx::ScalarType dtype = tx::kFloat;
  int64_t version = 0;

  static bool trackable(const tx::Tensor&) { return true; }  // decided by of()
  static TensorState of(const tx::Tensor& t) {
    TensorState s;
    if (t.is_inference() || !tx::try_version(t, &s.version)) return s;
    s.held = t;
    s.data = t.data_ptr();
    s.sizes.assign(t.sizes().begin(), t.sizes().end());
    s.strides.assign(t.strides().begin(), t.strides().end());
    s.dtype = t.scalar_type();
    return s;
  }
  bool matches(const tx::Tensor& t) const {
    if (!held || data != t.data_ptr() || dtype != t.scalar_type()) return false;
    const auto sz = t.sizes(), st = t.strides();
    if (sz.size() != sizes.size()) return false;
    for (size_t i = 0; i < sizes.size(); ++i)
      if (sz[i] != sizes[i] || st[i] != strides[i]) return false;
    int64_t v = 0;
    return tx::try_version(t, &v) && v == version;
  }
  bool expired() const { return !held; }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(data); }
  int64_t held_bytes() const { return held ? static_cast<int64_t>(held->nbytes()) : 0; }
};
#endif


// The once-per-live-tensors table (one for every family, keyed by `family`, a string
// literal). find() returns the payload stored for these tensors at their current versions
// and this key, or null; add() stores one (`payload_bytes`: what the payload holds, an
// estimate). Inference tensors are never stored (found never).
std::shared_ptr<const void> once_find(const char* family, std::initializer_list<const tx::Tensor*> tensors,
                                      std::initializer_list<int64_t> key);
void once_add(const char* family, std::initializer_list<const tx::Tensor*> tensors,
              std::initializer_list<int64_t> key, std::shared_ptr<const void> payload,
              int64_t payload_bytes);
// Vector-keyed forms (filter_conv's geometry).
std::shared_ptr<const void> once_find(const char* family, std::initializer_list<const tx::Tensor*> tensors,
                                      const std::vector<int64_t>& key);
void once_add(const char* family, std::initializer_list<const tx::Tensor*> tensors,
              const std::vector<int64_t>& key, std::shared_ptr<const void> payload,
              int64_t payload_bytes);

// Validates (rowptr, col) against num_cols (once per live tensor version) and returns the
// structure's stamp. Raises ValueError naming `op` and the first bad position.
plan::StructureStamp checked_structure(const tx::Tensor& rowptr, const tx::Tensor& col,
                                       int64_t num_cols, const char* op);

// Validates the arrays of a bucketed plan tensor for `stamp` once per live tensor version
// (O(rows + nnz)). `words` is the plan's CPU, contiguous copy (the same tensor when the plan
// already was one).
void checked_bucketed_plan(const tx::Tensor& plan, const tx::Tensor& words,
                           const plan::StructureStamp& stamp);

// Runs `validate` (which throws on bad input) unless the same live tensor, at the same
// version, already passed it with the same `param`: the once-per-structure check for op
// families whose plan is one tensor (RGMS).
void validated_once(const char* family, const tx::Tensor& tensor, int64_t param,
                    const std::function<void()>& validate);

// Structure-derived data computed once per live tensor (same rule as validated_once): the
// result of `build` (the data and the bytes it holds) for this tensor at this version and
// `param`, built on first use. For derived indexes that only a raw op needs and that are cheap
// enough to rebuild after torch.save.
struct Derived {
  std::shared_ptr<const void> data;
  int64_t bytes = 0;
};
std::shared_ptr<const void> derived_once(const char* family, const tx::Tensor& tensor,
                                         int64_t param, const std::function<Derived()>& build);

}  // namespace sparsejit
