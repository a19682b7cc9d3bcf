// The C++ API's PrunedConv2d (through the dispatcher) against at::conv2d.
#include <gtest/gtest.h>

#include <sparsejit/sparsejit.h>

TEST(PrunedConv2dApi, MatchesDenseConv) {
  at::manual_seed(0);
  auto w = at::randn({12, 8, 3, 3});
  w.mul_(at::rand_like(w) > 0.7);
  auto b = at::randn({12});
  auto x = at::randn({2, 8, 11, 11});
  auto m = sparsejit::PrunedConv2d::from_dense(w, b, {2, 2}, {1, 1}, {1, 1}, 1, true);
  EXPECT_EQ(m.nnz(), (w != 0).sum().item<int64_t>());
  auto want = at::relu(at::conv2d(x, w, b, {2, 2}, {1, 1}));
  EXPECT_TRUE(at::allclose(m.forward(x), want, 1e-4, 1e-4));
  EXPECT_THROW(m.forward(at::randn({2, 5, 11, 11})), c10::ValueError);
}
