// The tile loops built with -mavx2 -mfma (CMakeLists sets the flags on this file only); called
// only when the CPU reports both (sparsejit::cpu_has_avx2_fma, csrc/core/isa.h). Raw loops only: no standard
// library code is instantiated here, so no AVX2 copy of a shared inline function can be
// picked by the linker for the rest of the library.
#define SPARSEJIT_ISA_NS avx2_isa
#include "kernels/cpu/filter_conv_tiles.h"

namespace sparsejit::filter_conv {
void run_block_avx2(const BlockLaunch& l, Variant v) { avx2_isa::run_block(l, v); }
}  // namespace sparsejit::filter_conv
