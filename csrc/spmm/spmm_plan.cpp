#include "csrc/spmm/spmm_plan.h"

#include "codegen/jit_policy.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace sparsejit::plan {

SpmmPlan choose_spmm(int64_t rows, int64_t cols, int64_t nnz, int64_t row_width,
                     int64_t elem_size, bool jit_available) {
  SpmmPlan p;
  if (!jit_available) {
    p.reason = "JIT unavailable or off";
    return p;
  }
  if (row_width <= 0 || row_width > kMaxJitRowWidth) {
    p.reason = "row width outside the specialized range (1.." + std::to_string(kMaxJitRowWidth) + ")";
    return p;
  }
  const int64_t work = (rows + nnz) * row_width;
  if (work < codegen::min_jit_work(OpKind::Spmm)) {
    p.reason = "small problem (" + std::to_string(work) + " < " + std::to_string(codegen::min_jit_work(OpKind::Spmm)) +
               " entry-features): the generic kernel is as fast and needs no compile";
    return p;
  }
  p.kernel = Kernel::Jit;
  const int64_t x_bytes = cols * row_width * elem_size;
  constexpr int64_t kL2Bytes = 1 << 20;
  if (x_bytes > kL2Bytes) {
    // Enough gathered rows in flight to cover memory latency. Measured on a 2-core EPYC
    // (benchmarks/RESULTS.md): 16 entries ahead beat 0/4/8 for F = 32 and 128 alike.
    p.prefetch = 16;
    p.reason = "specialized kernel; X (" + std::to_string(x_bytes >> 10) +
               " KiB) exceeds L2, prefetch " + std::to_string(p.prefetch) + " entries ahead";
  } else {
    p.reason = "specialized kernel; X fits in L2, no prefetch";
  }
  return p;
}

bool sddmm_use_jit(int64_t nnz, int64_t row_width, bool jit_available, std::string* reason) {
  if (!jit_available) {
    *reason = "JIT unavailable or off";
    return false;
  }
  if (row_width <= 0 || row_width > kMaxJitRowWidth) {
    *reason = "row width outside the specialized range";
    return false;
  }
  if (nnz * row_width < codegen::min_jit_work(OpKind::Sddmm)) {
    *reason = "small problem: the generic kernel is as fast and needs no compile";
    return false;
  }
  *reason = "specialized kernel (compile-time H and F)";
  return true;
}

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::Generic: return "generic";
    case Kernel::Jit: return "jit";
    case Kernel::Bucketed: return "bucketed";
    default:
      throw std::invalid_argument("unknown SpMM kernel id " +
                                  std::to_string(static_cast<int64_t>(k)));
  }
}

Kernel parse_kernel(const std::string& name) {
  if (name == "generic") return Kernel::Generic;
  if (name == "jit") return Kernel::Jit;
  if (name == "bucketed") return Kernel::Bucketed;
  throw std::invalid_argument("kernel must be 'generic', 'jit' or 'bucketed'; got '" + name + "'");
}

void encode(const SpmmPlan& p, const StructureStamp& s, int64_t* words) {
  write_header(words, OpKind::Spmm, static_cast<int64_t>(p.kernel), p.prefetch, p.max_log2, s);
}

template <typename I>
void build_bucketed_plan(const I* rowptr, const I* col, int64_t rows, int64_t cols, int max_log2,
                         int32_t prefetch, int64_t* words) {
  const int64_t nnz = rows > 0 ? static_cast<int64_t>(rowptr[rows]) : 0;
  const int64_t cap = int64_t(1) << std::clamp(max_log2, 0, 30);
  write_header(words, OpKind::Spmm, static_cast<int64_t>(Kernel::Bucketed), prefetch, max_log2,
               stamp_structure(rowptr, col, rows, cols));
  int64_t* row_map = words + kHeaderWords;
  int64_t* out_rowptr = row_map + rows;
  int64_t* out_col = out_rowptr + rows + 1;
  int64_t* out_pos = out_col + nnz;
  // Counting sort of the rows by length, lengths above `cap` all in the last bucket (which
  // keeps the original row order, like every bucket: the sort is stable).
  std::vector<int64_t> start(static_cast<size_t>(cap + 3), 0);  // buckets 0..cap+1, plus one
  auto bucket = [&](int64_t i) {
    const int64_t len = static_cast<int64_t>(rowptr[i + 1]) - static_cast<int64_t>(rowptr[i]);
    return std::min(len, cap + 1);
  };
  for (int64_t i = 0; i < rows; ++i) ++start[static_cast<size_t>(bucket(i)) + 1];
  for (size_t b = 1; b < start.size(); ++b) start[b] += start[b - 1];
  for (int64_t i = 0; i < rows; ++i) row_map[start[static_cast<size_t>(bucket(i))]++] = i;
  out_rowptr[0] = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = row_map[r];
    const int64_t lo = rowptr[i], hi = rowptr[i + 1];
    int64_t o = out_rowptr[r];
    for (int64_t p = lo; p < hi; ++p, ++o) {
      out_col[o] = static_cast<int64_t>(col[p]);
      out_pos[o] = p;
    }
    out_rowptr[r + 1] = o;
  }
}

