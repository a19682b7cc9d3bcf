// Filter-sparse convolution (pruned Conv2d inference): csrc/filter_conv.
//
// filter_conv_plan(weight [C_out, C_in/groups, R, S], threshold, variant)
//     -> (plan, rowptr, taps, values): the weight compressed per output channel over (c, r, s)
//   (entries with |w| <= threshold dropped, zeros always), values in float32. `plan` is the
//   common plan header (OpKind::FilterConv, kernel word = the tile variant, 0 = the
//   planner's choice, stamp of (rowptr, taps)) followed by [C_out, C_in/groups, R, S].
// filter_conv(plan, rowptr, taps, values, x, bias, kernel_size, stride, padding, dilation,
//             groups, relu, variant=-1) -> y [N, C_out, OH, OW]: direct sparse convolution,
//   bias and ReLU fused. variant >= 0 forces a tile variant (tests), -1 takes the plan's.
//   (Not named `kernel`: Inductor's fallback passes its own `kernel` argument.)
//
// Inference only (no autograd). float32 natively; bfloat16 / float16 / float64 inputs are
// computed in float32 and the result converted back to the input's dtype. channels_last
// inputs are read through a contiguous NCHW copy and give a channels_last output.
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "csrc/filter_conv/filter_conv_run.h"
#include "csrc/plan/plan_header.h"
#include "torch_ext/common.h"
#include "torch_ext/cuda_common.h"
#include "torch_ext/validated.h"

