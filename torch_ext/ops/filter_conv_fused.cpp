// Fused groups of filter-sparse layers (csrc/filter_conv/fused_run.h).
//
// filter_conv_bottleneck(x, plan1, rowptr1, taps1, values1, bias1, plan2, ..., bias2, plan3,
//                        ..., bias3, band=0, plan4=None, ..., bias4=None, stride2=1) -> y:
//   y = relu(conv3(relu(conv2(relu(conv1(x) + b1)) + b2)) + b3 + r), conv1 / conv3 1x1, conv2
//   an odd R x S convolution with padding R/2, S/2 and stride `stride2`, r = x (stride 1), or
//   with layer 4 (a 1x1 projection shortcut at the same stride) r = conv4(x) + b4; each
//   layer's arrays from filter_conv_plan; run over bands of `band` output rows (0: the
//   planner's) so the intermediates stay in cache.
//   CPU, float32 NCHW; bfloat16 read and written by the kernel (float32 inside); float16 /
//   float64 and channels_last computed through a float32 NCHW copy, returned as given.
//   Inference only, like filter_conv.
#include "torch_ext/tensor_api.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "csrc/filter_conv/fused_run.h"
#include "csrc/plan/plan_header.h"
#include "torch_ext/common.h"
#include "torch_ext/validated.h"

SJ_LIBRARY_FRAGMENT(m) {
  m.def("filter_conv_bottleneck(Tensor x, Tensor plan1, Tensor rowptr1, Tensor taps1, "
        "Tensor values1, Tensor? bias1, Tensor plan2, Tensor rowptr2, Tensor taps2, "
        "Tensor values2, Tensor? bias2, Tensor plan3, Tensor rowptr3, Tensor taps3, "
        "Tensor values3, Tensor? bias3, int band=0, Tensor? plan4=None, Tensor? rowptr4=None, "
        "Tensor? taps4=None, Tensor? values4=None, Tensor? bias4=None, int stride2=1) -> Tensor");
}

