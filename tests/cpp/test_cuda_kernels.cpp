// The generated CUDA kernels checked element by element against plain references, with
// poisoned outputs and guard bands (tests/cpp/cuda_kernel_checks.h), two ways:
//
//  CudaEmulated  no GPU needed: each spec's source (exactly what NVRTC gets) is compiled by the
//                host compiler against tests/cpp/cuda_emulation.h and run on CPU threads.
//                Skipped without a host compiler ($CXX, else c++). About 25 s on two cores;
//                SPARSEJIT_TEST_EMULATE_ALL=1 runs every variant of enumerate_cuda_variants()
//                (about 15 minutes), SPARSEJIT_TEST_VERBOSE=1 prints the time per spec.
//  CudaGpu       on the GPU through NVRTC and the driver (codegen/cuda_launch.h); skipped
//                without a driver, a device or NVRTC. SPARSEJIT_TEST_GPU_ALL_VARIANTS=1 adds
//                every variant of enumerate_cuda_variants().
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "codegen/cuda_driver.h"
#include "codegen/cuda_launch.h"
#include "codegen/nvrtc.h"
#include "tests/cpp/cuda_kernel_checks.h"
#include "tests/cpp/cuda_point_conv_checks.h"

namespace sparsejit::codegen {
namespace {

using checks::Runner;

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}

// ---- The specs under test ---------------------------------------------------------------------
CudaSpmmSpec spmm_spec(CudaStrategy st, CudaScalar dt, IndexKind ix, Reduce r, int vm, int64_t h,
                       int64_t f, sparsejit::Act act, int g, int vec, bool det = false) {
  CudaSpmmSpec s;
  s.strategy = st;
  s.dtype = dt;
  s.index = ix;
  s.reduce = r;
  s.value_mode = vm;
  s.heads = h;
  s.features = f;
  s.act = act;
  s.group = g;
  s.vec = vec;
  s.deterministic = det;
  return s;
}

CudaSddmmSpec sddmm_spec(CudaScalar dt, IndexKind ix, int64_t h, int64_t f, int g, int split,
                        int vec) {
  CudaSddmmSpec s;
  s.dtype = dt;
  s.index = ix;
  s.heads = h;
  s.features = f;
  s.group = g;
  s.split = split;
  s.vec = vec;
  return s;
}

CudaEdgeSoftmaxSpec softmax_spec(bool backward, CudaScalar dt, IndexKind ix, int64_t h) {
  CudaEdgeSoftmaxSpec s;
  s.backward = backward;
  s.dtype = dt;
  s.index = ix;
  s.heads = h;
  return s;
}

// Filter conv: a square kernel, stride, padding and dilation, the epilogue and the tile.
CudaFilterConvSpec filter_conv_spec(CudaScalar dt, int k, int stride, int pad, int dil,
                                    sparsejit::Act act, int block, int channels) {
  CudaFilterConvSpec s;
  s.dtype = dt;
  s.conv.r = s.conv.s = k;
  s.conv.stride_h = s.conv.stride_w = stride;
  s.conv.pad_h = s.conv.pad_w = pad;
  s.conv.dil_h = s.conv.dil_w = dil;
  s.act = act;
  s.block = block;
  s.conv.channels_per_block = channels;
  return s;
}

// Every op, strategy, dtype, index type, reduce, value mode, activation, and group sizes,
// vector widths and shapes from scalar odd widths to multi-tile rows.
std::vector<CudaSpecPtr> specs_under_test() {
  using A = sparsejit::Act;
  using S = CudaScalar;
  using St = CudaStrategy;
  const IndexKind i32 = IndexKind::I32, i64 = IndexKind::I64;
  const bool fwd = false, bwd = true;
  std::vector<CudaSpecPtr> out;
  auto add = [&](const auto&... specs) { (out.push_back(share_spec(specs)), ...); };
  add(
      spmm_spec(St::RowGroup, S::F32, i32, Reduce::Sum, 1, 1, 64, A::Relu, 16, 4),
      spmm_spec(St::RowGroup, S::F32, i64, Reduce::Max, 0, 1, 7, A::None, 4, 1),
      spmm_spec(St::RowGroup, S::F16, i32, Reduce::Mean, 2, 4, 16, A::Gelu, 32, 8),
      spmm_spec(St::RowGroup, S::BF16, i64, Reduce::Min, 1, 1, 40, A::None, 8, 2),
      spmm_spec(St::RowGroup, S::F64, i32, Reduce::Max, 2, 2, 40, A::Elu, 32, 2),
      spmm_spec(St::RowGroup, S::F32, i64, Reduce::Sum, 0, 1, 300, A::LeakyRelu, 2, 1),
      spmm_spec(St::RowGroup, S::F32, i32, Reduce::Min, 1, 3, 5, A::None, 1, 1),
      spmm_spec(St::NnzSegment, S::F32, i32, Reduce::Max, 1, 1, 64, A::None, 8, 4),
      spmm_spec(St::NnzSegment, S::BF16, i64, Reduce::Sum, 2, 3, 5, A::Relu, 32, 1, true),
      spmm_spec(St::NnzSegment, S::F64, i32, Reduce::Min, 0, 1, 8, A::None, 4, 2),
      spmm_spec(St::NnzSegment, S::F16, i64, Reduce::Mean, 1, 1, 200, A::None, 16, 4),
      spmm_spec(St::NnzAtomic, S::F32, i64, Reduce::Sum, 1, 1, 16, A::None, 4, 4),
      spmm_spec(St::NnzAtomic, S::F64, i32, Reduce::Mean, 2, 2, 8, A::Gelu, 8, 1),
      sddmm_spec(S::F32, i32, 4, 32, 8, 1, 4),
      sddmm_spec(S::F16, i64, 2, 257, 4, 4, 1),
      sddmm_spec(S::BF16, i32, 1, 64, 4, 2, 8),
      sddmm_spec(S::F64, i64, 8, 6, 2, 1, 2),
      softmax_spec(fwd, S::F32, i32, 1),
      softmax_spec(fwd, S::BF16, i64, 3),
      softmax_spec(fwd, S::F64, i32, 40),
      softmax_spec(fwd, S::F16, i64, 8),
      softmax_spec(bwd, S::F32, i64, 3),
      softmax_spec(bwd, S::F64, i32, 1),
      softmax_spec(bwd, S::BF16, i64, 40),
      // Fused attention: each score form, forward and backward, bias, widths below and above
      // the group, both index types and dtypes.
      plan_cuda_attention(S::F32, i32, 2, 16, 16, 0, true, false),
      plan_cuda_attention(S::F32, i64, 2, 16, 16, 0, true, true),
      plan_cuda_attention(S::F64, i64, 1, 7, 5, 0, false, false),
      plan_cuda_attention(S::F64, i32, 3, 7, 5, 0, false, true),
      plan_cuda_attention(S::F32, i64, 3, 1, 12, 1, true, false),
      plan_cuda_attention(S::F64, i32, 2, 1, 12, 1, true, true),
      plan_cuda_attention(S::F32, i32, 2, 9, 4, 2, false, false),
      plan_cuda_attention(S::F64, i64, 2, 9, 4, 2, true, true),
      plan_cuda_attention(S::F32, i32, 1, 64, 40, 2, false, true),
      plan_cuda_point_conv(S::F32, i32, 64, false, 16),
      plan_cuda_point_conv(S::F32, i64, 3, true, 16),
      plan_cuda_point_conv(S::F16, i32, 32, true, 16),
      plan_cuda_point_conv(S::BF16, i64, 16, false, 8),
      plan_cuda_point_conv(S::F64, i32, 6, true, 16),
      plan_cuda_point_conv(S::F64, i64, 1, false, 16),
      plan_cuda_point_map(i32),
      plan_cuda_point_map(i64),
      plan_cuda_point_conv_implicit(S::F32, 16, 16, false, true),
      plan_cuda_point_conv_implicit(S::F32, 3, 32, false, false),
      plan_cuda_point_conv_implicit(S::F32, 64, 96, true, false),
      plan_cuda_point_conv_implicit(S::F16, 32, 64, false, false),
      plan_cuda_point_conv_implicit(S::BF16, 17, 5, true, false),
      plan_cuda_point_conv_implicit(S::F64, 24, 40, false, true),
      filter_conv_spec(S::F32, 3, 1, 1, 1, A::Relu, 64, 1),
      filter_conv_spec(S::F16, 1, 1, 0, 1, A::None, 128, 2),
      filter_conv_spec(S::BF16, 7, 2, 3, 1, A::Relu, 256, 4),
      filter_conv_spec(S::F64, 3, 2, 2, 2, A::None, 64, 8),
      filter_conv_spec(S::F32, 5, 3, 0, 1, A::None, 128, 3),
      [&] {  // rectangular: 3x1 kernel, dilation 2 down, stride 2 across, padding down only
        CudaFilterConvSpec s = filter_conv_spec(S::F32, 3, 1, 1, 2, A::Relu, 64, 2);
        s.conv.s = 1;
        s.conv.stride_w = 2;
        s.conv.pad_w = 0;
        s.conv.dil_w = 1;
        return s;
      }());
  return out;
}

// ---- Host emulation -------------------------------------------------------------------------
// The repository root (CMake's definition: __FILE__ is relative when ccache rewrites paths
// under CCACHE_BASEDIR).
std::string source_root() { return SPARSEJIT_SOURCE_DIR; }

std::string host_compiler() {
  const char* c = std::getenv("CXX");
  return c && *c ? c : "c++";
}

bool compiler_available() {
  return std::system((host_compiler() + " --version > /dev/null 2>&1").c_str()) == 0;
}

using LaunchFn = void (*)(unsigned, unsigned, unsigned, const void*);

struct EmulatedModule {
  std::string error;
  std::map<std::string, LaunchFn> entries;
};

// The generated source plus one wrapper per entry point, compiled into a shared library.
EmulatedModule build_emulated(const CudaKernelSpecBase& spec, const std::string& dir) {
  EmulatedModule m;
  std::string src = "#include \"tests/cpp/cuda_emulation.h\"\n" + spec.source() + "\n";
  for (const auto& e : spec.entry_points()) {
    src += "extern \"C\" void sj_emulate_" + e +
           "(unsigned gx, unsigned gy, unsigned block, const void* p) {\n  sj_emu::launch(&" + e +
           ", gx, gy, block, static_cast<const sparsejit::cuda::" + spec.params_type() +
           "*>(p));\n}\n";
  }
  const std::string base = dir + "/" + spec.name();
  std::ofstream(base + ".cpp") << src;
  // Every module defines the same template instances (kernel<sj_generated::Config>) and their
  // __shared__ (function-static) arrays under the same names: -fno-gnu-unique and -Bsymbolic
  // keep each module on its own copies instead of the first loaded module's.
  const std::string cmd = host_compiler() + " -std=c++17 -O1 -g -fPIC -shared -pthread " +
                          "-fno-gnu-unique -Wl,-Bsymbolic -fno-strict-aliasing -I" + source_root() + " " + base + ".cpp -o " +
                          base + ".so > " + base + ".log 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream log(base + ".log");
    m.error = spec.name() + ": host compile failed:\n" +
              std::string(std::istreambuf_iterator<char>(log), {});
    return m;
  }
  void* h = dlopen((base + ".so").c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    m.error = spec.name() + ": " + dlerror();
    return m;
  }
  for (const auto& e : spec.entry_points()) {
    auto fn = reinterpret_cast<LaunchFn>(dlsym(h, ("sj_emulate_" + e).c_str()));
    if (!fn) m.error = spec.name() + ": missing entry " + e;
    m.entries[e] = fn;
  }
  return m;
}

