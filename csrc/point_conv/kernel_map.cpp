#include "csrc/point_conv/kernel_map.h"

#include <omp.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "csrc/point_conv/merge_detail.h"

namespace sparsejit::point_conv {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

}  // namespace

namespace detail {

void check_params(const ConvParams& p, int dims) {
  if (p.dims != dims)
    fail("conv params have dims = " + std::to_string(p.dims) + "; the coordinates have " +
         std::to_string(dims) + " spatial axes");
  auto at_least = [&](const int64_t* v, const char* name, int64_t min) {
    for (int d = 0; d < dims; ++d)
      if (v[d] < min)
        fail(std::string(name) + "[" + std::to_string(d) + "] = " + std::to_string(v[d]) +
             " must be >= " + std::to_string(min));
  };
  at_least(p.kernel, "kernel", 1);
  at_least(p.stride, "stride", 1);
  at_least(p.dilation, "dilation", 1);
  at_least(p.padding, "padding", 0);
}

// Offset k's vector e (e_d in [0, kernel_d)), axis 0 slowest.
void offset_vector(const ConvParams& p, int64_t k, int64_t* e) {
  for (int d = p.dims - 1; d >= 0; --d) {
    e[d] = k % p.kernel[d];
    k /= p.kernel[d];
  }
}

bool same_layout(const KeyLayout& a, const KeyLayout& b) {
  if (a.dims != b.dims || a.batch_bits != b.batch_bits || a.batch_shift != b.batch_shift)
    return false;
  for (int d = 0; d < a.dims; ++d)
    if (a.lo[d] != b.lo[d] || a.axis_bits[d] != b.axis_bits[d] || a.shift[d] != b.shift[d])
      return false;
  return true;
}

std::vector<MergeTask> make_tasks(const std::vector<Span>& spans) {
  int64_t total = 0;
  for (const Span& s : spans) total += s.end - s.begin;
  const int64_t threads = omp_get_max_threads();
  // about 4 tasks per thread, none under 2048 positions
  const int64_t target = std::max<int64_t>(2048, total / (4 * threads) + 1);
  std::vector<MergeTask> tasks;
  for (const Span& s : spans) {
    const int64_t len = s.end - s.begin, chunks = std::max<int64_t>(1, len / target);
    for (int64_t c = 0; c < chunks; ++c) {
      MergeTask t;
      t.k = s.k;
      t.p0 = s.begin + len * c / chunks;
      t.p1 = s.begin + len * (c + 1) / chunks;
      if (t.p1 > t.p0) tasks.push_back(std::move(t));
    }
  }
  return tasks;
}

void assemble_map(const std::vector<MergeTask>& tasks, const std::vector<int64_t>& count,
                  KernelMap& out) {
  const int64_t K = static_cast<int64_t>(count.size());
  out.offset_ptr.resize(K + 1);
  out.offset_ptr[0] = 0;
  for (int64_t k = 0; k < K; ++k) out.offset_ptr[k + 1] = out.offset_ptr[k] + count[k];
  out.in_idx.resize(out.size());
  out.out_idx.resize(out.size());
  std::vector<int64_t> cursor(out.offset_ptr.begin(), out.offset_ptr.end() - 1);
  for (const MergeTask& t : tasks) {  // tasks of one offset are in chunk order: key order kept
    std::copy(t.ins.begin(), t.ins.end(), out.in_idx.begin() + cursor[t.k]);
    std::copy(t.outs.begin(), t.outs.end(), out.out_idx.begin() + cursor[t.k]);
    cursor[t.k] += static_cast<int64_t>(t.ins.size());
  }
}

}  // namespace detail

