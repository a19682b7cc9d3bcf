// Which index arrays a live sparsejit object owns, and the one byte budget of structure caches.
//
// The op library validates a structure once per live tensor set (torch_ext/validated.h). On
// PyTorch's stable ABI it has no weak references, so a table entry holds its tensors alive.
// Python objects that own index arrays (a SparseMatrix's structure, a TypedSparseMatrix's
// plan, a PrunedConv2d's buffers) register the arrays' data addresses here while they live
// and release them when they die (a weakref finalizer). An entry whose tensors are all owned
// is kept for as long as its owner lives: its strong references add nothing to what the owner
// holds, and the release drops it at once. Entries for other tensors (raw op calls, graphs
// that torch.compile builds on every call) are kept within unowned_budget_bytes(), least
// recently used first out.
//
// The budget (SPARSEJIT_CACHE_BYTES; default an eighth of the physical memory, at least
// 512 MiB; sparsejit.set_cache_budget) bounds the Python caches of built structures too
// (python/sparsejit/runtime/caches.py), whose window for first-seen structures has the same
// bound as the unowned entries here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace sparsejit::owned {

// Registers data addresses as owned (counted: the same address may be owned twice).
void own(const std::vector<uintptr_t>& addresses);
// Releases them; each address whose count drops to zero is passed to the release listeners
// (tables drop their entries for it).
void disown(const std::vector<uintptr_t>& addresses);
bool is_owned(const void* address);
int64_t owned_count();

// Called (outside the registry's lock) with the addresses no longer owned.
using Listener = std::function<void(const std::vector<uintptr_t>&)>;
void add_release_listener(Listener listener);

// The op library's tables report to and are cleared through these hooks, so the Torch-free
// Python module (_core) can show and empty them.
struct TableStats {
  std::string name;
  int64_t entries = 0, owned = 0, bytes = 0;
};
void add_table_hooks(std::function<std::vector<TableStats>()> stats, std::function<void()> clear);
std::vector<TableStats> table_stats();
void clear_tables();

// The byte budget of all structure / plan caches.
int64_t cache_budget_bytes();
void set_cache_budget_bytes(int64_t bytes);  // < 0: back to the environment's / the default
// What tables may hold for tensors no live object owns: a sixteenth of the budget, at most
// 64 MiB.
inline int64_t unowned_budget_bytes() {
  const int64_t b = cache_budget_bytes() / 16;
  return b < (int64_t{64} << 20) ? b : (int64_t{64} << 20);
}

}  // namespace sparsejit::owned
