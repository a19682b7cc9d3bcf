// Point-cloud coordinate sets: validation, packing into sortable 64-bit keys, one sort.
// Torch-free: raw pointers and std::vector only.
//
// Key encoding (KeyLayout). A site (b, c_0, ..., c_{D-1}) becomes one uint64 key
//
//     key = b << batch_shift | (c_0 - lo_0) << shift_0 | ... | (c_{D-1} - lo_{D-1})
//
// with the batch in the highest field and axis D-1 in the lowest, so sorting keys sorts sites
// lexicographically by (batch, c_0, ..., c_{D-1}). Every field is as narrow as the extents
// allow: the batch field has bit_width(batch_size - 1) bits, axis d has
// bit_width(hi_d - lo_d) bits, where [lo_d, hi_d] is the coordinate range the field must
// hold. That range is the grid [0, extent_d) widened by a margin on both sides, so that a
// site shifted by a kernel offset (which can leave the grid) still has a key: adding the
// constant key difference of an offset then never carries from one field into the next, a
// neighbour outside the grid matches nothing instead of wrapping into another row, axis or
// batch. All fields together must fit in 64 bits; a set that does not fit is refused with
// the bits each field needs (D = 3 with batch_size <= 2^16 fits any grid up to 2^16 - 2 *
// margin per axis; D = 3 with a single cloud fits 2^21 per axis).
//
// A CoordSet is the structure a convolution plans on: its sites sorted by key once, their
// coordinates in that order, and the site id (feature row) of each sorted position.
#pragma once

#include <cstdint>
#include <vector>

namespace sparsejit::point_conv {

constexpr int kMaxDims = 4;

struct KeyLayout {
  int dims = 0;
  int64_t batch_size = 0;  // batch ids lie in [0, batch_size)
  int batch_bits = 0, batch_shift = 0;
  int64_t lo[kMaxDims] = {0, 0, 0, 0};  // smallest coordinate a field holds (field = c - lo)
  int axis_bits[kMaxDims] = {0, 0, 0, 0};
  int shift[kMaxDims] = {0, 0, 0, 0};

  int total_bits() const;
  // Largest coordinate axis d can hold.
  int64_t hi(int d) const { return lo[d] + ((int64_t{1} << axis_bits[d]) - 1); }
  // Key of one coordinate row [b, c_0, ..., c_{D-1}]. Sums rather than ORs the fields: the
  // same for in-range sites, and linear modulo 2^64 for any site, so
  // pack(c) + offset(delta) == pack(c + delta) whenever c + delta is in range, even if c is
  // not (strided maps shift keys of o * stride, which may lie outside).
  template <typename T>
  uint64_t pack(const T* row) const {
    uint64_t k = static_cast<uint64_t>(row[0]) << batch_shift;
    for (int d = 0; d < dims; ++d)
      k += static_cast<uint64_t>(int64_t{row[1 + d]} - lo[d]) << shift[d];
    return k;
  }
  // Inverse of pack for an in-range key.
  void unpack(uint64_t key, int32_t* row) const {
    row[0] = batch_bits == 0 ? 0 : static_cast<int32_t>(key >> batch_shift);
    for (int d = 0; d < dims; ++d) {
      const uint64_t mask = (uint64_t{1} << axis_bits[d]) - 1;  // axis_bits < 64 always
      row[1 + d] = static_cast<int32_t>(static_cast<int64_t>((key >> shift[d]) & mask) + lo[d]);
    }
  }
  // Key difference of moving a site by `delta` (one value per axis). Added to a key with
  // unsigned wrap-around; exact whenever the moved site stays inside every field's range.
  uint64_t offset(const int64_t* delta) const {
    uint64_t k = 0;
    for (int d = 0; d < dims; ++d) k += static_cast<uint64_t>(delta[d]) << shift[d];
    return k;
  }
};

// The narrowest layout holding batch ids [0, batch_size) and coordinates [lo_d, hi_d] per
// axis. Throws std::invalid_argument naming each field's bits when they exceed 64.
KeyLayout make_key_layout(int dims, int64_t batch_size, const int64_t* lo, const int64_t* hi);

struct CoordSetOptions {
  // Grid extent per axis (coordinates lie in [0, extent)); empty = max coordinate + 1.
  std::vector<int64_t> spatial_shape;
  // Batch ids lie in [0, batch_size); 0 = max batch id + 1.
  int64_t batch_size = 0;
  // Extra coordinates every key field holds on each side of the grid, so that kernel maps
  // whose offsets stay within it reuse the stored keys (others repack them, O(N)).
  int64_t margin = 4;
  // Duplicate sites: false = error naming the two rows; true = merged, see CoordSet::inverse.
  bool dedup = false;
};

struct CoordSet {
  int dims = 0;
  int64_t batch_size = 0;
  std::vector<int64_t> spatial_shape;  // [dims]
  KeyLayout layout;
  int64_t num_rows = 0;                // input rows given (before de-duplication)
  std::vector<uint64_t> keys;          // [n] sorted ascending, strictly (no duplicates)
  std::vector<int32_t> coords;         // [n, 1 + dims] the sites in key order
  std::vector<int32_t> site;           // [n] site id (feature row) of each sorted position
  // With dedup: inverse[row] = site id of input row; sites are numbered by first occurrence
  // (so without duplicates site id == row). Empty when dedup was off.
  std::vector<int32_t> inverse;

  int64_t size() const { return static_cast<int64_t>(keys.size()); }
  int width() const { return dims + 1; }
  int64_t num_duplicates() const { return num_rows - size(); }
};

// Validates coords [n, width] (int32, batch first, width = 1 + D, D in 1..4) and builds the
// sorted set. Errors (std::invalid_argument) name the argument, row, column and value:
// wrong width, negative coordinates, coordinates outside spatial_shape, batch ids outside
// batch_size, duplicates (unless dedup), more than 2^31 - 1 rows, or a grid past the packing
// range.
CoordSet make_coord_set(const int32_t* coords, int64_t n, int64_t width,
                        const CoordSetOptions& options = {});

// Builds a set from packed keys of generated sites (e.g. strided output sites), which may
// repeat: sorts, keeps each site once, unpacks the coordinates, numbers sites in key order.
// `sorted_unique`: the keys are already strictly ascending (the sort is skipped).
CoordSet coord_set_from_keys(std::vector<uint64_t> keys, const KeyLayout& layout,
                             const std::vector<int64_t>& spatial_shape,
                             bool sorted_unique = false);

// Keys of `set`'s sites (in its key order) under another layout; order is unchanged because
// every layout orders sites the same way.
std::vector<uint64_t> repack_keys(const CoordSet& set, const KeyLayout& layout);

// Stable LSD radix sort of keys (only their low `key_bits` bits are used) carrying a value
// per key; OpenMP over chunks.
void radix_sort_pairs(std::vector<uint64_t>& keys, std::vector<int32_t>& values, int key_bits);

}  // namespace sparsejit::point_conv
