// foo's kernel against a naive loop, and its same-shape rule.
#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

namespace opbridge::testing {
namespace {

TEST(FooKernel, AddsElementwise) {
  Tensor x = Tensor::random<float>({9, 11}, 5), y = Tensor::random<float>({9, 11}, 6);
  auto z = run("foo", {x, y})[0].values<float>();
  auto vx = x.values<float>(), vy = y.values<float>();
  for (size_t i = 0; i < z.size(); ++i) EXPECT_EQ(z[i], vx[i] + vy[i]);
}

TEST(FooKernel, FloatPlusInt8) {
  // The mixed-type form: int8 y, float32 x; every int8 is exact in float.
  Tensor x = Tensor::random<float>({4, 5}, 7);
  std::vector<int8_t> yv(20);
  for (size_t i = 0; i < yv.size(); ++i) yv[i] = static_cast<int8_t>(int(i * 37 % 256) - 128);
  Tensor y = Tensor::of<int8_t>({4, 5}, yv);
  auto z = run("foo", {x, y})[0].values<float>();
  auto vx = x.values<float>();
  for (size_t i = 0; i < z.size(); ++i) EXPECT_EQ(z[i], vx[i] + float(yv[i]));
}

TEST(FooKernel, RejectsDifferentShapes) {
  Tensor x = Tensor::random<float>({2, 3}, 5), y = Tensor::random<float>({3}, 6);
  try {
    run("foo", {x, y});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must have the same shape"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace opbridge::testing
