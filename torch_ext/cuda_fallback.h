// One CUDA -> CPU fallback for every op (built with SPARSEJIT_WITH_CUDA): tensor arguments
// are copied to the CPU (float16 as float32), the op's CPU kernel runs, and tensor results
// are copied back to the device (floating results in the dtype of the first floating
// argument). Ops register it directly (structure building, plans), or call it from their
// CUDA kernel when NVRTC or the driver is unavailable (one warning, see cuda_common.h).
#pragma once

#ifdef SPARSEJIT_WITH_CUDA
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
#endif
