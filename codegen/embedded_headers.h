// Source text of the headers the CPU JIT compiles against, embedded at build time by
// cmake/embed_headers.cmake (so the JIT does not need the source tree).
#pragma once

#include <utility>
#include <vector>

namespace sparsejit::codegen {

// (relative path, contents) for every embedded header.
const std::vector<std::pair<const char*, const char*>>& embedded_headers();

}  // namespace sparsejit::codegen
