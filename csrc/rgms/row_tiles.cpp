#include "csrc/rgms/row_tiles.h"

#include "codegen/cpu_jit.h"
#include "codegen/jit_policy.h"
#include "codegen/cpu_row_tile_spec.h"

namespace sparsejit::rows {
namespace {

template <typename T>
void generic_tile(const void* l) {
  cpu::row_tile_detail::run<T, 0>(*static_cast<const cpu::RowTileLaunch*>(l));
}

}  // namespace

template <typename T>
TileFn generic_fn() {
  return &generic_tile<T>;
}

template <typename T>
TileFn tile_fn(int64_t width, int64_t work, int64_t width2) {
  auto& jit = codegen::CpuJit::instance();
  const bool shape_ok =
      width2 > 0 ? width >= 1 && width2 <= codegen::CpuRowTileSpec::kMaxWidth2 &&
                       width <= cpu::row_tile_detail::kFusedMaxWidth
                 : width >= 4 && width % 4 == 0;
  if (shape_ok && width <= codegen::CpuRowTileSpec::kMaxWidth &&
      codegen::worth_jit(OpKind::Rgms, work)) {
    codegen::CpuRowTileSpec spec;
    spec.dtype = sizeof(T) == 4 ? ScalarKind::F32 : ScalarKind::F64;
    spec.width = width;
    spec.width2 = width2;
    if (codegen::EntryFn fn = jit.lookup(spec)) return fn;
  }
  return &generic_tile<T>;
}

template TileFn generic_fn<float>();
template TileFn generic_fn<double>();
template TileFn tile_fn<float>(int64_t, int64_t, int64_t);
template TileFn tile_fn<double>(int64_t, int64_t, int64_t);

}  // namespace sparsejit::rows
