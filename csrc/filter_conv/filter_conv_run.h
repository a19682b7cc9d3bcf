// Filter-sparse convolution: a pruned Conv2d weight, compressed per output channel over
// (c, r, s), convolved directly with a dense NCHW input (no im2col).
//
// The weight is a CSR matrix [C_out, C_in/groups * R * S] whose column ("tap") index is
// (c * R + r) * S + s. At run time each tap becomes an offset into a padded, stride-phase-split
// copy of the input ("phase planes"): plane (ph, pw) of channel c holds
// Xpad[c][ph + i * stride_h][pw + j * stride_w]. In phase space every stride is 1, so output
// pixel (oh, ow) of tap (c, r, s) reads plane ((r*dil_h) % stride_h, (s*dil_w) % stride_w) at
// row oh + (r*dil_h) / stride_h, column ow + (s*dil_w) / stride_w: contiguous along the output
// width for every stride, padding and dilation, so one vectorized loop serves them all. The
// output is computed over the flattened (oh, column) grid of the planes' width (the columns past
// OW are thrown away), which keeps vectors full on 7x7 layers.
// A 1x1, stride-1, unpadded convolution reads the input in place: Y[oc] = sum_c W[oc, c] X[c],
// a sparse-weight x dense-activation product (SpMM with the weight as the sparse matrix).
//
// Torch-free; float32 compute (the adapter converts other dtypes).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "csrc/core/isa.h"
#include "kernels/common/types.h"
#include "kernels/cpu/filter_conv_args.h"

