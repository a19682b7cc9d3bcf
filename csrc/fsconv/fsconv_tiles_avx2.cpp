// The tile loops built with -mavx2 -mfma (CMakeLists sets the flags on this file only); called
// only when the CPU reports both (fsconv::cpu_has_avx2_fma). Raw loops only: no standard
// library code is instantiated here, so no AVX2 copy of a shared inline function can be
// picked by the linker for the rest of the library.
#define FSCONV_ISA avx2_isa
#include "csrc/fsconv/fsconv_tiles.h"

namespace sparsejit::fsconv {
void accumulate_avx2(const TileJob& j, Variant v) { avx2_isa::accumulate(j, v); }
}  // namespace sparsejit::fsconv