template void build_bucketed_plan<int32_t>(const int32_t*, const int32_t*, int64_t, int64_t,
                                           int, int32_t, int64_t*);
template void build_bucketed_plan<int64_t>(const int64_t*, const int64_t*, int64_t, int64_t,
                                           int, int32_t, int64_t*);

bool decode(const int64_t* words, int64_t n, const StructureStamp& s, SpmmPlan* p,
            std::string* error) {
  if (!check_header(words, n, OpKind::Spmm, s, error)) return false;
  const int64_t kernel = words[kWordKernel];
  if (kernel < static_cast<int64_t>(Kernel::Generic) ||
      kernel > static_cast<int64_t>(Kernel::Bucketed)) {
    *error = "unknown SpMM kernel id " + std::to_string(kernel) + " in plan";
    return false;
  }
  p->kernel = static_cast<Kernel>(kernel);
  p->prefetch = static_cast<int32_t>(std::clamp<int64_t>(words[kWordPrefetch], 0, 64));
  p->reason = "from plan";
  if (p->kernel != Kernel::Bucketed) {
    if (n != kHeaderWords) {
      *error = "a " + std::string(kernel_name(p->kernel)) + " plan has " +
               std::to_string(kHeaderWords) + " words; got " + std::to_string(n);
      return false;
    }
    return true;
  }
  if (n != bucketed_plan_words(s.rows, s.nnz)) {
    *error = n == kHeaderWords
                 ? "a bucketed plan needs its arrays (got only the recipe; build it with "
                   "sparsejit.ops.spmm_bucketed_plan)"
                 : "bucketed plan has " + std::to_string(n) + " words; a structure with " +
                       std::to_string(s.rows) + " rows and " + std::to_string(s.nnz) +
                       " entries needs " + std::to_string(bucketed_plan_words(s.rows, s.nnz));
    return false;
  }
  p->max_log2 = static_cast<int32_t>(words[kWordParam]);
  p->row_map = words + kHeaderWords;
  p->rowptr = p->row_map + s.rows;
  p->col = p->rowptr + s.rows + 1;
  p->pos = p->col + s.nnz;
  // O(rows) checks of the decomposed arrays, so that a damaged plan cannot send the kernel
  // outside its inputs' rows (the column range is guaranteed by the plan op's stamp).
  if (s.rows >= 0 && (p->rowptr[0] != 0 || p->rowptr[s.rows] != s.nnz)) {
    *error = "bucketed plan arrays are damaged (decomposed rowptr does not span the entries)";
    return false;
  }
  for (int64_t r = 0; r < s.rows; ++r) {
    if (p->row_map[r] < 0 || p->row_map[r] >= s.rows || p->rowptr[r + 1] < p->rowptr[r]) {
      *error = "bucketed plan arrays are damaged at decomposed row " + std::to_string(r);
      return false;
    }
  }
  return true;
}

bool validate_bucketed_arrays(const SpmmPlan& p, const StructureStamp& s, std::string* error) {
  std::vector<char> seen(static_cast<size_t>(std::max<int64_t>(s.rows, 0)), 0);
  for (int64_t r = 0; r < s.rows; ++r) {
    if (seen[static_cast<size_t>(p.row_map[r])]++) {
      *error = "bucketed plan arrays are damaged: output row " + std::to_string(p.row_map[r]) +
               " appears twice in row_map";
      return false;
    }
  }
  for (int64_t e = 0; e < s.nnz; ++e) {
    if (p.col[e] < 0 || p.col[e] >= s.cols || p.pos[e] < 0 || p.pos[e] >= s.nnz) {
      *error = "bucketed plan arrays are damaged at entry " + std::to_string(e) + " (col " +
               std::to_string(p.col[e]) + ", pos " + std::to_string(p.pos[e]) + ")";
      return false;
    }
  }
  return true;
}

}  // namespace sparsejit::plan
