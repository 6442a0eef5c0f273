// resize_bicubic's kernel against a naive loop written from the definition: Keys' kernel as a
// function of distance, half-pixel source coordinates, edge pixels repeated.
#include <cmath>
#include <functional>
#include <string>

#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

namespace opbridge::testing {
namespace {

double keys(double d) {
  const double a = -0.75;
  d = std::abs(d);
  if (d <= 1) return (a + 2) * d * d * d - (a + 3) * d * d + 1;
  if (d < 2) return a * d * d * d - 5 * a * d * d + 8 * a * d - 4 * a;
  return 0;
}

template <typename T>
void check_resize(Shape shape, float sh, float sw, double tol) {
  Tensor x = Tensor::random<T>(shape, 7);
  Tensor scales = Tensor::of<float>({4}, {1.0f, 1.0f, sh, sw});
  Tensor y = run("resize_bicubic", {x, scales})[0];
  const int64_t n = shape[0], c = shape[1], h = shape[2], w = shape[3];
  const int64_t oh = static_cast<int64_t>(std::floor(h * double(sh))), ow = static_cast<int64_t>(std::floor(w * double(sw)));
  ASSERT_EQ(y.view.shape, (Shape{n, c, oh, ow}));
  auto vx = x.values<T>(), vy = y.values<T>();
  for (int64_t p = 0; p < n * c; ++p)
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox) {
        const double sy = (oy + 0.5) / double(sh) - 0.5, sx = (ox + 0.5) / double(sw) - 0.5;
        const int64_t by = static_cast<int64_t>(std::floor(sy)), bx = static_cast<int64_t>(std::floor(sx));
        double want = 0;
        for (int64_t iy = by - 1; iy <= by + 2; ++iy)
          for (int64_t ix = bx - 1; ix <= bx + 2; ++ix) {
            const int64_t cy = std::clamp<int64_t>(iy, 0, h - 1), cx = std::clamp<int64_t>(ix, 0, w - 1);
            want += keys(sy - iy) * keys(sx - ix) * double(vx[(p * h + cy) * w + cx]);
          }
        EXPECT_NEAR(double(vy[(p * oh + oy) * ow + ox]), want, tol) << p << " " << oy << " " << ox;
      }
}

TEST(ResizeBicubicKernel, Upscale) { check_resize<float>({2, 3, 5, 7}, 2.0f, 1.5f, 2e-5); }
TEST(ResizeBicubicKernel, DownscaleFloat64) { check_resize<double>({1, 2, 9, 8}, 0.5f, 0.75f, 1e-6); }
TEST(ResizeBicubicKernel, OddScalesAndOnePixel) {
  check_resize<double>({1, 1, 4, 6}, 1.7f, 2.3f, 1e-6);
  check_resize<float>({1, 1, 1, 1}, 3.0f, 1.0f, 1e-6);
}
TEST(ResizeBicubicKernel, RejectsBadScales) {
  Tensor x = Tensor::random<float>({1, 1, 4, 4}, 1);
  EXPECT_THROW(run("resize_bicubic", {x, Tensor::of<float>({4}, {1, 1, 0.1f, 2})}), Error);  // empty output
  EXPECT_THROW(run("resize_bicubic", {x, Tensor::of<float>({4}, {2, 1, 2, 2})}), Error);      // batch scale
}

TEST(ResizeBicubicKernel, EmptyBatchBuildsNothingForAHugeScale) {
  // No image to resize: the output is empty at once, without tables sized by the scale.
  Tensor x = Tensor::random<float>({0, 3, 4, 4}, 1);
  Tensor y = run("resize_bicubic", {x, Tensor::of<float>({4}, {1, 1, 2.5e7f, 2.5e7f})})[0];
  EXPECT_EQ(y.view.shape, (Shape{0, 3, 100000000, 100000000}));
}

TEST(ResizeBicubicKernel, SizesBeyondInt64AreRefusedNamingAxisAndScale) {
  Tensor empty = Tensor::random<float>({0, 3, 4, 4}, 1), one = Tensor::random<float>({1, 1, 4, 4}, 1);
  std::string e = error_of([&] { run("resize_bicubic", {empty, Tensor::of<float>({4}, {1, 1, 1e18f * 4, 2})}); });
  EXPECT_NE(e.find("scale_h = 4e+18 on H = 4 gives an output size of 1.6e+19, which does not fit in int64"),
            std::string::npos) << e;
  e = error_of([&] { run("resize_bicubic", {one, Tensor::of<float>({4}, {1, 1, 1e9f, 1e9f})}); });
  EXPECT_NE(e.find("scales 1e+09 x 1e+09 give an output of shape [1, 1, 4000000000, 4000000000], which is too large"),
            std::string::npos) << e;
}

}  // namespace
}  // namespace opbridge::testing
