#include "codegen/cuda_launch.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "codegen/nvrtc.h"

namespace sparsejit::codegen {

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

size_t align_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

unsigned grid_x(int64_t threads, int block) {
  // Callers keep problems below 2^31 blocks (rows * 32 / block for the widest groups).
  return static_cast<unsigned>(std::max<int64_t>(0, ceil_div(threads, block)));
}

}  // namespace

SpmmLaunchPlan plan_spmm_launch(const CudaSpmmChoice& choice, int64_t rows, int64_t nnz) {
  const CudaKernelSpec& s = choice.spec;
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
  const bool arg = s.reduce == Reduce::Max || s.reduce == Reduce::Min;
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
  const bool arg = choice.spec.reduce == Reduce::Max || choice.spec.reduce == Reduce::Min;
  if (arg && choice.spec.strategy == CudaStrategy::NnzSegment)
    p->partial_arg = reinterpret_cast<long long*>(w + plan.partial_arg_offset);
  p->tail_row = reinterpret_cast<long long*>(w + plan.tail_row_offset);
}

CudaLaunch plan_sddmm_launch(const CudaKernelSpec& spec, int64_t nnz) {
  CudaLaunch a;
  a.entry = spec.entry_points()[0];
  a.block.x = static_cast<unsigned>(spec.block);
  a.grid.x = grid_x(nnz, sddmm_layout(spec).entries_per_block);
  return a;
}

std::vector<CudaLaunch> plan_attention_launch(const CudaKernelSpec& spec, int64_t rows,
                                              int64_t cols) {
  const std::vector<std::string> entries = spec.entry_points();
  std::vector<CudaLaunch> out;
  for (size_t k = 0; k < entries.size(); ++k) {
    CudaLaunch a;
    a.entry = entries[k];
    a.block.x = static_cast<unsigned>(spec.block);
    // A group per (row, head); the backward's second pass per (column, head).
    a.grid.x = grid_x((k == 0 ? rows : cols) * spec.heads * spec.group, spec.block);
    out.push_back(a);
  }
  return out;
}

CudaLaunch plan_edge_softmax_launch(const CudaKernelSpec& spec, int64_t rows) {
  CudaLaunch a;
  a.entry = spec.entry_points()[0];
  a.block.x = static_cast<unsigned>(spec.block);
  a.grid.x = grid_x(rows * 32, spec.block);
  return a;
}

// ---- Executor -------------------------------------------------------------------------------

namespace {

struct LoadedModule {
  std::string binary_path;
  std::string source_path;
  std::string error;  // a failed build is remembered, not retried on every call
};

std::mutex g_mutex;
std::map<std::tuple<std::string, int>, LoadedModule> g_modules;  // (spec name, device)
std::map<int, std::string> g_targets;                            // device -> NVRTC target

std::string target_for_device(int device, std::string* error) {
  {
    std::lock_guard<std::mutex> g(g_mutex);
    auto it = g_targets.find(device);
    if (it != g_targets.end()) return it->second;
  }
  const int cc = CudaDriver::instance().compute_capability(device, error);
  if (cc == 0) return "";
  const std::string t = Nvrtc::instance().target_for(cc);
  std::lock_guard<std::mutex> g(g_mutex);
  g_targets[device] = t;
  return t;
}

}  // namespace

CudaKernels& CudaKernels::instance() {
  static CudaKernels k;
  return k;
}

bool CudaKernels::available(std::string* why) {
  std::string a, b;
  const bool nv = Nvrtc::instance().available(&a);
  const bool dr = CudaDriver::instance().available(&b);
  if (why) *why = nv ? b : a;
  return nv && dr;
}

std::string CudaKernels::build(const CudaKernelSpec& spec, int device, CudaBuildInfo* info) {
  CudaBuildInfo local;
  CudaBuildInfo& bi = info ? *info : local;
  std::string err;
  const std::string target = target_for_device(device, &err);
  if (target.empty()) {
    bi.error = "kernel " + spec.name() + ": " + err;
    return "";
  }
  return compile_cuda_cached(spec.source(), spec.name(), target, &bi);
}

bool CudaKernels::run(const CudaKernelSpec& spec, int device, void* stream,
                      const std::vector<CudaLaunch>& launches, void* params, std::string* error) {
  if (launches.empty()) return true;
  const auto key = std::make_tuple(spec.name(), device);
  LoadedModule mod;
  bool known = false;
  {
    std::lock_guard<std::mutex> g(g_mutex);
    auto it = g_modules.find(key);
    if (it != g_modules.end()) {
      mod = it->second;
      known = true;
    }
  }
  if (!known) {
    CudaBuildInfo bi;
    mod.binary_path = build(spec, device, &bi);
    mod.source_path = bi.source_path;
    mod.error = bi.error;
    std::lock_guard<std::mutex> g(g_mutex);
    g_modules.emplace(key, mod);
  }
  if (!mod.error.empty() || mod.binary_path.empty()) {
    *error = mod.error.empty() ? "kernel " + spec.name() + " could not be built" : mod.error;
    return false;
  }
  CudaDriver& drv = CudaDriver::instance();
  for (const CudaLaunch& l : launches) {
    // The driver caches modules and functions, so this is a map lookup after the first call.
    CudaFunction f = drv.function(device, mod.binary_path, l.entry, mod.source_path, error);
    if (!f) return false;
    if (!drv.launch(f, l.grid, l.block, l.shared_bytes, stream, params, error)) return false;
  }
  return true;
}

}  // namespace sparsejit::codegen
