// The CUDA generator, without a GPU: every variant the planner can pick compiles with NVRTC
// for sm_90 (skipped when libnvrtc cannot be loaded), names are unique, invalid specs are
// refused, and the planner picks the expected schedule from row statistics.
//
// All variants compile in about 20 s on two cores (530 variants, NVRTC 13.0, warm disk cache);
// SPARSEJIT_TEST_CUDA_VARIANT_SUBSET=1 compiles a representative subset instead (every op,
// strategy, dtype, vector width, reduce, value mode, activation and group size at least once;
// about 80 variants, 5 s). SPARSEJIT_TEST_CUDA_ARCH overrides the target (default sm_90).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "codegen/cuda_attention.h"
#include "codegen/cuda_launch.h"
#include "codegen/cuda_point_conv.h"
#include "codegen/cuda_spec.h"
#include "codegen/cuda_spmm.h"
#include "codegen/nvrtc.h"

namespace sparsejit::codegen {
namespace {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}

// The schedule axes the greedy cover looks at (defaults where a family has no such axis).
struct Axes {
  int64_t heads = 1;
  int32_t group = 32, split = 1, vec = 1;
  CudaStrategy strategy = CudaStrategy::RowGroup;
};

Axes axes_of(const CudaKernelSpecBase& b) {
  Axes a;
  if (const auto* s = dynamic_cast<const CudaSpmmSpec*>(&b)) {
    a = {s->heads, s->group, 1, s->vec, s->strategy};
  } else if (const auto* s = dynamic_cast<const CudaSddmmSpec*>(&b)) {
    a = {s->heads, s->group, s->split, s->vec, CudaStrategy::RowGroup};
  } else if (const auto* s = dynamic_cast<const CudaEdgeSoftmaxSpec*>(&b)) {
    a.heads = s->heads;
  } else if (const auto* s = dynamic_cast<const CudaAttentionSpec*>(&b)) {
    a.heads = s->heads;
    a.group = s->group;
  } else if (const auto* s = dynamic_cast<const CudaPointConvSpec*>(&b)) {
    a.vec = s->vec;
  }
  return a;
}

// Greedy cover: keeps a variant when it brings a (op, feature) pair not seen yet.
std::vector<CudaSpecPtr> representative(const std::vector<CudaSpecPtr>& all) {
  std::set<std::string> seen;
  std::vector<CudaSpecPtr> out;
  for (const auto& p : all) {
    const CudaKernelSpecBase& s = *p;
    const Axes a = axes_of(s);
    const std::string op = std::to_string(static_cast<int>(s.op()));
    std::vector<std::string> feats = {
        op + "dt" + cuda_scalar_name(s.dtype),
        op + "ix" + std::to_string(static_cast<int>(s.index)),
        op + "h" + std::to_string(a.heads),
        op + "g" + std::to_string(a.group) + "s" + std::to_string(a.split) + "st" +
            cuda_strategy_name(a.strategy),
        op + "vec" + std::to_string(a.vec * cuda_scalar_bytes(s.dtype)) + cuda_scalar_name(s.dtype),
    };
    if (const auto* m = dynamic_cast<const CudaSpmmSpec*>(&s)) {
      feats.push_back("r" + std::string(reduce_name(m->reduce)) + cuda_strategy_name(m->strategy));
      feats.push_back("vm" + std::to_string(m->value_mode));
      feats.push_back("act" + std::to_string(static_cast<int>(m->act)));
      feats.push_back(std::string("det") + (m->deterministic ? "1" : "0") +
                      cuda_strategy_name(m->strategy));
      feats.push_back("dt" + std::string(cuda_scalar_name(m->dtype)) +
                      cuda_strategy_name(m->strategy) + reduce_name(m->reduce));
    }
    if (s.op() == CudaOp::FilterConv) feats.push_back(s.name().substr(0, s.name().find("_oc")));
    bool fresh = false;
    for (const auto& f : feats) fresh |= seen.insert(f).second;
    if (fresh) out.push_back(p);
  }
  return out;
}

TEST(CudaSpec, VariantsAreValidAndUniquelyNamed) {
  const auto all = enumerate_cuda_variants();
  EXPECT_GE(all.size(), 100u);
  EXPECT_LE(all.size(), 700u);
  std::set<std::string> names;
  std::set<std::string> entry_names;
  std::map<CudaOp, int> per_op;
  for (const auto& p : all) {
    const CudaKernelSpecBase& s = *p;
    EXPECT_EQ(s.validate(), "") << s.name();
    EXPECT_TRUE(names.insert(s.name()).second) << "duplicate name " << s.name();
    for (const auto& e : s.entry_points()) EXPECT_TRUE(entry_names.insert(e).second) << e;
    per_op[s.op()]++;
    const std::string src = s.source();
    for (const auto& e : s.entry_points())
      EXPECT_NE(src.find("extern \"C\" __global__ void __launch_bounds__(" +
                         std::to_string(s.block) + ") " + e + "("),
                std::string::npos)
          << s.name();
    EXPECT_EQ(src.find("#include <"), std::string::npos) << s.name() << " includes a system header";
    EXPECT_EQ(src.find("#error"), std::string::npos)
        << s.name() << ": the kernel headers are not embedded, or the spec is invalid";
  }
  EXPECT_GT(per_op[CudaOp::Spmm], 0);
  EXPECT_GT(per_op[CudaOp::Sddmm], 0);
  EXPECT_GT(per_op[CudaOp::EdgeSoftmax], 0);
  EXPECT_GT(per_op[CudaOp::EdgeSoftmaxBackward], 0);
  EXPECT_GT(per_op[CudaOp::Attention], 0);
  EXPECT_GT(per_op[CudaOp::AttentionBackward], 0);
  EXPECT_GT(per_op[CudaOp::FilterConv], 0);
  EXPECT_GT(per_op[CudaOp::PointConv], 0);
  EXPECT_GT(per_op[CudaOp::PointConvMap], 0);
  EXPECT_GT(per_op[CudaOp::PointConvImplicit], 0);
}

TEST(CudaSpec, InvalidSpecsAreRefusedWithReasons) {
  CudaSpmmSpec s;
  s.features = 64;
  s.vec = 4;
  EXPECT_EQ(s.validate(), "");
  s.group = 3;
  EXPECT_NE(s.validate().find("group"), std::string::npos);
  s.group = 8;
  s.features = 30;  // not a multiple of 4
  EXPECT_NE(s.validate().find("divide"), std::string::npos);
  s.features = 64;
  s.dtype = CudaScalar::F64;  // 4 doubles = 32 bytes
  EXPECT_NE(s.validate().find("vec"), std::string::npos);
  s.dtype = CudaScalar::F32;
  s.strategy = CudaStrategy::NnzAtomic;
  s.reduce = Reduce::Max;
  EXPECT_NE(s.validate().find("atomic"), std::string::npos);
  s.reduce = Reduce::Sum;
  s.deterministic = true;
  EXPECT_NE(s.validate().find("deterministic"), std::string::npos);
  // An invalid spec still yields a source, which fails to compile with the reason.
  EXPECT_NE(s.source().find("#error"), std::string::npos);
}

TEST(CudaSpec, LayoutCoversTheRow) {
  int spmm_specs = 0;
  for (const auto& p : enumerate_cuda_variants()) {
    const auto* m = dynamic_cast<const CudaSpmmSpec*>(p.get());
    EXPECT_EQ(m != nullptr, p->op() == CudaOp::Spmm) << p->name();
    if (!m) continue;
    ++spmm_specs;
    const CudaSpmmSpec& s = *m;
    const SpmmLayout l = spmm_layout(s);
    const int64_t hf = s.heads * s.features;
    EXPECT_EQ(l.gf * l.gn, s.group) << s.name();
    EXPECT_GE(int64_t(l.tile) * l.tiles, hf) << s.name();
    EXPECT_LT(int64_t(l.tile) * (l.tiles - 1), hf) << s.name();
    if (s.strategy != CudaStrategy::RowGroup) {
      EXPECT_EQ(l.gn, 1) << s.name();
    }
  }
  EXPECT_GT(spmm_specs, 100);
}

TEST(CudaPlanner, BalancedRowsGetARowGroup) {
  CudaSpmmProblem p;
  p.features = 64;  // 16 float4 vectors: 8 lanes x 2 vectors
  CudaRowStats st{100000, 1000000, 30};
  CudaSpmmChoice c = plan_cuda_spmm(p, st);
  EXPECT_EQ(c.spec.strategy, CudaStrategy::RowGroup) << c.reason;
  EXPECT_EQ(c.spec.vec, 4);
  EXPECT_EQ(c.spec.group, 16) << c.reason;  // 8 over features x 2 over entries (mean 10)
  EXPECT_EQ(spmm_layout(c.spec).gf, 8);
  EXPECT_EQ(c.spec.validate(), "");

  // Narrow rows and short rows: one lane per row.
  p.features = 4;
  st = {100000, 200000, 6};
  c = plan_cuda_spmm(p, st);
  EXPECT_EQ(c.spec.strategy, CudaStrategy::RowGroup);
  EXPECT_EQ(c.spec.group, 1) << c.reason;

  // Misaligned operands: scalar loads.
  p.features = 64;
  p.max_vec_bytes = 4;
  EXPECT_EQ(plan_cuda_spmm(p, st).spec.vec, 1);
  p.max_vec_bytes = 8;
  EXPECT_EQ(plan_cuda_spmm(p, st).spec.vec, 2);
  // Odd widths: scalar loads whatever the alignment.
  p.max_vec_bytes = 16;
  p.features = 7;
  EXPECT_EQ(plan_cuda_spmm(p, st).spec.vec, 1);
  p.dtype = CudaScalar::BF16;
  p.features = 24;
  EXPECT_EQ(plan_cuda_spmm(p, st).spec.vec, 8);
}

TEST(CudaPlanner, SkewedRowsGetChunks) {
  CudaSpmmProblem p;
  p.features = 32;
  CudaRowStats st{1000000, 10000000, 200000};  // power law: one row of 200k
  CudaSpmmChoice c = plan_cuda_spmm(p, st);
  EXPECT_EQ(c.spec.strategy, CudaStrategy::NnzAtomic) << c.reason;
  EXPECT_GE(c.chunk, 32);
  EXPECT_EQ(spmm_layout(c.spec).gn, 1);
  EXPECT_EQ(c.spec.validate(), "");

  // Deterministic, or max / min: ordered segments, never atomics.
  p.deterministic = true;
  c = plan_cuda_spmm(p, st);
  EXPECT_EQ(c.spec.strategy, CudaStrategy::NnzSegment) << c.reason;
  EXPECT_EQ(c.spec.validate(), "");
  p.deterministic = false;
  p.reduce = Reduce::Max;
  c = plan_cuda_spmm(p, st);
  EXPECT_EQ(c.spec.strategy, CudaStrategy::NnzSegment) << c.reason;

  // Moderately skewed (longest row spans few chunks): segments.
  p.reduce = Reduce::Sum;
  st = {100000, 1000000, 2000};
  c = plan_cuda_spmm(p, st);
  EXPECT_EQ(c.spec.strategy, CudaStrategy::NnzSegment) << c.reason;

  // A handful of very long rows: chunks even though they are all alike.
  st = {4, 400000, 100000};
  c = plan_cuda_spmm(p, st);
  EXPECT_NE(c.spec.strategy, CudaStrategy::RowGroup) << c.reason;
  EXPECT_GE(spmm_num_chunks(st.nnz, c.chunk), 64);

  // Empty matrix: a valid row-group spec.
  st = {0, 0, 0};
  c = plan_cuda_spmm(p, st);
  EXPECT_EQ(c.spec.validate(), "");
  EXPECT_EQ(spmm_num_chunks(0, 32), 1);
}

TEST(CudaPlanner, SddmmAndSoftmax) {
  CudaSddmmSpec s = plan_cuda_sddmm(CudaScalar::F32, IndexKind::I32, 4, 64, 16);
  EXPECT_EQ(s.vec, 4);
  EXPECT_EQ(s.group, 16);
  EXPECT_EQ(s.split, 1);
  EXPECT_EQ(s.validate(), "");
  s = plan_cuda_sddmm(CudaScalar::F32, IndexKind::I32, 1, 2048, 16);  // 512 vectors
  EXPECT_EQ(s.group, 32);
  EXPECT_EQ(s.split, 4);
  EXPECT_EQ(s.validate(), "");
  s = plan_cuda_sddmm(CudaScalar::F16, IndexKind::I64, 2, 3, 16);
  EXPECT_EQ(s.vec, 1);
  EXPECT_EQ(s.group, 4);
  EXPECT_EQ(plan_cuda_edge_softmax(CudaScalar::BF16, IndexKind::I64, 8, true).op(),
            CudaOp::EdgeSoftmaxBackward);
}

TEST(CudaPlanner, Attention) {
  CudaAttentionSpec s = plan_cuda_attention(CudaScalar::F32, IndexKind::I32, 4, 32, 32, 0, false,
                                         false);
  EXPECT_EQ(s.group, 16);  // two elements per lane
  EXPECT_EQ(s.validate(), "");
  EXPECT_EQ(s.entry_points().size(), 1u);
  s = plan_cuda_attention(CudaScalar::F64, IndexKind::I64, 8, 1, 8, 1, true, true);
  EXPECT_EQ(s.group, 4);
  EXPECT_EQ(s.entry_points().size(), 2u);  // the rows pass, then the columns pass
  EXPECT_NE(s.name().find("_bias"), std::string::npos);
  s = plan_cuda_attention(CudaScalar::F32, IndexKind::I32, 1, 2048, 8, 0, false, false);
  EXPECT_NE(s.validate().find("head widths"), std::string::npos);  // the CPU runs it
  s = plan_cuda_attention(CudaScalar::BF16, IndexKind::I32, 1, 8, 8, 0, false, false);
  EXPECT_NE(s.validate().find("float32 or float64"), std::string::npos);
  s = plan_cuda_attention(CudaScalar::F32, IndexKind::I32, 1, 4, 8, 1, false, false);
  EXPECT_NE(s.validate().find("additive mode has D = 1"), std::string::npos);
  const auto l = plan_attention_launch(
      plan_cuda_attention(CudaScalar::F32, IndexKind::I32, 2, 16, 16, 0, false, true), 100, 7);
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0].grid.x, (100u * 2 * 8 + 255) / 256);
  EXPECT_EQ(l[1].grid.x, (7u * 2 * 8 + 255) / 256);
}

