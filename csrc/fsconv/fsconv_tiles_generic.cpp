// The tile loops built for the library's baseline instruction set (any x86-64 / other CPU).
#define FSCONV_ISA generic_isa
#include "kernels/cpu/fsconv_tiles.h"

namespace sparsejit::fsconv {
void run_block_generic(const BlockLaunch& l, Variant v) { generic_isa::run_block(l, v); }
}  // namespace sparsejit::fsconv
