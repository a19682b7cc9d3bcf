// The stable-ABI backend of torch_ext/tensor_api.h (built with SPARSEJIT_STABLE_ABI): the same
// names as the ATen backend, on PyTorch's stable C shim only (torch/csrc/stable and
// torch/headeronly, TORCH_TARGET_VERSION = 2.10), so that one binary loads under every torch
// release from 2.10 up. The default build (CPU and CUDA) and the wheel's.
//
// How the names map:
//   - tx::Tensor derives from torch::stable::Tensor and adds the at::Tensor methods the
//     adapters use (contiguous, to, narrow, options, ...). Each is one stable shim call or one
//     call of the ATen op by name through the dispatcher (torch_call_dispatcher, 2.10+):
//     call<R>("aten::sort", "stable", args...) boxes the arguments into StableIValues.
//   - Errors: SJ_CHECK_VALUE throws std::invalid_argument, which PyTorch raises as ValueError
//     (as TORCH_CHECK_VALUE); SJ_CHECK_RUNTIME std::runtime_error (RuntimeError). There is no
//     stable way to raise TypeError: SJ_CHECK_TYPE throws std::invalid_argument with the
//     message prefixed "TypeError: " (ValueError in Python; sparsejit.h rethrows it as
//     c10::TypeError for LibTorch callers).
//   - What the dispatcher bridge cannot pass (Scalar arguments) is worked around per function
//     below (0-dim tensors, a stacked sum for integral add/sub, arange written directly).
#pragma once

#include <torch/csrc/stable/device.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/stableivalue_conversions.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace sparsejit::tx {

using ScalarType = torch::headeronly::ScalarType;
using IntArrayRef = torch::headeronly::IntHeaderOnlyArrayRef;
using Device = torch::stable::Device;
using DeviceType = torch::headeronly::DeviceType;
using MemoryFormat = torch::headeronly::MemoryFormat;
// A schema `str` argument (TORCH_BOX has no string_view). Its own type, not std::string, so
// that its conversion from a boxed value is ours (ToImpl<Str> below): torch 2.13's
// ToImpl<std::string> copies the string into a `new std::string` and returns a copy of it,
// leaking 48 bytes per str argument per call (pytorch/pytorch#190493). Small as it is, that
// leaked block lands inside the holes freed [N, F] outputs leave in glibc's heap, so a
// training loop's heap grew without bound (a SAGEConv step on PubMed: +28 MB of RSS a step).
struct Str : std::string {
  Str() = default;
  using std::string::string;
  Str(const std::string& s) : std::string(s) {}  // NOLINT: implicit, as the alias was
  Str(std::string&& s) : std::string(std::move(s)) {}  // NOLINT
};

constexpr ScalarType kFloat = ScalarType::Float;
constexpr ScalarType kDouble = ScalarType::Double;
constexpr ScalarType kHalf = ScalarType::Half;
constexpr ScalarType kBFloat16 = ScalarType::BFloat16;
constexpr ScalarType kInt = ScalarType::Int;
constexpr ScalarType kLong = ScalarType::Long;
constexpr ScalarType kShort = ScalarType::Short;
constexpr ScalarType kByte = ScalarType::Byte;
constexpr ScalarType kChar = ScalarType::Char;
constexpr ScalarType kBool = ScalarType::Bool;
constexpr DeviceType kCPU = DeviceType::CPU;
constexpr DeviceType kCUDA = DeviceType::CUDA;

inline bool isFloatingType(ScalarType t) {
  return t == kFloat || t == kDouble || t == kHalf || t == kBFloat16;
}
inline bool isComplexType(ScalarType t) {
  return t == ScalarType::ComplexHalf || t == ScalarType::ComplexFloat ||
         t == ScalarType::ComplexDouble;
}
inline bool isIntegralType(ScalarType t, bool include_bool) {
  return t == kByte || t == kChar || t == kShort || t == kInt || t == kLong ||
         (include_bool && t == kBool);
}
inline size_t elementSize(ScalarType t) {
  switch (t) {
    case ScalarType::Double: case ScalarType::Long: case ScalarType::ComplexFloat: return 8;
    case ScalarType::Float: case ScalarType::Int: return 4;
    case ScalarType::Half: case ScalarType::BFloat16: case ScalarType::Short: return 2;
    case ScalarType::ComplexDouble: return 16;
    default: return 1;
  }
}