namespace {

using detail::MergeTask;
using detail::check_params;
using detail::same_layout;

// The two sorted lists one merge walks: input keys, and output base keys (of o * stride),
// both in one layout that holds every query o * stride - padding + e * dilation.
struct MergeLists {
  KeyLayout layout;
  std::vector<uint64_t> in_storage, base_storage;  // used when stored keys cannot serve
  const uint64_t* in_keys = nullptr;
  const uint64_t* base = nullptr;
};

MergeLists prepare_lists(const CoordSet& in, const CoordSet& out, const ConvParams& p) {
  const int dims = in.dims, w = in.width();
  int64_t lo[kMaxDims], hi[kMaxDims];
  for (int d = 0; d < dims; ++d) {
    int64_t omin = INT64_MAX, omax = INT64_MIN;
    for (int64_t q = 0; q < out.size(); ++q) {
      omin = std::min<int64_t>(omin, out.coords[q * w + 1 + d]);
      omax = std::max<int64_t>(omax, out.coords[q * w + 1 + d]);
    }
    const int64_t qlo = omin * p.stride[d] - p.padding[d];
    const int64_t qhi = omax * p.stride[d] - p.padding[d] + p.dilation[d] * (p.kernel[d] - 1);
    lo[d] = std::min(in.layout.lo[d], qlo);
    hi[d] = std::max(in.layout.hi(d), qhi);
  }
  MergeLists m;
  m.layout = make_key_layout(dims, std::max(in.layout.batch_size, out.batch_size), lo, hi);
  if (same_layout(m.layout, in.layout) && m.layout.batch_size == in.layout.batch_size) {
    m.in_keys = in.keys.data();
  } else {  // the stored margin is too narrow for this kernel: same order, wider fields
    m.in_storage = repack_keys(in, m.layout);
    m.in_keys = m.in_storage.data();
  }
  bool unit_stride = true;
  for (int d = 0; d < dims; ++d) unit_stride &= p.stride[d] == 1;
  if (unit_stride && &in == &out && m.in_storage.empty()) {
    m.base = in.keys.data();
  } else if (unit_stride && same_layout(m.layout, out.layout)) {
    m.base = out.keys.data();
  } else {
    m.base_storage.resize(out.size());
#pragma omp parallel for schedule(static)
    for (int64_t q = 0; q < out.size(); ++q) {
      int64_t row[kMaxDims + 1] = {out.coords[q * w]};
      for (int d = 0; d < dims; ++d) row[1 + d] = int64_t{out.coords[q * w + 1 + d]} * p.stride[d];
      m.base_storage[q] = m.layout.pack(row);  // may lie outside the layout: pack is linear
    }
    m.base = m.base_storage.data();
  }
  return m;
}

// Walks the output chunk and the input list together; both ascend, so each step advances one
// cursor or both. Branch-free: the lists interleave finely (same density for submanifold
// maps), where a mispredicted compare per step would cost more than the step. Every step
// writes a candidate pair and keeps it only on a match (count <= steps on the output side).
void merge_chunk(const MergeLists& m, int64_t n_in, const int32_t* in_site,
                 const int32_t* out_site, uint64_t delta, MergeTask& t) {
  const uint64_t* in = m.in_keys;
  int64_t j = std::lower_bound(in, in + n_in, m.base[t.p0] + delta) - in;
  t.ins.resize(t.p1 - t.p0);
  t.outs.resize(t.p1 - t.p0);
  int64_t q = t.p0, count = 0;
  while (q < t.p1 && j < n_in) {
    const uint64_t a = m.base[q] + delta, b = in[j];
    t.ins[count] = in_site[j];
    t.outs[count] = out_site[q];
    count += a == b;
    q += a <= b;
    j += b <= a;
  }
  t.ins.resize(count);
  t.outs.resize(count);
}

// Merges the listed offsets; `mirror` (submanifold) fills offset K-1-k from offset k swapped
// and the centre with the identity. Writes `out` in place (resize, no clearing).
void build_map(const CoordSet& in, const CoordSet& outs, const ConvParams& p, bool mirror,
               KernelMap& out) {
  const int64_t K = p.volume(), center = (K - 1) / 2;
  std::vector<detail::Span> todo;
  for (int64_t k = 0; k < (mirror ? center : K); ++k) todo.push_back({k, 0, outs.size()});
  std::vector<MergeTask> tasks;
  if (in.size() > 0 && outs.size() > 0) {
    const MergeLists m = prepare_lists(in, outs, p);
    std::vector<uint64_t> delta(K);
    for (int64_t k = 0; k < K; ++k) {
      int64_t e[kMaxDims];
      detail::offset_vector(p, k, e);
      for (int d = 0; d < p.dims; ++d) e[d] = e[d] * p.dilation[d] - p.padding[d];
      delta[k] = m.layout.offset(e);
    }
    tasks = detail::make_tasks(todo);
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t t = 0; t < tasks.size(); ++t)
      merge_chunk(m, in.size(), in.site.data(), outs.site.data(), delta[tasks[t].k], tasks[t]);
  }
  std::vector<int64_t> count(K, 0);
  for (const MergeTask& t : tasks) count[t.k] += static_cast<int64_t>(t.ins.size());
  if (mirror) {
    for (int64_t k = 0; k < center; ++k) count[K - 1 - k] = count[k];
    count[center] = in.size();
  }
  detail::assemble_map(tasks, count, out);
  if (!mirror) return;
  for (int64_t k = 0; k < center; ++k) {  // map(-delta) = map(delta) swapped
    const int64_t src = out.offset_ptr[k], dst = out.offset_ptr[K - 1 - k];
    std::copy_n(out.in_idx.begin() + src, count[k], out.out_idx.begin() + dst);
    std::copy_n(out.out_idx.begin() + src, count[k], out.in_idx.begin() + dst);
  }
  std::copy(in.site.begin(), in.site.end(), out.in_idx.begin() + out.offset_ptr[center]);
  std::copy(in.site.begin(), in.site.end(), out.out_idx.begin() + out.offset_ptr[center]);
}

}  // namespace

