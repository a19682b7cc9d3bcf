// The RGMS backward (csrc/rgms/rgms_run.h): grad X as the forward on the transposed
// structure (grad W inside it where that pays), grad W on the source side or in its own pass,
// grad values one dot product per entry.
#include "csrc/rgms/rgms_passes.h"

namespace sparsejit::rgms {

using namespace detail;  // NOLINT: the passes' shared pieces

namespace {

// Relations whose dW is taken on their source side (see rgms_run.h): side[r] == 2, and the
// relations' distinct-source lists.
struct SourceSide {
  std::vector<int8_t> side;
  SourceIndex own;                      // built here when the caller has no cached index
  const SourceIndex* cached = nullptr;  // the caller's
  const SourceIndex& si() const { return cached ? *cached : own; }
  bool any = false;
};

// Chooses the source-side relations (the forward's transform-first ones) and computes their
// dW[r], one relation per task.
template <typename T>
SourceSide source_side(const Problem& p, const T* x, const T* values, const T* dy, T* dw) {
  const PlanView& pv = p.plan;
  const int64_t fi = p.f_in, fo = p.f_out;
  SourceSide ss;
  ss.side.assign(size_t(pv.r), 1);
  if (p.strategy == Strategy::kAggregateFirst || pv.e == 0 || fi == 0 || fo == 0 || !dw)
    return ss;
  if (p.sources) {
    ss.cached = p.sources;
  } else {
    ss.own = index_sources(p);
  }
  ss.side = plan_from_sources(p, ss.si()).choice;
  std::vector<int64_t> rels;
  for (int64_t r = 0; r < pv.r; ++r)
    if (ss.side[r] == 2 && ss.si().src_ptr[r + 1] > ss.si().src_ptr[r]) rels.push_back(r);
  ss.any = !rels.empty();
  if (!ss.any) return ss;
  const int64_t n_rels = int64_t(rels.size());
  FirstError fe;
  // Parallel even for one relation: a GEMM called outside an active parallel region lets
  // oneDNN thread it, and its threaded sgemm for this shape (F_in x F_out, K = S_r in the
  // thousands) took 3x the serial time on 2 threads (2026-11, EPYC, 20k nodes, F = 16).
#pragma omp parallel num_threads(std::max(1, p.num_threads)) if (pv.e * fo > 4096)
  {
    std::vector<T> t_r, xs;
#pragma omp for schedule(dynamic, 1)
    for (int64_t k = 0; k < n_rels; ++k) {
      const int64_t r = rels[size_t(k)];
      const int64_t s0 = ss.si().src_ptr[r], s_r = ss.si().src_ptr[r + 1] - s0;
      t_r.assign(size_t(s_r * fo), T(0));
      // T_r[slot] += coef * dY[target]: entries in their stored order (deterministic).
      slot_rows_run(SlotDir::kToSlots, pv, ss.si().slot.data(), values, p.mean,
                    pv.rel_ptr[r], pv.rel_ptr[r + 1], dy, t_r.data(), fo);
      // dW[r] = X[sources]^T T_r
      xs.resize(size_t(s_r * fi));
      for (int64_t i = 0; i < s_r; ++i)
        std::memcpy(xs.data() + i * fi, x + ss.si().src_list[size_t(s0 + i)] * fi, sizeof(T) * fi);
      gemm(fe, p.gemm, true, false, fi, fo, s_r, xs.data(), fi, t_r.data(), fo, T(0),
           dw + r * fi * fo, fo);
    }
  }
  fe.rethrow();
  return ss;
}

// dX = RGMS(A^T, dY, W^T) (+ dY @ root^T): the forward on the transposed structure, with
// each entry's coefficient (values, 1/|group| for the mean) in a vector by plan position.
template <typename T>
void backward_x_transposed(const Problem& p, const TransposedPlan* tp, const T* w,
                           const T* values, const T* dy, T* dx, const T* root,
                           GradWSink<T>* sink) {
  const PlanView& pv = p.plan;
  const int64_t fi = p.f_in, fo = p.f_out;
  Problem q = p;
  q.plan = tp->view(pv.r, pv.e);
  q.num_rows = p.num_src;
  q.num_src = p.num_rows;
  q.f_in = fo;
  q.f_out = fi;
  q.mean = false;
  q.sources = &tp->sources;
  q.transposed = nullptr;
  q.strategy = p.strategy == Strategy::kAggregateFirst  ? Strategy::kTransformFirst
               : p.strategy == Strategy::kTransformFirst ? Strategy::kAggregateFirst
                                                          : Strategy::kAuto;
  q.f_root = root ? fo : 0;
  std::vector<T> c;
  if (values || p.mean) {
    c.resize(size_t(pv.e));
    for (int64_t g = 0; g < pv.rel_ptr[pv.r]; ++g) {
      if (values) {
        for (int64_t k = pv.grp_ptr[g]; k < pv.grp_ptr[g + 1]; ++k)
          c[size_t(k)] = coef(pv, values, p.mean, g, k);
      } else {  // mean without values: coef's 1 / |g|, one division a group
        const T inv = T(1) / T(pv.grp_ptr[g + 1] - pv.grp_ptr[g]);
        std::fill(c.begin() + pv.grp_ptr[g], c.begin() + pv.grp_ptr[g + 1], inv);
      }
    }
  }
  std::vector<T> wt(size_t(pv.r * fi * fo));  // W[r]^T: [F_out, F_in] per relation
  for (int64_t r = 0; r < pv.r; ++r)
    for (int64_t i = 0; i < fi; ++i)
      for (int64_t j = 0; j < fo; ++j) wt[size_t((r * fo + j) * fi + i)] = w[(r * fi + i) * fo + j];
  std::vector<T> root_t;
  RootTerm<T> rt;
  if (root) {
    root_t.resize(size_t(fi * fo));
    for (int64_t i = 0; i < fi; ++i)
      for (int64_t j = 0; j < fo; ++j) root_t[size_t(j * fi + i)] = root[i * fo + j];
    rt.x_root = dy;
    rt.root = root_t.data();
  }
  forward_impl<T>(q, dy, wt.data(), c.empty() ? nullptr : c.data(), dx, rt, sink);
}

// Whether dW runs inside grad X's pass (GradWSink) for these widths and this structure: the
// transposed pass runs GEMM tiles (not the fused rows, no bfloat16), its tiles average at
// least 32 groups per (chunk, relation) (smaller ones make poor GEMMs for dW), and the
// partials fit in 32 MiB. Depends on the problem, never on the thread count.
template <typename T>
bool grad_w_in_grad_x(const Problem& p, const TransposedPlan& tp, int64_t chunks, int64_t slabs) {
  const int64_t fi = p.f_in, fo = p.f_out;
  if (p.w_bf16 != nullptr || p.x_bf16 != nullptr || !forward_runs_tiles(fo, fi, p.gemm))
    return false;
  // kAggregateFirst makes the transposed pass transform-first everywhere: no tiles to share.
  if (p.strategy == Strategy::kAggregateFirst) return false;
  int64_t active = 0;
  for (int64_t r = 0; r < p.plan.r; ++r)
    active += tp.rel_ptr[size_t(r + 1)] > tp.rel_ptr[size_t(r)];
  const int64_t groups = tp.rel_ptr[size_t(p.plan.r)];
  const double bytes = double(slabs) * double(p.plan.r) * double(fi) * double(fo) * sizeof(T);
  return active > 0 && groups >= 32 * chunks * active && bytes <= double(32 << 20);
}

// One relation's dW[r][i0:i0 + wd, :] (rows i0.. of it, every column): zeroed, then the sum
// over tiles of agg[:, i0:i0 + wd]^T @ dYg (or the fused kind-4 rows). agg [tile, wd] and
// dyg [tile, fo] are the caller's scratch.
template <typename T>
void relation_dw(FirstError& fe, const Problem& p, TileFn fn, bool fused, int64_t r, int64_t i0,
                 int64_t wd, const T* x, const T* values, const T* dy, T* dw, T* agg, T* dyg) {
  const PlanView& pv = p.plan;
  const int64_t fi = p.f_in, fo = p.f_out, tile = tile_of(p);
  T* dw_r = dw + r * fi * fo + i0 * fo;
  if (fo > 0) std::memset(dw_r, 0, sizeof(T) * wd * fo);
  if (pv.rel_ptr[r + 1] <= pv.rel_ptr[r] || fo == 0) return;
  if (fused) {  // per group: dW[r] rows += (reduced own columns) x dY[target]
    auto l = tile_launch(p, 4, values, x, dw_r, i0, wd, pv.rel_ptr[r], pv.rel_ptr[r + 1]);
    l.ld_in = fi;
    l.prefetch_end = pv.grp_ptr[pv.rel_ptr[r + 1]];
    l.grp_dst = pv.grp_dst;
    l.aux = dy;
    l.width2 = fo;
    fn(&l);
    return;
  }
  for (int64_t g0 = pv.rel_ptr[r]; g0 < pv.rel_ptr[r + 1]; g0 += tile) {
    const int64_t g1 = std::min(pv.rel_ptr[r + 1], g0 + tile), m = g1 - g0;
    gather_reduce(fn, p, values, x, fi, i0, wd, g0, g1, agg);
    gather_targets(pv, dy, fo, g0, g1, dyg);
    gemm(fe, p.gemm, true, false, wd, fo, m, agg, wd, dyg, fo, T(1), dw_r, fo);
  }
}

// Whether grad W gives whole relations to threads (dynamic schedule, largest first) rather
// than splitting every relation's rows of dW between them: when no relation holds more than
// a quarter of one thread's share of the entries, so the schedule stays balanced. Whole
// relations gather each dY row once (the row split gathers it once per thread) and run
// [F_in, F_out] products instead of [F_in / threads, F_out] ones.
bool grad_w_by_relation(const Problem& p, const std::vector<int8_t>& side) {
  const PlanView& pv = p.plan;
  const int64_t nt = std::max(1, p.num_threads);
  if (nt == 1) return false;
  int64_t total = 0, largest = 0;
  for (int64_t r = 0; r < pv.r; ++r) {
    if (side[size_t(r)] == 2) continue;
    const int64_t e_r = pv.grp_ptr[pv.rel_ptr[r + 1]] - pv.grp_ptr[pv.rel_ptr[r]];
    total += e_r;
    largest = std::max(largest, e_r);
  }
  return total > 0 && largest * 4 * nt <= total;
}

// dW[r][i0:i1, :] = sum over tiles of agg[:, i0:i1]^T @ dYg; thread t owns rows [i0, i1), or
// (grad_w_by_relation) whole relations. Source-side relations were written by source_side.
template <typename T>
void backward_w(const Problem& p, const T* x, const T* values, const T* dy, T* dw,
                const std::vector<int8_t>& side) {
  const PlanView& pv = p.plan;
  const int64_t fi = p.f_in, fo = p.f_out, tile = tile_of(p);
  FirstError fe;
  const bool fused = use_fused(p, Pass::kGradW);
  if (grad_w_by_relation(p, side)) {
    std::vector<int64_t> rels;
    for (int64_t r = 0; r < pv.r; ++r)
      if (!(side[size_t(r)] == 2 && pv.rel_ptr[r + 1] > pv.rel_ptr[r])) rels.push_back(r);
    const auto entries = [&](int64_t r) {
      return pv.grp_ptr[pv.rel_ptr[r + 1]] - pv.grp_ptr[pv.rel_ptr[r]];
    };
    std::stable_sort(rels.begin(), rels.end(),
                     [&](int64_t a, int64_t b) { return entries(a) > entries(b); });
    const TileFn fn = tile_fn<T>(fi, pv.e * fi, fused ? fo : 0);
    const int64_t n_rels = int64_t(rels.size());
#pragma omp parallel num_threads(std::max(1, p.num_threads)) if (n_rels > 1 && pv.e * fi > 4096)
    {
      std::vector<T> agg(size_t(tile * fi)), dyg(size_t(tile * std::max<int64_t>(fo, 1)));
#pragma omp for schedule(dynamic, 1)
      for (int64_t k = 0; k < n_rels; ++k)
        relation_dw(fe, p, fn, fused, rels[size_t(k)], 0, fi, x, values, dy, dw, agg.data(),
                    dyg.data());
    }
    fe.rethrow();
    return;
  }
  const auto fns = share_fns<T>(p, fi, 1, pv.e * fi, fused ? fo : 0);
#pragma omp parallel num_threads(std::max(1, p.num_threads)) if (pv.e * fi > 4096 && fi >= 2)
  {
    const int64_t nt = thread_count(), t = thread_id();
    const auto [i0, i1] = column_share(fi, t, nt, 1);
    const int64_t wd = i1 - i0;
    const TileFn fn = nt == int64_t(fns.size()) ? fns[size_t(t)] : rows::generic_fn<T>();
    std::vector<T> agg(size_t(tile * std::max<int64_t>(wd, 1))), dyg(size_t(tile * std::max<int64_t>(fo, 1)));
    for (int64_t r = 0; r < pv.r && wd > 0; ++r) {
      if (side[r] == 2 && pv.rel_ptr[r + 1] > pv.rel_ptr[r]) continue;
      relation_dw(fe, p, fn, fused, r, i0, wd, x, values, dy, dw, agg.data(), dyg.data());
    }
  }
  fe.rethrow();
}

// dvalues[perm_p] = scale_g * <x[src_p], dY[dst_g] @ W[r]^T>.
template <typename T>
void backward_values(const Problem& p, const T* x, const T* w, const T* dy, T* dv) {
  const PlanView& pv = p.plan;
  const int64_t fi = p.f_in, fo = p.f_out, tile = tile_of(p);
  std::vector<int64_t> items;  // (relation, first group) of every tile
  for (int64_t r = 0; r < pv.r; ++r)
    for (int64_t g0 = pv.rel_ptr[r]; g0 < pv.rel_ptr[r + 1]; g0 += tile) {
      items.push_back(r);
      items.push_back(g0);
    }
  const int64_t n_items = int64_t(items.size() / 2);
  FirstError fe;
#pragma omp parallel num_threads(std::max(1, p.num_threads)) if (pv.e * fi > 4096)
  {
    std::vector<T> dyg(size_t(tile * std::max<int64_t>(fo, 1))), dagg(size_t(tile * std::max<int64_t>(fi, 1)));
#pragma omp for schedule(dynamic, 4)
    for (int64_t it = 0; it < n_items; ++it) {
      const int64_t r = items[2 * it], g0 = items[2 * it + 1];
      const int64_t g1 = std::min(pv.rel_ptr[r + 1], g0 + tile), m = g1 - g0;
      gather_targets(pv, dy, fo, g0, g1, dyg.data());
      if (fi > 0) {
        gemm(fe, p.gemm, false, true, m, fi, fo, dyg.data(), std::max<int64_t>(fo, 1),
             w + r * fi * fo, std::max<int64_t>(fo, 1), T(0), dagg.data(), fi);
      }
      for (int64_t g = g0; g < g1; ++g) {
        const T* d = dagg.data() + (g - g0) * fi;
        const T scale = p.mean ? T(1) / T(pv.grp_ptr[g + 1] - pv.grp_ptr[g]) : T(1);
        for (int64_t q = pv.grp_ptr[g]; q < pv.grp_ptr[g + 1]; ++q) {
          const T* row = x + pv.src[q] * fi;
          T acc = 0;
          for (int64_t j = 0; j < fi; ++j) acc += row[j] * d[j];
          dv[pv.perm[q]] = scale * acc;
        }
      }
    }
  }
  fe.rethrow();
}

}  // namespace

template <typename T>
void backward(const Problem& p, const T* x, const T* w, const T* values, const T* dy, T* dx,
              T* dw, T* dvalues, const T* root) {
  const PlanView& pv = p.plan;
  const bool want_w = dw && p.f_in > 0 && p.f_out > 0;
  const auto ss = source_side(p, x, values, dy, want_w ? dw : nullptr);
  std::vector<int8_t> side = ss.side;  // 2: dW[r] written before backward_w
  if (dx) {
    if (p.f_out == 0 || (pv.e == 0 && !root)) {
      std::memset(dx, 0, sizeof(T) * p.num_src * p.f_in);
    } else {
      TransposedPlan own;
      const TransposedPlan* tp = p.transposed;
      if (!tp) {
        own = transpose_plan(p);
        tp = &own;
      }
      // The transposed pass's chunks when it carries dW: fixed by the problem (at least 32).
      const int64_t chunks = std::min<int64_t>(
          std::max<int64_t>(forward_chunks(p.num_src, p.f_in, int64_t(sizeof(T)), 1), 32),
          std::max<int64_t>(p.num_src, 1));
      const int64_t slabs = std::min<int64_t>(16, chunks);
      GradWSink<T> sink;
      const bool with_w = want_w && grad_w_in_grad_x<T>(p, *tp, chunks, slabs);
      std::vector<int8_t> want(size_t(pv.r));
      if (with_w) {
        for (int64_t r = 0; r < pv.r; ++r) want[size_t(r)] = int8_t(ss.side[size_t(r)] != 2);
        sink.x = x;
        sink.want = want.data();
        sink.chunks = chunks;
        sink.slabs = slabs;
        sink.partial.assign(size_t(slabs * pv.r * p.f_in * p.f_out), T(0));
      }
      backward_x_transposed(p, tp, w, values, dy, dx, root, with_w ? &sink : nullptr);
      if (with_w) {  // dW[r] = the slabs' partials, summed in slab order
        const int64_t block = p.f_in * p.f_out;
#pragma omp parallel for num_threads(std::max(1, p.num_threads)) schedule(static)
        for (int64_t r = 0; r < pv.r; ++r) {
          if (!sink.done[size_t(r)]) continue;
          T* out = dw + r * block;
          std::memcpy(out, sink.partial.data() + r * block, sizeof(T) * block);
          for (int64_t u = 1; u < slabs; ++u) {
            const T* part = sink.partial.data() + (u * pv.r + r) * block;
            for (int64_t k = 0; k < block; ++k) out[k] += part[k];
          }
        }
        for (int64_t r = 0; r < pv.r; ++r)
          if (sink.done[size_t(r)]) side[size_t(r)] = 2;
      }
    }
  }
  if (want_w) backward_w(p, x, values, dy, dw, side);
  if (dvalues) backward_values(p, x, w, dy, dvalues);
}

template void backward<float>(const Problem&, const float*, const float*, const float*,
                              const float*, float*, float*, float*, const float*);
template void backward<double>(const Problem&, const double*, const double*, const double*,
                               const double*, double*, double*, double*, const double*);

}  // namespace sparsejit::rgms