// ---- messages: what the ATen backend streams through TORCH_CHECK ------------------------------
namespace detail {
inline std::ostream& operator<<(std::ostream& os, IntArrayRef a) {
  os << '[';
  for (size_t i = 0; i < a.size(); ++i) os << (i ? ", " : "") << a[i];
  return os << ']';
}
inline std::ostream& operator<<(std::ostream& os, const Device& d) {
  os << (d.type() == kCUDA ? "cuda" : d.type() == kCPU ? "cpu" : "device");
  if (d.has_index()) os << ':' << int(d.index());
  return os;
}
template <class... A>
std::string cat(const A&... a) {
  std::ostringstream os;
  (void)(os << ... << a);
  return os.str();
}
[[noreturn]] inline void value_error(const std::string& m) { throw std::invalid_argument(m); }
[[noreturn]] inline void type_error(const std::string& m) {
  throw std::invalid_argument("TypeError: " + m);
}
[[noreturn]] inline void runtime_error(const std::string& m) { throw std::runtime_error(m); }
}  // namespace detail

class Tensor;

// ---- the dispatcher by name ------------------------------------------------------------------
template <class T>
StableIValue box(const T& v) {
  return torch::stable::detail::from(v);
}
StableIValue box(const Tensor& v);
StableIValue box(const std::optional<Tensor>& v);
StableIValue box(const std::vector<Tensor>& v);

// Calls ATen op `name.overload` with `args` (boxed in schema order; every argument must be
// given, defaults included) and returns the stack after the call: returns from slot 0.
template <size_t NRet, class... A>
std::array<StableIValue, (sizeof...(A) > NRet ? sizeof...(A) : NRet)> call_boxed(
    const char* name, const char* overload, const A&... args) {
  std::array<StableIValue, (sizeof...(A) > NRet ? sizeof...(A) : NRet)> st{box(args)...};
  if (torch_call_dispatcher(name, overload, st.data(), TORCH_ABI_VERSION) != AOTI_TORCH_SUCCESS)
    detail::runtime_error(detail::cat("sparsejit: ", name, *overload ? "." : "", overload,
                                      " failed (called through torch's stable dispatcher)"));
  return st;
}

// ---- tensors ---------------------------------------------------------------------------------
struct TensorOptions {
  ScalarType dtype_ = kFloat;
  Device device_ = Device(kCPU);
  TensorOptions() = default;
  /* implicit */ TensorOptions(ScalarType t) : dtype_(t) {}
  TensorOptions(ScalarType t, Device d) : dtype_(t), device_(d) {}
  TensorOptions dtype(ScalarType t) const { TensorOptions o = *this; o.dtype_ = t; return o; }
  TensorOptions device(Device d) const { TensorOptions o = *this; o.device_ = d; return o; }
  // empty() allocates contiguous tensors: the only memory format asked for.
  TensorOptions memory_format(MemoryFormat) const { return *this; }
};

class Tensor : public torch::stable::Tensor {
 public:
  using Base = torch::stable::Tensor;
  Tensor() = default;
  /* implicit */ Tensor(const Base& b) : Base(b) {}
  /* implicit */ Tensor(Base&& b) : Base(std::move(b)) {}

  template <class T>
  T* data_ptr() const { return static_cast<T*>(Base::data_ptr()); }
  void* data_ptr() const { return Base::data_ptr(); }
  int get_device() const { return is_cpu() ? -1 : int(get_device_index()); }
  size_t nbytes() const { return size_t(numel()) * element_size(); }
  TensorOptions options() const { return TensorOptions(scalar_type(), device()); }
  bool is_contiguous() const { return Base::is_contiguous(); }
  bool is_contiguous(MemoryFormat f) const {
    auto st = call_boxed<1>("aten::is_contiguous", "memory_format", *this, f);
    return torch::stable::detail::to<bool>(st[0]);
  }

