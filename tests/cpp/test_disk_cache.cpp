// JIT cache I/O under concurrency: several threads writing the same artefact, building the
// same key and extracting the same header set at once must all succeed and leave whole files.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "codegen/disk_cache.h"

namespace sparsejit::codegen {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string fresh_dir(const std::string& name) {
  char tmpl[] = "/tmp/sparsejit-cache-test-XXXXXX";
  const char* d = mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return std::string(d ? d : "/tmp") + "/" + name;
}

// Large enough that interleaved writes of a shared temp file would be caught.
std::string payload(int writer) {
  return std::string(1 << 18, static_cast<char>('a' + writer % 26)) + std::to_string(writer);
}

void run_threads(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::atomic<bool> go{false};
  for (int t = 0; t < n; ++t)
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      body(t);
    });
  go = true;
  for (auto& th : threads) th.join();
}

TEST(DiskCache, UniqueSuffixDiffersPerThreadAndCall) {
  std::vector<std::string> seen(16);
  run_threads(8, [&](int t) {
    seen[2 * t] = DiskCache::unique_suffix();
    seen[2 * t + 1] = DiskCache::unique_suffix();
  });
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end());
}

TEST(DiskCache, ConcurrentWriteAtomicOfOnePathLeavesOneWholeFile) {
  const std::string dir = fresh_dir("w");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  const std::string path = dir + "/artefact.so";
  constexpr int kThreads = 8, kRounds = 10;
  std::atomic<int> failures{0};
  run_threads(kThreads, [&](int t) {
    for (int r = 0; r < kRounds; ++r)
      if (!DiskCache::write_atomic(path, payload(t))) ++failures;
  });
  EXPECT_EQ(failures.load(), 0);
  const std::string got = read_all(path);
  bool whole = false;
  for (int t = 0; t < kThreads; ++t) whole = whole || got == payload(t);
  EXPECT_TRUE(whole) << "the artefact is a mix of several writers (" << got.size() << " bytes)";
}

TEST(DiskCache, ConcurrentGetOrBuildOfOneKeyBuildsOnce) {
  DiskCache cache(fresh_dir("root"));
  std::atomic<int> builds{0}, failures{0};
  std::vector<std::string> paths(8);
  run_threads(8, [&](int t) {
    std::string error;
    bool hit = false;
    auto build = [&](const std::string& tmp, std::string& err) {
      ++builds;
      std::ofstream(tmp, std::ios::binary) << payload(0);
      (void)err;
      return true;
    };
    if (!cache.get_or_build("cpu", "spmm_test", "0123abcd", "so", build, &paths[t], &error, &hit))
      ++failures;
  });
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(builds.load(), 1);
  for (const auto& p : paths) {
    EXPECT_EQ(p, paths[0]);
    EXPECT_EQ(read_all(p), payload(0));
  }
}

TEST(DiskCache, ConcurrentHeaderExtractionWritesEveryFileWhole) {
  const std::string dir = fresh_dir("include-abc");
  std::vector<std::pair<std::string, std::string>> files;
  for (int i = 0; i < 12; ++i)
    files.emplace_back("kernels/cpu/h" + std::to_string(i) + ".h", payload(i));
  std::atomic<int> failures{0};
  run_threads(8, [&](int) {
    std::string error;
    if (!DiskCache::ensure_files(dir, files, &error)) ++failures;
    // Every caller that returns sees the complete set.
    for (const auto& [rel, text] : files)
      if (read_all(dir + "/" + rel) != text) ++failures;
  });
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace sparsejit::codegen
