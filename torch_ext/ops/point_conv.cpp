// Point-cloud sparse convolution (issue 10).
//
// point_conv_plan(coords, spatial_shape, batch_size, kind, kernel, stride, padding, dilation,
//           out_coords?) -> (plan, out_coords)
//   Validates the coordinates once (csrc/point_conv/coords.h: errors name row, column and value),
//   finds the kernel map by merging sorted keys and assembles and stamps the plan tensor
//   (csrc/point_conv/plan_build.h; layout below). kind: "subm" (outputs = inputs), "spconv"
//   (spconv's strided output sites), "coarse" (unique(floor(c / stride))), "transposed"
//   (spconv's SparseConvTranspose sites), "generalized" (outputs = out_coords).
// point_conv(features, weight [K, C_in, C_out], bias?, plan, num_out, swap, dataflow)
//   -> [num_out, C_out]: the point-conv core (csrc/point_conv) over the plan's pairs; swap = read the map
//   backwards (spconv's inverse convolution: outputs are the plan's input sites).
// point_conv_backward(features, weight, grad_out, plan, swap, dataflow, need_features,
//   need_weight) -> (d_features, d_weight): d_features through the swapped map with W^T,
//   d_weight per offset (dataflow bits 2-3: its path, point_conv::WgradPath).
//
// Plan layout: csrc/point_conv/plan_layout.h (its one owner).
// float32 / float64 run natively; bfloat16 natively in the output-stationary rows the JIT
// compiles (features and output in bfloat16, float32 accumulation), else like float16 in
// float32, converted back.
#include "torch_ext/tensor_api.h"

#include <stdexcept>
#include <string>

#include "csrc/point_conv/kernel_map.h"
#include "csrc/point_conv/plan_build.h"
#include "csrc/point_conv/plan_layout.h"
#include "csrc/point_conv/point_conv_run.h"
#include "csrc/plan/plan_header.h"
#include "torch_ext/common.h"
#include "torch_ext/cuda_fallback.h"
#include "torch_ext/composite/point_conv_tensor_map.h"
#ifdef SPARSEJIT_WITH_CUDA
#include <list>
#include <mutex>

#include "codegen/cuda_point_conv.h"
#include "torch_ext/composite/point_conv_cuda.h"
#include "torch_ext/cuda_common.h"
#endif

SJ_LIBRARY_FRAGMENT(m) {
  m.def("point_conv_plan(Tensor coords, int[] spatial_shape, int batch_size, str kind, int[] kernel, "
        "int[] stride, int[] padding, int[] dilation, Tensor? out_coords) -> (Tensor, Tensor)");
  m.def("point_conv(Tensor features, Tensor weight, Tensor? bias, Tensor plan, SymInt num_out, "
        "bool swap, int dataflow, bool relu=False) -> Tensor");
  m.def("point_conv_backward(Tensor features, Tensor weight, Tensor grad_out, Tensor plan, "
        "bool swap, int dataflow, bool need_features, bool need_weight) -> (Tensor, Tensor)");
}

