// corner_pool's kernels against naive loops: each output position scans its own stretch of the
// row or column from the sweep's start (torch.cummax's rule, written out), on one thread and four.
// The values hold ties, NaNs and both zeros, so the rule's every branch decides something.
#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

namespace opbridge::testing {
namespace {

constexpr const char* kModes[] = {"top", "bottom", "left", "right"};

// Values from a small set (ties), with NaNs and -0.0 among them.
std::vector<double> tie_values(int64_t n, uint32_t seed, bool with_nan) {
  std::mt19937 gen(seed);
  const double pool[] = {-1.0, 0.0, -0.0, 1.0, 2.0, 2.0, 3.0, -2.5, std::numeric_limits<double>::quiet_NaN()};
  std::uniform_int_distribution<int> pick(0, with_nan ? 8 : 7);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = pool[pick(gen)];
  return v;
}

struct Shape4 {
  int64_t n, c, h, w;
  int64_t numel() const { return n * c * h * w; }
};

// The flat index of the k-th position (k = 0 at the sweep's start) of the line through (p, h, w).
int64_t line_index(const std::string& mode, const Shape4& s, int64_t plane, int64_t h, int64_t w, int64_t k) {
  if (mode == "bottom") h = k;
  if (mode == "top") h = s.h - 1 - k;
  if (mode == "right") w = k;
  if (mode == "left") w = s.w - 1 - k;
  return (plane * s.h + h) * s.w + w;
}

// How many positions from the sweep's start up to and including (h, w).
int64_t steps_to(const std::string& mode, const Shape4& s, int64_t h, int64_t w) {
  if (mode == "bottom") return h + 1;
  if (mode == "top") return s.h - h;
  if (mode == "right") return w + 1;
  return s.w - w;
}

// The flat index of where output (plane, h, w)'s maximum comes from, by a fresh scan.
int64_t holder(const std::string& mode, const Shape4& s, const std::vector<double>& x, int64_t plane, int64_t h,
               int64_t w) {
  int64_t best = line_index(mode, s, plane, h, w, 0);
  for (int64_t k = 1; k < steps_to(mode, s, h, w); ++k) {
    const int64_t i = line_index(mode, s, plane, h, w, k);
    if (std::isnan(x[i]) || (!std::isnan(x[best]) && x[i] >= x[best])) best = i;
  }
  return best;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

const Shape4 kShapes[] = {{2, 3, 5, 7}, {1, 2, 1, 9}, {1, 1, 8, 1}, {3, 5, 4, 4}, {1, 4, 17, 33}};

TEST(CornerPoolKernel, ForwardMatchesANaiveScanBitForBit) {
  for (const Shape4& s : kShapes)
    for (const char* mode : kModes)
      for (bool threaded : {false, true}) {
        std::vector<double> xv = tie_values(s.numel(), 3, true);
        Tensor x = Tensor::of<double>({s.n, s.c, s.h, s.w}, xv);
        std::vector<double> got = run("corner_pool", {x}, {{"mode", std::string(mode)}}, threaded)[0].values<double>();
        ASSERT_EQ(got.size(), xv.size());
        for (int64_t p = 0; p < s.n * s.c; ++p)
          for (int64_t h = 0; h < s.h; ++h)
            for (int64_t w = 0; w < s.w; ++w) {
              const int64_t o = (p * s.h + h) * s.w + w;
              EXPECT_TRUE(same_bits(got[o], xv[holder(mode, s, xv, p, h, w)])) << mode << " at " << o;
            }
      }
}

// float32 takes the same path as the 16-bit types' widened compare: check it on plain values.
TEST(CornerPoolKernel, Float32ForwardIsTheSameCopy) {
  const Shape4 s{2, 3, 6, 5};
  std::vector<double> xv = tie_values(s.numel(), 4, true);
  std::vector<float> xf(xv.begin(), xv.end());
  for (const char* mode : kModes) {
    std::vector<float> got =
        run("corner_pool", {Tensor::of<float>({s.n, s.c, s.h, s.w}, xf)}, {{"mode", std::string(mode)}})[0]
            .values<float>();
    for (int64_t p = 0; p < s.n * s.c; ++p)
      for (int64_t h = 0; h < s.h; ++h)
        for (int64_t w = 0; w < s.w; ++w) {
          const int64_t o = (p * s.h + h) * s.w + w;
          const float want = xf[holder(mode, s, xv, p, h, w)];
          EXPECT_EQ(std::memcmp(&got[o], &want, sizeof want), 0) << mode << " at " << o;
        }
  }
}

// The gradient: each output's incoming gradient added to its holder, outputs taken in sweep order
// (the order PyTorch's scatter_add over cummax's indices adds them).
TEST(CornerPoolKernel, BackwardSendsEachGradientToItsMaximum) {
  for (const Shape4& s : kShapes)
    for (const char* mode : kModes)
      for (bool threaded : {false, true}) {
        std::vector<double> xv = tie_values(s.numel(), 5, true);
        Tensor x = Tensor::of<double>({s.n, s.c, s.h, s.w}, xv);
        Tensor g = Tensor::random<double>({s.n, s.c, s.h, s.w}, 6);
        std::vector<double> gv = g.values<double>(), want(xv.size(), 0.0);
        const std::string m = mode;
        const bool vertical = m == "top" || m == "bottom";
        const int64_t lines = vertical ? s.w : s.h, length = vertical ? s.h : s.w;
        for (int64_t p = 0; p < s.n * s.c; ++p)
          for (int64_t line = 0; line < lines; ++line)
            for (int64_t k = 0; k < length; ++k) {
              const int64_t o = line_index(m, s, p, vertical ? 0 : line, vertical ? line : 0, k);
              const int64_t h = (o / s.w) % s.h, w = o % s.w;
              want[holder(m, s, xv, p, h, w)] += gv[o];
            }
        std::vector<double> got =
            run("corner_pool_backward", {g, x}, {{"mode", m}}, threaded)[0].values<double>();
        for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same_bits(got[i], want[i])) << mode << " at " << i;
      }
}

TEST(CornerPoolKernel, EmptyPlanesAndLines) {
  for (const char* mode : kModes)
    for (const Shape4& s : {Shape4{0, 3, 4, 4}, Shape4{2, 0, 4, 4}, Shape4{1, 2, 0, 5}, Shape4{1, 2, 5, 0}}) {
      Tensor x = Tensor::of<float>({s.n, s.c, s.h, s.w}, {});
      EXPECT_EQ(run("corner_pool", {x}, {{"mode", std::string(mode)}})[0].view.numel(), 0);
      EXPECT_EQ(run("corner_pool_backward", {x, x}, {{"mode", std::string(mode)}})[0].view.numel(), 0);
    }
}

TEST(CornerPoolKernel, AnUnknownModeIsAnError) {
  Tensor x = Tensor::random<float>({1, 2, 3, 3}, 7);
  for (const std::string mode : {"", "Top", "diagonal"}) {
    const std::string want = "mode must be 'top', 'bottom', 'left' or 'right', got '" + mode + "'";
    EXPECT_NE(error_of([&] { run("corner_pool", {x}, {{"mode", mode}}); }).find(want), std::string::npos);
    EXPECT_NE(error_of([&] { run("corner_pool_backward", {x, x}, {{"mode", mode}}); }).find(want), std::string::npos);
  }
  // Also with nothing to compute.
  Tensor empty = Tensor::of<float>({0, 2, 3, 3}, {});
  EXPECT_NE(error_of([&] { run("corner_pool", {empty}, {{"mode", std::string("up")}}); }).find("got 'up'"),
            std::string::npos);
}

}  // namespace
}  // namespace opbridge::testing