int64_t ConvParams::volume() const {
  int64_t v = 1;
  for (int d = 0; d < dims; ++d) v *= kernel[d];
  return v;
}

ConvParams cube_params(int dims, int64_t kernel, int64_t stride, int64_t dilation,
                       int64_t padding) {
  if (dims < 1 || dims > kMaxDims)
    fail("dims = " + std::to_string(dims) + " must lie in [1, " + std::to_string(kMaxDims) + "]");
  ConvParams p;
  p.dims = dims;
  for (int d = 0; d < dims; ++d) {
    p.kernel[d] = kernel;
    p.stride[d] = stride;
    p.dilation[d] = dilation;
    p.padding[d] = padding;
  }
  return p;
}

void submanifold_map(const CoordSet& sites, const ConvParams& p, KernelMap& out) {
  check_params(p, sites.dims);
  ConvParams centred = p;
  for (int d = 0; d < p.dims; ++d) {
    if (p.stride[d] != 1)
      fail("submanifold conv needs stride 1; stride[" + std::to_string(d) +
           "] = " + std::to_string(p.stride[d]));
    if (p.kernel[d] % 2 == 0)
      fail("submanifold conv needs an odd kernel; kernel[" + std::to_string(d) +
           "] = " + std::to_string(p.kernel[d]));
    centred.padding[d] = p.dilation[d] * (p.kernel[d] - 1) / 2;
  }
  build_map(sites, sites, centred, /*mirror=*/true, out);
}

void generalized_map(const CoordSet& in, const CoordSet& out_sites, const ConvParams& p,
                     KernelMap& out) {
  check_params(p, in.dims);
  if (out_sites.dims != in.dims)
    fail("output sites have " + std::to_string(out_sites.dims) + " spatial axes; inputs have " +
         std::to_string(in.dims));
  bool strided = false;
  for (int d = 0; d < p.dims; ++d) strided |= p.stride[d] > 1;
  if (strided && detail::strided_map(in, out_sites, p, out)) return;
  build_map(in, out_sites, p, /*mirror=*/false, out);
}

void inverse_map(const KernelMap& fwd, KernelMap& out) {
  if (&fwd == &out) {  // in place
    std::swap(out.in_idx, out.out_idx);
    return;
  }
  out.offset_ptr = fwd.offset_ptr;
  out.in_idx.resize(fwd.out_idx.size());
  out.out_idx.resize(fwd.in_idx.size());
  std::copy(fwd.out_idx.begin(), fwd.out_idx.end(), out.in_idx.begin());
  std::copy(fwd.in_idx.begin(), fwd.in_idx.end(), out.out_idx.begin());
}

void transposed_map(const CoordSet& in, const CoordSet& out_sites, const ConvParams& p,
                    KernelMap& out) {
  KernelMap swapped;  // pairs (o, i) with o = i * stride + e * dilation - padding
  generalized_map(out_sites, in, p, swapped);
  inverse_map(swapped, out);
}

}  // namespace sparsejit::point_conv
