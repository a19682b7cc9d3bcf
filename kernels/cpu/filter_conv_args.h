// Arguments of the filter-sparse convolution's tile loops (csrc/filter_conv), shared by the
// precompiled loops and the JIT-compiled ones (codegen/cpu_filter_conv_spec.h compiles against this
// exact header, embedded in the library, so the layouts match). No standard library beyond
// <cstdint>: it is also pasted into every generated source.
#pragma once

#include <cstdint>

namespace sparsejit::filter_conv {

// Register-tile variants of the inner loop (the plan's kernel word; 0 lets the planner pick).
// Auto, Generic and the Jit variants use the planner's tile shape (choose_variant); Auto runs
// the JIT's loop when the JIT is on (it measured at least as fast on every layer tried,
// docs/FILTER_SPARSE_CONV.md), Generic always the precompiled one.
enum class Variant : int64_t {
  Auto = 0,
  Scalar = 1,    // portable loop, no vector extensions beyond the build's baseline
  Vec8x1 = 2,    // 8 output pixels per tile (one AVX2 vector), 2 nonzeros interleaved
  Vec8x2 = 3,    // 16 pixels, 2 nonzeros interleaved (4 accumulator chains)
  Vec8x4 = 4,    // 32 pixels, 2 nonzeros interleaved (8 chains)
  Vec8x8 = 5,    // 64 pixels (8 chains)
  Jit = 6,       // the tile loop compiled with the layer's block shape as constants
  JitBaked = 7,  // each output channel's taps as immediate offsets in straight-line code
  Generic = 8,   // the planner's tile, precompiled loop
};
constexpr int64_t kNumVariants = 9;

// Output pixels of one register tile of a variant (Scalar: a 32-pixel tile, one at a time).
inline int64_t tile_pixels(Variant v) {
  switch (v) {
    case Variant::Vec8x1: return 8;
    case Variant::Vec8x2: return 16;
    case Variant::Vec8x8: return 64;
    default: return 32;
  }
}

// One call of the tile loop: the stored taps of one output channel within one input-channel
// chunk, added into a pixel tile.
struct TileJob {
  const float* x;        // input planes of the channel group, at the tile's first pixel
  const int32_t* off;    // per nonzero: offset of its tap in the planes
  const float* val;      // per nonzero: weight
  int64_t nnz;
  float* acc;            // tile_pixels(v) accumulators
  bool first;            // the tile's first chunk: acc is overwritten, not read
};

// One block of output channels of one pixel tile: every chunk, every channel of the block
// (what a JIT entry point runs; `sparsejit_entry(const BlockLaunch*)`).
struct BlockLaunch {
  const float* x;        // the image's planes (or packed panel) at the tile's first pixel
  const int32_t* off;    // every stored tap's offset into its group's planes
  const float* val;      // every stored weight
  const int64_t* cp;     // [c_out, chunks + 1]: first entry of each chunk of each channel
  float* acc;            // [oc1 - oc0, tile pixels]
  int64_t oc0, oc1;      // the block
  int64_t chunks;        // input-channel chunks per output channel
  int64_t cout_g;        // output channels per group
  int64_t group_stride;  // floats between groups' planes in x
};

}  // namespace sparsejit::filter_conv
