// The gather-GEMM-scatter core shared by point-cloud sparse convolution and RGMS. Torch-free.
//
//     Y[out_p, :] += scale_p * X[in_p, :] @ op(W[group_p])     for every pair p
//
// Pairs (in row, out row) are grouped by the weight they use (a kernel offset of a
// convolution, a relation of RGMS): group g holds pairs [group_ptr[g], group_ptr[g+1]).
// W is [G, C_in, C_out] row-major (op = identity), or [G, C_out, C_in] used transposed
// (trans_w, the backward pass through the same weights).
//
// Two dataflows:
// - GatherGemmScatter: per group, the pairs are cut into tiles whose gathered rows
//   ([tile, C_in] and [tile, C_out]) stay in L2; each tile is gathered, multiplied by
//   W[g] with one dense::sgemm/dgemm, and scattered (added) into Y. Tiles of one group run in
//   parallel when a group's out rows are distinct (true for convolution kernel maps); other
//   structures scatter one tile at a time. An identity group (pairs (r, r) for every row, the
//   centre offset of a submanifold convolution) is one plain GEMM on X, no gather.
// - OutputStationary: for a tile of output rows, every pair of each row (all groups) is
//   accumulated into the row while it sits in registers / L1: no [M, C] buffers, no scatter
//   conflicts, and the order of additions is fixed (deterministic). Needs the pairs indexed
//   by output row (index_by_row). JIT-compiled for (C_in, C_out) (kernels/cpu/
//   point_conv_kernel.h), ahead of time for C_out = 16, 32, 64, 128.
// choose_dataflow is the cost model; either dataflow can be forced (tests, tuning).
#pragma once

#include <cstdint>
#include <string>

namespace sparsejit::point_conv {

enum class Dataflow : int64_t { Auto = 0, GatherGemmScatter = 1, OutputStationary = 2 };
const char* dataflow_name(Dataflow d);
inline constexpr Dataflow kAllDataflows[] = {Dataflow::Auto, Dataflow::GatherGemmScatter,
                                             Dataflow::OutputStationary};

struct Pairs {
  int64_t num_groups = 0;
  const int64_t* group_ptr = nullptr;  // [G + 1], from 0 to M
  const int32_t* in_idx = nullptr;     // [M] rows of X
  const int32_t* out_idx = nullptr;    // [M] rows of Y
  int64_t num_in = 0, num_out = 0;     // rows of X and of Y
  // A group whose pairs are exactly (r, r), r = 0 .. num_in - 1 in order (num_in ==
  // num_out), or -1. Runs as one dense GEMM.
  int64_t identity_group = -1;
  // True when no out row repeats within a group (kernel maps): tiles scatter in parallel.
  bool unique_out_per_group = true;
  // Pairs indexed by out row, for OutputStationary (nullptr otherwise): row r's pairs are
  // row_pair[row_ptr[r] .. row_ptr[r+1]), pair_group[p] is the group of pair p.
  const int64_t* row_ptr = nullptr;   // [num_out + 1]
  const int32_t* row_pair = nullptr;  // [M]
  const int32_t* pair_group = nullptr;  // [M]

