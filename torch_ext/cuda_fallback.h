// One CUDA -> CPU fallback for every op (built with SPARSEJIT_WITH_CUDA): tensor arguments
// are copied to the CPU (float16 as float32), the op's CPU kernel runs, and tensor results
// are copied back to the device (floating results in the dtype of the first floating
// argument). Ops register it directly (structure building, plans: SJ_CUDA_FALLBACK(&cpu_fn)),
// or call it from their CUDA kernel when NVRTC or the driver is unavailable (call_on_cpu; one
// warning, see cuda_common.h).
//
// ATen backend: one boxed kernel for every op (the schema says which arguments are tensors).
// Stable backend: its boxed values carry no types, so the fallback is typed per op: OnCpu<&fn>
// wraps the op's CPU function, and call_on_cpu calls the op by name (torch_call_dispatcher)
// with CPU arguments, which reaches its CPU kernel.
#pragma once

#if defined(SPARSEJIT_WITH_CUDA) && defined(SPARSEJIT_STABLE_ABI)
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "torch_ext/common.h"

namespace sparsejit {
namespace cpu_fallback {

struct Ctx {  // the device and floating dtype of the first tensor argument of each kind
  std::optional<tx::Device> device;
  std::optional<tx::ScalarType> float_dtype;
};
inline tx::Tensor in(const tx::Tensor& t, Ctx& c) {
  if (!t.defined()) return t;
  if (!c.device && !t.is_cpu()) c.device = t.device();
  if (!c.float_dtype && tx::isFloatingType(t.scalar_type())) c.float_dtype = t.scalar_type();
  return half_as_float(t.cpu());
}
inline std::optional<tx::Tensor> in(const std::optional<tx::Tensor>& t, Ctx& c) {
  if (!t.has_value()) return std::nullopt;
  return in(*t, c);
}
inline std::string in(const char* v, Ctx&) { return v; }
inline std::vector<int64_t> in(tx::IntArrayRef v, Ctx&) { return {v.begin(), v.end()}; }
template <class T>
T in(const T& v, Ctx&) {
  return v;
}

inline tx::Tensor out(const tx::Tensor& t, const Ctx& c) {
  if (!t.defined()) return t;
  tx::Tensor r = t;
  if (c.float_dtype && tx::isFloatingType(r.scalar_type())) r = r.to(*c.float_dtype);
  if (c.device) r = r.to(*c.device);
  return r;
}
template <class... T>
std::tuple<T...> out(const std::tuple<T...>& t, const Ctx& c) {
  return std::apply([&](const auto&... x) { return std::tuple<T...>(out(x, c)...); }, t);
}

template <class T>
struct Unbox;
template <>
struct Unbox<tx::Tensor> {
  static constexpr size_t n = 1;
  template <class St>
  static tx::Tensor get(const St& st) {
    return tx::unbox_tensor(st[0]);
  }
};
template <class... T>
struct Unbox<std::tuple<T...>> {
  static constexpr size_t n = sizeof...(T);
  template <class St, size_t... I>
  static std::tuple<T...> get_impl(const St& st, std::index_sequence<I...>) {
    return std::tuple<T...>(tx::unbox_tensor(st[I])...);
  }
  template <class St>
  static std::tuple<T...> get(const St& st) {
    return get_impl(st, std::index_sequence_for<T...>{});
  }
};

}  // namespace cpu_fallback

// Calls op `name` ("sparsejit::spmm") with every schema argument, tensors moved to the CPU;
// Ret (a tensor or a tuple of tensors) comes back on the first tensor's device.
template <class Ret, class... Args>
Ret call_on_cpu(const char* name, const Args&... args) {
  cpu_fallback::Ctx c;
  // Braced: the arguments are converted left to right (the first tensor names the device).
  const auto conv =
      std::tuple<decltype(cpu_fallback::in(args, c))...>{cpu_fallback::in(args, c)...};
  const auto st = std::apply(
      [&](const auto&... a) {
        return tx::call_boxed<cpu_fallback::Unbox<Ret>::n>(name, "", a...);
      },
      conv);
  return cpu_fallback::out(cpu_fallback::Unbox<Ret>::get(st), c);
}

// The typed CUDA -> CPU fallback of an op whose CPU function is F.
template <auto F, class Sig = decltype(F)>
struct OnCpu;
template <auto F, class R, class... A>
struct OnCpu<F, R (*)(A...)> {
  static R call(A... args) {
    cpu_fallback::Ctx c;
    // Braced: converted left to right; held by value (an array argument as a vector).
    const auto conv = std::tuple<decltype(cpu_fallback::in(args, c))...>{
        cpu_fallback::in(args, c)...};
    return cpu_fallback::out(std::apply(F, conv), c);
  }
};

}  // namespace sparsejit

#define SJ_CUDA_FALLBACK(cpu_fn) TORCH_BOX(&::sparsejit::OnCpu<cpu_fn>::call)

#elif defined(SPARSEJIT_WITH_CUDA)
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <tuple>
#include <type_traits>

namespace sparsejit {

void cuda_to_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

template <class T>
struct ReturnsOf {  // one return
  static T pop(torch::jit::Stack& stack) { return torch::jit::pop(stack).to<T>(); }
};
template <class... Ts>
struct ReturnsOf<std::tuple<Ts...>> {  // an op with several returns: one stack entry each
  static std::tuple<Ts...> pop(torch::jit::Stack& stack) { return torch::jit::pop<Ts...>(stack); }
};

// Calls op `name` (schema name, e.g. "sparsejit::spmm") through the fallback with `args`;
// Ret is the op's return type (std::tuple for several returns).
template <class Ret, class... Args>
Ret call_on_cpu(const char* name, Args&&... args) {
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
  torch::jit::Stack stack;
  torch::jit::push(stack, std::forward<Args>(args)...);
  cuda_to_cpu_fallback(op, &stack);
  if constexpr (std::is_same_v<Ret, void>) {
    return;
  } else {
    return ReturnsOf<Ret>::pop(stack);
  }
}

}  // namespace sparsejit

#define SPARSEJIT_CUDA_FALLBACK \
  torch::CppFunction::makeFromBoxedFunction<&sparsejit::cuda_to_cpu_fallback>()
// The same boxed kernel for every op (the argument names the op's CPU function, which the
// stable backend's typed fallback needs).
#define SJ_CUDA_FALLBACK(cpu_fn) SPARSEJIT_CUDA_FALLBACK
#endif
