// The tile loops built for the library's baseline instruction set (any x86-64 / other CPU).
#define FSCONV_ISA generic_isa
#include "csrc/fsconv/fsconv_tiles.h"

namespace sparsejit::fsconv {
void accumulate_generic(const TileJob& j, Variant v) { generic_isa::accumulate(j, v); }
}  // namespace sparsejit::fsconv