  Tensor contiguous() const {
    if (Base::is_contiguous()) return *this;  // as ATen's inline fast path: no dispatch
    return torch::stable::contiguous(*this);
  }
  Tensor contiguous(MemoryFormat f) const {
    if (f == MemoryFormat::Contiguous) return contiguous();
    return torch::stable::contiguous(*this, f);
  }
  Tensor to(ScalarType t) const {
    if (t == scalar_type()) return *this;
    return torch::stable::to(*this, t);
  }
  Tensor to(DeviceType d) const { return to(Device(d)); }
  Tensor to(const Device& d) const {
    if (d == device()) return *this;
    return torch::stable::to(*this, std::nullopt, std::nullopt, d);
  }
  Tensor to(const Device& d, bool non_blocking, bool copy) const {
    if (d == device() && !copy) return *this;
    return torch::stable::to(*this, std::nullopt, std::nullopt, d, std::nullopt, non_blocking,
                             copy);
  }
  Tensor cpu() const { return to(Device(kCPU)); }
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const {
    Base self = *this;
    return torch::stable::narrow(self, dim, start, length);
  }
  Tensor select(int64_t dim, int64_t index) const {
    return torch::stable::select(*this, dim, index);
  }
  Tensor operator[](int64_t i) const { return select(0, i); }
  Tensor t() const { return torch::stable::transpose(*this, 0, 1); }
  Tensor view(IntArrayRef s) const { return torch::stable::view(*this, s); }
  Tensor view(ScalarType t) const;  // reinterpret the bytes (aten::view.dtype)
  Tensor reshape(IntArrayRef s) const { return torch::stable::reshape(*this, s); }
  Tensor zero_() const { Base self = *this; return torch::stable::zero_(self); }
  Tensor fill_(double v) const { return torch::stable::fill_(*this, v); }
  Tensor copy_(const Tensor& src) const {
    Base self = *this;
    return torch::stable::copy_(self, src);
  }
  Tensor clone() const { return torch::stable::clone(*this); }
  Tensor index_select(int64_t dim, const Tensor& index) const;
  int64_t _version() const;
  bool is_inference() const;

  // Element-wise and reductions (ATen ops by name; a scalar operand becomes a 0-dim tensor of
  // this tensor's dtype and device: the dispatcher bridge has no Scalar).
  Tensor scalar(double v) const;
  Tensor any() const;
  Tensor any(int64_t dim) const;
  Tensor min() const;
  Tensor max() const;
  Tensor nonzero() const;
  Tensor sqrt() const;
  Tensor reciprocal() const;
  Tensor cumsum(int64_t dim) const;
  Tensor sum() const;
  Tensor sum(int64_t dim) const;
  Tensor ne(const Tensor& o) const;
  Tensor ne(double v) const { return ne(scalar(v)); }
  Tensor logical_or(const Tensor& o) const;
  Tensor logical_and(const Tensor& o) const;
  Tensor expand(IntArrayRef sizes) const;
  Tensor masked_fill_(const Tensor& mask, double v) const;
  Tensor index_put_(const std::vector<Tensor>& indices, const Tensor& values) const;
  Tensor index_add_(int64_t dim, const Tensor& index, const Tensor& source) const;
  Tensor add_(const Tensor& o) const;
  Tensor div_(const Tensor& o) const;
  Tensor addmm_(const Tensor& a, const Tensor& b) const;
  template <class T>
  T item() const;
};

inline StableIValue box(const Tensor& v) {
  return torch::stable::detail::from(static_cast<const torch::stable::Tensor&>(v));
}
inline StableIValue box(const std::optional<Tensor>& v) {
  if (!v) return torch::stable::detail::from(std::nullopt);
  return torch::stable::detail::from(
      std::optional<torch::stable::Tensor>(static_cast<const torch::stable::Tensor&>(*v)));
}
inline StableIValue box(const std::vector<Tensor>& v) {
  std::vector<torch::stable::Tensor> b(v.begin(), v.end());
  return torch::stable::detail::from(b);
}
inline Tensor unbox_tensor(StableIValue v) {
  return torch::stable::detail::to<torch::stable::Tensor>(v);
}

inline Tensor Tensor::index_select(int64_t dim, const Tensor& index) const {
  return unbox_tensor(call_boxed<1>("aten::index_select", "", *this, dim, index)[0]);
}
// The version counter, or false for a tensor without one (an inference tensor).
inline bool try_version(const Tensor& t, int64_t* out) {
  std::array<StableIValue, 1> st{box(t)};
  if (torch_call_dispatcher("aten::_version", "", st.data(), TORCH_ABI_VERSION) !=
      AOTI_TORCH_SUCCESS)
    return false;
  *out = torch::stable::detail::to<int64_t>(st[0]);
  return true;
}
inline int64_t Tensor::_version() const {
  int64_t v = 0;
  if (!try_version(*this, &v))
    detail::runtime_error("sparsejit: an inference tensor has no version counter");
  return v;
}
inline bool Tensor::is_inference() const {
  return torch::stable::detail::to<bool>(call_boxed<1>("aten::is_inference", "", *this)[0]);
}

