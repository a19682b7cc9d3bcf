// csrc/core/owned.h: the registry of index arrays live objects own, its release listeners and
// the one cache budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "csrc/core/owned.h"

namespace sparsejit::owned {
namespace {

TEST(Owned, CountsOwnersAndTellsListenersWhenTheLastLetsGo) {
  static std::vector<uintptr_t> released;
  static bool registered = false;
  if (!registered) {
    add_release_listener([](const std::vector<uintptr_t>& a) {
      released.insert(released.end(), a.begin(), a.end());
    });
    registered = true;
  }
  released.clear();
  const int64_t before = owned_count();
  int a = 0, b = 0;
  const auto pa = reinterpret_cast<uintptr_t>(&a), pb = reinterpret_cast<uintptr_t>(&b);
  own({pa, pb, 0});  // 0 (an empty tensor's address) is never owned
  own({pa});         // a second owner of the same array
  EXPECT_TRUE(is_owned(&a) && is_owned(&b));
  EXPECT_FALSE(is_owned(nullptr));
  EXPECT_EQ(owned_count(), before + 2);
  disown({pa, pb});
  EXPECT_TRUE(is_owned(&a));
  EXPECT_FALSE(is_owned(&b));
  EXPECT_EQ(released, std::vector<uintptr_t>{pb});
  disown({pa});
  EXPECT_FALSE(is_owned(&a));
  EXPECT_EQ(released, (std::vector<uintptr_t>{pb, pa}));
  disown({pa});  // releasing what is not owned is a no-op
  EXPECT_EQ(released.size(), 2u);
  EXPECT_EQ(owned_count(), before);
}

TEST(Owned, OneBudgetAndItsUnownedShare) {
  const int64_t start = cache_budget_bytes();
  EXPECT_GE(start, int64_t{512} << 20);
  set_cache_budget_bytes(int64_t{32} << 20);
  EXPECT_EQ(cache_budget_bytes(), int64_t{32} << 20);
  EXPECT_EQ(unowned_budget_bytes(), int64_t{2} << 20);
  set_cache_budget_bytes(int64_t{64} << 30);
  EXPECT_EQ(unowned_budget_bytes(), int64_t{64} << 20);  // capped
  set_cache_budget_bytes(-1);  // back to the environment's or the default
  EXPECT_EQ(cache_budget_bytes(), start);
}

TEST(Owned, TableHooksReportAndClear) {
  static int clears = 0;
  add_table_hooks([] { return std::vector<TableStats>{{"test.table", 3, 1, 40}}; },
                  [] { ++clears; });
  const auto stats = table_stats();
  const auto it = std::find_if(stats.begin(), stats.end(),
                               [](const TableStats& s) { return s.name == "test.table"; });
  ASSERT_NE(it, stats.end());
  EXPECT_EQ(it->entries, 3);
  EXPECT_EQ(it->owned, 1);
  EXPECT_EQ(it->bytes, 40);
  clear_tables();
  EXPECT_EQ(clears, 1);
}

}  // namespace
}  // namespace sparsejit::owned
