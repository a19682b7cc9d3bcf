// Filter-sparse convolution (pruned Conv2d inference): csrc/filter_conv.
//
// filter_conv_plan(weight [C_out, C_in/groups, R, S], threshold, variant)
//     -> (plan, rowptr, taps, values): the weight compressed per output channel over (c, r, s)
//   (entries with |w| <= threshold dropped, zeros always), values in float32. `plan` is the
//   common plan header (OpKind::FilterConv, kernel word = the tile variant, 0 = the
//   planner's choice, stamp of (rowptr, taps)) followed by [C_out, C_in/groups, R, S].
// filter_conv(plan, rowptr, taps, values, x, bias, kernel_size, stride, padding, dilation,
//             groups, relu, variant=-1, residual=None) -> y [N, C_out, OH, OW]: direct sparse
//   convolution, bias, residual and ReLU fused: y = relu?(conv(x) + bias + residual), the
//   residual a tensor of y's shape (a ResNet block's identity; sparsify's fusion pass).
//   variant >= 0 forces a tile variant (tests), -1 takes the plan's.
//   (Not named `kernel`: Inductor's fallback passes its own `kernel` argument.)
//
// Inference only (no autograd). float32 natively; bfloat16 x (and residual) read and written
// by the kernel, computed in float32; float16 / float64 inputs (and bfloat16 x with another
// residual dtype) computed in float32 and the result converted back to x's dtype. channels_last
// inputs are read through a contiguous NCHW copy and give a channels_last output.
#include "torch_ext/tensor_api.h"

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "codegen/cuda_filter_conv.h"
#include "csrc/filter_conv/filter_conv_run.h"
#include "csrc/plan/plan_header.h"
#include "torch_ext/common.h"
#include "torch_ext/cuda_common.h"
#include "torch_ext/cuda_fallback.h"
#include "torch_ext/validated.h"

