// Point-cloud convolution plans, assembled and stamped (Torch-free): the kernel map of a map
// kind, the submanifold centre offset found and stored as the identity, and the plan words of
// csrc/point_conv/plan_layout.h written from the map. The Torch adapter
// (torch_ext/ops/point_conv.cpp) only converts tensors, checks arguments and calls these; the
// device-side builder (torch_ext/composite/point_conv_tensor_map.h) stamps its plans through
// the same header writer and fingerprint, so both devices' plans are word for word equal.
#pragma once

#include <cstdint>

#include "csrc/point_conv/coords.h"
#include "csrc/point_conv/kernel_map.h"
#include "csrc/point_conv/plan_layout.h"

namespace sparsejit::point_conv {

// The stamp's hash of an input site set: its sorted keys through the project's one structure
// hash (csrc/core/csr.h hash_words), kept positive so it reads the same from Python's signed
// view. keys: ascending, as CoordSet::keys.
int64_t sites_fingerprint(const uint64_t* sorted_keys, int64_t n);

// The kernel map of `kind` on the input set `in`, written into `km`; returns the output set:
// `in` (kSubm), `*given_out` (kGeneralized: must not be null) or `out_sites`, which it fills
// (kSpconv, kCoarse, kTransposed). `margin` is the key margin `in` was packed with. Throws
// std::invalid_argument (a grid past the packing range, an empty output axis, ...).
const CoordSet& build_kernel_map(Kind kind, const CoordSet& in, const CoordSet* given_out,
                                 const ConvParams& p, int64_t margin, KernelMap& km,
                                 CoordSet& out_sites);

// A submanifold map whose centre offset pairs every one of the n_in sites with itself is
// stored as the identity: that offset's pairs become (r, r) in row order, so the core runs it
// as one GEMM without a gather. Returns the centre offset, or -1 (other kinds, or a centre
// that is not the identity).
int64_t mark_identity(Kind kind, int64_t n_in, KernelMap& km);

// The plan's first kFixedWords words: the common header (OpKind::PointConv, kind, identity,
// stamp {n_out, M, n_in, hash}) and K.
void write_plan_head(int64_t* words, Kind kind, int64_t identity, int64_t k, int64_t m,
                     int64_t n_in, int64_t n_out, int64_t hash);

// All plan_words(K, M, n_in, n_out) words of the plan of `km` (K and M from the map): the
// head, the pairs, both row indexes and pair_group (int32 padding zeroed).
void write_plan(int64_t* words, Kind kind, int64_t identity, const KernelMap& km, int64_t n_in,
                int64_t n_out, int64_t hash);

}  // namespace sparsejit::point_conv