inline Tensor op1(const char* name, const char* overload, const Tensor& a) {
  return unbox_tensor(call_boxed<1>(name, overload, a)[0]);
}
inline Tensor op2(const char* name, const char* overload, const Tensor& a, const Tensor& b) {
  return unbox_tensor(call_boxed<1>(name, overload, a, b)[0]);
}
inline Tensor Tensor::scalar(double v) const {
  return torch::stable::full({}, v, scalar_type(), std::nullopt, device());
}
inline Tensor Tensor::any() const { return op1("aten::any", "", *this); }
inline Tensor Tensor::any(int64_t dim) const {
  return unbox_tensor(call_boxed<1>("aten::any", "dim", *this, dim, false)[0]);
}
inline Tensor Tensor::min() const { return op1("aten::min", "", *this); }
inline Tensor Tensor::max() const { return op1("aten::max", "", *this); }
inline Tensor Tensor::nonzero() const { return op1("aten::nonzero", "", *this); }
inline Tensor Tensor::sqrt() const { return op1("aten::sqrt", "", *this); }
inline Tensor Tensor::reciprocal() const { return op1("aten::reciprocal", "", *this); }
inline Tensor Tensor::cumsum(int64_t dim) const {
  return unbox_tensor(
      call_boxed<1>("aten::cumsum", "", *this, dim, std::optional<ScalarType>())[0]);
}
inline Tensor Tensor::sum() const {
  return unbox_tensor(call_boxed<1>("aten::sum", "", *this, std::optional<ScalarType>())[0]);
}
inline Tensor Tensor::ne(const Tensor& o) const { return op2("aten::ne", "Tensor", *this, o); }
inline Tensor Tensor::sum(int64_t dim) const {
  return unbox_tensor(call_boxed<1>("aten::sum", "dim_IntList", *this,
                                    std::optional<std::vector<int64_t>>(std::vector<int64_t>{dim}),
                                    false, std::optional<ScalarType>())[0]);
}
inline Tensor Tensor::view(ScalarType t) const {
  return unbox_tensor(call_boxed<1>("aten::view", "dtype", *this, t)[0]);
}
inline Tensor Tensor::logical_or(const Tensor& o) const {
  return op2("aten::logical_or", "", *this, o);
}
inline Tensor Tensor::logical_and(const Tensor& o) const {
  return op2("aten::logical_and", "", *this, o);
}
inline Tensor Tensor::expand(IntArrayRef sizes) const {
  return unbox_tensor(call_boxed<1>("aten::expand", "", *this, sizes, false)[0]);
}
inline Tensor Tensor::masked_fill_(const Tensor& mask, double v) const {
  return unbox_tensor(
      call_boxed<1>("aten::masked_fill_", "Tensor", *this, mask, scalar(v))[0]);
}
inline Tensor Tensor::index_put_(const std::vector<Tensor>& indices, const Tensor& values) const {
  std::vector<std::optional<torch::stable::Tensor>> idx;
  for (const auto& t : indices) idx.emplace_back(t);
  (void)call_boxed<1>("aten::index_put_", "", *this, idx, values, false);
  return *this;
}
inline Tensor Tensor::index_add_(int64_t dim, const Tensor& index, const Tensor& source) const {
  // index_add_ has a Scalar alpha the bridge cannot pass: an accumulating index_put_ along
  // `dim` (0 here, the only use) sums duplicates the same way.
  if (dim != 0) detail::runtime_error("sparsejit: tx::index_add_ supports dim 0 only");
  std::vector<std::optional<torch::stable::Tensor>> idx{torch::stable::Tensor(index)};
  (void)call_boxed<1>("aten::index_put_", "", *this, idx, source, true);
  return *this;
}
inline Tensor add_signed(const Tensor& a, const Tensor& b, int sign);
inline Tensor Tensor::add_(const Tensor& o) const { return copy_(add_signed(*this, o, 1)); }
inline Tensor Tensor::div_(const Tensor& o) const {
  return op2("aten::div_", "Tensor", *this, o);
}
inline Tensor Tensor::addmm_(const Tensor& a, const Tensor& b) const {
  return add_(op2("aten::mm", "", a, b));
}
template <class T>
T Tensor::item() const {
  constexpr ScalarType want = c10::CppTypeToScalarType<T>::value;
  const Tensor h = to(want).cpu().contiguous();
  if (h.numel() != 1)
    detail::runtime_error("sparsejit: item() of a tensor with " + std::to_string(h.numel()) +
                          " elements");
  return *static_cast<const T*>(h.data_ptr());
}