  int64_t size() const { return group_ptr == nullptr ? 0 : group_ptr[num_groups]; }
};

// The same pairs read the other way (in <-> out): the backward pass for the features.
// `in_row_ptr` / `in_row_pair` index the pairs by *in* row (index_by_row over in_idx), for
// OutputStationary; `unique_in_per_group` tells whether in rows are distinct in a group.
Pairs swapped(const Pairs& p, const int64_t* in_row_ptr, const int32_t* in_row_pair,
              bool unique_in_per_group);

// Counting sort of pairs by `rows[p]` (rows in [0, num_rows)): row_ptr [num_rows + 1],
// row_pair [M] (pair ids of each row in increasing order, so in group order), and
// pair_group [M] when not null.
void index_by_row(const int64_t* group_ptr, int64_t num_groups, const int32_t* rows,
                  int64_t num_rows, int64_t* row_ptr, int32_t* row_pair, int32_t* pair_group);

// O(G + M) check of a structure, empty when valid, else what is wrong. Always: group_ptr
// from 0 and non-decreasing, every index (rows, row index, pair groups) in range and the
// identity group of the right size, which is all the kernels need to stay in bounds
// (cheap, branch-free: run on every call). `full` adds the semantic checks: the identity
// group is the identity, the row index and pair groups agree with the pairs.
std::string check_pairs(const Pairs& p, bool full = true);

// check_pairs(p, false) and check_pairs(swapped(p, in_row_ptr, in_row_pair, ...), false) in
// one pass (in_row_ptr and in_row_pair: the index by input row, or both null when p has no row
// index): the checks every call of the ops runs on a plan.
std::string check_pairs_both_ways(const Pairs& p, const int64_t* in_row_ptr,
                                  const int32_t* in_row_pair);

template <typename T>
struct PointConvArgs {
  const T* x = nullptr;  // [num_in, c_in]
  int64_t c_in = 0;
  const T* w = nullptr;  // [G, c_in, c_out], or [G, c_out, c_in] with trans_w
  bool trans_w = false;
  int64_t c_out = 0;
  const T* scale = nullptr;  // [M] per-pair factor, or nullptr (all 1)
  const T* bias = nullptr;   // [c_out] added to every out row (when !accumulate), or nullptr
  T* y = nullptr;            // [num_out, c_out]
  // false: Y is overwritten (bias or 0 first, so every row is written); true: Y += ...
  bool accumulate = false;
  // y = max(y, 0) on each finished out row (the fused ReLU; not with accumulate): in the row
  // store of the output-stationary dataflow and of the row reduction, as a last pass over the
  // rows otherwise.
  bool relu = false;
};

Dataflow choose_dataflow(const Pairs& p, int64_t c_in, int64_t c_out, int64_t elem_bytes);

// Y (+)= sum over pairs (see top). Dataflow::Auto asks choose_dataflow; OutputStationary
// without a row index falls back to GatherGemmScatter. Returns the dataflow that ran.
template <typename T>
Dataflow gather_gemm_scatter(const Pairs& p, const PointConvArgs<T>& a, Dataflow d);

// bfloat16 features and output, float32 weights, bias and accumulation: `a.x` and `a.y` hold
// bfloat16 bits (uint16) although typed float*. Runs only the output-stationary rows the JIT
// compiles for bfloat16 storage (the same bits as the float32 rows on the widened features,
// rounded to nearest even); returns false, having written nothing, when `d` (Auto:
// choose_dataflow_bf16) is not output-stationary, the JIT does not take the pass, or `a`
// accumulates or has a per-pair scale. The caller then runs the float32 path on converted
// tensors. `weights_bf16`: every weight is a bfloat16 value (the caller's weights were
// bfloat16); on CPUs with AVX512-BF16 the rows then multiply channel pairs with vdpbf16ps
// (the same bits, except that the instruction takes subnormal inputs and results as zero).
bool output_stationary_bf16(const Pairs& p, const PointConvArgs<float>& a, Dataflow d,
                            bool weights_bf16 = false);

// output_stationary_bf16's Auto: choose_dataflow's float32 choice, except that with bfloat16
// weights on a CPU with AVX512-BF16 (channel pairs) output-stationary is also taken while the
// bfloat16 weights fit in L2 (128 -> 128 channels at 27 offsets with a 1 MiB L2).
Dataflow choose_dataflow_bf16(const Pairs& p, int64_t c_in, int64_t c_out, bool weights_bf16);

// Out rows the JIT's output-stationary kernel takes together for these weights (its spec's
// `rows`): 4 when the num_groups x c_in x c_out weights (elem_bytes each) take more than
// four times the L1 data cache, else 1.
int64_t os_rows_together(int64_t num_groups, int64_t c_in, int64_t c_out, int64_t elem_bytes);

// How the weight gradient is computed: rank-1 updates with the dY row in vector registers
// (compiled for c_out = 16, 32, 64, 128; other widths take Gemm), or gathered tiles of X and
// dY through the dense GEMM (sgemm with trans_a). Auto asks choose_wgrad_path.
enum class WgradPath : int64_t { Auto = 0, Registers = 1, Gemm = 2 };
inline constexpr WgradPath kAllWgradPaths[] = {WgradPath::Auto, WgradPath::Registers,
                                               WgradPath::Gemm};
inline const char* wgrad_path_name(WgradPath w) {
  switch (w) {
    case WgradPath::Registers: return "registers";
    case WgradPath::Gemm: return "gemm";
    default: return "auto";
  }
}
WgradPath choose_wgrad_path(const Pairs& p, int64_t c_in, int64_t c_out);

// weight_grad for bfloat16 X and dY (bits, uint16) into a float32 dW: gathered bfloat16 tiles
// through oneDNN's bfloat16 GEMM (float32 accumulation). Runs where that GEMM runs natively
// (dense::gemm_bf16_native(): AVX512-BF16 / AMX) and the path is Gemm (Auto asks
// choose_wgrad_path), and returns true; else writes nothing and returns false (the caller
// then converts to float32). The products are exact; the order of the sums is oneDNN's.
bool weight_grad_bf16(const Pairs& p, const uint16_t* x, int64_t c_in, const uint16_t* dy,
                      int64_t c_out, float* dw, WgradPath path = WgradPath::Auto);

// dW[g] = sum_{p in g} scale_p * X[in_p]^T dY[out_p]  ([G, c_in, c_out], overwritten).
// Parallel over groups; deterministic.
template <typename T>
void weight_grad(const Pairs& p, const T* x, int64_t c_in, const T* dy, int64_t c_out,
                 const T* scale, T* dw, WgradPath path = WgradPath::Auto);

}  // namespace sparsejit::point_conv
