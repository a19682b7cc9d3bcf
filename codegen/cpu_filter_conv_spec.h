// The JIT spec of a filter-sparse convolution block loop (kernels/cpu/filter_conv_tiles.h,
// csrc/filter_conv): its entry point takes a filter_conv::BlockLaunch.
//
// Two kinds:
//  - shaped (`baked` false): run_block<V, U, chunks, channels per group, group stride> - the
//    layer's loop bounds and group offsets as constants; shared by every layer of the same
//    geometry (ResNet-50's 53 convolutions need 20-odd).
//  - baked: one straight-line function per (output channel, chunk) whose taps are immediate
//    offsets (`x + 1234`) and immediate weight indices (`w[56]`): no index loads. The weights
//    are still read from the plan's values, so an in-place change of the values needs no
//    recompilation; the offsets are the pattern's, so the spec is per pattern.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/kernel_spec.h"

namespace sparsejit::codegen {

struct CpuFilterConvSpec final : KernelSpecBase {
  int32_t vec = 8;     // V: vectors of 8 pixels per tile
  int32_t unroll = 1;  // U: taps interleaved
  int64_t chunks = 1, cout_g = 1, group_stride = 0;
  bool baked = false;
  // Shaped only: 16-lane vectors for tiles of 16+ pixels where the host has AVX-512
  // (SPARSEJIT_FILTER_CONV_WIDE in filter_conv_tiles.h); false keeps 8 lanes (for A/B runs).
  bool wide = true;
  // Baked only: cp [c_out, chunks + 1] (first tap of each chunk of each channel) and every
  // tap's offset into its group's planes.
  std::vector<int64_t> cp;
  std::vector<int32_t> off;

  OpKind op() const override { return OpKind::FilterConv; }
  // filter_conv_v8u1_k3_g64_s200704, filter_conv_baked_v8u1_<hash of the pattern's offsets>
  std::string name() const override;
  std::string source() const override;
  uint64_t packed_key() const override;
};

}  // namespace sparsejit::codegen