// a + sign * b. Floating: the stable subtract (its alpha is a double). Integral: the bridge
// cannot pass the integral alpha of add / sub, so a sum over a stacked pair (exact, and in
// a's dtype: the adapters add tensors of one dtype); b is broadcast to a's shape or a to b's.
inline Tensor add_signed(const Tensor& a, const Tensor& b, int sign) {
  if (isFloatingType(a.scalar_type()) && isFloatingType(b.scalar_type()))
    return torch::stable::subtract(a, b, -double(sign));
  Tensor x = a, y = b.to(a.scalar_type());
  if (sign < 0) y = op1("aten::neg", "", y);
  if (x.dim() >= y.dim()) {
    y = y.expand(x.sizes());
  } else {
    x = x.expand(y.sizes());
  }
  const std::vector<Tensor> pair{x, y};
  const Tensor both = unbox_tensor(call_boxed<1>("aten::stack", "", pair, int64_t{0})[0]);
  return unbox_tensor(call_boxed<1>("aten::sum", "dim_IntList", both,
                                    std::optional<std::vector<int64_t>>(std::vector<int64_t>{0}),
                                    false, std::optional<ScalarType>())[0]);
}

// Operators: tensor op tensor, tensor op scalar (the scalar in the tensor's dtype).
inline Tensor operator-(const Tensor& a, const Tensor& b) { return add_signed(a, b, -1); }
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add_signed(a, b, 1); }
inline Tensor operator*(const Tensor& a, const Tensor& b) {
  return op2("aten::mul", "Tensor", a, b);
}
inline Tensor operator*(const Tensor& a, double v) { return a * a.scalar(v); }
inline Tensor operator+(const Tensor& a, double v) { return a + a.scalar(v); }
inline Tensor operator-(const Tensor& a, double v) { return a - a.scalar(v); }
inline Tensor operator<(const Tensor& a, const Tensor& b) {
  return op2("aten::lt", "Tensor", a, b);
}
inline Tensor operator<=(const Tensor& a, const Tensor& b) {
  return op2("aten::le", "Tensor", a, b);
}
inline Tensor operator>(const Tensor& a, const Tensor& b) {
  return op2("aten::gt", "Tensor", a, b);
}
inline Tensor operator>=(const Tensor& a, const Tensor& b) {
  return op2("aten::ge", "Tensor", a, b);
}
inline Tensor operator==(const Tensor& a, const Tensor& b) {
  return op2("aten::eq", "Tensor", a, b);
}
inline Tensor operator!=(const Tensor& a, const Tensor& b) {
  return op2("aten::ne", "Tensor", a, b);
}
inline Tensor operator<(const Tensor& a, double v) { return a < a.scalar(v); }
inline Tensor operator<=(const Tensor& a, double v) { return a <= a.scalar(v); }
inline Tensor operator>(const Tensor& a, double v) { return a > a.scalar(v); }
inline Tensor operator>=(const Tensor& a, double v) { return a >= a.scalar(v); }
inline Tensor operator==(const Tensor& a, double v) { return a == a.scalar(v); }
inline Tensor operator|(const Tensor& a, const Tensor& b) {
  return op2("aten::bitwise_or", "Tensor", a, b);
}
inline Tensor logical_or(const Tensor& a, const Tensor& b) { return a.logical_or(b); }
inline Tensor logical_and(const Tensor& a, const Tensor& b) { return a.logical_and(b); }

}  // namespace sparsejit::tx

