// CUDA specs of SpMM, SDDMM and the edge softmax: validation, names, the Config members, the
// variants NVRTC compiles in CI, the planners and the launch plans (codegen/cuda_spmm.h).
#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "codegen/cuda_spmm.h"

namespace sparsejit::codegen {

using namespace cuda_spec_detail;

namespace {

bool is_extremum(Reduce r) {
  return r == Reduce::Max || r == Reduce::Min;
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

// Lanes and load width of the SpMM and SDDMM kernels.
void check_lanes(std::ostringstream& e, CudaScalar dtype, int64_t features, int32_t group,
                 int32_t vec) {
  if (features < 1) e << "features must be >= 1; got " << features << ". ";
  if (!is_pow2(group) || group > 32)
    e << "group must be 1, 2, 4, 8, 16 or 32; got " << group << ". ";
  if (!is_pow2(vec) || vec * cuda_scalar_bytes(dtype) > 16)
    e << "vec must be a power of two with vec * sizeof(T) <= 16; got " << vec << ". ";
  else if (features >= 1 && features % vec != 0)
    e << "vec (" << vec << ") must divide features (" << features << "). ";
}

void check_heads(std::ostringstream& e, int64_t heads) {
  if (heads < 1) e << "heads must be >= 1; got " << heads << ". ";
}

unsigned grid_x(int64_t threads, int block) {
  // Callers keep problems below 2^31 blocks (rows * 32 / block for the widest groups).
  return static_cast<unsigned>(std::max<int64_t>(0, ceil_div(threads, block)));
}

size_t align_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

}  // namespace

const char* cuda_strategy_name(CudaStrategy s) {
  switch (s) {
    case CudaStrategy::RowGroup: return "rowgroup";
    case CudaStrategy::NnzSegment: return "segment";
    case CudaStrategy::NnzAtomic: return "atomic";
    default:
      throw std::invalid_argument("unknown CUDA strategy " + std::to_string(static_cast<int>(s)));
  }
}

// ---- SpMM ---------------------------------------------------------------------------------------
SpmmLayout spmm_layout(const CudaSpmmSpec& s) {
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

std::string CudaSpmmSpec::validate_family() const {
  std::ostringstream e;
  check_heads(e, heads);
  check_lanes(e, dtype, features, group, vec);
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
  return e.str();
}

std::string CudaSpmmSpec::stem() const {
  std::ostringstream os;
  os << "spmm_" << cuda_strategy_name(strategy) << "_" << cuda_scalar_name(dtype) << "_"
     << index_name(index) << "_" << reduce_name(reduce) << "_v" << value_mode << "_h" << heads
     << "_f" << features << "_" << act_short(act) << "_g" << group << "_vec" << vec;
  if (deterministic) os << "_det";
  return os.str();
}

std::vector<std::string> CudaSpmmSpec::entry_points() const {
  if (strategy != CudaStrategy::RowGroup) return {name() + "_chunks", name() + "_fixup"};
  return {name()};
}

std::string CudaSpmmSpec::config(std::vector<std::string>* bodies) const {
  const SpmmLayout l = spmm_layout(*this);
  std::ostringstream os;
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
    *bodies = {"spmm_rowgroup"};
  } else {
    *bodies = {"spmm_chunks", "spmm_fixup"};
  }
  return os.str();
}

// ---- SDDMM --------------------------------------------------------------------------------------
SddmmLayout sddmm_layout(const CudaSddmmSpec& s) {
  SddmmLayout l;
  const int64_t team = int64_t(s.group) * s.split;
  const int64_t nvh = std::max<int64_t>(1, s.features / std::max(1, s.vec));
  l.m = static_cast<int>(ceil_div(nvh, team));
  l.entries_per_block = static_cast<int>(s.block / team);
  return l;
}

std::string CudaSddmmSpec::validate_family() const {
  std::ostringstream e;
  check_heads(e, heads);
  check_lanes(e, dtype, features, group, vec);
  if (!is_pow2(split) || split > 8)
    e << "split must be 1, 2, 4 or 8; got " << split << ". ";
  else if (group * split > block || block % (group * split) != 0)
    e << "group * split must divide the block. ";
  return e.str();
}

std::string CudaSddmmSpec::stem() const {
  std::ostringstream os;
  os << "sddmm_" << cuda_scalar_name(dtype) << "_" << index_name(index) << "_h" << heads << "_f"
     << features << "_g" << group << "_s" << split << "_vec" << vec;
  return os.str();
}

std::string CudaSddmmSpec::config(std::vector<std::string>* bodies) const {
  const SddmmLayout l = sddmm_layout(*this);
  std::ostringstream os;
  os << "  static constexpr int F = " << features << ";\n"
     << "  static constexpr int G = " << group << ";\n"
     << "  static constexpr int S = " << split << ";\n"
     << "  static constexpr int VEC = " << vec << ";\n"
     << "  static constexpr int M = " << l.m << ";  // " << l.entries_per_block
     << " entries per block\n";
  *bodies = {"sddmm_kernel"};
  return os.str();
}

// ---- Edge softmax -------------------------------------------------------------------------------
std::string CudaEdgeSoftmaxSpec::validate_family() const {
  std::ostringstream e;
  check_heads(e, heads);
  return e.str();
}

std::string CudaEdgeSoftmaxSpec::stem() const {
  std::ostringstream os;
  os << (backward ? "edge_softmax_bwd_" : "edge_softmax_") << cuda_scalar_name(dtype) << "_"
     << index_name(index) << "_h" << heads;
  return os.str();
}

std::string CudaEdgeSoftmaxSpec::config(std::vector<std::string>* bodies) const {
  *bodies = {"edge_softmax_kernel"};
  return std::string("  static constexpr bool BACKWARD = ") + (backward ? "true" : "false") +
         ";\n";
}

// ---- Variants -------------------------------------------------------------------------------

void append_spmm_variants(std::vector<CudaSpecPtr>* out) {
  const CudaScalar dtypes[] = {CudaScalar::F32, CudaScalar::F16, CudaScalar::BF16, CudaScalar::F64};
  const Reduce reduces[] = {Reduce::Sum, Reduce::Mean, Reduce::Max, Reduce::Min};
  const Act acts[] = {Act::None, Act::Relu, Act::LeakyRelu, Act::Elu, Act::Gelu};
  // (heads, features): with a full 16-byte vector every F here divides; the scalar shapes
  // take odd widths, single features and rows wider than one tile.
  const int64_t vec_shapes[][2] = {{1, 64}, {4, 16}, {2, 40}, {1, 200}, {3, 8}};
  const int64_t scalar_shapes[][2] = {{1, 7}, {3, 5}, {1, 33}, {2, 16}, {1, 1}, {1, 300}};
  int turn = 0;  // rotates the axes that are not crossed
  auto add = [&](const auto& s) {
    if (s.validate().empty()) out->push_back(share_spec(s));
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
          CudaSpmmSpec s;
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
        CudaSddmmSpec s;
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
  for (bool backward : {false, true}) {
    for (CudaScalar dt : dtypes) {
      for (IndexKind ix : {IndexKind::I32, IndexKind::I64}) {
        for (int64_t h : {1, 3, 8, 40}) {
          CudaEdgeSoftmaxSpec s;
          s.backward = backward;
          s.dtype = dt;
          s.index = ix;
          s.heads = h;
          add(s);
        }
      }
    }
  }
}

// ---- Planners -----------------------------------------------------------------------------------

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
  CudaSpmmSpec& s = c.spec;
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

CudaSddmmSpec plan_cuda_sddmm(CudaScalar dtype, IndexKind index, int64_t heads, int64_t features,
                              int32_t max_vec_bytes) {
  CudaSddmmSpec s;
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

CudaEdgeSoftmaxSpec plan_cuda_edge_softmax(CudaScalar dtype, IndexKind index, int64_t heads,
                                           bool backward) {
  CudaEdgeSoftmaxSpec s;
  s.backward = backward;
  s.dtype = dtype;
  s.index = index;
  s.heads = heads;
  return s;
}

// ---- Launch plans -------------------------------------------------------------------------------

SpmmLaunchPlan plan_spmm_launch(const CudaSpmmChoice& choice, int64_t rows, int64_t nnz) {
  const CudaSpmmSpec& s = choice.spec;
  const SpmmLayout l = spmm_layout(s);
  const std::vector<std::string> entries = s.entry_points();
  SpmmLaunchPlan p;
  CudaLaunch base;
  base.block.x = static_cast<unsigned>(s.block);
  base.grid.y = static_cast<unsigned>(l.tiles);
  if (rows == 0) return p;  // nothing to write
  if (s.strategy == CudaStrategy::RowGroup) {
    CudaLaunch a = base;
    a.entry = entries[0];
    a.grid.x = grid_x(rows * s.group, s.block);
    p.launches.push_back(a);
    return p;
  }
  p.num_chunks = spmm_num_chunks(nnz, choice.chunk);
  const int64_t hf = s.heads * s.features;
  const size_t acc_bytes = s.dtype == CudaScalar::F64 ? 8 : 4;
  const bool atomic = s.strategy == CudaStrategy::NnzAtomic;
  const bool arg = is_extremum(s.reduce);
  const size_t slots = static_cast<size_t>(p.num_chunks) * (atomic ? 1 : 2);
  p.partial_offset = 0;
  size_t end = slots * hf * acc_bytes;
  p.zero_bytes = atomic ? end : 0;
  p.partial_arg_offset = align_up(end, 256);
  if (arg) end = p.partial_arg_offset + slots * hf * sizeof(long long);
  p.tail_row_offset = align_up(end, 256);
  p.workspace_bytes = p.tail_row_offset + static_cast<size_t>(p.num_chunks) * sizeof(long long);
  for (size_t k = 0; k < entries.size(); ++k) {
    CudaLaunch a = base;
    a.entry = entries[k];
    a.grid.x = grid_x(p.num_chunks * l.gf, s.block);
    p.launches.push_back(a);
  }
  return p;
}

void bind_spmm_workspace(const SpmmLaunchPlan& plan, const CudaSpmmChoice& choice, void* workspace,
                         cuda::SpmmParams* p) {
  p->partial = nullptr;
  p->partial_arg = nullptr;
  p->tail_row = nullptr;
  p->chunk = choice.chunk;
  p->num_chunks = plan.num_chunks;
  if (plan.workspace_bytes == 0) return;
  char* w = static_cast<char*>(workspace);
  p->partial = w + plan.partial_offset;
  if (is_extremum(choice.spec.reduce) && choice.spec.strategy == CudaStrategy::NnzSegment)
    p->partial_arg = reinterpret_cast<long long*>(w + plan.partial_arg_offset);
  p->tail_row = reinterpret_cast<long long*>(w + plan.tail_row_offset);
}

CudaLaunch plan_sddmm_launch(const CudaSddmmSpec& spec, int64_t nnz) {
  CudaLaunch a;
  a.entry = spec.entry_points()[0];
  a.block.x = static_cast<unsigned>(spec.block);
  a.grid.x = grid_x(nnz, sddmm_layout(spec).entries_per_block);
  return a;
}

CudaLaunch plan_edge_softmax_launch(const CudaEdgeSoftmaxSpec& spec, int64_t rows) {
  CudaLaunch a;
  a.entry = spec.entry_points()[0];
  a.block.x = static_cast<unsigned>(spec.block);
  a.grid.x = grid_x(rows * 32, spec.block);
  return a;
}

}  // namespace sparsejit::codegen