TEST(Nvrtc, EveryVariantCompiles) {
  std::string why;
  if (!Nvrtc::instance().available(&why)) GTEST_SKIP() << "NVRTC not available: " << why;
  const char* arch_env = std::getenv("SPARSEJIT_TEST_CUDA_ARCH");
  const std::string arch = arch_env && *arch_env ? arch_env : "sm_90";
  const auto all = enumerate_cuda_variants();
  const bool full = !env_flag("SPARSEJIT_TEST_CUDA_VARIANT_SUBSET");
  const std::vector<CudaSpecPtr> specs = full ? all : representative(all);
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::vector<std::string> failures;
  const auto t0 = std::chrono::steady_clock::now();
  auto worker = [&] {
    for (size_t i = next++; i < specs.size(); i = next++) {
      const NvrtcOutput o = Nvrtc::instance().compile(specs[i]->source(), specs[i]->name(), arch);
      if (!o.ok || o.binary.empty()) {
        std::lock_guard<std::mutex> g(mu);
        failures.push_back(specs[i]->name() + ":\n" + o.log);
      }
    }
  };
  unsigned n = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < n; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "[ nvrtc    ] compiled %zu of %zu variants for %s with NVRTC %s in %.1f s on %u threads%s\n",
      specs.size(), all.size(), arch.c_str(), Nvrtc::instance().version_string().c_str(), s, n,
      full ? "" : " (subset: SPARSEJIT_TEST_CUDA_VARIANT_SUBSET is set)");
  for (const auto& f : failures) ADD_FAILURE() << f;
  EXPECT_TRUE(failures.empty()) << failures.size() << " variants failed to compile";
}

TEST(Nvrtc, CompileErrorsNameTheKernelAndCarryTheLog) {
  std::string why;
  if (!Nvrtc::instance().available(&why)) GTEST_SKIP() << "NVRTC not available: " << why;
  const NvrtcOutput o = Nvrtc::instance().compile(
      "extern \"C\" __global__ void broken(float* x) { x[0] = undefined_name; }", "broken_kernel");
  EXPECT_FALSE(o.ok);
  EXPECT_NE(o.log.find("broken_kernel"), std::string::npos) << o.log;
  EXPECT_NE(o.log.find("undefined_name"), std::string::npos) << o.log;
}

TEST(Nvrtc, TargetsFallBackToPtxForUnknownArchitectures) {
  std::string why;
  if (!Nvrtc::instance().available(&why)) GTEST_SKIP() << "NVRTC not available: " << why;
  EXPECT_EQ(Nvrtc::instance().target_for(90), "sm_90");
  // A compute capability newer than any this NVRTC knows: PTX for the newest it knows.
  const std::string t = Nvrtc::instance().target_for(999);
  EXPECT_EQ(t.rfind("compute_", 0), 0u) << t;
}

}  // namespace
}  // namespace sparsejit::codegen
