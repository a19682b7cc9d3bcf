// The CUDA filter-conv generator and planner, without a GPU (codegen/cuda_filter_conv.h):
// refused specs name the reason, the planner's tile fills the GPU without idle channel slots,
// and the launch covers every pixel and output channel exactly once.
#include <gtest/gtest.h>

#include "codegen/cuda_filter_conv.h"

namespace sparsejit::codegen {
namespace {

CudaFilterConvSpec conv3x3() {
  CudaFilterConvProblem p;
  p.r = p.s = 3;
  p.pad_h = p.pad_w = 1;
  p.c_out = 64;
  p.pixels = 8 * 56 * 56;
  return plan_cuda_filter_conv(p);
}

TEST(CudaFilterConvSpec, InvalidSpecsAreRefusedWithReasons) {
  CudaFilterConvSpec s = conv3x3();
  ASSERT_EQ(s.validate(), "");
  EXPECT_NE(s.source().find("static constexpr int R = 3, S = 3;"), std::string::npos);
  s.act = Act::Gelu;
  EXPECT_NE(s.validate().find("ReLU"), std::string::npos);
  s.act = Act::Relu;
  s.conv.stride_h = 0;
  EXPECT_NE(s.validate().find("stride"), std::string::npos);
  s.conv.stride_h = 1;
  s.conv.channels_per_block = 0;
  EXPECT_NE(s.validate().find("channels_per_block"), std::string::npos);
  s.conv.channels_per_block = 4;
  s.index = IndexKind::I32;
  EXPECT_NE(s.validate().find("int64"), std::string::npos);
  EXPECT_NE(s.source().find("#error"), std::string::npos);
}

TEST(CudaFilterConvSpec, PlannerSizesTheTileToTheLayer) {
  const CudaFilterConvSpec big = conv3x3();
  EXPECT_EQ(big.block, 256);
  EXPECT_EQ(big.conv.channels_per_block, 8);  // 98 pixel blocks x 64 channels: plenty
  EXPECT_EQ(big.name(), "filter_conv_f32_k3x3_s1x1_p1x1_d1x1_oc8");
  CudaFilterConvProblem small;
  small.r = small.s = 1;
  small.c_out = 512;
  small.pixels = 7 * 7;  // one image of a late ResNet stage
  small.relu = true;
  small.dtype = CudaScalar::F16;
  const CudaFilterConvSpec s = plan_cuda_filter_conv(small);
  EXPECT_EQ(s.block, 64);
  EXPECT_EQ(s.conv.channels_per_block, 1);
  EXPECT_EQ(s.act, Act::Relu);
  EXPECT_EQ(s.validate(), "");
}

TEST(CudaFilterConvSpec, LaunchCoversPixelsAndChannels) {
  const CudaFilterConvSpec s = conv3x3();
  const auto l = plan_filter_conv_launch(s, 1000, 13);
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].entry, s.name());
  EXPECT_EQ(l[0].block.x, 256u);
  EXPECT_EQ(l[0].grid.x, 4u);  // ceil(1000 / 256)
  EXPECT_EQ(l[0].grid.y, 2u);  // ceil(13 / 8)
  EXPECT_TRUE(plan_filter_conv_launch(s, 0, 13).empty());
  EXPECT_TRUE(plan_filter_conv_launch(s, 10, 0).empty());
}

}  // namespace
}  // namespace sparsejit::codegen
