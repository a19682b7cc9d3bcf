// Strided kernel maps, input-driven. For offset e, write t = e * dilation - padding; input i
// pairs with o = (i - t) / stride, which exists only when i = t (mod stride) on every axis.
// With r = t mod stride (the residue class of the inputs that can match) and
// c = (r - t) / stride, that output is o = floor(i / stride) + c: for the inputs of class r,
// a constant key shift of the keys of floor(i / stride). So: group the inputs by residue class
// once (key order kept within a class, where floor(i / stride) is then strictly increasing),
// and for each offset merge its class's shifted list with the sorted output keys. The output
// list is walked by galloping, so an offset costs about |class| * log(gap) rather than
// |outputs| + |inputs| as the output-driven merge would (for stride 2 in 3-D a class holds
// about 1/8 of the inputs).
#include <omp.h>

#include <algorithm>
#include <climits>

#include "csrc/point_conv/merge_detail.h"

namespace sparsejit::point_conv::detail {
namespace {

constexpr int64_t kMaxClasses = 4096;  // counting-sort buckets; larger strides merge by output

struct ResidueClasses {
  std::vector<int64_t> ptr;      // [S + 1] entries of class r: [ptr[r], ptr[r + 1])
  std::vector<int32_t> site;     // input site id per entry
  std::vector<uint64_t> coarse;  // key of (batch, floor(i / stride)) per entry
};

// Class of a coordinate row: the residues i_d mod s_d as mixed-radix digits, axis 0 slowest.
int64_t residue_class(const int32_t* row, const ConvParams& p) {
  int64_t r = 0;
  for (int d = 0; d < p.dims; ++d) r = r * p.stride[d] + row[1 + d] % p.stride[d];
  return r;
}

// Stable counting sort of the input positions by class (they are in key order already).
ResidueClasses group_by_residue(const CoordSet& in, const ConvParams& p, int64_t classes,
                                const KeyLayout& layout) {
  const int64_t n = in.size();
  const int w = in.width();
  std::vector<int64_t> cls(n);
  ResidueClasses g;
  g.ptr.assign(classes + 1, 0);
  for (int64_t q = 0; q < n; ++q) ++g.ptr[(cls[q] = residue_class(&in.coords[q * w], p)) + 1];
  for (int64_t r = 0; r < classes; ++r) g.ptr[r + 1] += g.ptr[r];
  std::vector<int64_t> pos(g.ptr.begin(), g.ptr.end() - 1);
  std::vector<int64_t> order(n);
  for (int64_t q = 0; q < n; ++q) order[pos[cls[q]]++] = q;
  g.site.resize(n);
  g.coarse.resize(n);
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n; ++j) {
    const int32_t* row = &in.coords[order[j] * w];
    int64_t c[kMaxDims + 1] = {row[0]};
    for (int d = 0; d < p.dims; ++d) c[1 + d] = row[1 + d] / p.stride[d];
    g.coarse[j] = layout.pack(c);
    g.site[j] = in.site[order[j]];
  }
  return g;
}

// Class r and coarse shift c of offset k (see the top of the file).
int64_t offset_class(const ConvParams& p, int64_t k, int64_t* c) {
  int64_t e[kMaxDims], r = 0;
  offset_vector(p, k, e);
  for (int d = 0; d < p.dims; ++d) {
    const int64_t s = p.stride[d], t = e[d] * p.dilation[d] - p.padding[d];
    const int64_t rd = ((t % s) + s) % s;
    c[d] = (rd - t) / s;
    r = r * s + rd;
  }
  return r;
}

// A layout holding the output sites and every query floor(i / stride) + c.
KeyLayout query_layout(const CoordSet& in, const CoordSet& out, const ConvParams& p) {
  int64_t lo[kMaxDims], hi[kMaxDims];
  for (int d = 0; d < p.dims; ++d) {
    int64_t cmin = INT64_MAX, cmax = INT64_MIN;
    for (int64_t e = 0; e < p.kernel[d]; ++e) {
      const int64_t s = p.stride[d], t = e * p.dilation[d] - p.padding[d];
      const int64_t c = (((t % s) + s) % s - t) / s;
      cmin = std::min(cmin, c);
      cmax = std::max(cmax, c);
    }
    // inputs lie in [0, spatial_shape), so floor(i / s) in [0, (shape - 1) / s]
    lo[d] = std::min(out.layout.lo[d], cmin);
    hi[d] = std::max(out.layout.hi(d), (in.spatial_shape[d] - 1) / p.stride[d] + cmax);
  }
  return make_key_layout(p.dims, std::max(in.batch_size, out.layout.batch_size), lo, hi);
}

// Pairs of one offset over class entries [p0, p1): each shifted coarse key looked up in the
// output keys by galloping; both ascend, so the output cursor only moves forward.
void merge_class_chunk(const ResidueClasses& g, const uint64_t* out_keys, int64_t n_out,
                       const int32_t* out_site, uint64_t delta, MergeTask& t) {
  int64_t j = std::lower_bound(out_keys, out_keys + n_out, g.coarse[t.p0] + delta) - out_keys;
  for (int64_t q = t.p0; q < t.p1 && j < n_out; ++q) {
    const uint64_t key = g.coarse[q] + delta;
    j = gallop(out_keys, j, n_out, key);
    if (j < n_out && out_keys[j] == key) {
      t.ins.push_back(g.site[q]);
      t.outs.push_back(out_site[j]);
      ++j;  // output keys are unique, coarse keys within a class too
    }
  }
}

}  // namespace

bool strided_map(const CoordSet& in, const CoordSet& out_sites, const ConvParams& p,
                 KernelMap& out) {
  int64_t classes = 1;
  for (int d = 0; d < p.dims; ++d) {
    classes *= p.stride[d];
    if (classes > kMaxClasses) return false;
  }
  const int64_t K = p.volume();
  std::vector<MergeTask> tasks;
  if (in.size() > 0 && out_sites.size() > 0) {
    const KeyLayout layout = query_layout(in, out_sites, p);
    std::vector<uint64_t> repacked;
    const uint64_t* out_keys = out_sites.keys.data();
    if (!same_layout(layout, out_sites.layout)) {  // fields too narrow for some queries
      repacked = repack_keys(out_sites, layout);
      out_keys = repacked.data();
    }
    const ResidueClasses g = group_by_residue(in, p, classes, layout);
    std::vector<Span> spans;
    std::vector<uint64_t> delta(K);
    for (int64_t k = 0; k < K; ++k) {
      int64_t c[kMaxDims];
      const int64_t r = offset_class(p, k, c);
      delta[k] = layout.offset(c);
      spans.push_back({k, g.ptr[r], g.ptr[r + 1]});
    }
    tasks = make_tasks(spans);
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t t = 0; t < tasks.size(); ++t)
      merge_class_chunk(g, out_keys, out_sites.size(), out_sites.site.data(), delta[tasks[t].k],
                        tasks[t]);
  }
  std::vector<int64_t> count(K, 0);
  for (const MergeTask& t : tasks) count[t.k] += static_cast<int64_t>(t.ins.size());
  assemble_map(tasks, count, out);
  return true;
}

}  // namespace sparsejit::point_conv::detail
