#include "codegen/disk_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

namespace sparsejit::codegen {

namespace {

std::mutex g_warn_mutex;
WarnFn g_warn_handler;
std::set<std::string> g_warned;

uint64_t fnv1a(const std::string& s, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool mkdirs(const std::string& dir) {
  if (dir.empty()) return false;
  std::string cur;
  std::stringstream ss(dir);
  std::string part;
  if (dir[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  return true;
}

std::string default_root() {
  if (const char* env = std::getenv("SPARSEJIT_CACHE_DIR"); env && *env) return env;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::string(xdg) + "/sparsejit";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/sparsejit";
  return "/tmp/sparsejit-cache";
}

bool read_file(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

// Manifest: "<size> <checksum>\n" of the artefact.
std::string manifest_text(const std::string& artefact_bytes) {
  return std::to_string(artefact_bytes.size()) + " " + hash_hex(artefact_bytes) + "\n";
}

bool valid_entry(const std::string& path) {
  std::string bytes, manifest;
  if (!read_file(path + ".manifest", &manifest)) return false;
  if (!read_file(path, &bytes)) return false;
  return manifest == manifest_text(bytes);
}

// An exclusive advisory lock on a file, released on destruction.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (fd_ >= 0 && flock(fd_, LOCK_EX) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~FileLock() {
    if (fd_ >= 0) {
      flock(fd_, LOCK_UN);
      close(fd_);
    }
  }
  bool locked() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

std::mutex g_build_mutex;  // one build at a time within a process (locks are per process)

}  // namespace

std::string hash_hex(const std::string& text) {
  return hex64(fnv1a(text, 1469598103934665603ull)) + hex64(fnv1a(text, 0x9e3779b97f4a7c15ull));
}

void set_warning_handler(WarnFn fn) {
  std::lock_guard<std::mutex> g(g_warn_mutex);
  g_warn_handler = std::move(fn);
}

void warn(const std::string& message) {
  WarnFn fn;
  {
    std::lock_guard<std::mutex> g(g_warn_mutex);
    fn = g_warn_handler;
  }
  if (fn) {
    fn(message);
  } else {
    std::cerr << "sparsejit warning: " << message << std::endl;
  }
}

void warn_once(const std::string& topic, const std::string& message) {
  {
    std::lock_guard<std::mutex> g(g_warn_mutex);
    if (!g_warned.insert(topic).second) return;
  }
  warn(message);
}

DiskCache& DiskCache::instance() {
  static DiskCache cache(default_root());
  return cache;
}

DiskCache::DiskCache(std::string root) : root_(std::move(root)) {}

void DiskCache::reset_root_from_env() {
  std::lock_guard<std::mutex> g(g_build_mutex);
  root_ = default_root();
}

bool DiskCache::usable_dir(const std::string& dir) {
  if (!mkdirs(dir)) return false;
  return access(dir.c_str(), W_OK | X_OK) == 0;
}

std::string DiskCache::writable_root(const std::string& kind) {
  std::lock_guard<std::mutex> g(g_build_mutex);
  return writable_root_locked(kind);
}

std::string DiskCache::writable_root_locked(const std::string& kind) {
  if (usable_dir(root_ + "/" + kind)) return root_;
  warn_once("cache-unwritable:" + root_,
            "the JIT cache directory '" + root_ + "' cannot be written; compiled kernels are "
            "kept in a private temporary directory for this process only (set "
            "SPARSEJIT_CACHE_DIR to a writable directory to keep them across runs)");
  static const std::string private_root = [] {
    char tmpl[] = "/tmp/sparsejit-private-XXXXXX";
    const char* d = mkdtemp(tmpl);
    return std::string(d ? d : "");
  }();
  if (private_root.empty() || !usable_dir(private_root + "/" + kind)) return "";
  return private_root;
}

std::string DiskCache::unique_suffix() {
  static std::atomic<uint64_t> counter{0};
  const size_t thread = std::hash<std::thread::id>{}(std::this_thread::get_id());
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%lld.%zx.%llu", static_cast<long long>(getpid()), thread,
                static_cast<unsigned long long>(counter.fetch_add(1)));
  return buf;
}

bool DiskCache::write_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + unique_suffix();
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return false;
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!f) return false;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

namespace {
bool all_present(const std::string& dir,
                 const std::vector<std::pair<std::string, std::string>>& files) {
  for (const auto& [rel, text] : files) {
    struct stat st;
    const std::string full = dir + "/" + rel;
    if (stat(full.c_str(), &st) != 0 || st.st_size != static_cast<off_t>(text.size()))
      return false;
  }
  return true;
}
}  // namespace

bool DiskCache::ensure_files(const std::string& dir,
                             const std::vector<std::pair<std::string, std::string>>& files,
                             std::string* error) {
  if (all_present(dir, files)) return true;
  std::lock_guard<std::mutex> g(g_build_mutex);
  if (!mkdirs(dir)) {
    *error = "cannot create " + dir;
    return false;
  }
  FileLock lock(dir + ".lock");
  // Another thread or process may have written them while we waited for the lock.
  if (all_present(dir, files)) return true;
  for (const auto& [rel, text] : files) {
    const std::string full = dir + "/" + rel;
    if (!mkdirs(full.substr(0, full.rfind('/'))) || !write_atomic(full, text)) {
      *error = "cannot write " + full;
      return false;
    }
  }
  return true;
}

bool DiskCache::get_or_build(
    const std::string& kind, const std::string& prefix, const std::string& key,
    const std::string& ext,
    const std::function<bool(const std::string& tmp_path, std::string& error)>& build,
    std::string* path, std::string* error, bool* hit) {
  std::lock_guard<std::mutex> g(g_build_mutex);
  const std::string root = writable_root_locked(kind);
  if (root.empty()) {
    *error = "no writable directory for JIT artefacts";
    return false;
  }
  const std::string final_path = root + "/" + kind + "/" + prefix + "-" + key + "." + ext;
  *path = final_path;
  if (valid_entry(final_path)) {
    if (hit) *hit = true;
    return true;
  }
  if (hit) *hit = false;
  FileLock lock(final_path + ".lock");
  // Another process may have finished the build while we waited for the lock.
  if (lock.locked() && valid_entry(final_path)) {
    if (hit) *hit = true;
    return true;
  }
  const std::string tmp = final_path + ".build." + unique_suffix() + "." + ext;
  std::string err;
  if (!build(tmp, err)) {
    std::remove(tmp.c_str());
    *error = err;
    return false;
  }
  std::string bytes;
  if (!read_file(tmp, &bytes)) {
    *error = "the build wrote no artefact at " + tmp;
    return false;
  }
  // Artefact first, manifest last: a reader that sees the manifest sees the whole artefact.
  std::remove((final_path + ".manifest").c_str());
  if (std::rename(tmp.c_str(), final_path.c_str()) != 0 ||
      !write_atomic(final_path + ".manifest", manifest_text(bytes))) {
    std::remove(tmp.c_str());
    *error = "could not move the artefact into the cache at " + final_path;
    return false;
  }
  return true;
}

}  // namespace sparsejit::codegen
