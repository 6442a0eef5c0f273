// dual_residual's kernel against a naive loop.
#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

namespace opbridge::testing {
namespace {

template <typename T>
void check_dual_residual(Shape sx, Shape sy, double alpha) {
  Tensor x = Tensor::random<T>(sx, 3), y = Tensor::random<T>(sy, 4);
  auto out = run("dual_residual", {x, y}, {{"alpha", alpha}});
  const Shape& s = out[0].view.shape;
  auto vx = x.values<T>(), vy = y.values<T>(), r1 = out[0].values<T>(), r2 = out[1].values<T>();
  const T a = static_cast<T>(alpha);
  for (int64_t i = 0; i < out[0].view.numel(); ++i) {
    T xi = vx[broadcast_offset(s, sx, i)], yi = vy[broadcast_offset(s, sy, i)];
    EXPECT_EQ(r1[i], xi * a - yi);
    EXPECT_EQ(r2[i], yi * a - xi);
  }
}

TEST(DualResidualKernel, Float32) { check_dual_residual<float>({5, 40}, {5, 40}, 0.5); }
TEST(DualResidualKernel, Float64Broadcast) { check_dual_residual<double>({3, 1}, {1, 7}, -1.25); }
TEST(DualResidualKernel, DefaultAlphaIsOne) {
  Tensor x = Tensor::of<float>({2}, {1.f, 2.f}), y = Tensor::of<float>({2}, {3.f, 5.f});
  auto out = run("dual_residual", {x, y});
  EXPECT_EQ(out[0].values<float>(), (std::vector<float>{-2.f, -3.f}));
  EXPECT_EQ(out[1].values<float>(), (std::vector<float>{2.f, 3.f}));
}

}  // namespace
}  // namespace opbridge::testing
