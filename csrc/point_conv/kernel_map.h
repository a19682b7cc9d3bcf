// Kernel maps for sparse convolution, found by merging sorted key lists (the neighbour
// retrieval of TACO-UCF, Won et al., MLSys 2023): no hash table, sequential access.
// Torch-free.
//
// Geometry. A kernel offset is a vector e with e_d in [0, kernel_d); offsets are numbered
// lexicographically with axis 0 slowest, k = sum_d e_d * prod_{d' > d} kernel_{d'}, which is
// spconv 2.x's weight layout [out, k_0, ..., k_{D-1}, in]. Input site i and output site o
// (same batch) are paired by offset e when
//
//     i = o * stride + e * dilation - padding            (per axis)
//
// - submanifold: outputs = inputs, stride 1, odd kernel, padding = dilation * (kernel-1)/2,
//   i.e. the centred offsets delta = e - (kernel-1)/2 and i = o + delta * dilation;
// - strided (spconv SparseConv): outputs = every o in [0, out_shape) whose receptive field
//   holds an input, out_shape = (in + 2*pad - dil*(k-1) - 1) / stride + 1;
// - coarse grid (MinkowskiEngine-style strided): outputs = unique(floor(c / stride)), paired
//   by the same formula (kernel = stride with padding 0 pools each stride^D cell; kernel 3
//   with padding = dilation gives ME's centred odd kernel);
// - generalized: outputs are any user-given set (its own CoordSet), same formula;
// - inverse (spconv SparseInverseConv): the forward map with in and out swapped, offset
//   numbering unchanged, output sites = the forward's input sites;
// - transposed (spconv SparseConvTranspose): new output sites o = i * stride + e * dilation
//   - padding inside out_shape = (in - 1) * stride - 2 * pad + dil * (k - 1) + 1, pairs
//   (i, o) by that formula: the generalized map with the roles of the two sets exchanged.
//
// How (stride 1): the output sites are sorted, so the keys of o - padding + e * dilation are
// sorted for each e: the output keys plus one constant (KeyLayout::offset). Each offset's map
// is one branch-free merge of that list with the sorted input keys, parallel over chunks of
// the output list (each chunk finds its start in the input list by binary search).
// Submanifold maps exploit symmetry: the map of -delta is the map of delta swapped, and the
// centre offset is the identity.
// How (stride > 1, strided_map.cpp): input-driven. Only inputs with i = e * dilation -
// padding (mod stride) can pair with offset e, and for them o = floor(i / stride) + const:
// the inputs are grouped by residue class once, and each offset merges one class's shifted
// keys with the sorted output keys by galloping. Fields of a layout too narrow for the
// queries are widened by repacking (same order, O(N)); past 64 bits it is an error.
// Output sites (strided and transposed, output_sites.cpp): plane by plane (one batch id and
// one coordinate on axis 0); the inputs reaching a plane are one contiguous window of the
// sorted inputs, which mark their sites in a bitmap over the other axes, read back in key
// order: sorted and unique without sorting candidates. Wide, sparse grids (bitmaps costlier
// than a sort) generate every candidate key and radix-sort them instead.
#pragma once

#include <cstdint>
#include <vector>

#include "csrc/point_conv/coords.h"

namespace sparsejit::point_conv {

struct ConvParams {
  int dims = 0;
  int64_t kernel[kMaxDims] = {1, 1, 1, 1};
  int64_t stride[kMaxDims] = {1, 1, 1, 1};
  int64_t dilation[kMaxDims] = {1, 1, 1, 1};
  int64_t padding[kMaxDims] = {0, 0, 0, 0};

  int64_t volume() const;  // number of kernel offsets K
};

// Same value on every axis (the common cube / square kernel).
ConvParams cube_params(int dims, int64_t kernel, int64_t stride = 1, int64_t dilation = 1,
                       int64_t padding = 0);

// Pairs grouped by kernel offset (CSR over offsets): the pairs of offset k are
// [offset_ptr[k], offset_ptr[k+1]) of in_idx / out_idx, which hold site ids (feature rows)
// of the input and output sets. Within an offset the order is deterministic (key order of
// one of the two sides). Builders resize without clearing, so a poisoned buffer shows any
// entry left unwritten.
struct KernelMap {
  std::vector<int64_t> offset_ptr;  // [K + 1]
  std::vector<int32_t> in_idx;      // [M]
  std::vector<int32_t> out_idx;     // [M]

  int64_t kernel_volume() const { return static_cast<int64_t>(offset_ptr.size()) - 1; }
  int64_t size() const { return offset_ptr.empty() ? 0 : offset_ptr.back(); }
};

// spconv 2.x output spatial shape; throws when an axis would be empty.
std::vector<int64_t> spconv_output_shape(const std::vector<int64_t>& in_shape,
                                         const ConvParams& p);

// Output sites of a spconv strided convolution (sorted, numbered in key order).
CoordSet spconv_output_sites(const CoordSet& in, const ConvParams& p, int64_t margin = 4);

// Output sites unique(floor(c / stride)) on the grid ceil(shape / stride).
CoordSet coarse_output_sites(const CoordSet& in, const ConvParams& p, int64_t margin = 4);

// Submanifold map of `sites` onto itself. p.stride must be 1 and p.kernel odd; p.padding is
// ignored (dilation * (kernel - 1) / 2, as spconv's SubMConv).
void submanifold_map(const CoordSet& sites, const ConvParams& p, KernelMap& out);

// Map from `in` onto any output set (strided, coarse or user-given), by the formula above.
void generalized_map(const CoordSet& in, const CoordSet& out_sites, const ConvParams& p,
                     KernelMap& out);

// The map of the inverse convolution: `fwd` with in and out swapped (`out` may be `fwd`).
void inverse_map(const KernelMap& fwd, KernelMap& out);

// spconv 2.x transposed-conv output shape (no output_padding).
std::vector<int64_t> transposed_output_shape(const std::vector<int64_t>& in_shape,
                                             const ConvParams& p);

// Output sites of a transposed convolution (sorted, numbered in key order).
CoordSet transposed_output_sites(const CoordSet& in, const ConvParams& p, int64_t margin = 4);

// Pairs (i, o) with o = i * stride + e * dilation - padding.
void transposed_map(const CoordSet& in, const CoordSet& out_sites, const ConvParams& p,
                    KernelMap& out);

}  // namespace sparsejit::point_conv