class EmuRunner : public Runner {
 public:
  explicit EmuRunner(const std::map<std::string, EmulatedModule>* modules) : modules_(modules) {}
  void* upload(const void* host, size_t bytes) override {
    const size_t size = (bytes + 255) / 256 * 256 + 256;
    void* p = std::aligned_alloc(256, size);
    std::memcpy(p, host, bytes);
    blocks_.emplace_back(static_cast<unsigned char*>(p), &std::free);
    return p;
  }
  void download(void* host, const void* device, size_t bytes) override {
    std::memcpy(host, device, bytes);
  }
  std::string run(const CudaKernelSpecBase& spec, const std::vector<CudaLaunch>& launches,
                  void* params) override {
    auto it = modules_->find(spec.name());
    if (it == modules_->end()) return spec.name() + " was not built";
    if (!it->second.error.empty()) return it->second.error;
    for (const auto& l : launches)
      it->second.entries.at(l.entry)(l.grid.x, l.grid.y, l.block.x, params);
    return "";
  }
  void reset() override { blocks_.clear(); }

 private:
  const std::map<std::string, EmulatedModule>* modules_;
  std::vector<std::unique_ptr<unsigned char, void (*)(void*)>> blocks_;
};

// Fewer CPU threads per emulated block keep the emulation fast; every fourth spec keeps the
// production block size (the only difference is the BLOCK constant of the source).
std::vector<CudaSpecPtr> emulated_specs() {
  std::vector<CudaSpecPtr> v =
      env_flag("SPARSEJIT_TEST_EMULATE_ALL") ? enumerate_cuda_variants() : specs_under_test();
  for (size_t i = 0; i < v.size(); ++i) {
    std::unique_ptr<CudaKernelSpecBase> small = v[i]->clone();
    small->block = 64;
    if (i % 4 != 0 && small->validate().empty()) v[i] = std::move(small);
  }
  return v;
}

