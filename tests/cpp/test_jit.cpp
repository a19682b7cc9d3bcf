// The JIT through its op-agnostic interface, without ATen: specs of two op families compile
// through CpuJit::lookup, run through the one calling convention (sparsejit_entry(const
// void* launch) on the op's launch struct), and match the generic kernels bit for bit.
// Skipped when no host compiler is found or the JIT is off.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <stdexcept>
#include <vector>

#include "codegen/cpu_attention_spec.h"
#include "codegen/cpu_point_conv_spec.h"
#include "codegen/cpu_jit.h"
#include "codegen/cpu_row_tile_spec.h"
#include "codegen/cpu_sddmm_spec.h"
#include "codegen/cpu_spmm_spec.h"
#include "kernels/cpu/kernels.h"
#include "tests/cpp/test_util.h"

namespace sparsejit {
namespace {

using codegen::CpuJit;
using codegen::CpuRowTileSpec;
using codegen::CpuSddmmSpec;
using codegen::CpuSpmmSpec;

std::vector<float> as_float(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(JitSpec, NamesAndKeysAreDistinctAcrossOps) {
  CpuSpmmSpec spmm;
  spmm.features = 64;
  CpuSddmmSpec sddmm;
  sddmm.features = 64;
  EXPECT_EQ(spmm.op(), OpKind::Spmm);
  EXPECT_EQ(sddmm.op(), OpKind::Sddmm);
  EXPECT_NE(spmm.packed_key(), sddmm.packed_key());
  EXPECT_NE(spmm.name(), sddmm.name());
  std::set<uint64_t> keys;
  for (Reduce r : kAllReduces)
    for (Act a : {Act::None, Act::Relu, Act::Gelu}) {
      CpuSpmmSpec s = spmm;
      s.reduce = r;
      s.act = a;
      EXPECT_TRUE(keys.insert(s.packed_key()).second) << s.name();
      EXPECT_NE(s.source().find("extern \"C\" void sparsejit_entry(const void* launch)"),
                std::string::npos);
    }
}

TEST(JitSpec, RowTileWidthsAreKeyedAndChecked) {
  std::set<uint64_t> keys;
  std::set<std::string> names;
  for (int64_t w : {8, 16, 64})
    for (int64_t w2 : {0, 8, 16, 64}) {
      CpuRowTileSpec s;
      s.width = w;
      s.width2 = w2;
      EXPECT_EQ(s.op(), OpKind::Rgms);
      EXPECT_TRUE(keys.insert(s.packed_key()).second) << s.name();
      EXPECT_TRUE(names.insert(s.name()).second) << s.name();
      EXPECT_NE(s.source().find(", " + std::to_string(w2) + ">("), std::string::npos);
    }
  CpuRowTileSpec bad;
  bad.width = 16;
  bad.width2 = CpuRowTileSpec::kMaxWidth2 + 1;
  try {
    bad.source();
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("width2"), std::string::npos) << e.what();
  }
}

TEST(JitSpec, UnsupportedValuesThrowNamingThem) {
  CpuSpmmSpec s;
  s.features = 8;
  s.dtype = ScalarKind::F16;  // float16 runs through the float32 kernels, never compiled
  EXPECT_THROW(s.source(), std::invalid_argument);
  s.dtype = static_cast<ScalarKind>(42);
  try {
    s.name();
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("42"), std::string::npos) << e.what();
  }
}

TEST(Jit, SpmmAndSddmmMatchTheGenericKernelsBitForBit) {
  codegen::JitInfo probe;
  CpuSpmmSpec spec;
  spec.dtype = ScalarKind::F32;
  spec.index = IndexKind::I32;
  spec.reduce = Reduce::Mean;
  spec.value_mode = 1;
  spec.heads = 1;
  spec.features = 24;
  spec.act = Act::Relu;
  spec.prefetch = 8;
  codegen::EntryFn spmm = CpuJit::instance().lookup(spec, &probe);
  if (spmm == nullptr) GTEST_SKIP() << "JIT unavailable: " << probe.error;

  const auto a = testing::random_csr<int32_t>(300, 200, 6.0, true, 7);
  const int64_t F = spec.features;
  const auto vals = as_float(testing::random_vec(a.nnz(), 1));
  const auto x = as_float(testing::random_vec(a.cols * F, 2));
  cpu::SpmmArgs args;
  args.rows = a.rows;
  args.features = F;
  args.value_heads = 1;
  args.reduce = Reduce::Mean;
  args.act = Act::Relu;
  args.scale = 0.5f;
  args.num_threads = 3;
  args.min_parallel_work = 0;
  std::vector<float> jit_out(a.rows * F, -7.0f), ref_out(a.rows * F, -9.0f);
  const cpu::SpmmLaunch launch{args, a.rowptr.data(), a.col.data(), vals.data(), x.data(),
                               jit_out.data(), nullptr};
  spmm(&launch);
  cpu::spmm<float, int32_t>(args, a.rowptr.data(), a.col.data(), vals.data(), x.data(),
                            ref_out.data(), nullptr);
  EXPECT_TRUE(same_bits(jit_out, ref_out));

  CpuSddmmSpec sspec;
  sspec.dtype = ScalarKind::F32;
  sspec.index = IndexKind::I32;
  sspec.heads = 2;
  sspec.features = 20;
  codegen::EntryFn sddmm = CpuJit::instance().lookup(sspec, &probe);
  ASSERT_NE(sddmm, nullptr) << probe.error;
  const int64_t HF = sspec.heads * sspec.features;
  const auto q = as_float(testing::random_vec(a.rows * HF, 3));
  const auto k = as_float(testing::random_vec(a.cols * HF, 4));
  cpu::SddmmArgs sargs;
  sargs.rows = a.rows;
  sargs.heads = sspec.heads;
  sargs.features = sspec.features;
  sargs.num_threads = 3;
  sargs.min_parallel_work = 0;
  std::vector<float> jit_s(a.nnz() * sspec.heads, -7.0f), ref_s(a.nnz() * sspec.heads, -9.0f);
  const cpu::SddmmLaunch slaunch{sargs, a.rowptr.data(), a.col.data(), q.data(), k.data(),
                                 jit_s.data()};
  sddmm(&slaunch);
  cpu::sddmm<float, int32_t>(a.rows, sspec.heads, sspec.features, a.rowptr.data(), a.col.data(),
                             q.data(), k.data(), ref_s.data(), 3);
  EXPECT_TRUE(same_bits(jit_s, ref_s));

  // A second lookup is a memory hit returning the same entry point.
  codegen::JitInfo again;
  EXPECT_EQ(CpuJit::instance().lookup(spec, &again), spmm);
  EXPECT_TRUE(again.memory_hit);
}

TEST(JitSpec, AttentionSpecsAreDistinctAndRejectWhatTheyCannotCompile) {
  using codegen::CpuAttentionSpec;
  std::set<uint64_t> keys;
  std::set<std::string> names;
  for (auto mode : {attention::Mode::Dot, attention::Mode::Additive, attention::Mode::GATv2})
    for (int64_t h : {1, 4, 64})
      for (int64_t d : {1, 16, 1024}) {
        CpuAttentionSpec s;
        s.mode = mode;
        s.heads = h;
        s.qk_width = d;
        s.v_width = 16;
        EXPECT_EQ(s.op(), OpKind::Attention);
        EXPECT_TRUE(keys.insert(s.packed_key()).second) << s.name();
        EXPECT_TRUE(names.insert(s.name()).second) << s.name();
        if (CpuAttentionSpec::supports(h, d, 16))
          EXPECT_NE(s.source().find("extern \"C\" void sparsejit_entry(const void* launch)"),
                    std::string::npos);
        else
          EXPECT_THROW(s.source(), std::invalid_argument);
      }
  CpuAttentionSpec spmm_like;
  spmm_like.heads = 1;
  spmm_like.qk_width = 64;
  spmm_like.v_width = 64;
  CpuSddmmSpec sddmm;
  sddmm.features = 64;
  EXPECT_NE(spmm_like.packed_key(), sddmm.packed_key());
  EXPECT_FALSE(CpuAttentionSpec::supports(65, 16, 16));
  EXPECT_FALSE(CpuAttentionSpec::supports(4, 16, 2048));
  // bfloat16: a forward-only kernel with bfloat16 storage and float32 arithmetic; float16
  // runs through the float32 kernel.
  spmm_like.dtype = ScalarKind::BF16;
  EXPECT_NE(spmm_like.source().find("float, int64_t, sparsejit::bf16>"), std::string::npos)
      << spmm_like.source();
  EXPECT_TRUE(keys.insert(spmm_like.packed_key()).second);
  spmm_like.dtype = ScalarKind::F16;
  EXPECT_THROW(spmm_like.source(), std::invalid_argument);
}

TEST(JitSpec, ConvOutputStationarySpecsAreDistinctAndRejectBadWidths) {
  using codegen::CpuPointConvSpec;
  std::set<uint64_t> keys;
  std::set<std::string> names;
  for (auto dt : {ScalarKind::F32, ScalarKind::F64, ScalarKind::BF16})
    for (int64_t ci : {1, 16, 1024})
      for (int64_t co : {8, 16, 1024}) {
        CpuPointConvSpec s;
        s.dtype = dt;
        s.c_in = ci;
        s.c_out = co;
        EXPECT_EQ(s.op(), OpKind::PointConv);
        EXPECT_TRUE(keys.insert(s.packed_key()).second) << s.name();
        EXPECT_TRUE(names.insert(s.name()).second) << s.name();
        EXPECT_NE(s.source().find("point_conv_detail::rows<"), std::string::npos) << s.name();
      }
  CpuPointConvSpec bad;
  bad.c_in = 16;
  bad.c_out = 12;  // not a multiple of 8 float32 lanes
  EXPECT_THROW(bad.source(), std::invalid_argument);
  bad.c_out = 16;
  bad.c_in = 0;
  EXPECT_THROW(bad.source(), std::invalid_argument);
  bad.c_in = 2048;
  EXPECT_THROW(bad.source(), std::invalid_argument);
  bad.c_in = 16;
  bad.dtype = ScalarKind::F16;
  EXPECT_THROW(bad.source(), std::invalid_argument);
  bad.dtype = ScalarKind::F64;
  bad.c_out = 12;  // a multiple of 4 float64 lanes
  EXPECT_NO_THROW(bad.source());
}

}  // namespace
}  // namespace sparsejit
