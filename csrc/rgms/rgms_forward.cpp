// The RGMS forward (csrc/rgms/rgms_run.h): rows of Y in chunks, per chunk and relation tiles
// of groups (aggregate first: gather-reduce, one GEMM or the fused rows; transform first: the
// relation's transformed source rows reduced into Y), the root term and bias first.
#include "csrc/rgms/rgms_passes.h"

#include <stdexcept>

#include "csrc/core/isa.h"

namespace sparsejit::rgms {

namespace detail {

template <typename T>
void forward_impl(const Problem& p, const T* x, const T* w, const T* values, T* y,
                  const RootTerm<T>& rt, GradWSink<T>* sink) {
  const PlanView& pv = p.plan;
  const int64_t n = p.num_rows, fi = p.f_in, fo = p.f_out, tile = tile_of(p);
  // Relations computed transform-first: their distinct sources' rows times W[r], once.
  std::vector<int8_t> choice(size_t(pv.r), 1);
  SourceIndex own;
  const SourceIndex* si = nullptr;
  std::vector<T> transformed;
  std::vector<int64_t> t_off;
  if (p.strategy != Strategy::kAggregateFirst && fo > 0 && pv.e > 0) {
    // One pass indexes every relation's sources: the cost model reads their counts, the
    // transform-first relations their slots.
    si = &sources_of(p, own);
    choice = plan_from_sources(p, *si).choice;
    bool any = false;
    for (auto c : choice) any = any || c == 2;
    if (any) {
      // Only the transform-first relations' rows are kept (t_off: their prefix sums).
      t_off.assign(size_t(pv.r + 1), 0);
      for (int64_t r = 0; r < pv.r; ++r)
        t_off[r + 1] = t_off[r] + (choice[r] == 2 ? si->src_ptr[r + 1] - si->src_ptr[r] : 0);
      transformed.assign(size_t(t_off[pv.r] * fo), T(0));
      std::vector<int64_t> items;  // (relation, first source slot) of every tile
      for (int64_t r = 0; r < pv.r; ++r)
        for (int64_t k = si->src_ptr[r]; choice[r] == 2 && k < si->src_ptr[r + 1]; k += tile) {
          items.push_back(r);
          items.push_back(k);
        }
      const int64_t n_items = int64_t(items.size() / 2);
      FirstError fe;
#pragma omp parallel num_threads(std::max(1, p.num_threads)) if (n_items > 1)
      {
        std::vector<T> rows(size_t(tile * std::max<int64_t>(fi, 1)));
        std::vector<bf16> abuf;
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < n_items; ++it) {
          const int64_t r = items[2 * it], k0 = items[2 * it + 1];
          const int64_t k1 = std::min(si->src_ptr[r + 1], k0 + tile), m = k1 - k0;
          for (int64_t k = k0; k < k1; ++k) {
            T* dst = rows.data() + (k - k0) * fi;
            if (p.x_bf16 != nullptr) {  // the sources' bfloat16 rows, widened exactly
              const bf16* src = p.x_bf16 + si->src_list[k] * fi;
              for (int64_t j = 0; j < fi; ++j) dst[j] = T(src[j]);
            } else {
              std::memcpy(dst, x + si->src_list[k] * fi, sizeof(T) * fi);
            }
          }
          tile_product(fe, p, abuf, m, rows.data(), w, r,
                       transformed.data() + (t_off[r] + k0 - si->src_ptr[r]) * fo);
        }
      }
      fe.rethrow();
    }
  }
  const bool fused = use_fused(p, Pass::kForward);
  const TileFn gather_fn = tile_fn<T>(fi, pv.e * fi, fused ? fo : 0);
  // bfloat16 X on the fused rows: kind 8 on the weights in pairs (forward() packs them where
  // fused_bf16_takes, the only case a caller sets x_bf16 for the fused rows).
  const bool fused_bf16 = fused && p.x_bf16 != nullptr;
  if (fused_bf16 && p.w_pairs == nullptr)
    throw std::logic_error("rgms forward: x_bf16 on the fused rows without w_pairs");
  // Rows of width fo: the tiles' products added into Y, and the sink's X rows (its width is
  // this pass's f_out).
  const TileFn rows_fn = fused ? nullptr : tile_fn<T>(fo, pv.e * fo);
  if (sink) {
    sink->done.assign(size_t(pv.r), 0);
    for (int64_t r = 0; r < pv.r && !fused; ++r)
      sink->done[size_t(r)] = int8_t(sink->want[r] != 0 && choice[size_t(r)] == 1);
  }
  FirstError fe;
#pragma omp parallel num_threads(std::max(1, p.num_threads)) if (n * fo > 4096)
  {
    // Every relation adds into the chunk's rows of Y (forward_chunks). With a sink the
    // chunks run in its fixed slabs, one slab per task.
    const int64_t chunks =
        sink ? sink->chunks : forward_chunks(n, fo, int64_t(sizeof(T)), thread_count());
    const int64_t units = sink ? sink->slabs : chunks;
    std::vector<T> agg(size_t(tile * std::max<int64_t>(fi, 1))), prod(size_t(tile * std::max<int64_t>(fo, 1)));
    std::vector<T> xs(sink ? size_t(tile * fo) : 0);  // the sink's X rows
    std::vector<bf16> abuf;  // a tile in bfloat16 (p.w_bf16)
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < units; ++u)
    for (int64_t c = sink ? chunks * u / units : u,
                 c_end = sink ? chunks * (u + 1) / units : u + 1;
         c < c_end; ++c) {
      const int64_t row0 = n * c / chunks, row1 = n * (c + 1) / chunks;
      if (fo == 0) continue;
      init_rows(fe, p, rt, row0, row1, y);
      for (int64_t r = 0; r < pv.r; ++r) {
        const int64_t ga = lower_bound_dst(pv, pv.rel_ptr[r], pv.rel_ptr[r + 1], row0);
        const int64_t gb = lower_bound_dst(pv, ga, pv.rel_ptr[r + 1], row1);
        if (choice[r] == 2) {  // reduce transformed rows straight into Y
          slot_rows_run(SlotDir::kToTargets, pv, si->slot.data(), values, p.mean, ga, gb,
                        transformed.data() + t_off[r] * fo, y, fo);
          continue;
        }
        const T* w_r = w + r * fi * fo;
        if (fused) {  // y[target] += (reduced row) @ W[r], row by row
          if (gb <= ga) continue;
          auto l = tile_launch(p, 2, values, x, y, 0, fi, ga, gb);
          l.ld_in = fi;
          l.ld_out = fo;
          l.prefetch_end = pv.grp_ptr[gb];
          l.grp_dst = pv.grp_dst;
          l.w = w_r;
          l.width2 = fo;
          if (fused_bf16) {
            l.kind = 8;
            l.in = p.x_bf16;
            l.w = p.w_pairs + r * p.w_pairs_stride;
            l.ld_w = dense::bf16_vnni_ld(fo);
          }
          gather_fn(&l);
          continue;
        }
        for (int64_t g0 = ga; g0 < gb; g0 += tile) {
          const int64_t g1 = std::min(gb, g0 + tile), m = g1 - g0;
          if (p.x_bf16 != nullptr) {  // bfloat16 rows, widened in the kernel (kind 7)
            auto l = tile_launch<T>(p, 7, values, nullptr, agg.data(), 0, fi, g0, g1);
            l.in = p.x_bf16;
            l.ld_in = fi;
            l.prefetch_end = p.plan.grp_ptr[g1];
            gather_fn(&l);
          } else {
            gather_reduce(gather_fn, p, values, x, fi, 0, fi, g0, g1, agg.data());
          }
          tile_product(fe, p, abuf, m, agg.data(), w, r, prod.data());
          rows::scatter_add_rows(rows_fn, prod.data(), fo, pv.grp_dst + g0, m, y, fo);
          if (sink && sink->done[size_t(r)]) {  // partial dW[r] += X[rows]^T agg
            rows::gather_rows(rows_fn, sink->x, fo, 0, fo, pv.grp_dst + g0,
                              static_cast<const T*>(nullptr), m, xs.data());
            gemm(fe, p.gemm, true, false, fo, fi, m, xs.data(), fo, agg.data(), fi, T(1),
                 sink->partial.data() + (u * pv.r + r) * fo * fi, fi);
          }
        }
      }
    }
  }
  fe.rethrow();
}

