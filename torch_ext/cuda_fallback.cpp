#include "torch_ext/cuda_fallback.h"

#ifndef SPARSEJIT_STABLE_ABI  // the stable backend's fallback is typed (cuda_fallback.h)

#include <optional>
#include <vector>

#include "torch_ext/common.h"

namespace sparsejit {

void cuda_to_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n_args = schema.arguments().size();
  std::optional<tx::Device> device;
  std::optional<tx::ScalarType> float_dtype;
  std::vector<c10::IValue> args(stack->end() - n_args, stack->end());
  torch::jit::drop(*stack, n_args);
  for (auto& a : args) {
    if (!a.isTensor()) continue;
    const tx::Tensor t = a.toTensor();
    if (!device && !t.is_cpu()) device = t.device();
    if (!float_dtype && t.is_floating_point()) float_dtype = t.scalar_type();
    a = half_as_float(t.cpu());
  }
  for (auto& a : args) stack->push_back(std::move(a));
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  const size_t n_ret = schema.returns().size();
  for (size_t i = stack->size() - n_ret; i < stack->size(); ++i) {
    auto& v = (*stack)[i];
    if (!v.isTensor()) continue;
    tx::Tensor t = v.toTensor();
    if (float_dtype && t.is_floating_point()) t = t.to(*float_dtype);
    if (device) t = t.to(*device);
    v = t;
  }
}

}  // namespace sparsejit

#endif  // SPARSEJIT_STABLE_ABI
