// Huge-page advice (csrc/core/huge_pages.h) lands only on the 2 MiB pages of a buffer that no
// write has made resident yet, only at or above the threshold, and never where it is off.
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "csrc/core/huge_pages.h"

namespace sparsejit {
namespace {

constexpr std::size_t kHuge = std::size_t{2} << 20;

bool os_allows_thp() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  return f && std::getline(f, s) && s.find("[never]") == std::string::npos;
}

// For each 2 MiB page of [p, p + n): whether the mapping holding it carries MADV_HUGEPAGE
// ("hg" in the VmFlags of /proc/self/smaps).
std::vector<bool> advised_pages(const char* p, std::size_t n) {
  struct Vma {
    std::uintptr_t lo, hi;
    bool hg;
  };
  std::vector<Vma> vmas;
  std::ifstream f("/proc/self/smaps");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream ss(line);
    std::string head;
    ss >> head;
    const auto dash = head.find('-');
    if (dash != std::string::npos &&
        head.find_first_not_of("0123456789abcdef-") == std::string::npos) {
      vmas.push_back({std::stoull(head.substr(0, dash), nullptr, 16),
                      std::stoull(head.substr(dash + 1), nullptr, 16), false});
    } else if (head == "VmFlags:" && !vmas.empty()) {
      std::string flag;
      while (ss >> flag) vmas.back().hg |= flag == "hg";
    }
  }
  std::vector<bool> out;
  for (std::size_t off = 0; off < n; off += kHuge) {
    const auto a = reinterpret_cast<std::uintptr_t>(p) + off;
    bool hg = false;
    for (const Vma& v : vmas)
      if (v.lo <= a && a < v.hi) hg = v.hg;
    out.push_back(hg);
  }
  return out;
}

// A 2 MiB-aligned anonymous mapping of `pages` huge pages, unmapped at the end of the scope.
struct Region {
  explicit Region(std::size_t pages) : n(pages * kHuge) {
    raw = mmap(nullptr, n + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) raw = nullptr;
    const auto a = reinterpret_cast<std::uintptr_t>(raw);
    p = reinterpret_cast<char*>((a + kHuge - 1) & ~(kHuge - 1));
  }
  ~Region() {
    if (raw) munmap(raw, n + kHuge);
  }
  void* raw = nullptr;
  char* p = nullptr;
  std::size_t n;
};

struct ThresholdScope {
  explicit ThresholdScope(std::size_t t) : prev(set_huge_page_threshold(t)) {}
  ~ThresholdScope() { set_huge_page_threshold(prev); }
  std::size_t prev;
};

TEST(HugePages, OnlyFreshPagesAreAdvised) {
  if (!os_allows_thp()) GTEST_SKIP() << "the OS runs transparent huge pages 'never'";
  ThresholdScope th(std::size_t{4} << 20);
  Region r(6);
  ASSERT_NE(r.raw, nullptr);
  // Pages 0 and 1 written whole, page 3 by one byte (one resident 4 KiB page is enough for
  // the advice to leave its huge page alone); pages 2, 4 and 5 never touched.
  std::memset(r.p, 1, 2 * kHuge);
  r.p[3 * kHuge + 12345] = 1;
  EXPECT_TRUE(advise_huge_pages(r.p, r.n));
  EXPECT_EQ(advised_pages(r.p, r.n), (std::vector<bool>{false, false, true, false, true, true}));
  // The advised pages take writes and keep them.
  std::memset(r.p + 4 * kHuge, 7, 2 * kHuge);
  EXPECT_EQ(r.p[4 * kHuge], 7);
  EXPECT_EQ(r.p[6 * kHuge - 1], 7);
}

TEST(HugePages, ResidentBufferIsLeftAlone) {
  if (!os_allows_thp()) GTEST_SKIP() << "the OS runs transparent huge pages 'never'";
  ThresholdScope th(std::size_t{4} << 20);
  Region r(4);
  ASSERT_NE(r.raw, nullptr);
  for (std::size_t off = 0; off < r.n; off += 4096) r.p[off] = 1;  // a recycled heap buffer
  EXPECT_FALSE(advise_huge_pages(r.p, r.n));
  EXPECT_EQ(advised_pages(r.p, r.n), std::vector<bool>(4, false));
}

TEST(HugePages, ThresholdAndOffAndUnalignedEdges) {
  if (!os_allows_thp()) GTEST_SKIP() << "the OS runs transparent huge pages 'never'";
  Region r(8);
  ASSERT_NE(r.raw, nullptr);
  {
    ThresholdScope off(0);  // off: nothing advised, whatever the size
    EXPECT_FALSE(advise_huge_pages(r.p, r.n));
  }
  {
    ThresholdScope th(std::size_t{8} << 20);  // below the threshold: left alone
    EXPECT_FALSE(advise_huge_pages(r.p, (std::size_t{8} << 20) - 1));
    EXPECT_FALSE(advise_huge_pages(nullptr, r.n));
  }
  EXPECT_EQ(advised_pages(r.p, r.n), std::vector<bool>(8, false));
  {
    // A buffer that starts and ends inside huge pages: only the whole pages within it.
    ThresholdScope th(std::size_t{4} << 20);
    EXPECT_TRUE(advise_huge_pages(r.p + 100, 5 * kHuge));
  }
  EXPECT_EQ(advised_pages(r.p, r.n),
            (std::vector<bool>{false, true, true, true, true, false, false, false}));
}

TEST(HugePages, DefaultThreshold) {
  // The default (SPARSEJIT_HUGE_PAGES unset) is 4 MiB where the OS allows THP, else off;
  // ctest runs without the variable.
  if (std::getenv("SPARSEJIT_HUGE_PAGES")) GTEST_SKIP() << "SPARSEJIT_HUGE_PAGES is set";
  EXPECT_EQ(huge_page_threshold(), os_allows_thp() ? (std::size_t{4} << 20) : 0);
}

}  // namespace
}  // namespace sparsejit