template void forward_impl<float>(const Problem&, const float*, const float*, const float*,
                                  float*, const RootTerm<float>&, GradWSink<float>*);
template void forward_impl<double>(const Problem&, const double*, const double*,
                                   const double*, double*, const RootTerm<double>&,
                                   GradWSink<double>*);

}  // namespace detail

using namespace detail;  // NOLINT: the passes' shared pieces

namespace {

// W [R, f_in, f_out] in bfloat16, each relation packed in bfloat16 pairs
// (dense::pack_bf16_vnni); `per` values a relation.
std::vector<bf16> pack_pairs(const Problem& p, int64_t& per) {
  per = dense::bf16_vnni_size(p.f_in, p.f_out);
  std::vector<bf16> packed(size_t(std::max<int64_t>(p.plan.r * per, 1)));
  for (int64_t r = 0; r < p.plan.r; ++r)
    dense::pack_bf16_vnni(p.w_bf16 + r * p.f_in * p.f_out, p.f_in, p.f_out, p.f_out,
                          packed.data() + r * per);
  return packed;
}

}  // namespace

template <typename T>
void forward(const Problem& p, const T* x, const T* w, const T* values, T* y,
             const RootTerm<T>& rt) {
  if constexpr (std::is_same_v<T, float>) {
    // The bfloat16 weights packed in pairs once per call: for the bfloat16 micro-kernel
    // where the forward runs tiles, for the fused rows' vdpbf16ps (kind 8) where it runs
    // those (each path reads only its own).
    const bool tiles = p.w_bf16 != nullptr && p.w_vnni == nullptr &&
                       forward_runs_tiles(p.f_in, p.f_out, p.gemm) &&
                       dense::gemm_bf16_ukernel_takes(p.f_out);
    const bool rows = !tiles && p.x_bf16 != nullptr && p.w_bf16 != nullptr &&
                      fused_bf16_takes(p);
    if (tiles || rows) {
      int64_t per = 0;
      const std::vector<bf16> packed = pack_pairs(p, per);
      Problem q = p;
      (tiles ? q.w_vnni : q.w_pairs) = packed.data();
      (tiles ? q.w_vnni_stride : q.w_pairs_stride) = per;
      forward_impl<T>(q, x, w, values, y, rt, nullptr);
      return;
    }
  }
  forward_impl<T>(p, x, w, values, y, rt, nullptr);
}

template void forward<float>(const Problem&, const float*, const float*, const float*, float*,
                             const RootTerm<float>&);
template void forward<double>(const Problem&, const double*, const double*, const double*,
                              double*, const RootTerm<double>&);

}  // namespace sparsejit::rgms