SJ_LIBRARY_FRAGMENT(m) {
  m.def("filter_conv_plan(Tensor weight, float threshold=0.0, int variant=0) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
  m.def("filter_conv(Tensor plan, Tensor rowptr, Tensor taps, Tensor values, Tensor x, "
        "Tensor? bias, int[2] kernel_size, int[2] stride, int[2] padding, int[2] dilation, "
        "int groups, bool relu, int variant=-1, Tensor? residual=None) -> Tensor");
}

namespace sparsejit {
namespace {


constexpr int64_t kGeomWords = filter_conv::kPlanGeomWords;  // C_out, C_in/groups, R, S

void check_kernel_id(int64_t kernel, const char* op) {
  SJ_CHECK_VALUE(kernel >= 0 && kernel < filter_conv::kNumVariants, "sparsejit.", op,
                    ": variant must be in [0, ", filter_conv::kNumVariants, ") (0 = auto, 1 = scalar, "
                    "2..5 = vec8x1, vec8x2, vec8x4, vec8x8, 6 = jit, 7 = jit_baked, 8 = generic); got ", kernel);
}

std::tuple<tx::Tensor, tx::Tensor, tx::Tensor, tx::Tensor> filter_conv_plan_cpu(
    const tx::Tensor& weight, double threshold, int64_t kernel) {
  SJ_CHECK_VALUE(weight.dim() == 4, "sparsejit.filter_conv_plan: weight must be 4-D "
                    "[C_out, C_in/groups, R, S]; got shape ", weight.sizes());
  check_float(weight, "weight");
  SJ_CHECK_VALUE(threshold >= 0, "sparsejit.filter_conv_plan: threshold must be >= 0; got ",
                    threshold);
  check_kernel_id(kernel, "filter_conv_plan");
  SJ_CHECK_VALUE(weight.size(1) >= 1 && weight.size(2) >= 1 && weight.size(3) >= 1,
                    "sparsejit.filter_conv_plan: weight must have C_in/groups, R, S >= 1; got "
                    "shape ", weight.sizes());
  const auto w = weight.to(tx::kFloat).contiguous();
  const int64_t rows = w.size(0), cols = w.size(1) * w.size(2) * w.size(3);
  const float thr = static_cast<float>(threshold);
  const int64_t nnz = filter_conv::count_kept(ptr<float>(w), rows, cols, thr);
  auto opt = w.options().dtype(tx::kLong);
  auto rowptr = tx::empty({rows + 1}, opt);
  auto taps = tx::empty({nnz}, opt);
  auto values = tx::empty({nnz}, w.options());
  filter_conv::compress(ptr<float>(w), rows, cols, thr, ptr<int64_t>(rowptr), ptr<int64_t>(taps),
                   ptr<float>(values));
  auto plan = tx::empty({plan::kHeaderWords + kGeomWords}, opt);
  filter_conv::write_plan(ptr<int64_t>(plan), kernel, ptr<int64_t>(rowptr), ptr<int64_t>(taps),
                          rows, w.size(1), w.size(2), w.size(3));
  return {plan, rowptr, taps, values};
}

// ---- prepared layers ---------------------------------------------------------------------
// Validating the pattern, stamping it and computing every tap's offset are O(nnz) and cost as
// much as the convolution itself on 7x7 layers, so they run once per (rowptr, taps, input
// size, variant) at their versions, through the once-per-live-tensors table
// (torch_ext/validated.h: what it keeps alive, and for how long). A tensor modified in place
// bumps its version and is validated again; inference tensors (no version counter) every call.

// Geometry without the batch: what a Prepared depends on.
std::vector<int64_t> geometry_key(const filter_conv::Geometry& g, int64_t variant) {
  return {g.c_in, g.h, g.w, g.c_out, g.groups, g.r, g.s, g.stride_h, g.stride_w,
          g.pad_h, g.pad_w, g.dil_h, g.dil_w, variant};
}

struct PreparedEntry {
  plan::StructureStamp stamp;
  std::shared_ptr<const filter_conv::Prepared> prepared;
};

int64_t prepared_bytes(const filter_conv::Prepared& P) {
  return static_cast<int64_t>(sizeof(P) + 4 * (P.off.size() + P.off_packed.size()) +
                              8 * P.cp.size());
}

void check_index(const tx::Tensor& t, const char* name) {
  SJ_CHECK_TYPE(t.scalar_type() == tx::kLong, "sparsejit.filter_conv: ", name,
                   " must be int64; got ", t.scalar_type());
  SPARSEJIT_CHECK("filter_conv", t.dim() == 1, name, " must be 1-D; got shape ", t.sizes());
  SPARSEJIT_CHECK("filter_conv", t.device().is_cpu(), name, " must be on the CPU; got ",
                  t.device());
}

// channels_last and not NCHW-contiguous, with more than one channel, row and column: where a
// size is 1 the two layouts differ only in strides that Inductor may choose differently from
// the example it traced (SparseLinear's [1, C, M, 1] views), so those stay NCHW. The fake
// (python/sparsejit/families/filter_conv/ops.py) applies the same rule.
bool channels_last_input(const tx::Tensor& x) {
  return x.dim() == 4 && x.size(1) > 1 && x.size(2) > 1 && x.size(3) > 1 && !x.is_contiguous() &&
         x.is_contiguous(tx::MemoryFormat::ChannelsLast);
}

int64_t pair_at(tx::IntArrayRef v, int i, const char* name) {
  SPARSEJIT_CHECK("filter_conv", v.size() == 2 || v.size() == 1, name, " must have 2 entries; got ",
                  v.size());
  return v.size() == 1 ? v[0] : v[i];
}

// The call's geometry from the plan's words (a host copy) and the arguments, checked as the
// CPU and CUDA implementations share them: everything but the devices and the weight pattern.
struct LayerCall {
  filter_conv::Geometry g;
  int64_t cin_g = 0, variant = 0;
};

LayerCall check_call(const int64_t* words, int64_t plan_numel, const tx::Tensor& rowptr_t,
                     const tx::Tensor& taps_t, const tx::Tensor& values_t, const tx::Tensor& x_in,
                     const std::optional<tx::Tensor>& bias_in, tx::IntArrayRef kernel_size,
                     tx::IntArrayRef stride, tx::IntArrayRef padding,
                     tx::IntArrayRef dilation, int64_t groups, int64_t kernel,
                     const std::optional<tx::Tensor>& residual_in) {
  SJ_CHECK_TYPE(values_t.scalar_type() == tx::kFloat, "sparsejit.filter_conv: values must "
                   "be float32 (from filter_conv_plan); got ", values_t.scalar_type());
  SPARSEJIT_CHECK("filter_conv", values_t.dim() == 1 && values_t.numel() == taps_t.numel(),
                  "values must have shape "
                  "[",
                  taps_t.numel(), "] (one per tap); got ", values_t.sizes());
  check_float(x_in, "x");
  SPARSEJIT_CHECK("filter_conv", x_in.dim() == 4, "x must be 4-D [N, C_in, H, W]; got shape ",
                  x_in.sizes());
  SPARSEJIT_CHECK("filter_conv", plan_numel == plan::kHeaderWords + kGeomWords, "plan must have ",
                  plan::kHeaderWords + kGeomWords, " words; got ", plan_numel);
  const int64_t c_out = words[plan::kHeaderWords], cin_g = words[plan::kHeaderWords + 1];
  const int64_t r = words[plan::kHeaderWords + 2], s = words[plan::kHeaderWords + 3];
  SPARSEJIT_CHECK("filter_conv", c_out >= 0 && cin_g >= 1 && r >= 1 && s >= 1,
                  "plan holds an invalid weight shape [", c_out, ", ", cin_g, ", ", r, ", ", s,
                  "]");
  SPARSEJIT_CHECK("filter_conv", rowptr_t.numel() == c_out + 1,
                  "rowptr must have C_out + 1 = ", c_out + 1, " entries; got ", rowptr_t.numel());
  SPARSEJIT_CHECK("filter_conv", kernel >= -1 && kernel < filter_conv::kNumVariants,
                  "variant must be -1 (the plan's) or in "
                  "[0, ",
                  filter_conv::kNumVariants, "); got ", kernel);
  LayerCall call;
  call.variant = kernel >= 0 ? kernel : words[plan::kWordKernel];
  SPARSEJIT_CHECK("filter_conv", call.variant >= 0 && call.variant < filter_conv::kNumVariants,
                  "plan's variant word ", call.variant, " is not a variant");

  SPARSEJIT_CHECK(
      "filter_conv",
      pair_at(kernel_size, 0, "kernel_size") == r && pair_at(kernel_size, 1, "kernel_size") == s,
      "kernel_size ", kernel_size, " does not match the plan's weight (", r, "x", s, ")");
  filter_conv::Geometry& g = call.g;
  g.batch = x_in.size(0);
  g.c_in = x_in.size(1);
  g.h = x_in.size(2);
  g.w = x_in.size(3);
  g.c_out = c_out;
  g.groups = groups;
  g.r = r;
  g.s = s;
  g.stride_h = pair_at(stride, 0, "stride");
  g.stride_w = pair_at(stride, 1, "stride");
  g.pad_h = pair_at(padding, 0, "padding");
  g.pad_w = pair_at(padding, 1, "padding");
  g.dil_h = pair_at(dilation, 0, "dilation");
  g.dil_w = pair_at(dilation, 1, "dilation");
  SPARSEJIT_CHECK("filter_conv", groups >= 1, "groups must be >= 1; got ", groups);
  // Divides rather than multiplies: cin_g * groups can wrap around to x's channel count.
  SPARSEJIT_CHECK("filter_conv", g.c_in % groups == 0 && g.c_in / groups == cin_g, "x has ", g.c_in,
                  " channels but "
                  "the weight expects C_in/groups * groups = ",
                  cin_g, " * ", groups);
  SPARSEJIT_CHECK("filter_conv", static_cast<double>(cin_g) * r * s < 0x1p62,
                  "plan holds an invalid weight shape [", c_out, ", ", cin_g, ", ", r, ", ", s,
                  "]");
  const std::string gerr = filter_conv::check_geometry(g);
  SPARSEJIT_CHECK("filter_conv", gerr.empty(), gerr);
  if (bias_in.has_value()) {
    check_float(*bias_in, "bias");
    SPARSEJIT_CHECK("filter_conv", bias_in->dim() == 1 && bias_in->numel() == c_out,
                    "bias must have shape [", c_out, "]; got ", bias_in->sizes());
    check_same_device(*bias_in, x_in, "bias", "x");
  }
  if (residual_in.has_value()) {
    check_float(*residual_in, "residual");
    const auto& rs = *residual_in;
    SPARSEJIT_CHECK("filter_conv", rs.dim() == 4 && rs.size(0) == g.batch &&
                    rs.size(1) == c_out && rs.size(2) == g.out_h() && rs.size(3) == g.out_w(),
                    "residual must have the output's shape [", g.batch, ", ", c_out, ", ",
                    g.out_h(), ", ", g.out_w(), "]; got ", rs.sizes());
    check_same_device(rs, x_in, "residual", "x");
  }
  call.cin_g = cin_g;
  return call;
}

tx::Tensor filter_conv_cpu(const tx::Tensor& plan_t, const tx::Tensor& rowptr_t,
                           const tx::Tensor& taps_t, const tx::Tensor& values_t,
                           const tx::Tensor& x_in, const std::optional<tx::Tensor>& bias_in,
                           tx::IntArrayRef kernel_size, tx::IntArrayRef stride,
                           tx::IntArrayRef padding, tx::IntArrayRef dilation, int64_t groups,
                           bool relu, int64_t kernel,
                           const std::optional<tx::Tensor>& residual_in) {
  check_index(plan_t, "plan");
  check_index(rowptr_t, "rowptr");
  check_index(taps_t, "taps");
  SPARSEJIT_CHECK("filter_conv", values_t.device().is_cpu(), "values must be on the CPU; got ",
                  values_t.device());
  SPARSEJIT_CHECK("filter_conv", x_in.device().is_cpu(),
                  "x must be on the CPU for the CPU kernel; got ", x_in.device());
  const auto plan_c = plan_t.contiguous();
  const int64_t* words = ptr<int64_t>(plan_c);
  const LayerCall call = check_call(words, plan_c.numel(), rowptr_t, taps_t, values_t, x_in,
                                    bias_in, kernel_size, stride, padding, dilation, groups,
                                    kernel, residual_in);
  const filter_conv::Geometry& g = call.g;
  const int64_t c_out = g.c_out, variant = call.variant;
  tx::Tensor bias;
  if (bias_in.has_value()) bias = bias_in->to(tx::kFloat).contiguous();
  const auto rowptr = rowptr_t.contiguous();
  const auto taps = taps_t.contiguous();
  const auto values = values_t.contiguous();
  filter_conv::Pattern p;
  p.rowptr = ptr<int64_t>(rowptr);
  p.taps = ptr<int64_t>(taps);
  p.values = ptr<float>(values);
  p.c_out = c_out;
  p.cols = call.cin_g * g.r * g.s;
  const auto key = geometry_key(g, variant);
  auto hit = std::static_pointer_cast<const PreparedEntry>(
      once_find("filter_conv_prepared", {&rowptr_t, &taps_t}, key));
  if (!hit) {
    const std::string perr = filter_conv::check_pattern(p, taps.numel());
    SPARSEJIT_CHECK("filter_conv", perr.empty(), "invalid weight pattern: ", perr);
    auto e = std::make_shared<PreparedEntry>();
    e->stamp = plan::stamp_structure<int64_t>(p.rowptr, p.taps, c_out, p.cols);
    e->prepared = filter_conv::prepare(g, p, static_cast<filter_conv::Variant>(variant));
    once_add("filter_conv_prepared", {&rowptr_t, &taps_t}, key, e, prepared_bytes(*e->prepared));
    hit = std::move(e);
  }
  std::string herr;
  SPARSEJIT_CHECK("filter_conv",
                  plan::check_header(words, plan_c.numel(), OpKind::FilterConv, hit->stamp, &herr),
                  "plan: ", herr);

  // bfloat16 x (and residual, if any) in, bfloat16 out, without float32 copies: the kernel
  // widens where it stages its input and rounds each output once (the float32 path's bits).
  if (x_in.scalar_type() == tx::kBFloat16 &&
      (!residual_in.has_value() || residual_in->scalar_type() == tx::kBFloat16)) {
    const auto xb = x_in.contiguous();
    auto yb = new_output({g.batch, c_out, g.out_h(), g.out_w()}, xb.options());
    tx::Tensor rb;
    if (residual_in.has_value()) rb = residual_in->contiguous();
    filter_conv::forward(*hit->prepared, g, p, ptr<bf16>(xb),
                         bias.defined() ? ptr<float>(bias) : nullptr, relu, ptr<bf16>(yb),
                         rb.defined() ? ptr<bf16>(rb) : nullptr);
    if (channels_last_input(x_in)) yb = yb.contiguous(tx::MemoryFormat::ChannelsLast);
    return yb;
  }
  const auto x = x_in.to(tx::kFloat).contiguous();
  auto y = new_output({g.batch, c_out, g.out_h(), g.out_w()}, x.options());
  // The residual as float32 NCHW rows, like y (a copy unless it already is one; it never
  // overlaps y, which is freshly allocated).
  tx::Tensor residual;
  if (residual_in.has_value()) residual = residual_in->to(tx::kFloat).contiguous();
  filter_conv::forward(*hit->prepared, g, p, ptr<float>(x),
                  bias.defined() ? ptr<float>(bias) : nullptr, relu, ptr<float>(y),
                  residual.defined() ? ptr<float>(residual) : nullptr);
  // channels_last in, channels_last out (one transposing copy of the output: the kernel
  // writes whole output-channel rows).
  if (channels_last_input(x_in)) y = y.contiguous(tx::MemoryFormat::ChannelsLast);
  return x_in.scalar_type() == tx::kFloat ? y : y.to(x_in.scalar_type());
}


#ifdef SPARSEJIT_WITH_CUDA
using namespace cuda_ext;

// ---- CUDA ----------------------------------------------------------------------------------
// A layer's plan arrays on one device, checked once per (plan, rowptr, taps, values) at their
// versions: the pattern check and the plan's stamp need the arrays on the host, so a miss
// copies them there (a device sync when they live on the GPU: once per layer, never on a hit)
// and copies rowptr / taps / values to x's device, kept with the entry (torch_ext/validated.h).
struct DeviceLayer {
  int device = -1;
  std::vector<int64_t> words;
  tx::Tensor rowptr_d, taps_d, values_d;
};


void check_index_any_device(const tx::Tensor& t, const char* name, const tx::Tensor& x) {
  SJ_CHECK_TYPE(t.scalar_type() == tx::kLong, "sparsejit.filter_conv: ", name,
                   " must be int64; got ", t.scalar_type());
  SPARSEJIT_CHECK("filter_conv", t.dim() == 1, name, " must be 1-D; got shape ", t.sizes());
  SPARSEJIT_CHECK("filter_conv", t.device().is_cpu() || t.device() == x.device(), name,
                  " must be on the CPU or on ", "x's device ", x.device(), "; got ", t.device());
}

// Compression runs on the host (once per layer); the plan arrays go back to the weight's device
// (values stay float32, whatever the weight's dtype).
std::tuple<tx::Tensor, tx::Tensor, tx::Tensor, tx::Tensor> filter_conv_plan_cuda(
    const tx::Tensor& weight, double threshold, int64_t kernel) {
  auto [plan, rowptr, taps, values] = filter_conv_plan_cpu(weight.to(tx::kCPU), threshold, kernel);
  const auto d = weight.device();
  return {plan.to(d), rowptr.to(d), taps.to(d), values.to(d)};
}

tx::Tensor filter_conv_cuda(const tx::Tensor& plan_t, const tx::Tensor& rowptr_t,
                            const tx::Tensor& taps_t, const tx::Tensor& values_t,
                            const tx::Tensor& x_in, const std::optional<tx::Tensor>& bias_in,
                            tx::IntArrayRef kernel_size, tx::IntArrayRef stride,
                            tx::IntArrayRef padding, tx::IntArrayRef dilation, int64_t groups,
                            bool relu, int64_t kernel,
                            const std::optional<tx::Tensor>& residual_in) {
  SPARSEJIT_CHECK("filter_conv", x_in.is_cuda(), "x must be on the GPU when the plan is; got ",
                  x_in.device());
  check_index_any_device(plan_t, "plan", x_in);
  check_index_any_device(rowptr_t, "rowptr", x_in);
  check_index_any_device(taps_t, "taps", x_in);
  SPARSEJIT_CHECK("filter_conv", values_t.device().is_cpu() || values_t.device() == x_in.device(),
                  "values must be "
                  "on the CPU or on x's device ",
                  x_in.device(), "; got ", values_t.device());
  DeviceGuard guard(x_in.device());
  if (!gpu_kernels_available()) {
    const auto y = call_on_cpu<tx::Tensor>(
        "sparsejit::filter_conv", plan_t, rowptr_t, taps_t, values_t, x_in, bias_in,
        kernel_size.vec(), stride.vec(), padding.vec(), dilation.vec(), groups, relu, kernel,
        residual_in);
    return y.to(x_in.scalar_type());  // the fallback returns values' dtype (float32)
  }
  const int device = x_in.get_device();
  auto layer = std::static_pointer_cast<const DeviceLayer>(once_find(
      "filter_conv_device", {&plan_t, &rowptr_t, &taps_t, &values_t}, {int64_t{device}}));
  tx::Tensor plan_h;
  if (!layer) plan_h = plan_t.to(tx::kCPU).contiguous();  // sync if on the GPU (once per layer)
  const int64_t* words = layer ? layer->words.data() : ptr<int64_t>(plan_h);
  const int64_t plan_numel = layer ? int64_t(layer->words.size()) : plan_h.numel();
  const LayerCall call = check_call(words, plan_numel, rowptr_t, taps_t, values_t, x_in, bias_in,
                                    kernel_size, stride, padding, dilation, groups, kernel,
                                    residual_in);
  const filter_conv::Geometry& g = call.g;
  if (!layer) {
    auto fresh = std::make_shared<DeviceLayer>();
    const auto rowptr_h = rowptr_t.to(tx::kCPU).contiguous();
    const auto taps_h = taps_t.to(tx::kCPU).contiguous();
    const auto values_h = values_t.to(tx::kCPU).contiguous();
    filter_conv::Pattern p;
    p.rowptr = ptr<int64_t>(rowptr_h);
    p.taps = ptr<int64_t>(taps_h);
    p.values = ptr<float>(values_h);
    p.c_out = g.c_out;
    p.cols = call.cin_g * g.r * g.s;
    const std::string perr = filter_conv::check_pattern(p, taps_h.numel());
    SPARSEJIT_CHECK("filter_conv", perr.empty(), "invalid weight pattern: ", perr);
    const auto stamp = plan::stamp_structure<int64_t>(p.rowptr, p.taps, g.c_out, p.cols);
    std::string herr;
    SPARSEJIT_CHECK("filter_conv",
                    plan::check_header(words, plan_numel, OpKind::FilterConv, stamp, &herr),
                    "plan: ", herr);
    fresh->device = device;
    fresh->words.assign(words, words + plan_numel);
    fresh->rowptr_d = rowptr_h.to(x_in.device(), /*non_blocking=*/false, /*copy=*/true);
    fresh->taps_d = taps_h.to(x_in.device(), /*non_blocking=*/false, /*copy=*/true);
    fresh->values_d = values_h.to(x_in.device(), /*non_blocking=*/false, /*copy=*/true);
    once_add("filter_conv_device", {&plan_t, &rowptr_t, &taps_t, &values_t}, {int64_t{device}},
             fresh,
             static_cast<int64_t>(8 * fresh->words.size() + fresh->rowptr_d.nbytes() +
                                  fresh->taps_d.nbytes() + fresh->values_d.nbytes()));
    layer = std::move(fresh);
  }

  const int64_t oh = g.out_h(), ow = g.out_w(), pixels = g.batch * oh * ow;
  auto y = new_output({g.batch, g.c_out, oh, ow}, x_in.options().memory_format(
                                                      tx::MemoryFormat::Contiguous));
  if (pixels > 0 && g.c_out > 0) {
    codegen::CudaFilterConvProblem prob;
    prob.dtype = cuda_scalar(x_in.scalar_type());
    prob.r = static_cast<int32_t>(g.r);
    prob.s = static_cast<int32_t>(g.s);
    prob.stride_h = static_cast<int32_t>(g.stride_h);
    prob.stride_w = static_cast<int32_t>(g.stride_w);
    prob.pad_h = static_cast<int32_t>(std::min<int64_t>(g.pad_h, INT32_MAX));
    prob.pad_w = static_cast<int32_t>(std::min<int64_t>(g.pad_w, INT32_MAX));
    prob.dil_h = static_cast<int32_t>(g.dil_h);
    prob.dil_w = static_cast<int32_t>(g.dil_w);
    prob.relu = relu;
    prob.c_out = g.c_out;
    prob.pixels = pixels;
    const codegen::CudaFilterConvSpec spec = codegen::plan_cuda_filter_conv(prob);
    const std::string invalid = spec.validate();
    SJ_CHECK_VALUE(invalid.empty(), "sparsejit.filter_conv (CUDA): no kernel for this layer: ",
                      invalid);
    const auto launches = codegen::plan_filter_conv_launch(spec, pixels, g.c_out);
    SPARSEJIT_CHECK(
        "filter_conv",
        pixels / spec.block < (int64_t(1) << 31) &&
            (g.c_out + spec.conv.channels_per_block - 1) / spec.conv.channels_per_block <= 65535,
        "layer too large for one launch (", pixels, " output pixels, ", g.c_out,
        " output channels)");
    const auto x = x_in.contiguous();
    tx::Tensor bias;
    if (bias_in.has_value()) bias = bias_in->to(tx::kFloat).contiguous();
    // The residual in x's dtype and y's NCHW layout (the kernel adds it before the ReLU).
    tx::Tensor residual;
    if (residual_in.has_value())
      residual = residual_in->to(x_in.scalar_type()).contiguous();
    cuda::FilterConvParams params{layer->rowptr_d.data_ptr(), layer->taps_d.data_ptr(),
                                  layer->values_d.data_ptr(), x.data_ptr(),
                                  bias.defined() ? bias.data_ptr() : nullptr, y.data_ptr(),
                                  g.batch, g.c_in, g.h, g.w, g.c_out, oh, ow, call.cin_g,
                                  g.c_out / g.groups,
                                  residual.defined() ? residual.data_ptr() : nullptr};
    std::string err;
    if (!CudaKernels::instance().run(spec, device, current_stream(),
                                     launches, &params, &err))
      raise_cuda_error("filter_conv", err);
  }
  if (channels_last_input(x_in)) y = y.contiguous(tx::MemoryFormat::ChannelsLast);
  return y;
}
#endif

}  // namespace

SJ_LIBRARY_IMPL(CPU, m) {
  m.impl("filter_conv_plan", SJ_KERNEL(&filter_conv_plan_cpu));
  m.impl("filter_conv", SJ_KERNEL(&filter_conv_cpu));
}

#ifdef SPARSEJIT_WITH_CUDA
SJ_LIBRARY_IMPL(CUDA, m) {
  m.impl("filter_conv_plan", SJ_KERNEL(&filter_conv_plan_cuda));
  m.impl("filter_conv", SJ_KERNEL(&filter_conv_cuda));
}
#endif

}  // namespace sparsejit
