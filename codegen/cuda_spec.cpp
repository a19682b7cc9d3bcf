#include "codegen/cuda_spec.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "codegen/cuda_point_conv.h"
#include "codegen/cuda_filter_conv.h"
#include "codegen/embedded_headers.h"

namespace sparsejit::codegen {

namespace {

int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

int64_t pow2_floor(int64_t v) {
  int64_t p = 1;
  while (p * 2 <= v) p <<= 1;
  return p;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

bool is_pow2(int64_t v) {
  return v > 0 && (v & (v - 1)) == 0;
}

const char* device_type(CudaScalar s) {
  switch (s) {
    case CudaScalar::F32: return "float";
    case CudaScalar::F16: return "sparsejit::cuda::half_t";
    case CudaScalar::BF16: return "sparsejit::cuda::bf16_t";
    case CudaScalar::F64: return "double";
    default: detail::bad_enum("scalar kind", static_cast<int>(s));
  }
}

const char* act_short(Act a) {
  switch (a) {
    case Act::None: return "none";
    case Act::Relu: return "relu";
    case Act::LeakyRelu: return "leaky";
    case Act::Elu: return "elu";
    case Act::Gelu: return "gelu";
    case Act::Runtime: return "runtime";
    default: detail::bad_enum("activation", static_cast<int>(a));
  }
}

const char* index_short(IndexKind k) {
  return index_name(k);
}

bool is_extremum(Reduce r) {
  return r == Reduce::Max || r == Reduce::Min;
}

// The text of an embedded kernel header without its `#pragma once` (the generated source is
// one translation unit); an #error naming the header if it was not embedded.
std::string embedded(const std::string& rel) {
  for (const auto& [path, text] : embedded_headers()) {
    if (rel != path) continue;
    std::istringstream in(text);
    std::ostringstream out;
    std::string line;
    while (std::getline(in, line))
      if (line != "#pragma once") out << line << "\n";
    return "// ---- " + rel + " ----\n" + out.str();
  }
  return "#error \"sparsejit: " + rel +
         " is not embedded in this build (add it to SPARSEJIT_JIT_HEADERS)\"\n";
}

// Lanes of a row-group spread over features: about two vectors per lane (coarsening), the
// rest of the group splits the entries. The planner sizes groups with the same rule.
int64_t feature_lanes(int64_t nvec, int64_t group) {
  return std::min<int64_t>(group, pow2_ceil(ceil_div(nvec, 2)));
}

// Accumulators a lane keeps per tile (registers): fewer when positions are tracked too.
int accumulator_budget(CudaScalar dtype, Reduce r) {
  int budget = dtype == CudaScalar::F64 ? 8 : 16;
  return is_extremum(r) ? budget / 2 : budget;
}

}  // namespace

int cuda_scalar_bytes(CudaScalar s) {
  return scalar_bytes(s);
}

const char* cuda_scalar_name(CudaScalar s) {
  return scalar_name(s);
}

const char* cuda_strategy_name(CudaStrategy s) {
  switch (s) {
    case CudaStrategy::RowGroup: return "rowgroup";
    case CudaStrategy::NnzSegment: return "segment";
    case CudaStrategy::NnzAtomic: return "atomic";
    default:
      throw std::invalid_argument("unknown CUDA strategy " + std::to_string(static_cast<int>(s)));
  }
}

SpmmLayout spmm_layout(const CudaKernelSpec& s) {
  SpmmLayout l;
  const int64_t hf = s.heads * s.features;
  const int64_t nvec = std::max<int64_t>(1, hf / std::max(1, s.vec));
  if (s.strategy == CudaStrategy::RowGroup) {
    l.gf = static_cast<int>(feature_lanes(nvec, s.group));
  } else {
    l.gf = s.group;  // chunk workers spread all their lanes over features
  }
  l.gn = s.group / l.gf;
  const int budget = std::max(1, accumulator_budget(s.dtype, s.reduce) / std::max(1, s.vec));
  l.co = static_cast<int>(std::clamp<int64_t>(ceil_div(nvec, l.gf), 1, budget));
  l.tile = l.gf * l.co * s.vec;
  l.tiles = static_cast<int>(ceil_div(hf, l.tile));
  l.exact = hf % l.tile == 0;
  return l;
}

SddmmLayout sddmm_layout(const CudaKernelSpec& s) {
  SddmmLayout l;
  const int64_t team = int64_t(s.group) * s.split;
  const int64_t nvh = std::max<int64_t>(1, s.features / std::max(1, s.vec));
  l.m = static_cast<int>(ceil_div(nvh, team));
  l.entries_per_block = static_cast<int>(s.block / team);
  return l;
}

std::string CudaKernelSpec::validate() const {
  std::ostringstream e;
  if (block < 32 || block > 1024 || block % 32 != 0)
    e << "block must be a multiple of 32 in [32, 1024]; got " << block << ". ";
  if (heads < 1) e << "heads must be >= 1; got " << heads << ". ";
  if (op == CudaOp::Attention || op == CudaOp::AttentionBackward)
    e << attention_spec::attention_validate(*this);
  if (op == CudaOp::Spmm || op == CudaOp::Sddmm) {
    if (features < 1) e << "features must be >= 1; got " << features << ". ";
    if (!is_pow2(group) || group > 32)
      e << "group must be 1, 2, 4, 8, 16 or 32; got " << group << ". ";
    if (!is_pow2(vec) || vec * cuda_scalar_bytes(dtype) > 16)
      e << "vec must be a power of two with vec * sizeof(T) <= 16; got " << vec << ". ";
    else if (features >= 1 && features % vec != 0)
      e << "vec (" << vec << ") must divide features (" << features << "). ";
  }
  if (op == CudaOp::Spmm) {
    if (value_mode < 0 || value_mode > 2) e << "value_mode must be 0, 1 or 2. ";
    if (act == Act::Runtime) e << "the CUDA kernels compile the activation in. ";
    if (strategy == CudaStrategy::NnzAtomic && is_extremum(reduce))
      e << "the atomic strategy supports sum and mean only. ";
    if (strategy == CudaStrategy::NnzAtomic && deterministic)
      e << "deterministic mode excludes the atomic strategy. ";
    if (heads * features > (int64_t(1) << 24)) {
      e << "rows wider than 2^24 scalars. ";
    } else if (e.str().empty() && spmm_layout(*this).tiles > 65535) {
      e << "more than 65535 feature tiles per row (grid.y); use a larger group or vec. ";
    }
  }
  if (is_point_conv_op(op)) e << point_conv_validate(*this);
  if (op == CudaOp::FilterConv) e << filter_conv_validate(*this);
  if (op == CudaOp::Sddmm) {
    if (!is_pow2(split) || split > 8)
      e << "split must be 1, 2, 4 or 8; got " << split << ". ";
    else if (group * split > block || block % (group * split) != 0)
      e << "group * split must divide the block. ";
  }
  return e.str();
}

std::string CudaKernelSpec::name() const {
  std::ostringstream os;
  switch (op) {
    case CudaOp::Spmm:
      os << "spmm_" << cuda_strategy_name(strategy) << "_" << cuda_scalar_name(dtype) << "_"
         << index_short(index) << "_" << reduce_name(reduce) << "_v" << value_mode << "_h" << heads
         << "_f" << features << "_" << act_short(act) << "_g" << group << "_vec" << vec;
      if (deterministic) os << "_det";
      break;
    case CudaOp::Sddmm:
      os << "sddmm_" << cuda_scalar_name(dtype) << "_" << index_short(index) << "_h" << heads
         << "_f" << features << "_g" << group << "_s" << split << "_vec" << vec;
      break;
    case CudaOp::EdgeSoftmax:
    case CudaOp::EdgeSoftmaxBackward:
      os << (op == CudaOp::EdgeSoftmax ? "edge_softmax_" : "edge_softmax_bwd_")
         << cuda_scalar_name(dtype) << "_" << index_short(index) << "_h" << heads;
      break;
    case CudaOp::Attention:
    case CudaOp::AttentionBackward: os << attention_spec::attention_name(*this); break;
    case CudaOp::FilterConv: os << filter_conv_name(*this); break;
    case CudaOp::PointConv:
    case CudaOp::PointConvMap:
    case CudaOp::PointConvImplicit: os << point_conv_name(*this); break;
    default: detail::bad_enum("op kind", static_cast<int>(op));
  }
  if (block != 256) os << "_b" << block;
  return os.str();
}

std::vector<std::string> CudaKernelSpec::entry_points() const {
  if (op == CudaOp::Spmm && strategy != CudaStrategy::RowGroup)
    return {name() + "_chunks", name() + "_fixup"};
  if (op == CudaOp::Attention || op == CudaOp::AttentionBackward)
    return attention_spec::attention_entry_points(*this);
  if (is_point_conv_op(op)) return point_conv_entry_points(*this);
  return {name()};
}

std::string CudaKernelSpec::source() const {
  std::ostringstream os;
  os << "// sparsejit generated CUDA kernel: " << name() << "\n"
     << "// Compiled at run time by NVRTC; the kernel templates are the embedded text of\n"
     << "// kernels/cuda/*.cuh, configured by the struct at the end.\n";
  const std::string err = validate();
  if (!err.empty()) {
    os << "#error \"invalid CudaKernelSpec: " << err << "\"\n";
    return os.str();
  }
  os << "#define SJ_CUDA_AMALGAMATED 1\n"
     << embedded("kernels/common/enums.h") << embedded("kernels/cuda/cuda_args.h") << embedded("kernels/cuda/common.cuh");
  const char* op_file = is_point_conv_op(op)
                            ? "kernels/cuda/point_conv.cuh"
                        : op == CudaOp::Spmm    ? "kernels/cuda/spmm.cuh"
                        : op == CudaOp::Sddmm ? "kernels/cuda/sddmm.cuh"
                        : (op == CudaOp::Attention || op == CudaOp::AttentionBackward)
                            ? "kernels/cuda/attention.cuh"
                        : op == CudaOp::FilterConv ? "kernels/cuda/filter_conv.cuh"
                            : "kernels/cuda/edge_softmax.cuh";
  os << embedded(op_file);
  os << "\n// ---- configuration ----\n"
     << "namespace sj_generated {\n"
     << "struct Config {\n"
     << "  typedef " << device_type(dtype) << " T;\n"
     << "  typedef " << (index == IndexKind::I32 ? "int" : "long long") << " I;\n"
     << "  static constexpr int H = " << heads << ";\n"
     << "  static constexpr int BLOCK = " << block << ";\n";
  std::string params = "SpmmParams";
  std::vector<std::string> bodies;
  switch (op) {
    case CudaOp::Spmm: {
      const SpmmLayout l = spmm_layout(*this);
      os << "  static constexpr int F = " << features << ";\n"
         << "  static constexpr int VMODE = " << value_mode << ";\n"
         << "  static constexpr int REDUCE = " << static_cast<int>(reduce) << ";  // "
         << reduce_name(reduce) << "\n"
         << "  static constexpr int ACT = " << static_cast<int>(act) << ";  // " << act_short(act)
         << "\n"
         << "  static constexpr int G = " << group << ";\n"
         << "  static constexpr int GF = " << l.gf << ";  // lanes over features; " << l.gn
         << " over entries\n"
         << "  static constexpr int VEC = " << vec << ";\n"
         << "  static constexpr int CO = " << l.co << ";  // tile: " << l.tile << " features, "
         << l.tiles << " per row\n"
         << "  static constexpr bool EXACT_TILES = " << (l.exact ? "true" : "false") << ";\n"
         << "  static constexpr bool ATOMIC = "
         << (strategy == CudaStrategy::NnzAtomic ? "true" : "false") << ";\n"
         << "  static constexpr bool DETERMINISTIC = " << (deterministic ? "true" : "false")
         << ";\n";
      if (strategy == CudaStrategy::RowGroup) {
        bodies = {"spmm_rowgroup"};
      } else {
        bodies = {"spmm_chunks", "spmm_fixup"};
      }
      break;
    }
    case CudaOp::Sddmm: {
      const SddmmLayout l = sddmm_layout(*this);
      os << "  static constexpr int F = " << features << ";\n"
         << "  static constexpr int G = " << group << ";\n"
         << "  static constexpr int S = " << split << ";\n"
         << "  static constexpr int VEC = " << vec << ";\n"
         << "  static constexpr int M = " << l.m << ";  // " << l.entries_per_block
         << " entries per block\n";
      params = "SddmmParams";
      bodies = {"sddmm_kernel"};
      break;
    }
    case CudaOp::EdgeSoftmax:
    case CudaOp::EdgeSoftmaxBackward:
      os << "  static constexpr bool BACKWARD = "
         << (op == CudaOp::EdgeSoftmaxBackward ? "true" : "false") << ";\n";
      params = "SoftmaxParams";
      bodies = {"edge_softmax_kernel"};
      break;
    case CudaOp::Attention:
    case CudaOp::AttentionBackward:
      os << attention_spec::attention_config(*this, &bodies);
      params = "AttentionParams";
      break;
    case CudaOp::FilterConv:
      os << filter_conv_config(*this);
      params = "FilterConvParams";
      bodies = {"filter_conv_kernel"};
      break;
    case CudaOp::PointConv:
    case CudaOp::PointConvMap:
    case CudaOp::PointConvImplicit:
      os << point_conv_config(*this);
      params = point_conv_params_type(*this);
      bodies = point_conv_bodies(*this);
      break;
    default: detail::bad_enum("op kind", static_cast<int>(op));
  }
  os << "};\n}  // namespace sj_generated\n\n";
  const std::vector<std::string> entries = entry_points();
  for (size_t k = 0; k < entries.size(); ++k) {
    os << "extern \"C\" __global__ void __launch_bounds__(" << block << ") " << entries[k]
       << "(const sparsejit::cuda::" << params << " p) {\n"
       << "  sparsejit::cuda::" << bodies[k] << "<sj_generated::Config>(p);\n"
       << "}\n";
  }
  return os.str();
}

// ---- Variants -------------------------------------------------------------------------------

std::vector<CudaKernelSpec> enumerate_cuda_variants() {
  std::vector<CudaKernelSpec> out;
  const CudaScalar dtypes[] = {CudaScalar::F32, CudaScalar::F16, CudaScalar::BF16, CudaScalar::F64};
  const Reduce reduces[] = {Reduce::Sum, Reduce::Mean, Reduce::Max, Reduce::Min};
  const Act acts[] = {Act::None, Act::Relu, Act::LeakyRelu, Act::Elu,
                           Act::Gelu};
  // (heads, features): with a full 16-byte vector every F here divides; the scalar shapes
  // take odd widths, single features and rows wider than one tile.
  const int64_t vec_shapes[][2] = {{1, 64}, {4, 16}, {2, 40}, {1, 200}, {3, 8}};
  const int64_t scalar_shapes[][2] = {{1, 7}, {3, 5}, {1, 33}, {2, 16}, {1, 1}, {1, 300}};
  int turn = 0;  // rotates the axes that are not crossed
  auto add = [&](CudaKernelSpec s) {
    if (s.validate().empty()) out.push_back(s);
  };

  // SpMM: dtype x load width x reduce x schedule.
  for (CudaScalar dt : dtypes) {
    for (bool wide : {false, true}) {
      for (Reduce r : reduces) {
        struct Sched {
          CudaStrategy st;
          int g;
        };
        std::vector<Sched> scheds;
        for (int g : {1, 2, 4, 8, 16, 32}) scheds.push_back({CudaStrategy::RowGroup, g});
        const int seg_g[] = {2, 8, 32, 16};
        scheds.push_back({CudaStrategy::NnzSegment, seg_g[static_cast<int>(r)]});
        if (!is_extremum(r)) scheds.push_back({CudaStrategy::NnzAtomic, r == Reduce::Sum ? 4 : 32});
        for (const Sched& sc : scheds) {
          CudaKernelSpec s;
          s.op = CudaOp::Spmm;
          s.dtype = dt;
          s.reduce = r;
          s.strategy = sc.st;
          s.group = sc.g;
          const auto& shape = wide ? vec_shapes[turn % 5] : scalar_shapes[turn % 6];
          s.heads = shape[0];
          s.features = shape[1];
          s.vec = wide ? 16 / cuda_scalar_bytes(dt) : 1;
          s.index = turn % 2 ? IndexKind::I32 : IndexKind::I64;
          s.value_mode = turn % 3;
          s.act = acts[(turn / 2) % 5];
          s.deterministic = sc.st != CudaStrategy::NnzAtomic && (turn % 4 == 3);
          add(s);
          ++turn;
        }
      }
    }
  }
  // SDDMM: dtype x load width x (group, split).
  const int sddmm_sched[][2] = {{1, 1},  {2, 1},  {4, 1},  {8, 1}, {16, 1},
                                {32, 1}, {32, 2}, {32, 4}, {8, 4}};
  const int64_t sddmm_shapes[][2] = {{1, 64}, {4, 32}, {2, 256}, {8, 16}, {1, 8}};
  for (CudaScalar dt : dtypes) {
    for (bool wide : {false, true}) {
      for (const auto& gs : sddmm_sched) {
        CudaKernelSpec s;
        s.op = CudaOp::Sddmm;
        s.dtype = dt;
        s.group = gs[0];
        s.split = gs[1];
        const auto& shape = sddmm_shapes[turn % 5];
        s.heads = shape[0];
        s.features = wide ? shape[1] : shape[1] + (turn % 2);  // odd widths with scalar loads
        s.vec = wide ? 16 / cuda_scalar_bytes(dt) : 1;
        s.index = turn % 2 ? IndexKind::I32 : IndexKind::I64;
        add(s);
        ++turn;
      }
    }
  }
  // Edge softmax forward and backward: dtype x index x heads.
  for (CudaOp op : {CudaOp::EdgeSoftmax, CudaOp::EdgeSoftmaxBackward}) {
    for (CudaScalar dt : dtypes) {
      for (IndexKind ix : {IndexKind::I32, IndexKind::I64}) {
        for (int64_t h : {1, 3, 8, 40}) {
          CudaKernelSpec s;
          s.op = op;
          s.dtype = dt;
          s.index = ix;
          s.heads = h;
          add(s);
        }
      }
    }
  }
  attention_spec::add_attention_variants(&out);
  for (const CudaKernelSpec& s : filter_conv_variants()) add(s);
  append_point_conv_variants(&out);
  return out;
}

// ---- Planner --------------------------------------------------------------------------------

int32_t choose_vec(CudaScalar dtype, int64_t features, int32_t max_bytes) {
  const int bytes = cuda_scalar_bytes(dtype);
  for (int32_t v = 16 / bytes; v > 1; v /= 2)
    if (v * bytes <= max_bytes && features % v == 0) return v;
  return 1;
}

int64_t spmm_num_chunks(int64_t nnz, int64_t chunk) {
  return std::max<int64_t>(1, ceil_div(nnz, std::max<int64_t>(1, chunk)));
}

CudaSpmmChoice plan_cuda_spmm(const CudaSpmmProblem& prob, const CudaRowStats& st) {
  CudaSpmmChoice c;
  CudaKernelSpec& s = c.spec;
  s.op = CudaOp::Spmm;
  s.dtype = prob.dtype;
  s.index = prob.index;
  s.heads = prob.heads;
  s.features = prob.features;
  s.value_mode = prob.value_mode;
  s.reduce = prob.reduce;
  s.act = prob.act;
  s.deterministic = prob.deterministic;
  s.vec = choose_vec(prob.dtype, prob.features, prob.max_vec_bytes);
  const int64_t nvec = std::max<int64_t>(1, prob.heads * prob.features / s.vec);
  const int64_t gf = feature_lanes(nvec, 32);
  const double avg = st.rows > 0 ? double(st.nnz) / double(st.rows) : 0.0;
  std::ostringstream why;
  why << "rows " << st.rows << ", nnz " << st.nnz << ", mean row " << avg << ", longest "
      << st.max_row << ": ";

  const bool skewed = double(st.max_row) > std::max(256.0, 16.0 * avg);
  const bool few_long_rows = st.rows < 512 && avg >= 1024;
  if (skewed || few_long_rows) {
    // Equal-nnz chunks: several times the mean row (so most rows end inside one chunk and the
    // partials stay small), but enough chunks to fill the GPU.
    const int64_t by_rows = pow2_ceil(std::max<int64_t>(32, int64_t(8 * avg)));
    const int64_t by_parallelism =
        std::max<int64_t>(32, pow2_floor(std::max<int64_t>(1, st.nnz / 4096)));
    c.chunk = std::min(by_rows, by_parallelism);
    s.group = static_cast<int32_t>(gf);
    const bool sum_like = !is_extremum(prob.reduce);
    if (sum_like && !prob.deterministic && st.max_row >= 32 * c.chunk) {
      s.strategy = CudaStrategy::NnzAtomic;
      why << "rows are skewed; equal chunks of " << c.chunk
          << " entries, long rows finished with atomics";
    } else {
      s.strategy = CudaStrategy::NnzSegment;
      why << (skewed ? "rows are skewed" : "few long rows") << "; equal chunks of " << c.chunk
          << " entries, split rows finished in order"
          << (prob.deterministic ? " (deterministic)" : "");
    }
  } else {
    // A group per row: the feature lanes, times lanes over entries for longer rows.
    const int64_t gn =
        std::clamp<int64_t>(pow2_floor(std::max<int64_t>(1, int64_t(avg / 4))), 1, 32 / gf);
    s.strategy = CudaStrategy::RowGroup;
    s.group = static_cast<int32_t>(gf * gn);
    why << "balanced rows; " << s.group << " lanes per row (" << gf << " over features, " << gn
        << " over entries)";
  }
  why << ", " << s.vec << "-wide loads";
  c.reason = why.str();
  return c;
}

CudaKernelSpec plan_cuda_sddmm(CudaScalar dtype, IndexKind index, int64_t heads, int64_t features,
                               int32_t max_vec_bytes) {
  CudaKernelSpec s;
  s.op = CudaOp::Sddmm;
  s.dtype = dtype;
  s.index = index;
  s.heads = heads;
  s.features = features;
  s.vec = choose_vec(dtype, features, max_vec_bytes);
  const int64_t nvh = std::max<int64_t>(1, features / s.vec);
  s.group = static_cast<int32_t>(std::min<int64_t>(32, pow2_ceil(nvh)));
  // Very wide heads: several warps per entry, summed in shared memory (stage 2).
  s.split =
      nvh > 128 ? static_cast<int32_t>(std::min<int64_t>(4, pow2_ceil(ceil_div(nvh, 128)))) : 1;
  return s;
}

CudaKernelSpec plan_cuda_edge_softmax(CudaScalar dtype, IndexKind index, int64_t heads,
                                      bool backward) {
  CudaKernelSpec s;
  s.op = backward ? CudaOp::EdgeSoftmaxBackward : CudaOp::EdgeSoftmax;
  s.dtype = dtype;
  s.index = index;
  s.heads = heads;
  return s;
}

}  // namespace sparsejit::codegen