namespace sparsejit {
namespace {


using point_conv::kFixedWords;
using point_conv::kGeneralized;
using point_conv::kSpconv;
using point_conv::kSubm;
using point_conv::Kind;
using point_conv::kTransposed;
using point_conv::kCoarse;
using point_conv::plan_words;
using point_conv::PlanView;
using point_conv::view_words;
constexpr int kWordK = point_conv::kWordKernelVolume;
constexpr int64_t kMaxKernelVolume = int64_t{1} << 20;  // K of a plan (check_plan's bound)
constexpr int64_t kMaxReach = int64_t{1} << 30;         // the coordinate sets' widest margin

// ---- plan ---------------------------------------------------------------------------------

point_conv::CoordSet coord_set(const tx::Tensor& coords_in, const char* name,
                         const std::vector<int64_t>& shape, int64_t batch_size, int64_t margin) {
  const char* op = "point_conv_plan";
  SJ_CHECK_TYPE(!tx::isFloatingType(coords_in.scalar_type()) &&
                       !tx::isComplexType(coords_in.scalar_type()) &&
                       coords_in.scalar_type() != tx::kBool,
                   "sparsejit.point_conv_plan: ", name, " must hold integers; got ",
                   coords_in.scalar_type());
  SPARSEJIT_CHECK(op, coords_in.dim() == 2, name,
                  " must be [N, 1 + D] (batch index first); "
                  "got shape ",
                  coords_in.sizes());
  SPARSEJIT_CHECK(op, coords_in.device().is_cpu(), name, " must be on the CPU; got ",
                  coords_in.device());
  tx::Tensor c = coords_in.contiguous();
  if (c.scalar_type() != tx::kInt) {
    if (c.numel() > 0) {
      const int64_t lo = c.min().item<int64_t>(), hi = c.max().item<int64_t>();
      SPARSEJIT_CHECK(op, lo >= INT32_MIN && hi <= INT32_MAX, name,
                      " holds values outside int32 (min ", lo, ", max ", hi, ")");
    }
    c = c.to(tx::kInt);
  }
  point_conv::CoordSetOptions opt;
  opt.spatial_shape = shape;
  opt.batch_size = batch_size;
  opt.margin = margin;
  try {
    return point_conv::make_coord_set(ptr<int32_t>(c), c.size(0), c.size(1), opt);
  } catch (const std::invalid_argument& e) {
    // The core's message names the row as coords[row, col]; say which argument it was.
    // A packing failure comes from the arguments, not from a row: name them.
    const bool packing = std::string(e.what()).find("packing range") != std::string::npos;
    SPARSEJIT_CHECK(op, false, std::string(name) == "coords" ? "" : name,
                    std::string(name) == "coords" ? "" : ": ", e.what(),
                    packing ? " (from spatial_shape, batch_size and the kernel's reach)" : "");
  }
  return {};
}

// point_conv_plan's arguments, checked once for both devices: the map kind, the geometry and the
// key margin every coordinate set of the call is packed with.
struct PlanGeometry {
  Kind kind;
  point_conv::ConvParams p;
  std::vector<int64_t> shape;
  int64_t margin;
};

PlanGeometry check_plan_args(const tx::Tensor& coords, tx::IntArrayRef spatial_shape,
                             int64_t batch_size, tx::Str kind_name,
                             tx::IntArrayRef kernel, tx::IntArrayRef stride,
                             tx::IntArrayRef padding, tx::IntArrayRef dilation) {
  const char* op = "point_conv_plan";
  const std::string kn(kind_name);
  Kind kind;
  if (kn == "subm") kind = kSubm;
  else if (kn == "spconv") kind = kSpconv;
  else if (kn == "coarse") kind = kCoarse;
  else if (kn == "transposed") kind = kTransposed;
  else if (kn == "generalized") kind = kGeneralized;
  else
    SPARSEJIT_CHECK(op, false,
                    "kind must be subm, spconv, coarse, transposed or generalized; "
                    "got '",
                    kn, "'");
  const int64_t dims = static_cast<int64_t>(spatial_shape.size());
  SPARSEJIT_CHECK(op, dims >= 1 && dims <= point_conv::kMaxDims,
                  "spatial_shape must have 1 to 4 axes; "
                  "got ",
                  spatial_shape);
  for (auto [name, v] : {std::pair{"kernel", kernel}, {"stride", stride}, {"padding", padding},
                         {"dilation", dilation}})
    SPARSEJIT_CHECK(op, static_cast<int64_t>(v.size()) == dims, name, " must have ", dims,
                    " values (one per spatial axis); got ", v);
  SPARSEJIT_CHECK(op, batch_size >= 1, "batch_size must be >= 1; got ", batch_size);
  SPARSEJIT_CHECK(op, coords.dim() != 2 || coords.size(1) == dims + 1, "coords must have 1 + ",
                  dims, " columns (batch, then one per axis of spatial_shape ", spatial_shape,
                  "); got ", coords.size(1));
  point_conv::ConvParams p;
  p.dims = static_cast<int>(dims);
  int64_t reach = 0, volume = 1;
  for (int64_t d = 0; d < dims; ++d) {
    p.kernel[d] = kernel[d];
    p.stride[d] = stride[d];
    p.padding[d] = padding[d];
    p.dilation[d] = dilation[d];
    SPARSEJIT_CHECK(
        op, kernel[d] >= 1 && stride[d] >= 1 && dilation[d] >= 1 && padding[d] >= 0, "axis ", d,
        ": kernel, stride and dilation must be >= 1 and padding >= 0; got "
        "kernel ",
        kernel[d], ", stride ", stride[d], ", dilation ", dilation[d], ", padding ", padding[d]);
    // Coordinates are int32: larger values only overflow the key arithmetic (int64 products
    // below and in csrc/point_conv wrapped into spurious pairs).
    SPARSEJIT_CHECK(op,
                    kernel[d] <= kMaxKernelVolume && stride[d] <= INT32_MAX &&
                        dilation[d] <= INT32_MAX && padding[d] <= INT32_MAX,
                    "axis ", d,
                    ": kernel must be <= 2^20 and stride, dilation and padding "
                    "<= 2^31 - 1; got kernel ",
                    kernel[d], ", stride ", stride[d], ", dilation ", dilation[d], ", padding ",
                    padding[d]);
    volume *= kernel[d];
    SPARSEJIT_CHECK(op, volume < kMaxKernelVolume, "kernel ", kernel, " has ", volume,
                    (d + 1 < dims ? " or more" : ""), " offsets; a plan holds fewer than 2^20");
    reach = std::max(reach, dilation[d] * (kernel[d] - 1) + padding[d]);
    SPARSEJIT_CHECK(op, reach <= kMaxReach, "axis ", d, ": dilation * (kernel - 1) + padding = ",
                    dilation[d] * (kernel[d] - 1) + padding[d], " must be <= 2^30 (kernel ",
                    kernel[d], ", dilation ", dilation[d], ", padding ", padding[d], ")");
    if (kind == kSubm)
      SPARSEJIT_CHECK(op, kernel[d] % 2 == 1 && stride[d] == 1,
                      "a submanifold convolution needs "
                      "odd kernel sizes and stride 1; axis ",
                      d, " has kernel ", kernel[d], " and stride ", stride[d]);
  }
  const std::vector<int64_t> shape(spatial_shape.begin(), spatial_shape.end());
  for (int64_t d = 0; d < dims; ++d)
    SPARSEJIT_CHECK(op, shape[d] >= 1, "spatial_shape[", d, "] must be >= 1; got ", shape[d]);
  const int64_t margin = std::max<int64_t>(4, reach);
  return {kind, p, shape, margin};
}

std::tuple<tx::Tensor, tx::Tensor> conv_plan_cpu(
    const tx::Tensor& coords, tx::IntArrayRef spatial_shape, int64_t batch_size,
    tx::Str kind_name, tx::IntArrayRef kernel, tx::IntArrayRef stride,
    tx::IntArrayRef padding, tx::IntArrayRef dilation,
    const std::optional<tx::Tensor>& out_coords) {
  const char* op = "point_conv_plan";
  const PlanGeometry geo = check_plan_args(coords, spatial_shape, batch_size, kind_name, kernel,
                                           stride, padding, dilation);
  const Kind kind = geo.kind;
  const point_conv::ConvParams& p = geo.p;
  const std::vector<int64_t>& shape = geo.shape;
  const int64_t margin = geo.margin;
  const int64_t dims = static_cast<int64_t>(spatial_shape.size());
  if (structure_aten_forced() && coords.dim() == 2 &&
      tx::isIntegralType(coords.scalar_type(), /*includeBool=*/false)) {
    // The device-generic builders the CUDA op runs, on CPU tensors (tests compare them with
    // the core's plans); input they leave to the core (invalid, unsupported) falls through.
    std::optional<std::tuple<tx::Tensor, tx::Tensor>> r;
    if (kind == kSubm) {
      r = point_conv_tensor::subm_plan(coords.contiguous(), shape, batch_size, p, margin,
                                       &point_conv_tensor::search_keys_with_tensor_ops);
    } else {
      r = point_conv_tensor::strided_plan(coords.contiguous(), shape, batch_size, kind, p, margin,
                                          out_coords);
    }
    if (r.has_value()) return *r;
  }
  const point_conv::CoordSet in = coord_set(coords, "coords", shape, batch_size, margin);
  point_conv::CoordSet given_out;
  if (kind == kGeneralized) {
    SPARSEJIT_CHECK(op, out_coords.has_value(), "kind 'generalized' needs out_coords");
    SPARSEJIT_CHECK(op, out_coords->dim() == 2 && out_coords->size(1) == dims + 1,
                    "out_coords must be [M, 1 + ", dims, "] like coords; got shape ",
                    out_coords->sizes());
    given_out = coord_set(*out_coords, "out_coords", {}, batch_size, margin);
  }
  point_conv::KernelMap km;
  point_conv::CoordSet out_sites;
  const point_conv::CoordSet* out = nullptr;
  try {
    out = &point_conv::build_kernel_map(kind, in, &given_out, p, margin, km, out_sites);
  } catch (const std::invalid_argument& e) {
    const bool packing = std::string(e.what()).find("packing range") != std::string::npos;
    SPARSEJIT_CHECK(op, false, e.what(),
                    packing ? " (from spatial_shape, batch_size, kernel, stride, padding and "
                              "dilation)"
                            : "");
  }
  const int64_t k = km.kernel_volume(), m = km.size(), n_in = in.size(), n_out = out->size();
  const int64_t identity = point_conv::mark_identity(kind, n_in, km);
  auto plan_t = tx::empty({plan_words(k, m, n_in, n_out)}, coords.options().dtype(tx::kLong));
  point_conv::write_plan(ptr<int64_t>(plan_t), kind, identity, km, n_in, n_out,
                         point_conv::sites_fingerprint(in.keys.data(), n_in));
  auto oc = tx::empty({n_out, dims + 1}, coords.options().dtype(tx::kInt));
  if (kind == kSubm || kind == kGeneralized) {
    // Output rows keep the caller's order (site id = row).
    const auto src = (kind == kSubm ? coords : *out_coords).to(tx::kInt).contiguous();
    oc.copy_(src);
  } else {
    std::copy(out->coords.begin(), out->coords.end(), ptr<int32_t>(oc));
  }
  return {plan_t, oc};
}

// ---- convolution --------------------------------------------------------------------------

struct PlanSizes {
  int64_t k, m, n_in, n_out;
};

// The plan tensor's type and shape, and its header words `w` (host memory): magic, version,
// family and sizes consistent with the tensor's length.
PlanSizes check_plan_header(const char* op, const tx::Tensor& plan_t, const int64_t* w);

PlanView check_plan(const char* op, const tx::Tensor& plan_t) {
  check_plan_header(op, plan_t, nullptr);  // type and shape before reading words
  const int64_t* w = ptr<int64_t>(plan_t);
  const PlanSizes z = check_plan_header(op, plan_t, w);
  PlanView v = view_words(w, z.k, z.m, z.n_in, z.n_out);
  // The pairs the kernels read end at group_ptr[K]: past the header's M they would read
  // beyond the int32 arrays.
  SPARSEJIT_CHECK(op, v.group_ptr[z.k] == z.m, "corrupted plan: group_ptr[K] = ", v.group_ptr[z.k],
                  " but the plan holds ", z.m, " pairs");
  v.identity = w[plan::kWordParam];
  return v;
}

PlanSizes check_plan_header(const char* op, const tx::Tensor& plan_t, const int64_t* w) {
  SJ_CHECK_TYPE(plan_t.scalar_type() == tx::kLong, "sparsejit.", op,
                   ": plan must be an int64 tensor from point_conv_plan; got ", plan_t.scalar_type());
  SPARSEJIT_CHECK(op, plan_t.dim() == 1 && plan_t.numel() >= kFixedWords && plan_t.is_contiguous(),
                  "plan must be a contiguous 1-D tensor from point_conv_plan; got shape ",
                  plan_t.sizes());
  if (w == nullptr) return {};
  SPARSEJIT_CHECK(
      op, w[plan::kWordMagic] == plan::kPlanMagic && w[plan::kWordVersion] == plan::kPlanVersion,
      "plan is not a sparsejit plan (bad magic or version)");
  const int64_t family = w[plan::kWordOp];
  SPARSEJIT_CHECK(op, family == static_cast<int64_t>(OpKind::PointConv),
                  "plan was built "
                  "for ",
                  std::string(plan::plan_op_name(family)) == "unknown" ? "an unknown op"
                                                                       : plan::plan_op_name(family),
                  " (op family word ", family, "), not point_conv");
  const int64_t k = w[kWordK], m = w[plan::kWordNnz], n_in = w[plan::kWordCols],
                n_out = w[plan::kWordRows];
  SPARSEJIT_CHECK(op,
                  k >= 0 && m >= 0 && n_in >= 0 && n_out >= 0 && m <= INT32_MAX && k < (1 << 20) &&
                      n_in <= INT32_MAX && n_out <= INT32_MAX &&
                      plan_t.numel() == plan_words(k, m, n_in, n_out),
                  "plan sizes are inconsistent (corrupted plan)");
  return {k, m, n_in, n_out};
}

point_conv::Pairs pairs_of(const PlanView& v, bool swap) {
  point_conv::Pairs p;
  p.num_groups = v.k;
  p.group_ptr = v.group_ptr;
  p.in_idx = v.in_idx;
  p.out_idx = v.out_idx;
  p.num_in = v.n_in;
  p.num_out = v.n_out;
  p.identity_group = v.identity;
  p.row_ptr = v.out_row_ptr;
  p.row_pair = v.out_row_pair;
  p.pair_group = v.pair_group;
  return swap ? point_conv::swapped(p, v.in_row_ptr, v.in_row_pair, true) : p;
}

// The plan's pairs read forward or backwards (swap), after the O(M) range checks of both
// directions (the backward pass reads the other one), so a corrupted plan is an error.
point_conv::Pairs checked_pairs(const char* op, const tx::Tensor& plan_t, bool swap) {
  const PlanView v = check_plan(op, plan_t);
  const std::string err =
      point_conv::check_pairs_both_ways(pairs_of(v, false), v.in_row_ptr, v.in_row_pair);
  SPARSEJIT_CHECK(op, err.empty(), "corrupted plan: ", err);
  // The identity group runs as one GEMM without reading its pairs: pairs that are not
  // (r, r) would be silently ignored (O(N), beside check_pairs' O(M)).
  if (v.identity >= 0) {
    const int64_t first = v.group_ptr[v.identity];
    bool ok = true;
    for (int64_t r = 0; r < v.n_in; ++r)
      ok &= (v.in_idx[first + r] == r) & (v.out_idx[first + r] == r);
    SPARSEJIT_CHECK(op, ok, "corrupted plan: the identity group ", v.identity,
                    " holds pairs other than (r, r)");
  }
  return pairs_of(v, swap);
}

// `dataflow` packs 2-bit fields (0 = auto, 1, 2; never 3): bits 0-1 the dataflow this op
// runs, then (forward) the backward's feature-gradient dataflow and weight-gradient path, or
// (backward) the weight-gradient path.
void check_packed_dataflow(const char* op, int64_t dataflow, int fields) {
  bool ok = dataflow >= 0 && dataflow < (int64_t{1} << (2 * fields));
  for (int f = 0; f < fields && ok; ++f) ok = ((dataflow >> (2 * f)) & 3) != 3;
  SPARSEJIT_CHECK(op, ok,
                  "dataflow must be 0 (auto), 1 (gather-GEMM-scatter) or 2 "
                  "(output-stationary), plus 2-bit fields for the backward's choices (0, 1 or 2 "
                  "each; ",
                  fields, " fields in all); got ", dataflow);
}

point_conv::Dataflow parse_dataflow(const char* op, int64_t d) {
  SPARSEJIT_CHECK(op, d >= 0 && d <= 2,
                  "dataflow must be 0 (auto), 1 (gather-GEMM-scatter) or "
                  "2 (output-stationary); got ",
                  d);
  return static_cast<point_conv::Dataflow>(d);
}

void check_conv_args(const char* op, const tx::Tensor& x, const tx::Tensor& w,
                     const point_conv::Pairs& p, bool cpu_only = true) {
  check_float(x, "features");
  check_float(w, "weight");
  SPARSEJIT_CHECK(op, x.dim() == 2, "features must be [N, C_in]; got shape ", x.sizes());
  SPARSEJIT_CHECK(op, w.dim() == 3, "weight must be [K, C_in, C_out]; got shape ", w.sizes());
  SJ_CHECK_TYPE(w.scalar_type() == x.scalar_type(), "sparsejit.", op, ": weight dtype (",
                   w.scalar_type(), ") must match features dtype (", x.scalar_type(), ")");
  check_same_device(w, x, "weight", "features");
  SPARSEJIT_CHECK(op, !cpu_only || x.device().is_cpu(), "only CPU tensors are supported; got ",
                  x.device());
  SPARSEJIT_CHECK(op, x.size(0) == p.num_in, "features have ", x.size(0),
                  " rows but the plan's "
                  "input coordinate set has ",
                  p.num_in, " sites");
  SPARSEJIT_CHECK(op, w.size(0) == p.num_groups, "weight has ", w.size(0),
                  " kernel offsets but "
                  "the plan has ",
                  p.num_groups);
  SPARSEJIT_CHECK(op, w.size(1) == x.size(1), "weight has C_in = ", w.size(1),
                  " but features "
                  "have ",
                  x.size(1), " channels");
}

// Arguments of point_conv::output_stationary_bf16: x and y are bfloat16 tensors passed as bits.
point_conv::PointConvArgs<float> bf16_args(const tx::Tensor& x, const tx::Tensor& w,
                              const std::optional<tx::Tensor>& bias, tx::Tensor& y,
                              bool trans_w, bool relu) {
  point_conv::PointConvArgs<float> a;
  a.x = static_cast<const float*>(x.const_data_ptr());
  a.c_in = x.size(1);
  a.w = w.const_data_ptr<float>();
  a.trans_w = trans_w;
  a.c_out = y.size(1);
  a.bias = bias.has_value() ? bias->const_data_ptr<float>() : nullptr;
  a.y = static_cast<float*>(y.mutable_data_ptr());
  a.relu = relu;
  return a;
}

tx::Tensor sparse_conv_cpu(const tx::Tensor& x_in, const tx::Tensor& w_in,
                           const std::optional<tx::Tensor>& bias_in, const tx::Tensor& plan_t,
                           int64_t num_out, bool swap, int64_t dataflow, bool relu) {
  const char* op = "point_conv";
  const point_conv::Pairs p = checked_pairs(op, plan_t, swap);
  check_conv_args(op, x_in, w_in, p);
  SPARSEJIT_CHECK(op, num_out == p.num_out, "num_out = ", num_out, " but the plan has ", p.num_out,
                  " output sites");
  const auto ct = compute_type(x_in.scalar_type());
  const auto w = w_in.to(ct).contiguous();
  std::optional<tx::Tensor> bias;
  if (bias_in.has_value()) {
    check_float(*bias_in, "bias");
    SPARSEJIT_CHECK(op, bias_in->dim() == 1 && bias_in->size(0) == w.size(2),
                    "bias must be [C_out"
                    " = ",
                    w.size(2), "]; got shape ", bias_in->sizes());
    check_same_device(*bias_in, x_in, "bias", "features");
    bias = bias_in->to(ct).contiguous();
  }
  // Bits 2-5 may carry the backward's choices (set by point_conv's Python wrapper from
  // sj.tune's store, read by its autograd formula): the forward runs bits 0-1.
  check_packed_dataflow(op, dataflow, 3);
  const auto d = parse_dataflow(op, dataflow & 3);
  if (x_in.scalar_type() == tx::kBFloat16) {
    // bfloat16 features in, bfloat16 out, float32 accumulation, no float32 copies of X or Y
    // (when the output-stationary rows take the pass; else the float32 path below).
    const auto xb = x_in.contiguous();
    auto yb = new_output({num_out, w.size(2)}, xb.options());
    if (point_conv::output_stationary_bf16(p, bf16_args(xb, w, bias, yb, false, relu), d,
                                           w_in.scalar_type() == tx::kBFloat16))
      return yb;
  }
  const auto x = x_in.to(ct).contiguous();
  auto y = new_output({num_out, w.size(2)}, x.options());
  SJ_DISPATCH_FLOATING_TYPES(ct, "sparsejit.point_conv", [&] {
    point_conv::PointConvArgs<scalar_t> a;
    a.x = ptr<scalar_t>(x);
    a.c_in = x.size(1);
    a.w = ptr<scalar_t>(w);
    a.c_out = w.size(2);
    a.bias = bias.has_value() ? ptr<scalar_t>(*bias) : nullptr;
    a.y = ptr<scalar_t>(y);
    a.relu = relu;
    point_conv::gather_gemm_scatter<scalar_t>(p, a, d);
  });
  return y.to(x_in.scalar_type());
}

std::tuple<tx::Tensor, tx::Tensor> sparse_conv_backward_cpu(
    const tx::Tensor& x_in, const tx::Tensor& w_in, const tx::Tensor& dy_in,
    const tx::Tensor& plan_t, bool swap, int64_t dataflow, bool need_x, bool need_w) {
  const char* op = "point_conv_backward";
  const point_conv::Pairs p = checked_pairs(op, plan_t, swap);
  check_conv_args(op, x_in, w_in, p);
  check_float(dy_in, "grad_out");
  check_same_device(dy_in, x_in, "grad_out", "features");
  SPARSEJIT_CHECK(
      op, dy_in.dim() == 2 && dy_in.size(0) == p.num_out && dy_in.size(1) == w_in.size(2),
      "grad_out must be [", p.num_out, ", ", w_in.size(2), "]; got shape ", dy_in.sizes());
  const auto ct = compute_type(x_in.scalar_type());
  const auto w = w_in.to(ct).contiguous();
  check_packed_dataflow(op, dataflow, 2);  // bits 2-3: the weight-gradient path
  const auto d = parse_dataflow(op, dataflow & 3);
  const auto wpath = static_cast<point_conv::WgradPath>(dataflow >> 2);
  // dX = the same pairs read backwards with W^T (in rows are distinct within an offset too).
  const point_conv::Pairs back = pairs_of(check_plan(op, plan_t), !swap);
  const bool bf16 = x_in.scalar_type() == tx::kBFloat16 && dy_in.scalar_type() == tx::kBFloat16;
  const auto dyb = bf16 ? dy_in.contiguous() : dy_in;
  tx::Tensor dx_native;  // bfloat16 dX straight from bfloat16 dY (see sparse_conv_cpu)
  if (need_x && bf16) {
    auto dxb = new_output({x_in.size(0), x_in.size(1)}, dyb.options());
    if (point_conv::output_stationary_bf16(back, bf16_args(dyb, w, std::nullopt, dxb, true, false),
                                           d, w_in.scalar_type() == tx::kBFloat16))
      dx_native = dxb;
  }
  tx::Tensor dw_native;  // float32 dW from bfloat16 X and dY (oneDNN's bfloat16 GEMM)
  if (need_w && bf16) {
    const auto xb = x_in.contiguous();
    auto dwf = tx::empty_like(w);  // float32
    if (point_conv::weight_grad_bf16(p, static_cast<const uint16_t*>(xb.const_data_ptr()),
                                     xb.size(1), static_cast<const uint16_t*>(dyb.const_data_ptr()),
                                     dyb.size(1), ptr<float>(dwf), wpath))
      dw_native = dwf;
  }
  const bool fp_x = need_x && !dx_native.defined();
  const bool fp_w = need_w && !dw_native.defined();
  const auto x = fp_w ? x_in.to(ct).contiguous() : tx::empty({0, x_in.size(1)}, w.options());
  const auto dy = fp_w || fp_x ? dy_in.to(ct).contiguous() : tx::empty({0}, w.options());
  auto dx = fp_x ? new_output({x_in.size(0), x_in.size(1)}, w.options())
                 : tx::empty({0}, w.options());
  auto dw = fp_w ? tx::empty_like(w) : tx::empty({0}, w.options());
  SJ_DISPATCH_FLOATING_TYPES(ct, "sparsejit.point_conv_backward", [&] {
    if (fp_x) {
      point_conv::PointConvArgs<scalar_t> a;
      a.x = ptr<scalar_t>(dy);
      a.c_in = dy.size(1);
      a.w = ptr<scalar_t>(w);
      a.trans_w = true;
      a.c_out = x.size(1);
      a.y = ptr<scalar_t>(dx);
      point_conv::gather_gemm_scatter<scalar_t>(back, a, d);
    }
    if (fp_w)
      point_conv::weight_grad<scalar_t>(p, ptr<scalar_t>(x), x.size(1), ptr<scalar_t>(dy), dy.size(1),
                                 nullptr, ptr<scalar_t>(dw), wpath);
  });
  return {dx_native.defined() ? dx_native : dx.to(x_in.scalar_type()),
          (dw_native.defined() ? dw_native : dw).to(x_in.scalar_type())};
}

}  // namespace

SJ_LIBRARY_IMPL(CPU, m) {
  m.impl("point_conv_plan", SJ_KERNEL(&conv_plan_cpu));
  m.impl("point_conv", SJ_KERNEL(&sparse_conv_cpu));
  m.impl("point_conv_backward", SJ_KERNEL(&sparse_conv_backward_cpu));
}

#ifdef SPARSEJIT_WITH_CUDA
// torch_ext/ops/point_conv_cuda.inc: the CUDA implementations (same checks, plans on the GPU).
#include "torch_ext/ops/point_conv_cuda.inc"

SJ_LIBRARY_IMPL(CUDA, m) {
  m.impl("point_conv_plan", SJ_KERNEL(&conv_plan_cuda));
  m.impl("point_conv", SJ_KERNEL(&sparse_conv_cuda));
  m.impl("point_conv_backward", SJ_KERNEL(&sparse_conv_backward_cuda));
}
#endif

}  // namespace sparsejit
