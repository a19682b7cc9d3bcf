// The tile loops built for the library's baseline instruction set (any x86-64 / other CPU).
#define SPARSEJIT_ISA_NS generic_isa
#include "kernels/cpu/filter_conv_tiles.h"

namespace sparsejit::filter_conv {
void run_block_generic(const BlockLaunch& l, Variant v) { generic_isa::run_block(l, v); }
}  // namespace sparsejit::filter_conv