// TORCH_BOX converts kernel arguments and results through these: tx::Tensor is a
// torch::stable::Tensor (same handle, same ownership rules).
HIDDEN_NAMESPACE_BEGIN(torch, stable, detail)
template <>
struct FromImpl<sparsejit::tx::Tensor> {
  static StableIValue call(const sparsejit::tx::Tensor& v, uint64_t build, bool internal) {
    return FromImpl<torch::stable::Tensor>::call(v, build, internal);
  }
};
template <>
struct ToImpl<sparsejit::tx::Tensor> {
  static sparsejit::tx::Tensor call(StableIValue v, uint64_t build, bool internal) {
    return ToImpl<torch::stable::Tensor>::call(v, build, internal);
  }
};
// A str argument: the characters copied out, the boxed string handle deleted, nothing kept.
template <>
struct ToImpl<sparsejit::tx::Str> {
  static sparsejit::tx::Str call(StableIValue v, uint64_t, bool) {
    StringHandle handle = torch::stable::detail::to<StringHandle>(v);
    size_t length = 0;
    const char* data = nullptr;
    AOTITorchError err = torch_string_length(handle, &length);
    if (err == AOTI_TORCH_SUCCESS) err = torch_string_c_str(handle, &data);
    sparsejit::tx::Str out;
    if (err == AOTI_TORCH_SUCCESS) out.assign(data, length);
    STABLE_TORCH_ERROR_CODE_CHECK(torch_delete_string(handle));
    STABLE_TORCH_ERROR_CODE_CHECK(err);
    return out;
  }
};
template <>
struct FromImpl<sparsejit::tx::Str> {
  static StableIValue call(const sparsejit::tx::Str& v, uint64_t build, bool internal) {
    return FromImpl<std::string>::call(v, build, internal);
  }
};
HIDDEN_NAMESPACE_END(torch, stable, detail)

namespace sparsejit::tx {

// ---- factories and the ATen ops the CPU adapters call -----------------------------------------
// Contiguous and uninitialised, straight from the C shim (no dispatch by name).
inline Tensor empty(IntArrayRef sizes, const TensorOptions& o = TensorOptions()) {
  const int64_t n = int64_t(sizes.size());
  int64_t strides[16];
  if (n > 16) return torch::stable::empty(sizes, o.dtype_, std::nullopt, o.device_);
  int64_t step = 1;
  for (int64_t i = n - 1; i >= 0; --i) {
    strides[i] = step;
    step *= std::max<int64_t>(sizes[size_t(i)], 1);
  }
  const int32_t dtype = torch::stable::detail::to<int32_t>(torch::stable::detail::from(o.dtype_));
  const int32_t device_type =
      torch::stable::detail::to<int32_t>(torch::stable::detail::from(o.device_.type()));
  AtenTensorHandle h = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(
      n, sizes.data(), strides, dtype, device_type, o.device_.has_index() ? o.device_.index() : 0,
      &h));
  return torch::stable::Tensor(h);
}
inline Tensor empty_like(const Tensor& t) { return torch::stable::empty_like(t); }
inline Tensor zeros(IntArrayRef sizes, const TensorOptions& o) {
  return empty(sizes, o).zero_();
}
inline Tensor zeros_like(const Tensor& t) { return empty_like(t).zero_(); }
inline Tensor ones(IntArrayRef sizes, const TensorOptions& o) {
  return empty(sizes, o).fill_(1.0);
}
// 0, 1, ..., end - 1 (aten::arange takes a Scalar, which the bridge cannot pass): written on
// the CPU, a cumulative sum of ones minus one on another device.
inline Tensor arange(int64_t end, const TensorOptions& o) {
  if (o.device_.type() != kCPU) {
    const Tensor ones = empty({end}, o).fill_(1.0);
    return (ones.cumsum(0) - ones).to(o.dtype_);  // an integral cumsum is int64
  }
  Tensor t = empty({end}, TensorOptions(kLong));
  int64_t* p = static_cast<int64_t*>(t.data_ptr());
  for (int64_t i = 0; i < end; ++i) p[i] = i;
  return t.to(o.dtype_);
}
inline std::tuple<Tensor, Tensor> sort(const Tensor& t, bool stable, int64_t dim,
                                       bool descending) {
  auto st = call_boxed<2>("aten::sort", "stable", t, std::optional<bool>(stable), dim,
                          descending);
  return {unbox_tensor(st[0]), unbox_tensor(st[1])};
}
inline Tensor searchsorted(const Tensor& sorted, const Tensor& values, bool out_int32 = false,
                           bool right = false) {
  return unbox_tensor(call_boxed<1>("aten::searchsorted", "Tensor", sorted, values, out_int32,
                                    right, std::optional<std::string>(std::nullopt),
                                    std::optional<Tensor>(std::nullopt))[0]);
}
inline Tensor repeat_interleave(const Tensor& self, const Tensor& repeats,
                                std::optional<int64_t> dim, std::optional<int64_t> output_size) {
  return unbox_tensor(call_boxed<1>("aten::repeat_interleave", "self_Tensor", self, repeats, dim,
                                    output_size)[0]);
}
inline Tensor& mm_out(Tensor& out, const Tensor& a, const Tensor& b) {
  (void)call_boxed<1>("aten::mm", "out", a, b, out);
  return out;
}
inline Tensor cat(const std::vector<Tensor>& ts, int64_t dim = 0) {
  return unbox_tensor(call_boxed<1>("aten::cat", "", ts, dim)[0]);
}
inline int get_num_threads() { return int(torch::stable::get_num_threads()); }
inline Tensor stack(const std::vector<Tensor>& ts, int64_t dim = 0) {
  return unbox_tensor(call_boxed<1>("aten::stack", "", ts, dim)[0]);
}
inline Tensor bincount(const Tensor& self, const std::optional<Tensor>& weights,
                       int64_t minlength) {
  return unbox_tensor(call_boxed<1>("aten::bincount", "", self, weights, minlength)[0]);
}
inline Tensor nonzero(const Tensor& t) { return t.nonzero(); }
// A CPU tensor holding `v` (as at::tensor(ArrayRef<int64_t>, dtype)).
inline Tensor tensor(const std::vector<int64_t>& v, const TensorOptions& o) {
  Tensor t = empty({int64_t(v.size())}, TensorOptions(kLong));
  std::copy(v.begin(), v.end(), static_cast<int64_t*>(t.data_ptr()));
  return t.to(o.dtype_);
}