TORCH_LIBRARY_FRAGMENT(sparsejit, m) {
  m.def("filter_conv_plan(Tensor weight, float threshold=0.0, int variant=0) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
  m.def("filter_conv(Tensor plan, Tensor rowptr, Tensor taps, Tensor values, Tensor x, "
        "Tensor? bias, int[2] kernel_size, int[2] stride, int[2] padding, int[2] dilation, "
        "int groups, bool relu, int variant=-1) -> Tensor");
}

namespace sparsejit {
namespace {

constexpr int64_t kGeomWords = 4;  // after the header: C_out, C_in/groups, R, S

void check_kernel_id(int64_t kernel, const char* op) {
  TORCH_CHECK_VALUE(kernel >= 0 && kernel < filter_conv::kNumVariants, "sparsejit.", op,
                    ": variant must be in [0, ", filter_conv::kNumVariants, ") (0 = auto, 1 = scalar, "
                    "2..5 = vec8x1, vec8x2, vec8x4, vec8x8, 6 = jit, 7 = jit_baked, 8 = generic); got ", kernel);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> filter_conv_plan_cpu(
    const at::Tensor& weight, double threshold, int64_t kernel) {
  TORCH_CHECK_VALUE(weight.dim() == 4, "sparsejit.filter_conv_plan: weight must be 4-D "
                    "[C_out, C_in/groups, R, S]; got shape ", weight.sizes());
  check_float(weight, "weight");
  TORCH_CHECK_VALUE(threshold >= 0, "sparsejit.filter_conv_plan: threshold must be >= 0; got ",
                    threshold);
  check_kernel_id(kernel, "filter_conv_plan");
  TORCH_CHECK_VALUE(weight.size(1) >= 1 && weight.size(2) >= 1 && weight.size(3) >= 1,
                    "sparsejit.filter_conv_plan: weight must have C_in/groups, R, S >= 1; got "
                    "shape ", weight.sizes());
  const auto w = weight.to(at::kFloat).contiguous();
  const int64_t rows = w.size(0), cols = w.size(1) * w.size(2) * w.size(3);
  const float thr = static_cast<float>(threshold);
  const int64_t nnz = filter_conv::count_kept(ptr<float>(w), rows, cols, thr);
  auto opt = w.options().dtype(at::kLong);
  auto rowptr = at::empty({rows + 1}, opt);
  auto taps = at::empty({nnz}, opt);
  auto values = at::empty({nnz}, w.options());
  filter_conv::compress(ptr<float>(w), rows, cols, thr, ptr<int64_t>(rowptr), ptr<int64_t>(taps),
                   ptr<float>(values));
  auto plan = at::empty({plan::kHeaderWords + kGeomWords}, opt);
  int64_t* words = ptr<int64_t>(plan);
  const auto stamp =
      plan::stamp_structure<int64_t>(ptr<int64_t>(rowptr), ptr<int64_t>(taps), rows, cols);
  plan::write_header(words, OpKind::FilterConv, kernel, 0, 0, stamp);
  words[plan::kHeaderWords + 0] = rows;
  words[plan::kHeaderWords + 1] = w.size(1);
  words[plan::kHeaderWords + 2] = w.size(2);
  words[plan::kHeaderWords + 3] = w.size(3);
  return {plan, rowptr, taps, values};
}

// ---- prepared layers ---------------------------------------------------------------------
// Validating the pattern, stamping it and computing every tap's offset are O(nnz) and cost as
// much as the convolution itself on 7x7 layers, so they run once per (rowptr, taps, input
// size, variant): a small process-wide table keyed by the live tensors (weakly held) at their
// version, as torch_ext/validated.cpp does for CSR structures. A tensor modified in place bumps
// its version and is validated again; inference tensors (no version counter) every call.

// TensorState: torch_ext/validated.h.

// Geometry without the batch: what a Prepared depends on.
std::vector<int64_t> geometry_key(const filter_conv::Geometry& g, int64_t variant) {
  return {g.c_in, g.h, g.w, g.c_out, g.groups, g.r, g.s, g.stride_h, g.stride_w,
          g.pad_h, g.pad_w, g.dil_h, g.dil_w, variant};
}

struct PreparedEntry {
  TensorState rowptr, taps;
  std::vector<int64_t> key;
  plan::StructureStamp stamp;
  std::shared_ptr<const filter_conv::Prepared> prepared;
};

class PreparedTable {
 public:
  std::optional<PreparedEntry> find(const at::Tensor& rowptr, const at::Tensor& taps,
                                    const std::vector<int64_t>& key) {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& e : entries_) {
      if (e.key == key && e.rowptr.matches(rowptr) && e.taps.matches(taps)) return e;
    }
    return std::nullopt;
  }
  void add(PreparedEntry entry) {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<PreparedEntry> kept;
    kept.push_back(std::move(entry));
    for (auto& old : entries_) {
      if (kept.size() >= kMaxEntries) break;
      if (!old.rowptr.expired() && !old.taps.expired()) kept.push_back(std::move(old));
    }
    entries_.swap(kept);
  }

 private:
  static constexpr size_t kMaxEntries = 256;  // a ResNet-50 has 53 convolutions
  std::mutex mu_;
  std::vector<PreparedEntry> entries_;
};

PreparedTable& prepared_table() {
  static PreparedTable t;
  return t;
}

void check_index(const at::Tensor& t, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong, "sparsejit.filter_conv: ", name,
                   " must be int64; got ", t.scalar_type());
  SPARSEJIT_CHECK("filter_conv", t.dim() == 1, name, " must be 1-D; got shape ", t.sizes());
  SPARSEJIT_CHECK("filter_conv", t.device().is_cpu(), name, " must be on the CPU; got ",
                  t.device());
}

// channels_last and not NCHW-contiguous, with more than one channel, row and column: where a
// size is 1 the two layouts differ only in strides that Inductor may choose differently from
// the example it traced (SparseLinear's [1, C, M, 1] views), so those stay NCHW. The fake
// (python/sparsejit/ops/filter_conv.py) applies the same rule.
bool channels_last_input(const at::Tensor& x) {
  return x.dim() == 4 && x.size(1) > 1 && x.size(2) > 1 && x.size(3) > 1 && !x.is_contiguous() &&
         x.is_contiguous(at::MemoryFormat::ChannelsLast);
}

int64_t pair_at(c10::IntArrayRef v, int i, const char* name) {
  SPARSEJIT_CHECK("filter_conv", v.size() == 2 || v.size() == 1, name, " must have 2 entries; got ",
                  v.size());
  return v.size() == 1 ? v[0] : v[i];
}

// The layer a call describes: the plan's weight shape checked against rowptr, x and the
// convolution arguments (each failure names the argument); the variant forced or the plan's.
struct Layer {
  filter_conv::Geometry g;
  int64_t cin_g = 0, variant = 0;
};

Layer check_layer(const int64_t* words, const at::Tensor& rowptr_t, const at::Tensor& x_in,
                  c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                  c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                  int64_t kernel) {
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
  const int64_t variant = kernel >= 0 ? kernel : words[plan::kWordKernel];
  SPARSEJIT_CHECK("filter_conv", variant >= 0 && variant < filter_conv::kNumVariants,
                  "plan's variant word ", variant, " is not a variant");

  SPARSEJIT_CHECK(
      "filter_conv",
      pair_at(kernel_size, 0, "kernel_size") == r && pair_at(kernel_size, 1, "kernel_size") == s,
      "kernel_size ", kernel_size, " does not match the plan's weight (", r, "x", s, ")");
  filter_conv::Geometry g;
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
  SPARSEJIT_CHECK("filter_conv", c_out % groups == 0, "C_out = ", c_out,
                  " is not divisible by groups = ", groups);
  return {g, cin_g, variant};
}

at::Tensor filter_conv_cpu(const at::Tensor& plan_t, const at::Tensor& rowptr_t,
                           const at::Tensor& taps_t, const at::Tensor& values_t,
                           const at::Tensor& x_in, const std::optional<at::Tensor>& bias_in,
                           c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                           c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                           bool relu, int64_t kernel) {
  check_index(plan_t, "plan");
  check_index(rowptr_t, "rowptr");
  check_index(taps_t, "taps");
  TORCH_CHECK_TYPE(values_t.scalar_type() == at::kFloat, "sparsejit.filter_conv: values must "
                   "be float32 (from filter_conv_plan); got ", values_t.scalar_type());
  SPARSEJIT_CHECK("filter_conv", values_t.device().is_cpu(), "values must be on the CPU; got ",
                  values_t.device());
  SPARSEJIT_CHECK("filter_conv", values_t.dim() == 1 && values_t.numel() == taps_t.numel(),
                  "values must have shape [", taps_t.numel(), "] (one per tap); got ",
                  values_t.sizes());
  check_float(x_in, "x");
  SPARSEJIT_CHECK("filter_conv", x_in.dim() == 4, "x must be 4-D [N, C_in, H, W]; got shape ",
                  x_in.sizes());
  SPARSEJIT_CHECK("filter_conv", x_in.device().is_cpu(), "x must be on the CPU or a CUDA "
                  "device; got ", x_in.device());
  SPARSEJIT_CHECK("filter_conv", plan_t.numel() == plan::kHeaderWords + kGeomWords,
                  "plan must have ", plan::kHeaderWords + kGeomWords, " words; got ",
                  plan_t.numel());
  const auto plan_c = plan_t.contiguous();
  const int64_t* words = ptr<int64_t>(plan_c);
  const Layer layer = check_layer(words, rowptr_t, x_in, kernel_size, stride, padding, dilation,
                                  groups, kernel);
  const filter_conv::Geometry g = layer.g;
  const int64_t c_out = g.c_out, cin_g = layer.cin_g, r = g.r, s = g.s;
  const int64_t variant = layer.variant;

  at::Tensor bias;
  if (bias_in.has_value()) {
    check_float(*bias_in, "bias");
    SPARSEJIT_CHECK("filter_conv", bias_in->dim() == 1 && bias_in->numel() == c_out,
                    "bias must have shape [", c_out, "]; got ", bias_in->sizes());
    check_same_device(*bias_in, x_in, "bias", "x");
    bias = bias_in->to(at::kFloat).contiguous();
  }
  const auto rowptr = rowptr_t.contiguous();
  const auto taps = taps_t.contiguous();
  const auto values = values_t.contiguous();
  filter_conv::Pattern p;
  p.rowptr = ptr<int64_t>(rowptr);
  p.taps = ptr<int64_t>(taps);
  p.values = ptr<float>(values);
  p.c_out = c_out;
  p.cols = cin_g * r * s;
  const auto key = geometry_key(g, variant);
  const bool track = !rowptr_t.is_inference() && !taps_t.is_inference();
  std::optional<PreparedEntry> hit;
  if (track) hit = prepared_table().find(rowptr_t, taps_t, key);
  if (!hit) {
    const std::string perr = filter_conv::check_pattern(p, taps.numel());
    SPARSEJIT_CHECK("filter_conv", perr.empty(), "invalid weight pattern: ", perr);
    PreparedEntry e;
    e.stamp = plan::stamp_structure<int64_t>(p.rowptr, p.taps, c_out, p.cols);
    e.key = key;
    e.prepared = filter_conv::prepare(g, p, static_cast<filter_conv::Variant>(variant));
    if (track) {
      e.rowptr = TensorState::of(rowptr_t);
      e.taps = TensorState::of(taps_t);
      prepared_table().add(e);
    }
    hit = std::move(e);
  }
  std::string herr;
  SPARSEJIT_CHECK("filter_conv",
                  plan::check_header(words, plan_c.numel(), OpKind::FilterConv, hit->stamp, &herr),
                  "plan: ", herr);

  const auto x = x_in.to(at::kFloat).contiguous();
  auto y = new_output({g.batch, c_out, g.out_h(), g.out_w()}, x.options());
  filter_conv::forward(*hit->prepared, g, p, ptr<float>(x),
                  bias.defined() ? ptr<float>(bias) : nullptr, relu, ptr<float>(y));
  // channels_last in, channels_last out (one transposing copy of the output: the kernel
  // writes whole output-channel rows).
  if (channels_last_input(x_in)) y = y.contiguous(at::MemoryFormat::ChannelsLast);
  return x_in.scalar_type() == at::kFloat ? y : y.to(x_in.scalar_type());
}

#ifdef SPARSEJIT_WITH_CUDA
// ---- CUDA (kernels/cuda/filter_conv.cuh) -------------------------------------------------------
// The plan, rowptr, taps and values may live on the CPU or on x's device (a module moved with
// .to("cuda") carries them there). Host reads: the plan's 14 words per call, and the pattern's
// O(nnz) check and stamp once per live (rowptr, taps) on a host copy.
using namespace cuda_ext;

at::Tensor filter_conv_cuda(const at::Tensor& plan_t, const at::Tensor& rowptr_t,
                            const at::Tensor& taps_t, const at::Tensor& values_t,
                            const at::Tensor& x_in, const std::optional<at::Tensor>& bias_in,
                            c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                            c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                            bool relu, int64_t kernel) {
  SPARSEJIT_CHECK("filter_conv", x_in.is_cuda(), "x is on ", x_in.device(),
                  " but the layer's plan / weights are on a CUDA device; move them together");
  c10::cuda::CUDAGuard guard(x_in.device());
  auto host = [](const at::Tensor& t) { return t.is_cpu() ? t : t.cpu(); };
  if (!gpu_kernels_available())
    return call_on_cpu<at::Tensor>("sparsejit::filter_conv", host(plan_t), host(rowptr_t),
                                   host(taps_t), host(values_t), x_in, bias_in, kernel_size,
                                   stride, padding, dilation, groups, relu, kernel);
  for (auto [t, name] : {std::pair{&plan_t, "plan"}, std::pair{&rowptr_t, "rowptr"},
                         std::pair{&taps_t, "taps"}}) {
    TORCH_CHECK_TYPE(t->scalar_type() == at::kLong, "sparsejit.filter_conv: ", name,
                     " must be int64; got ", t->scalar_type());
    SPARSEJIT_CHECK("filter_conv", t->dim() == 1, name, " must be 1-D; got shape ", t->sizes());
  }
  TORCH_CHECK_TYPE(values_t.scalar_type() == at::kFloat, "sparsejit.filter_conv: values must "
                   "be float32 (from filter_conv_plan); got ", values_t.scalar_type());
  SPARSEJIT_CHECK("filter_conv", values_t.dim() == 1 && values_t.numel() == taps_t.numel(),
                  "values must have shape [", taps_t.numel(), "] (one per tap); got ",
                  values_t.sizes());
  check_float(x_in, "x");
  SPARSEJIT_CHECK("filter_conv", x_in.dim() == 4, "x must be 4-D [N, C_in, H, W]; got shape ",
                  x_in.sizes());
  SPARSEJIT_CHECK("filter_conv", plan_t.numel() == plan::kHeaderWords + kGeomWords,
                  "plan must have ", plan::kHeaderWords + kGeomWords, " words; got ",
                  plan_t.numel());
  const auto plan_c = host(plan_t).contiguous();
  const int64_t* words = ptr<int64_t>(plan_c);
  const Layer layer = check_layer(words, rowptr_t, x_in, kernel_size, stride, padding, dilation,
                                  groups, kernel);
  const filter_conv::Geometry g = layer.g;
  const int64_t c_out = g.c_out, cin_g = layer.cin_g, r = g.r, s = g.s;
  // The pattern's check and stamp, once per live (rowptr, taps).
  auto made = derived_once("filter_conv_pattern", {rowptr_t, taps_t}, 0, [&] {
    const auto rp = host(rowptr_t).contiguous(), tp = host(taps_t).contiguous();
    filter_conv::Pattern p;
    p.rowptr = ptr<int64_t>(rp);
    p.taps = ptr<int64_t>(tp);
    p.c_out = c_out;
    p.cols = cin_g * r * s;
    const std::string perr = filter_conv::check_pattern(p, tp.numel());
    SPARSEJIT_CHECK("filter_conv", perr.empty(), "invalid weight pattern: ", perr);
    return std::static_pointer_cast<const void>(std::make_shared<const plan::StructureStamp>(
        plan::stamp_structure<int64_t>(p.rowptr, p.taps, c_out, p.cols)));
  });
  std::string herr;
  SPARSEJIT_CHECK("filter_conv",
                  plan::check_header(words, plan_c.numel(), OpKind::FilterConv,
                                     *std::static_pointer_cast<const plan::StructureStamp>(made),
                                     &herr),
                  "plan: ", herr);
  const auto dev = x_in.device();
  const auto rowptr = rowptr_t.to(dev).contiguous(), taps = taps_t.to(dev).contiguous();
  const auto values = values_t.to(dev).contiguous();
  at::Tensor bias;
  if (bias_in.has_value()) {
    check_float(*bias_in, "bias");
    SPARSEJIT_CHECK("filter_conv", bias_in->dim() == 1 && bias_in->numel() == c_out,
                    "bias must have shape [", c_out, "]; got ", bias_in->sizes());
    bias = bias_in->to(dev, at::kFloat).contiguous();
  }
  const auto x = x_in.to(at::kFloat).contiguous();
  auto y = at::empty({g.batch, c_out, g.out_h(), g.out_w()}, x.options());
  const int64_t pixels = g.out_h() * g.out_w();
  if (g.batch > 0 && c_out > 0 && pixels > 0) {
    const auto spec = codegen::plan_cuda_filter_conv(
        static_cast<int32_t>(r), static_cast<int32_t>(s), static_cast<int32_t>(g.stride_h),
        static_cast<int32_t>(g.stride_w), static_cast<int32_t>(g.pad_h),
        static_cast<int32_t>(g.pad_w), static_cast<int32_t>(g.dil_h),
        static_cast<int32_t>(g.dil_w));
    const std::string invalid = spec.validate();
    SPARSEJIT_CHECK("filter_conv", invalid.empty(), "no CUDA kernel for this layer: ", invalid);
    cuda::FilterConvParams p{};
    p.rowptr = rowptr.data_ptr();
    p.taps = taps.data_ptr();
    p.values = values.data_ptr();
    p.x = x.data_ptr();
    p.bias = bias.defined() ? bias.data_ptr() : nullptr;
    p.y = y.data_ptr();
    p.batch = g.batch, p.c_in = g.c_in, p.h = g.h, p.w = g.w, p.c_out = c_out;
    p.cin_g = cin_g, p.cout_g = c_out / groups, p.out_h = g.out_h(), p.out_w = g.out_w();
    p.relu = relu ? 1 : 0;
    std::string err;
    if (!CudaKernels::instance().run(
            spec, x.get_device(), c10::cuda::getCurrentCUDAStream().stream(),
            {codegen::plan_filter_conv_launch(spec, g.batch, c_out, pixels)}, &p, &err))
      raise_cuda_error("filter_conv", err);
  }
  if (channels_last_input(x_in)) y = y.contiguous(at::MemoryFormat::ChannelsLast);
  return x_in.scalar_type() == at::kFloat ? y : y.to(x_in.scalar_type());
}
#endif

}  // namespace

TORCH_LIBRARY_IMPL(sparsejit, CPU, m) {
  m.impl("filter_conv_plan", &filter_conv_plan_cpu);
  m.impl("filter_conv", &filter_conv_cpu);
}

#ifdef SPARSEJIT_WITH_CUDA
// filter_conv_plan compresses a weight once (on the CPU; the module keeps the result).
TORCH_LIBRARY_IMPL(sparsejit, CUDA, m) {
  m.impl("filter_conv_plan", SPARSEJIT_CUDA_FALLBACK);
  m.impl("filter_conv", &filter_conv_cuda);
}
#endif

}  // namespace sparsejit