namespace sparsejit {
namespace {

constexpr const char* kOp = "filter_conv_bottleneck";
constexpr int64_t kGeomWords = 4;  // after the header: C_out, C_in/groups, R, S

// One layer's arguments, checked; the pattern points into the contiguous copies.
struct Layer {
  tx::Tensor plan, rowptr, taps, values, bias;
  int64_t c_out = 0, cin = 0, r = 0, s = 0, variant = 0;
  filter_conv::Pattern p;
};

Layer layer_of(int which, const tx::Tensor& plan_t, const tx::Tensor& rowptr_t,
               const tx::Tensor& taps_t, const tx::Tensor& values_t,
               const std::optional<tx::Tensor>& bias_t) {
  const std::string n = std::to_string(which);
  const std::string names[3] = {"plan" + n, "rowptr" + n, "taps" + n};
  const tx::Tensor* idx[3] = {&plan_t, &rowptr_t, &taps_t};
  for (int i = 0; i < 3; ++i) {
    SJ_CHECK_TYPE(idx[i]->scalar_type() == tx::kLong, "sparsejit.", kOp, ": ", names[i],
                  " must be int64; got ", idx[i]->scalar_type());
    SPARSEJIT_CHECK(kOp, idx[i]->dim() == 1, names[i], " must be 1-D; got shape ",
                    idx[i]->sizes());
    SPARSEJIT_CHECK(kOp, idx[i]->device().is_cpu(), names[i], " must be on the CPU; got ",
                    idx[i]->device());
  }
  SJ_CHECK_TYPE(values_t.scalar_type() == tx::kFloat, "sparsejit.", kOp, ": values", n,
                " must be float32 (from filter_conv_plan); got ", values_t.scalar_type());
  SPARSEJIT_CHECK(kOp, values_t.device().is_cpu(), "values", n, " must be on the CPU; got ",
                  values_t.device());
  SPARSEJIT_CHECK(kOp, values_t.dim() == 1 && values_t.numel() == taps_t.numel(), "values", n,
                  " must have shape [", taps_t.numel(), "] (one per tap); got ",
                  values_t.sizes());
  Layer L;
  L.plan = plan_t.contiguous();
  SPARSEJIT_CHECK(kOp, L.plan.numel() == plan::kHeaderWords + kGeomWords, "plan", n,
                  " must have ", plan::kHeaderWords + kGeomWords, " words; got ",
                  L.plan.numel());
  const int64_t* w = ptr<int64_t>(L.plan);
  L.c_out = w[plan::kHeaderWords];
  L.cin = w[plan::kHeaderWords + 1];
  L.r = w[plan::kHeaderWords + 2];
  L.s = w[plan::kHeaderWords + 3];
  SPARSEJIT_CHECK(kOp, L.c_out >= 0 && L.cin >= 1 && L.r >= 1 && L.s >= 1 && L.r < (1 << 20) &&
                  L.s < (1 << 20) && L.cin < (int64_t{1} << 30),
                  "plan", n, " holds an invalid weight shape [", L.c_out, ", ", L.cin, ", ", L.r,
                  ", ", L.s, "]");
  L.variant = w[plan::kWordKernel];
  SPARSEJIT_CHECK(kOp, L.variant >= 0 && L.variant < filter_conv::kNumVariants, "plan", n,
                  "'s variant word ", L.variant, " is not a variant");
  SPARSEJIT_CHECK(kOp, rowptr_t.numel() == L.c_out + 1, "rowptr", n, " must have C_out + 1 = ",
                  L.c_out + 1, " entries; got ", rowptr_t.numel());
  L.rowptr = rowptr_t.contiguous();
  L.taps = taps_t.contiguous();
  L.values = values_t.contiguous();
  if (bias_t.has_value()) {
    check_float(*bias_t, ("bias" + n).c_str());
    SPARSEJIT_CHECK(kOp, bias_t->dim() == 1 && bias_t->numel() == L.c_out, "bias", n,
                    " must have shape [", L.c_out, "]; got ", bias_t->sizes());
    SPARSEJIT_CHECK(kOp, bias_t->device().is_cpu(), "bias", n, " must be on the CPU; got ",
                    bias_t->device());
    L.bias = bias_t->to(tx::kFloat).contiguous();
  }
  L.p.rowptr = ptr<int64_t>(L.rowptr);
  L.p.taps = ptr<int64_t>(L.taps);
  L.p.values = ptr<float>(L.values);
  L.p.c_out = L.c_out;
  L.p.cols = L.cin * L.r * L.s;
  return L;
}

struct Entry {
  plan::StructureStamp stamps[4];
  std::shared_ptr<const filter_conv::Bottleneck> prepared;
};

tx::Tensor filter_conv_bottleneck_cpu(
    const tx::Tensor& x_in, const tx::Tensor& plan1, const tx::Tensor& rowptr1,
    const tx::Tensor& taps1, const tx::Tensor& values1, const std::optional<tx::Tensor>& bias1,
    const tx::Tensor& plan2, const tx::Tensor& rowptr2, const tx::Tensor& taps2,
    const tx::Tensor& values2, const std::optional<tx::Tensor>& bias2, const tx::Tensor& plan3,
    const tx::Tensor& rowptr3, const tx::Tensor& taps3, const tx::Tensor& values3,
    const std::optional<tx::Tensor>& bias3, int64_t band,
    const std::optional<tx::Tensor>& plan4, const std::optional<tx::Tensor>& rowptr4,
    const std::optional<tx::Tensor>& taps4, const std::optional<tx::Tensor>& values4,
    const std::optional<tx::Tensor>& bias4, int64_t stride2) {
  check_float(x_in, "x");
  SPARSEJIT_CHECK(kOp, x_in.dim() == 4, "x must be 4-D [N, C, H, W]; got shape ", x_in.sizes());
  SPARSEJIT_CHECK(kOp, x_in.device().is_cpu(), "x must be on the CPU; got ", x_in.device());
  SPARSEJIT_CHECK(kOp, band >= 0, "band must be >= 0 (0: the planner's); got ", band);
  const int given = plan4.has_value() + rowptr4.has_value() + taps4.has_value() +
                    values4.has_value();
  SPARSEJIT_CHECK(kOp, given == 0 || given == 4, "the shortcut needs plan4, rowptr4, taps4 "
                  "and values4 together; got ", given, " of them");
  SPARSEJIT_CHECK(kOp, given == 4 || !bias4.has_value(), "bias4 given without the shortcut "
                  "(plan4, rowptr4, taps4, values4)");
  const bool shortcut = given == 4;
  const int nl = shortcut ? 4 : 3;
  Layer L[4] = {layer_of(1, plan1, rowptr1, taps1, values1, bias1),
                layer_of(2, plan2, rowptr2, taps2, values2, bias2),
                layer_of(3, plan3, rowptr3, taps3, values3, bias3),
                shortcut ? layer_of(4, *plan4, *rowptr4, *taps4, *values4, bias4) : Layer{}};
  if (shortcut)
    SPARSEJIT_CHECK(kOp, L[3].r == 1 && L[3].s == 1, "the shortcut (layer 4) must be 1x1; got ",
                    L[3].r, "x", L[3].s);
  const int64_t batch = x_in.size(0), c = x_in.size(1), h = x_in.size(2), w = x_in.size(3);
  SPARSEJIT_CHECK(kOp, L[0].r == 1 && L[0].s == 1 && L[2].r == 1 && L[2].s == 1,
                  "conv1 and conv3 must be 1x1; got ", L[0].r, "x", L[0].s, " and ", L[2].r, "x",
                  L[2].s);
  const std::string gerr = filter_conv::check_bottleneck(
      c, h, w, L[0].p, L[0].cin, L[1].p, L[1].cin, L[1].r, L[1].s, stride2, L[2].p, L[2].cin,
      shortcut ? &L[3].p : nullptr, L[3].cin);
  SPARSEJIT_CHECK(kOp, gerr.empty(), gerr);
  const std::vector<int64_t> key = {c, h, w, band, stride2, L[0].variant, L[1].variant,
                                    L[2].variant, shortcut ? L[3].variant : -1};
  // (an identity block has no fourth layer: rowptr1 / taps1 stand in, changing nothing)
  const std::initializer_list<const tx::Tensor*> arrays = {
      &rowptr1, &taps1, &rowptr2, &taps2, &rowptr3, &taps3,
      shortcut ? &*rowptr4 : &rowptr1, shortcut ? &*taps4 : &taps1};
  auto hit = std::static_pointer_cast<const Entry>(once_find("filter_conv_bottleneck", arrays, key));
  filter_conv::BlockWeights W;
  W.p1 = &L[0].p;
  W.p2 = &L[1].p;
  W.p3 = &L[2].p;
  W.p4 = shortcut ? &L[3].p : nullptr;
  auto bias_ptr = [](const Layer& l) {
    return l.bias.defined() ? ptr<float>(l.bias) : static_cast<const float*>(nullptr);
  };
  W.b1 = bias_ptr(L[0]);
  W.b2 = bias_ptr(L[1]);
  W.b3 = bias_ptr(L[2]);
  W.b4 = shortcut ? bias_ptr(L[3]) : nullptr;
  if (!hit) {
    auto e = std::make_shared<Entry>();
    for (int i = 0; i < nl; ++i) {
      const std::string perr = filter_conv::check_pattern(L[i].p, L[i].taps.numel());
      SPARSEJIT_CHECK(kOp, perr.empty(), "invalid weight pattern of conv", i + 1, ": ", perr);
      e->stamps[i] = plan::stamp_structure<int64_t>(L[i].p.rowptr, L[i].p.taps, L[i].c_out,
                                                    L[i].p.cols);
    }
    // the planner's tile unless every layer's plan forces the same variant
    bool same = true;
    for (int i = 1; i < nl; ++i) same = same && L[i].variant == L[0].variant;
    const int64_t v = same ? L[0].variant : 0;
    e->prepared = filter_conv::prepare_bottleneck(c, h, w, W, L[1].r, L[1].s, stride2, band,
                                                  static_cast<filter_conv::Variant>(v));
    int64_t bytes = sizeof(Entry);
    for (const auto* P : {e->prepared->P1.get(), e->prepared->P2.get(), e->prepared->P3.get(),
                          e->prepared->P4.get()})
      if (P != nullptr)
        bytes += int64_t(4 * (P->off.size() + P->off_packed.size()) + 8 * P->cp.size());
    once_add("filter_conv_bottleneck", arrays, key, e, bytes);
    hit = std::move(e);
  }
  for (int i = 0; i < nl; ++i) {
    std::string herr;
    SPARSEJIT_CHECK(kOp, plan::check_header(ptr<int64_t>(L[i].plan), L[i].plan.numel(),
                                            OpKind::FilterConv, hit->stamps[i], &herr),
                    "plan", i + 1, ": ", herr);
  }
  const int64_t c_out = L[2].c_out, h2 = hit->prepared->h2, w2 = hit->prepared->w2;
  const bool channels_last = c > 1 && h > 1 && w > 1 && !x_in.is_contiguous() &&
                             x_in.is_contiguous(tx::MemoryFormat::ChannelsLast);
  if (x_in.scalar_type() == tx::kBFloat16) {  // read and written by the kernel, float32 inside
    const auto xb = x_in.contiguous();
    auto yb = new_output({batch, c_out, h2, w2}, xb.options());
    filter_conv::bottleneck_forward(*hit->prepared, batch, W, ptr<bf16>(xb), ptr<bf16>(yb));
    return channels_last ? yb.contiguous(tx::MemoryFormat::ChannelsLast) : yb;
  }
  const auto x = x_in.to(tx::kFloat).contiguous();
  auto y = new_output({batch, c_out, h2, w2}, x.options());
  filter_conv::bottleneck_forward(*hit->prepared, batch, W, ptr<float>(x), ptr<float>(y));
  if (channels_last) y = y.contiguous(tx::MemoryFormat::ChannelsLast);
  return x_in.scalar_type() == tx::kFloat ? y : y.to(x_in.scalar_type());
}

}  // namespace

SJ_LIBRARY_IMPL(CPU, m) { m.impl("filter_conv_bottleneck", SJ_KERNEL(&filter_conv_bottleneck_cpu)); }

}  // namespace sparsejit
