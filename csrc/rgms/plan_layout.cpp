#include "csrc/rgms/plan_layout.h"

#include <algorithm>

#include "csrc/core/csr.h"

namespace sparsejit::rgms {

plan::StructureStamp stamp_plan(const int64_t* words, int64_t r, int64_t e, int64_t num_dst,
                                int64_t num_src) {
  plan::StructureStamp s;
  s.rows = num_dst;
  s.nnz = e;
  s.cols = num_src;
  // rel_ptr as the "row pointer", every later array word as the "column" words.
  const int64_t* rel_ptr = words + kFixedWords;
  const int64_t rest = plan_words(r, e) - kFixedWords - (r + 1);
  // Kept positive so it reads the same from Python's signed view (as plan_header.cpp does).
  s.hash = static_cast<int64_t>(fingerprint<int64_t>(rel_ptr, r, rel_ptr + r + 1, rest, num_src) >>
                                1);
  return s;
}

void write_plan_head(int64_t* words, int64_t r, int64_t e, int64_t num_dst, int64_t num_src) {
  std::fill(words, words + kFixedWords, int64_t{0});
  plan::write_header(words, OpKind::Rgms, /*kernel=*/0, /*prefetch=*/0, /*param=*/r,
                     stamp_plan(words, r, e, num_dst, num_src));
}

}  // namespace sparsejit::rgms
