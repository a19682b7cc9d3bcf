// The device-generic RGMS (rgms_composite.h): the plan builder and the composite.
#include "torch_ext/composite/rgms_composite.h"

#ifndef SPARSEJIT_STABLE_ABI
#include <ATen/core/dispatch/Dispatcher.h>
#endif

#include <cstdlib>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "csrc/plan/plan_header.h"
#include "csrc/rgms/plan_layout.h"
#include "csrc/rgms/rgms_plan.h"
#include "torch_ext/common.h"
#include "torch_ext/validated.h"

namespace sparsejit::composite {

// The plan with tensor ops on the edges' own device, word for word build_plan's: a stable sort
// by the key relation * num_dst + target (the CPU's two stable counting sorts: ties keep edge
// order), groups where the key changes, rel_ptr by a search of each group's relation. nullopt
// when an edge is out of range (the caller's CPU checks name it) or the key could overflow.
// Host syncs: the validity flag, the group count, and the whole plan once for its
// fingerprint (a serial hash, computed on the host; the header goes back in one small copy).
std::optional<tx::Tensor> rgms_plan_tensor(const tx::Tensor& ei, const tx::Tensor& et,
                                           int64_t num_src, int64_t num_dst, int64_t r) {
  const int64_t e = ei.size(1);
  // (the key's scalars cross the stable ABI as doubles: exact below 2^53)
  if (num_dst > (int64_t{1} << 53) || e > (int64_t{1} << 53) ||
      (num_dst > 0 && r > (int64_t{1} << 62) / num_dst))
    return std::nullopt;
  const auto i64 = ei.options();
  const tx::Tensor s = ei.select(0, 0), d = ei.select(0, 1);
  if (e > 0) {
    const tx::Tensor bad = (et < 0) | (et >= r) | (s < 0) | (s >= num_src) | (d < 0) |
                           (d >= num_dst);
    if (bad.any().item<bool>()) return std::nullopt;  // sync: the validity flag
  }
  const tx::Tensor key = et * num_dst + d;
  auto [sk, perm] = tx::sort(key, /*stable=*/true, 0, false);
  const tx::Tensor starts = tx::nonzero(run_starts(sk)).reshape({-1});  // sync: the group count
  const int64_t g = starts.numel();
  const tx::Tensor lead = perm.index_select(0, starts);  // first edge of each group
  const tx::Tensor arrays[] = {
      tx::searchsorted(et.index_select(0, lead), tx::arange(r + 1, i64)),         // rel_ptr
      tx::cat({starts, tx::zeros({e + 1 - g}, i64) + e}),                          // grp_ptr
      tx::cat({d.index_select(0, lead), tx::zeros({e - g}, i64)}),                 // grp_dst
      s.index_select(0, perm),                                                     // src
      perm};                                                                       // perm
  tx::Tensor plan = tx::empty({rgms::plan_words(r, e)}, i64);
  int64_t at[rgms::kNumArrays];
  rgms::array_offsets(r, e, at);
  for (int i = 0; i < rgms::kNumArrays; ++i)
    plan.narrow(0, at[i], rgms::kArrays[i].length(r, e)).copy_(arrays[i]);
  // sync: the words for the fingerprint (the CPU plan's own stamp_plan over them).
  tx::Tensor host = plan.cpu();
  int64_t* words = ptr<int64_t>(host);
  rgms::write_plan_head(words, r, e, num_dst, num_src);
  if (plan.device().is_cpu()) return host;
  plan.narrow(0, 0, rgms::kFixedWords).copy_(host.narrow(0, 0, rgms::kFixedWords));
  return plan;
}

bool rgms_composite_forced() {
  const char* v = std::getenv("SPARSEJIT_RGMS_COMPOSITE");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

namespace {

// What the composite derives from a plan (once per live plan, row and source count).
struct Composite {
  std::vector<int64_t> rel;  // rel_ptr on the host: group ranges of the relations
  int64_t groups = 0;        // G
  tx::Tensor grp_rowptr;     // grp_ptr[0 : G + 1]: groups -> entries (col = src)
  tx::Tensor tg_rowptr, tg_col;  // targets -> groups
  tx::Tensor sg_rowptr, sg_col, sg_pos;  // sources -> (group, entry position) of their entries
  tx::Tensor inv_size;       // [E]: 1 / the size of each entry's group (mean)
};

std::shared_ptr<const Composite> composite_of(const PlanArgs& a, int64_t num_rows,
                                              int64_t num_src) {
  const int64_t key = rows_sources_key(num_rows, num_src);
  auto made = derived_once("rgms_composite", a.plan, key,
                           [&] {
    auto c = std::make_shared<Composite>();
    const tx::Tensor rel = a.rel_ptr.cpu();
    c->rel.assign(ptr<int64_t>(rel), ptr<int64_t>(rel) + rel.numel());
    c->groups = c->rel.back();
    const auto opt = a.grp_ptr.options();
    c->grp_rowptr = a.grp_ptr.narrow(0, 0, c->groups + 1).contiguous();
    // Targets -> groups: a stable sort of the groups by target.
    const auto dst = a.grp_dst.narrow(0, 0, c->groups);
    auto [dst_sorted, by_dst] = tx::sort(dst, /*stable=*/true, 0, false);
    c->tg_rowptr = tx::searchsorted(dst_sorted, tx::arange(num_rows + 1, opt));
    c->tg_col = by_dst;
    // Each entry's group, and the sources -> entries CSR.
    const auto sizes = c->grp_rowptr.narrow(0, 1, c->groups) - c->grp_rowptr.narrow(0, 0, c->groups);
    const auto entry_group =
        tx::repeat_interleave(tx::arange(c->groups, opt), sizes, 0, a.e);
    c->inv_size = tx::ones({a.e}, opt.dtype(tx::kDouble))
                      .div_(sizes.index_select(0, entry_group).to(tx::kDouble));
    auto [src_sorted, by_src] = tx::sort(a.src, /*stable=*/true, 0, false);
    c->sg_rowptr = tx::searchsorted(src_sorted, tx::arange(num_src + 1, opt));
    c->sg_col = entry_group.index_select(0, by_src);
    c->sg_pos = by_src;
    int64_t bytes = 8 * int64_t(c->rel.size());
    for (const auto* t : {&c->grp_rowptr, &c->tg_rowptr, &c->tg_col, &c->sg_rowptr, &c->sg_col,
                          &c->sg_pos, &c->inv_size})
      bytes += static_cast<int64_t>(t->nbytes());
    return Derived{std::shared_ptr<const Composite>(c), bytes};
  });
  return std::static_pointer_cast<const Composite>(made);
}

// The composite's nested sparsejit::spmm / sddmm calls, through the dispatcher (so that they
// reach the kernel of the tensors' device).
#ifndef SPARSEJIT_STABLE_ABI
tx::Tensor call_spmm(const tx::Tensor& rowptr, const tx::Tensor& col,
                     const std::optional<tx::Tensor>& values, const tx::Tensor& x,
                     tx::Str reduce, int64_t num_cols) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("sparsejit::spmm", "")
          .typed<std::tuple<tx::Tensor, tx::Tensor>(
              const tx::Tensor&, const tx::Tensor&, const std::optional<tx::Tensor>&,
              const tx::Tensor&, tx::Str, c10::SymInt, const std::optional<tx::Tensor>&,
              const std::optional<tx::Tensor>&, const std::optional<tx::Tensor>&,
              const std::optional<tx::Tensor>&, const std::optional<tx::Tensor>&,
              tx::Str, double, double, bool)>();
  return std::get<0>(op.call(rowptr, col, values, x, reduce, c10::SymInt(num_cols), std::nullopt,
                             std::nullopt, std::nullopt, std::nullopt, std::nullopt, "none",
                             0.01, 1.0, false));
}

tx::Tensor call_sddmm(const tx::Tensor& rowptr, const tx::Tensor& col, const tx::Tensor& q,
                      const tx::Tensor& k) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("sparsejit::sddmm", "")
          .typed<tx::Tensor(const tx::Tensor&, const tx::Tensor&, const tx::Tensor&,
                            const tx::Tensor&, c10::SymInt, const std::optional<tx::Tensor>&,
                            const std::optional<tx::Tensor>&, const std::optional<tx::Tensor>&)>();
  return op.call(rowptr, col, q, k, c10::SymInt(k.size(0)), std::nullopt, std::nullopt,
                 std::nullopt);
}
#else
tx::Tensor call_spmm(const tx::Tensor& rowptr, const tx::Tensor& col,
                     const std::optional<tx::Tensor>& values, const tx::Tensor& x,
                     tx::Str reduce, int64_t num_cols) {
  const std::optional<tx::Tensor> none;
  return tx::unbox_tensor(tx::call_boxed<2>("sparsejit::spmm", "", rowptr, col, values, x, reduce,
                                            num_cols, none, none, none, none, none,
                                            std::string("none"), 0.01, 1.0, false)[0]);
}

tx::Tensor call_sddmm(const tx::Tensor& rowptr, const tx::Tensor& col, const tx::Tensor& q,
                      const tx::Tensor& k) {
  const std::optional<tx::Tensor> none;
  return tx::unbox_tensor(tx::call_boxed<1>("sparsejit::sddmm", "", rowptr, col, q, k,
                                            int64_t(k.size(0)), none, none, none)[0]);
}
#endif

// Z [G, F_in]: each group's reduce (sum or mean) of a_e X[src[e]].
tx::Tensor composite_groups(const PlanArgs& a, const Composite& c, const tx::Tensor& x,
                            const std::optional<tx::Tensor>& values) {
  std::optional<tx::Tensor> v;
  if (values.has_value()) v = values->index_select(0, a.perm);
  return call_spmm(c.grp_rowptr, a.src, v, x, a.mean ? "mean" : "sum", x.size(0));
}

}  // namespace