TEST(CudaEmulated, EveryKernelMatchesTheReference) {
  if (!compiler_available()) GTEST_SKIP() << "no host C++ compiler (" << host_compiler() << ")";
  char tmpl[] = "/tmp/sparsejit-emu-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::vector<CudaSpecPtr> specs = emulated_specs();
  std::vector<EmulatedModule> built(specs.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < specs.size(); i = next++) built[i] = build_emulated(*specs[i], dir);
  };
  std::thread t1(work), t2(work);
  t1.join();
  t2.join();
  std::map<std::string, EmulatedModule> modules;
  for (size_t i = 0; i < specs.size(); ++i) modules[specs[i]->name()] = built[i];
  EmuRunner runner(&modules);
  const bool verbose = env_flag("SPARSEJIT_TEST_VERBOSE");
  for (const auto& s : specs) {
    const auto t0 = std::chrono::steady_clock::now();
    checks::check_spec(runner, *s);
    if (verbose)
      std::printf(
          "  %-62s %6.0f ms\n", s->name().c_str(),
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  runner.reset();
  if (!HasFailure()) std::system(("rm -rf " + dir).c_str());  // kept for debugging otherwise
}

// ---- GPU ----------------------------------------------------------------------------------------
class GpuRunner : public Runner {
 public:
  void* upload(const void* host, size_t bytes) override {
    uintptr_t p = 0;
    std::string err;
    if (!CudaDriver::instance().malloc(&p, bytes, &err) ||
        !CudaDriver::instance().copy_to_device(p, host, bytes, &err)) {
      ADD_FAILURE() << err;
      return nullptr;
    }
    blocks_.push_back(p);
    return reinterpret_cast<void*>(p);
  }
  void download(void* host, const void* device, size_t bytes) override {
    std::string err;
    if (!CudaDriver::instance().copy_to_host(host, reinterpret_cast<uintptr_t>(device), bytes,
                                             &err))
      ADD_FAILURE() << err;
  }
  std::string run(const CudaKernelSpecBase& spec, const std::vector<CudaLaunch>& launches,
                  void* params) override {
    std::string err;
    if (!CudaKernels::instance().run(spec, 0, nullptr, launches, params, &err)) return err;
    if (!CudaDriver::instance().synchronize(&err)) return spec.name() + ": " + err;
    return "";
  }
  void reset() override {
    for (uintptr_t p : blocks_) CudaDriver::instance().free(p);
    blocks_.clear();
  }
  ~GpuRunner() override { reset(); }

 private:
  std::vector<uintptr_t> blocks_;
};

TEST(CudaGpu, EveryKernelMatchesTheReference) {
  std::string why;
  if (!CudaKernels::instance().available(&why)) GTEST_SKIP() << why;
  if (CudaDriver::instance().device_count() == 0) GTEST_SKIP() << "no CUDA device";
  ASSERT_TRUE(CudaDriver::instance().ensure_context(0, &why)) << why;
  std::vector<CudaSpecPtr> specs = specs_under_test();
  if (env_flag("SPARSEJIT_TEST_GPU_ALL_VARIANTS")) {
    const auto all = enumerate_cuda_variants();
    specs.insert(specs.end(), all.begin(), all.end());
  }
  GpuRunner runner;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& s : specs) checks::check_spec(runner, *s);
  std::printf("[ gpu      ] %zu specs checked in %.1f s (compile included)\n", specs.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// ---- Launch plans (no device) -------------------------------------------------------------------
TEST(CudaLaunchPlan, WorkspaceAndGrids) {
  CudaSpmmChoice c;
  c.spec = spmm_spec(CudaStrategy::NnzSegment, CudaScalar::F32, IndexKind::I32, Reduce::Max, 1, 2,
                     16, sparsejit::Act::None, 8, 4);
  c.chunk = 32;
  SpmmLaunchPlan p = plan_spmm_launch(c, 100, 1000);
  EXPECT_EQ(p.num_chunks, 32);
  ASSERT_EQ(p.launches.size(), 2u);
  EXPECT_EQ(p.launches[0].entry, c.spec.name() + "_chunks");
  EXPECT_EQ(p.launches[1].entry, c.spec.name() + "_fixup");
  EXPECT_EQ(p.zero_bytes, 0u);
  EXPECT_GE(p.workspace_bytes, 32u * 2 * 32 * (4 + 8) + 32 * 8);
  EXPECT_EQ(p.partial_arg_offset % 256, 0u);
  EXPECT_EQ(p.tail_row_offset % 256, 0u);
  c.spec.strategy = CudaStrategy::NnzAtomic;
  c.spec.reduce = Reduce::Sum;
  p = plan_spmm_launch(c, 100, 1000);
  EXPECT_EQ(p.zero_bytes, 32u * 32 * 4);
  c.spec.strategy = CudaStrategy::RowGroup;
  p = plan_spmm_launch(c, 100, 1000);
  ASSERT_EQ(p.launches.size(), 1u);
  EXPECT_EQ(p.workspace_bytes, 0u);
  EXPECT_EQ(p.launches[0].grid.x, 4u);  // 100 rows x 8 lanes = 800 threads: 4 blocks of 256
  EXPECT_EQ(p.launches[0].grid.y, 1u);  // 32 features: one tile of 4 lanes x 2 float4
  EXPECT_TRUE(plan_spmm_launch(c, 0, 0).launches.empty());
}

}  // namespace
}  // namespace sparsejit::codegen
