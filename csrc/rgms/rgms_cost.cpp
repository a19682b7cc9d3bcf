// RGMS plan and cost model (csrc/rgms/rgms_run.h): the distinct-source index, the
// per-relation choice between aggregate first and transform first, the transposed
// structure grad X runs on, and the forward's defaults.
#include "csrc/rgms/rgms_passes.h"

#include "csrc/core/isa.h"
#include "csrc/rgms/rgms_plan.h"

namespace sparsejit::rgms {

using namespace detail;  // NOLINT: the passes' shared pieces

bool forward_runs_tiles(int64_t f_in, int64_t f_out, Gemm gemm) {
  Problem p;
  p.f_in = f_in;
  p.f_out = f_out;
  p.gemm = gemm;
  return f_in > 0 && f_out > 0 && !use_fused(p, Pass::kForward);
}

int64_t default_tile(int64_t f_in, int64_t f_out) {
  // Gathered rows plus products within ~64 KiB of float32 (L1 + part of L2): the tile then
  // amortizes the per-call packing of W[r] (AIFB, F = 16: 512 groups measured ~20% faster
  // than 128).
  const int64_t width = std::max<int64_t>(1, f_in + f_out);
  return std::clamp<int64_t>(16384 / width, 16, 512);
}

// Parallel over relations; each thread stamps a private array of num_src marks with the
// relation id, so nothing is cleared between them.
SourceIndex index_sources(const Problem& p) {
  const PlanView& pv = p.plan;
  SourceIndex si;
  si.src_ptr.assign(size_t(pv.r + 1), 0);
  si.slot.assign(size_t(pv.e), 0);
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      for (int64_t r = 0; r < pv.r; ++r) si.src_ptr[r + 1] += si.src_ptr[r];
      si.src_list.assign(size_t(si.src_ptr[pv.r]), 0);
    }
#pragma omp parallel num_threads(std::max(1, p.num_threads)) if (pv.e > 65536)
    {
      std::vector<int64_t> mark(size_t(p.num_src), -1), local(size_t(p.num_src), 0);
#pragma omp for schedule(dynamic, 1)
      for (int64_t r = 0; r < pv.r; ++r) {
        int64_t count = 0;
        const int64_t q0 = pv.grp_ptr[pv.rel_ptr[r]], q1 = pv.grp_ptr[pv.rel_ptr[r + 1]];
        for (int64_t q = q0; q < q1; ++q) {
          const int64_t s = pv.src[q];
          if (mark[s] != r) {
            mark[s] = r;
            local[s] = count;
            if (pass == 1) si.src_list[size_t(si.src_ptr[r] + count)] = s;
            ++count;
          }
          if (pass == 1) si.slot[size_t(q)] = local[s];
        }
        if (pass == 0) si.src_ptr[r + 1] = count;
      }
    }
  }
  return si;
}

namespace detail {

RelationPlan plan_from_sources(const Problem& p, const SourceIndex& si) {
  const PlanView& pv = p.plan;
  RelationPlan rp;
  const double fi = double(p.f_in), fo = double(p.f_out);
  int64_t budget = p.num_rows;  // transformed rows kept, in rows of F_out
  for (int64_t r = 0; r < pv.r; ++r) {
    const int64_t g = pv.rel_ptr[r + 1] - pv.rel_ptr[r];
    const int64_t e = g > 0 ? pv.grp_ptr[pv.rel_ptr[r + 1]] - pv.grp_ptr[pv.rel_ptr[r]] : 0;
    const int64_t s = si.src_ptr[r + 1] - si.src_ptr[r];
    rp.entries.push_back(e);
    rp.targets.push_back(g);
    rp.sources.push_back(s);
    const double agg_first = double(g) * fi * fo + double(e) * fi;
    const double tr_first = double(s) * fi * fo + double(s) * fi + double(e) * fo;
    int8_t c = 1;
    if (p.strategy == Strategy::kTransformFirst) {
      c = 2;
    } else if (p.strategy == Strategy::kAuto && e > 0 && tr_first < 0.9 * agg_first &&
               s <= budget) {
      c = 2;
      budget -= s;
    }
    rp.choice.push_back(c);
  }
  return rp;
}

// The cached index when the caller has one, else a fresh one kept in `own`.
const SourceIndex& sources_of(const Problem& p, SourceIndex& own) {
  if (p.sources) return *p.sources;
  own = index_sources(p);
  return own;
}

}  // namespace detail

TransposedPlan transpose_plan(const Problem& p) {
  const PlanView& pv = p.plan;
  const int64_t e = pv.e, r = pv.r;
  // The entries as edges (original target -> original source), in plan order.
  std::vector<int64_t> t_src(static_cast<size_t>(e)), t_dst(static_cast<size_t>(e)),
      t_rel(static_cast<size_t>(e));
  for (int64_t rel = 0; rel < r; ++rel)
    for (int64_t g = pv.rel_ptr[rel]; g < pv.rel_ptr[rel + 1]; ++g)
      for (int64_t q = pv.grp_ptr[g]; q < pv.grp_ptr[g + 1]; ++q) {
        t_src[size_t(q)] = pv.grp_dst[g];
        t_dst[size_t(q)] = pv.src[q];
        t_rel[size_t(q)] = rel;
      }
  TransposedPlan t;
  t.rel_ptr.resize(size_t(r + 1));
  t.grp_ptr.resize(size_t(e + 1));
  t.grp_dst.resize(size_t(e));
  t.src.resize(size_t(e));
  t.perm.resize(size_t(e));
  build_plan(t_src.data(), t_dst.data(), t_rel.data(), e, p.num_src, r, t.rel_ptr.data(),
             t.grp_ptr.data(), t.grp_dst.data(), t.src.data(), t.perm.data());
  Problem q = p;
  q.plan = t.view(r, e);
  q.num_rows = p.num_src;
  q.num_src = p.num_rows;
  t.sources = index_sources(q);
  return t;
}

RelationPlan relation_plan(const Problem& p) {
  SourceIndex own;
  return plan_from_sources(p, sources_of(p, own));
}

bool fused_bf16_takes(const Problem& p) {
  // Kind 8 multiplies with vdpbf16ps only in a JIT instantiation built for this CPU (the
  // library's own copy emulates it, slower than kind 2 on widened rows).
  return p.f_in > 0 && p.f_out > 0 && use_fused(p, Pass::kForward) && cpu_has_avx512_bf16() &&
         tile_fn<float>(p.f_in, p.plan.e * p.f_in, p.f_out) != rows::generic_fn<float>();
}

}  // namespace sparsejit::rgms
