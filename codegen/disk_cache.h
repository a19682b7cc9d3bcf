// Content-addressed on-disk cache for JIT artefacts (host shared objects, NVRTC cubins).
//
// Layout: <root>/<kind>/<readable-prefix>-<key>.<ext>, plus <same>.manifest written last
// (size and checksum of the artefact), and <same>.lock taken around a build.
// root = $SPARSEJIT_CACHE_DIR, else $XDG_CACHE_HOME/sparsejit, else ~/.cache/sparsejit.
// Writes go to a temp file in the same directory and are renamed into place. An entry whose
// manifest is missing or does not match is treated as absent and rebuilt. If the root cannot
// be written, one warning is given and artefacts go to a private per-process directory.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace sparsejit::codegen {

// 128-bit hash of `text` as 32 hex digits (two independent 64-bit FNV-1a streams).
std::string hash_hex(const std::string& text);

// Warnings from the JIT (unwritable cache, compiler missing, compile failure). The Torch
// adapter routes them to TORCH_WARN; the default prints to stderr.
using WarnFn = std::function<void(const std::string&)>;
void set_warning_handler(WarnFn fn);
void warn(const std::string& message);
// Warns only the first time `topic` is seen in this process.
void warn_once(const std::string& topic, const std::string& message);

class DiskCache {
 public:
  // The process-wide cache (root read from the environment on first use).
  static DiskCache& instance();
  explicit DiskCache(std::string root);

  const std::string& root() const { return root_; }
  // Re-reads $SPARSEJIT_CACHE_DIR (tests point it at a fresh directory).
  void reset_root_from_env();

  // Returns the path of a valid artefact, building it first if needed. `build(tmp_path)`
  // writes the artefact to tmp_path and returns true, or returns false with `error` set.
  // Concurrent callers (threads or processes) with the same key build it once.
  // `hit` (optional) tells whether the artefact was already there.
  bool get_or_build(const std::string& kind, const std::string& prefix, const std::string& key,
                    const std::string& ext,
                    const std::function<bool(const std::string& tmp_path, std::string& error)>& build,
                    std::string* path, std::string* error, bool* hit = nullptr);

  // The root artefacts of `kind` go under: root(), or a private temporary directory (with
  // one warning) when root() cannot be written; empty if neither can.
  std::string writable_root(const std::string& kind);

  // Writes `text` to path atomically: a temp file in the same directory, unique per process,
  // thread and call, renamed into place. Returns false on failure.
  static bool write_atomic(const std::string& path, const std::string& text);

  // Makes `dir` hold `files` (relative path, content), e.g. the headers the JIT compiles
  // against. Files already there with the right size are kept; otherwise all are written
  // under the build lock (this process's build mutex and the file lock `dir`.lock, shared
  // with other processes), after a re-check once the lock is held. False with `error` set
  // when a file cannot be written.
  static bool ensure_files(const std::string& dir,
                           const std::vector<std::pair<std::string, std::string>>& files,
                           std::string* error);

  // "<pid>.<thread>.<n>": a suffix no other writer (process, thread or call) uses.
  static std::string unique_suffix();

 private:
  bool usable_dir(const std::string& dir);
  std::string writable_root_locked(const std::string& kind);
  std::string root_;
};

}  // namespace sparsejit::codegen