namespace sparsejit::filter_conv {

const char* variant_name(Variant v);

struct Geometry {
  int64_t batch = 0, c_in = 0, h = 0, w = 0;
  int64_t c_out = 0, groups = 1, r = 1, s = 1;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  int64_t out_h() const { return (h + 2 * pad_h - dil_h * (r - 1) - 1) / stride_h + 1; }
  int64_t out_w() const { return (w + 2 * pad_w - dil_w * (s - 1) - 1) / stride_w + 1; }
  int64_t taps_per_channel() const { return c_in / groups * r * s; }
};

// Empty when the geometry is valid; else a message naming the offending argument.
std::string check_geometry(const Geometry& g);

// The compressed weight: rowptr [c_out + 1], taps [nnz] (column of W viewed as
// [c_out, c_in/groups * r * s]), values [nnz].
struct Pattern {
  const int64_t* rowptr = nullptr;
  const int64_t* taps = nullptr;
  const float* values = nullptr;
  int64_t c_out = 0, cols = 0;
};

// Entries of a dense weight [rows, cols] whose magnitude exceeds `threshold` (> 0 keeps
// every nonzero when threshold is 0).
int64_t count_kept(const float* w, int64_t rows, int64_t cols, float threshold);
// Fills rowptr [rows + 1], taps [nnz], values [nnz] (nnz from count_kept).
void compress(const float* w, int64_t rows, int64_t cols, float threshold, int64_t* rowptr,
              int64_t* taps, float* values);
// The plan tensor: the common header (OpKind::FilterConv, kernel word = the tile variant, the
// pattern's structure stamp over rowptr / taps) then kPlanGeomWords words: C_out, C_in/groups,
// R, S. write_plan fills all plan::kHeaderWords + kPlanGeomWords of `words`.
constexpr int64_t kPlanGeomWords = 4;
void write_plan(int64_t* words, int64_t variant, const int64_t* rowptr, const int64_t* taps,
                int64_t c_out, int64_t cin_g, int64_t r, int64_t s);
// O(rows + nnz) check of plan arrays handed back to the forward op; empty when valid.
std::string check_pattern(const Pattern& p, int64_t nnz);

// Outputs of a 1x1 of at least this many bytes are written with non-temporal stores (the
// same values): a quarter of the L3 cache (sysfs), never where its size is unknown or
// SPARSEJIT_FILTER_CONV_STREAM=0. set_stream_output_bytes changes it for the process (tests,
// A/B runs; 1 = every output) and returns the previous value.
int64_t stream_output_bytes();
int64_t set_stream_output_bytes(int64_t bytes);

// The planner's choice for a layer (what Auto resolves to).
Variant choose_variant(const Geometry& g, int64_t nnz);

// The AVX2+FMA tile loops run when sparsejit::cpu_has_avx2_fma() (csrc/core/isa.h); else
// every vector variant runs the portable loop of the same tile shape.
using sparsejit::cpu_has_avx2_fma;

// What a call needs besides the data, computed once per (pattern, input size, variant) in
// O(nnz) and reusable for any batch size: every tap's offset into the phase planes, and each
// output channel's taps split by input-channel chunk.
struct Prepared {
  Variant variant = Variant::Auto;  // resolved tile variant (never Auto or Jit*)
  Variant requested = Variant::Auto;  // what was asked for (Jit, JitBaked or the tile)
  // The JIT-compiled block loop (Jit / JitBaked), null for the precompiled loops (also when
  // the JIT is off or failed: the JIT warned once).
  void (*block_fn)(const void* launch) = nullptr;
  double jit_compile_ms = 0;  // this prepare's compile time (0 on a cache hit)
  bool in_place = false, out_direct = false, packed = false;
  int64_t wq = 0, plane_c = 0, img = 0, len = 0, chunks = 0;
  // The phase planes' layout (not in place): hq rows of wq per plane, `plane` = hq * wq
  // floats; slot[ph * stride_w + pw] = the plane of phase (ph, pw) within a channel, -1 if
  // no tap reads it (the fused groups write a producer's output straight into it).
  int64_t hq = 0, plane = 0;
  std::vector<int64_t> slot;
  std::vector<int32_t> off, off_packed;
  std::vector<int64_t> cp;  // [c_out, chunks + 1]
};
// The geometry must pass check_geometry and the pattern check_pattern (the batch is ignored).
// `tile`: where v leaves the tile to the planner (Auto, Generic, Jit, JitBaked), this tile
// instead of choose_variant(g) (the fused groups prepare a layer on one band but keep the
// tile the whole layer would get, so their sums stay those of the layer calls).
std::shared_ptr<const Prepared> prepare(const Geometry& g, const Pattern& p, Variant v,
                                        Variant tile = Variant::Auto);

// y [batch, c_out, out_h, out_w] = conv(x [batch, c_in, h, w], W) (+ bias[c_out])
// (+ residual) (ReLU): the residual (a tensor of y's shape, e.g. a ResNet block's identity)
// is added after the bias and before the ReLU. bias and residual may be null; residual may
// not overlap y or x. Uses OpenMP threads. `P` must come from prepare() with the same
// geometry (but any batch) and pattern.
void forward(const Prepared& P, const Geometry& g, const Pattern& p, const float* x,
             const float* bias, bool relu, float* y, const float* residual = nullptr);
// The same with bfloat16 x, residual and y (weights and bias stay float32): each input value
// widened where it is staged, sums in float32, each output rounded once to nearest even, so
// the bits of the float32 forward on the widened tensors, rounded.
void forward(const Prepared& P, const Geometry& g, const Pattern& p, const bf16* x,
             const float* bias, bool relu, bf16* y, const bf16* residual = nullptr);
// prepare() then forward() (tests, one-off calls).
void forward(const Geometry& g, const Pattern& p, const float* x, const float* bias, bool relu,
             Variant v, float* y, const float* residual = nullptr);

// The tile loops of one output-channel block (filter_conv_tiles_*.cpp, one copy per instruction
// set; kernels/cpu/filter_conv_tiles.h).
void run_block_generic(const BlockLaunch& l, Variant v);
void run_block_avx2(const BlockLaunch& l, Variant v);

}  // namespace sparsejit::filter_conv
