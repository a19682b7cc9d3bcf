// Fused groups of filter-sparse layers (post-tiling fusion, issue 47): a ResNet bottleneck
// y = relu(conv3(relu(conv2(relu(conv1(x) + b1)) + b2)) + b3 + x), where conv1 and conv3 are
// 1x1 and conv2 is an odd R x S "same" convolution (stride 1, padding R/2, S/2), run over
// bands of output rows so that the two intermediate activations never leave the core's caches.
//
// Only the output space is tiled: a band of output rows [r0, r1) of one image. Its producer
// tiles follow from what each consumer reads: conv3 reads conv2's band as it is (1x1), conv2
// reads conv1's rows [r0 - R/2, r1 + R/2) (the halo). A thread walks down a strip of bands and
// keeps conv1's rows in a rolling buffer, so a halo row is computed once per strip, not once
// per band: only where two strips meet (one image split between threads, batch < threads) are
// R - 1 rows computed twice (recompute instead of a shared buffer, which would need the
// threads to wait for each other).
//
// Per thread, per band: conv1's rows in conv2's phase-plane layout ([m1][band + R - 1][W +
// S - 1], padding zeros in place), conv2's band written straight into conv3's packed panels
// ([tile][m2][T3]). The same tile loops as the per-layer forward (kernels/cpu/
// filter_conv_tiles.h, JIT-compiled where the layer's Prepared carries one), so each output
// sees the products of the unfused layers in the same order: the fused block gives the bits
// of the three per-layer calls.
//
// Torch-free; float32, or bfloat16 input and output with float32 compute.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "csrc/filter_conv/filter_conv_run.h"

namespace sparsejit::filter_conv {

struct Bottleneck {
  int64_t c_in = 0, m1 = 0, m2 = 0, h = 0, w = 0;  // conv3 writes c_in channels
  int64_t r = 3, s = 3;                           // conv2's kernel (odd)
  int64_t band = 0;                               // output rows per band (0: planner)
  std::shared_ptr<const Prepared> P1, P2, P3;     // prepared on the band's geometry
};

// Empty when the three weight shapes make a bottleneck on an [*, c_in, h, w] input; else a
// message naming the offending layer.
std::string check_bottleneck(int64_t c_in, int64_t h, int64_t w, const Pattern& p1,
                             int64_t cin1, const Pattern& p2, int64_t cin2, int64_t r, int64_t s,
                             const Pattern& p3, int64_t cin3);

// Output rows per band for an image of h x w with m1 conv1 channels: the rolling buffer of
// conv1 (m1 x (band + r - 1) x (w + s - 1) floats) and conv2's band (m2 x band x w) within
// half of the core's L2 cache, at least r rows, at most h.
int64_t choose_band(int64_t h, int64_t w, int64_t m1, int64_t m2, int64_t r, int64_t s);

// Prepares the three layers for bands of `band` rows (0: choose_band). Patterns must pass
// check_pattern and the shapes check_bottleneck; v as for prepare().
std::shared_ptr<const Bottleneck> prepare_bottleneck(int64_t c_in, int64_t h, int64_t w,
                                                     const Pattern& p1, const Pattern& p2,
                                                     int64_t r, int64_t s, const Pattern& p3,
                                                     int64_t band, Variant v);

// y [batch, c_in, h, w] from x of the same shape (not overlapping y); biases may be null.
void bottleneck_forward(const Bottleneck& B, int64_t batch, const Pattern& p1, const Pattern& p2,
                        const Pattern& p3, const float* x, const float* b1, const float* b2,
                        const float* b3, float* y);
// The same with bfloat16 x and y: x widened where conv1 stages it and where the residual is
// added, sums and intermediates in float32, each output rounded once to nearest even (the
// bits of the float32 block on the widened input, rounded).
void bottleneck_forward(const Bottleneck& B, int64_t batch, const Pattern& p1, const Pattern& p2,
                        const Pattern& p3, const bf16* x, const float* b1, const float* b2,
                        const float* b3, bf16* y);

}  // namespace sparsejit::filter_conv