// ATen's autograd guard: inside an op's kernel the dispatcher already runs below autograd
// (the Python autograd registration redispatches below it), so nested sparsejit calls record
// nothing; the stable backend has no guard to set and needs none.
struct AutoDispatchBelowADInplaceOrView {
  AutoDispatchBelowADInplaceOrView() {}  // user-provided: a guard variable is not "unused"
};

// AT_DISPATCH_FLOATING_TYPES: float and double.
template <class F>
void dispatch_floating(ScalarType t, const char* name, F&& f) {
  if (t == kDouble) {
    f(double{});
  } else if (t == kFloat) {
    f(float{});
  } else {
    detail::runtime_error(detail::cat("\"", name, "\" not implemented for '", t, "'"));
  }
}

}  // namespace sparsejit::tx

#define SJ_CHECK_VALUE(cond, ...)                                                         \
  do {                                                                                      \
    if (!(cond)) ::sparsejit::tx::detail::value_error(::sparsejit::tx::detail::cat(__VA_ARGS__)); \
  } while (0)
#define SJ_CHECK_TYPE(cond, ...)                                                         \
  do {                                                                                      \
    if (!(cond)) ::sparsejit::tx::detail::type_error(::sparsejit::tx::detail::cat(__VA_ARGS__)); \
  } while (0)
#define SJ_CHECK_RUNTIME(cond, ...)                                                  \
  do {                                                                               \
    if (!(cond))                                                                     \
      ::sparsejit::tx::detail::runtime_error(::sparsejit::tx::detail::cat(__VA_ARGS__)); \
  } while (0)

#define SJ_WARN(msg) \
  aoti_torch_warn(__func__, __FILE__, uint32_t(__LINE__), std::string(msg).c_str())

#define SJ_DISPATCH_FLOATING_TYPES(type, name, ...) \
  ::sparsejit::tx::dispatch_floating(type, name, [&](auto sj_zero_) { \
    using scalar_t = decltype(sj_zero_);                           \
    (__VA_ARGS__)();                                               \
  })

#define SJ_LIBRARY(m) STABLE_TORCH_LIBRARY(sparsejit, m)
#define SJ_LIBRARY_FRAGMENT(m) STABLE_TORCH_LIBRARY_FRAGMENT(sparsejit, m)
#define SJ_LIBRARY_IMPL(key, m) STABLE_TORCH_LIBRARY_IMPL(sparsejit, key, m)
#define SJ_KERNEL(fn) TORCH_BOX(fn)