tx::Tensor rgms_composite(const PlanArgs& a, const tx::Tensor& x, const tx::Tensor& w,
                          const std::optional<tx::Tensor>& values, int64_t num_rows,
                          const std::optional<tx::Tensor>& root,
                          const std::optional<tx::Tensor>& x_root,
                          const std::optional<tx::Tensor>& bias) {
  tx::AutoDispatchBelowADInplaceOrView below_autograd;
  const auto c = composite_of(a, num_rows, x.size(0));
  const auto z = composite_groups(a, *c, x, values);
  auto zw = tx::empty({c->groups, w.size(2)}, x.options());
  for (int64_t r = 0; r < a.r; ++r) {
    const int64_t g0 = c->rel[r], n = c->rel[r + 1] - g0;
    if (n == 0) continue;
    auto out_r = zw.narrow(0, g0, n);
    tx::mm_out(out_r, z.narrow(0, g0, n), w[r]);
  }
  auto y = call_spmm(c->tg_rowptr, c->tg_col, std::nullopt, zw, "sum", c->groups);
  if (root.has_value()) y.addmm_(*x_root, *root);
  if (bias.has_value()) y.add_(*bias);
  return y;
}

std::tuple<tx::Tensor, tx::Tensor, tx::Tensor> rgms_backward_composite(
    const PlanArgs& a, const tx::Tensor& x, const tx::Tensor& w,
    const std::optional<tx::Tensor>& values, const tx::Tensor& dy, bool need_x, bool need_w,
    bool need_values, const std::optional<tx::Tensor>& root) {
  tx::AutoDispatchBelowADInplaceOrView below_autograd;
  const int64_t num_rows = dy.size(0);
  const auto c = composite_of(a, num_rows, x.size(0));
  const auto dzw = dy.index_select(0, a.grp_dst.narrow(0, 0, c->groups));  // [G, F_out]
  tx::Tensor z;
  if (need_w) z = composite_groups(a, *c, x, values);
  auto dw = need_w ? tx::zeros_like(w) : tx::empty({0}, x.options());
  auto dz = (need_x || need_values) ? tx::empty({c->groups, x.size(1)}, x.options())
                                    : tx::Tensor();
  for (int64_t r = 0; r < a.r; ++r) {
    const int64_t g0 = c->rel[r], n = c->rel[r + 1] - g0;
    if (n == 0) continue;
    if (need_w) {
      auto dw_r = dw[r];
      tx::mm_out(dw_r, z.narrow(0, g0, n).t(), dzw.narrow(0, g0, n));
    }
    if (dz.defined()) {
      auto dz_r = dz.narrow(0, g0, n);
      tx::mm_out(dz_r, dzw.narrow(0, g0, n), w[r].t());
    }
  }
  // Each entry's factor: its value, divided by its group's size for the mean.
  std::optional<tx::Tensor> factor;
  if (values.has_value()) factor = values->index_select(0, a.perm);
  if (a.mean) {
    const auto inv = c->inv_size.to(x.scalar_type());
    factor = factor.has_value() ? *factor * inv : inv;
  }
  tx::Tensor dx = tx::empty({0}, x.options());
  if (need_x) {
    std::optional<tx::Tensor> f_src;
    if (factor.has_value()) f_src = factor->index_select(0, c->sg_pos);
    dx = call_spmm(c->sg_rowptr, c->sg_col, f_src, dz, "sum", c->groups);
    if (root.has_value()) dx.addmm_(dy, root->t());
  }
  tx::Tensor dv = tx::empty({0}, x.options());
  if (need_values) {
    auto dots = call_sddmm(c->grp_rowptr, a.src, dz, x);  // <dZ[g], X[src[e]]> per entry
    if (a.mean) dots = dots * c->inv_size.to(x.scalar_type());
    dv = tx::empty({a.e}, x.options()).index_put_({a.perm}, dots);
  }
  return {dx, dw, dv};
}

}  // namespace sparsejit::composite
