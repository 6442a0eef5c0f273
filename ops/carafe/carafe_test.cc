// carafe's kernels against naive loops over every output pixel and window position (mmcv's
// definition), on one thread and many.
#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

#include <cmath>
#include <limits>
#include <string>

namespace opbridge::testing {
namespace {

struct Case {
  int64_t n, c, h, w, k, groups, s;
};

// Visits every (output element, window position inside the image) with the flat indices of the
// feature, mask and output values it combines.
template <typename F>
void each_term(const Case& p, F&& f) {
  const int64_t ho = p.h * p.s, wo = p.w * p.s, r = (p.k - 1) / 2, mc = p.groups * p.k * p.k;
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t c = 0; c < p.c; ++c)
      for (int64_t oy = 0; oy < ho; ++oy)
        for (int64_t ox = 0; ox < wo; ++ox)
          for (int64_t ky = 0; ky < p.k; ++ky)
            for (int64_t kx = 0; kx < p.k; ++kx) {
              const int64_t iy = oy / p.s + ky - r, ix = ox / p.s + kx - r;
              if (iy < 0 || iy >= p.h || ix < 0 || ix >= p.w) continue;
              const int64_t m = (c / (p.c / p.groups) * p.k + ky) * p.k + kx;
              f(((n * p.c + c) * p.h + iy) * p.w + ix, ((n * mc + m) * ho + oy) * wo + ox,
                ((n * p.c + c) * ho + oy) * wo + ox);
            }
}

std::map<std::string, AttrValue> attrs(const Case& p) {
  return {{"kernel_size", p.k}, {"group_size", p.groups}, {"scale_factor", p.s}};
}

// Windows past every border, and images wide enough for the columns every window position
// reaches (k = 1, 3, 5, 7 have their own loops there; 9 takes the per-column path).
const Case kCases[] = {{2, 4, 5, 6, 3, 2, 2},  {1, 6, 4, 3, 5, 3, 3},  {1, 3, 3, 4, 1, 1, 1},
                       {2, 8, 2, 7, 5, 4, 1},  {1, 2, 6, 1, 3, 1, 2},  {1, 3, 4, 10, 5, 1, 2},
                       {1, 4, 3, 9, 7, 2, 2},  {1, 2, 5, 12, 9, 1, 1}, {1, 2, 3, 11, 3, 2, 3}};

TEST(CarafeKernel, ForwardMatchesANaiveLoop) {
  for (const Case& p : kCases)
    for (bool threaded : {false, true}) {
      Tensor f = Tensor::random<double>({p.n, p.c, p.h, p.w}, 1);
      Tensor m = Tensor::random<double>({p.n, p.groups * p.k * p.k, p.h * p.s, p.w * p.s}, 2);
      std::vector<double> fv = f.values<double>(), mv = m.values<double>();
      std::vector<double> want(static_cast<size_t>(p.n * p.c * p.h * p.s * p.w * p.s), 0.0);
      each_term(p, [&](int64_t fi, int64_t mi, int64_t oi) { want[oi] += fv[fi] * mv[mi]; });
      std::vector<double> got = run("carafe", {f, m}, attrs(p), threaded)[0].values<double>();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << p.k << " " << p.s << " at " << i;
    }
}

// float32 runs the widest row-loop variant the CPU has (carafe_variants.h).
TEST(CarafeKernel, Float32MatchesANaiveLoopInDouble) {
  for (const Case& p : kCases) {
    Tensor f = Tensor::random<float>({p.n, p.c, p.h, p.w}, 11);
    Tensor m = Tensor::random<float>({p.n, p.groups * p.k * p.k, p.h * p.s, p.w * p.s}, 12);
    std::vector<float> fv = f.values<float>(), mv = m.values<float>();
    std::vector<double> want(static_cast<size_t>(p.n * p.c * p.h * p.s * p.w * p.s), 0.0);
    each_term(p, [&](int64_t fi, int64_t mi, int64_t oi) { want[oi] += double{fv[fi]} * double{mv[mi]}; });
    std::vector<float> got = run("carafe", {f, m}, attrs(p))[0].values<float>();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4) << p.k << " " << p.s << " at " << i;
  }
}

TEST(CarafeKernel, BackwardMatchesANaiveLoop) {
  for (const Case& p : kCases)
    for (bool threaded : {false, true}) {
      Tensor f = Tensor::random<double>({p.n, p.c, p.h, p.w}, 3);
      Tensor m = Tensor::random<double>({p.n, p.groups * p.k * p.k, p.h * p.s, p.w * p.s}, 4);
      Tensor go = Tensor::random<double>({p.n, p.c, p.h * p.s, p.w * p.s}, 5);
      std::vector<double> fv = f.values<double>(), mv = m.values<double>(), gv = go.values<double>();
      std::vector<double> want_f(fv.size(), 0.0), want_m(mv.size(), 0.0);
      each_term(p, [&](int64_t fi, int64_t mi, int64_t oi) {
        want_f[fi] += mv[mi] * gv[oi];
        want_m[mi] += fv[fi] * gv[oi];
      });
      std::vector<Tensor> got = run("carafe_backward", {go, f, m}, attrs(p), threaded);
      std::vector<double> gf = got[0].values<double>(), gm = got[1].values<double>();
      for (size_t i = 0; i < gf.size(); ++i) EXPECT_NEAR(gf[i], want_f[i], 1e-12) << "grad_features " << i;
      for (size_t i = 0; i < gm.size(); ++i) EXPECT_NEAR(gm[i], want_m[i], 1e-12) << "grad_masks " << i;
    }
}

// A window position outside the image takes no part: a NaN weight there leaves the output finite,
// and its gradient is 0.
TEST(CarafeKernel, WeightsOutsideTheImageTakeNoPart) {
  const Case p{1, 1, 2, 2, 3, 1, 1};
  Tensor f = Tensor::random<float>({1, 1, 2, 2}, 6);
  std::vector<float> mv(9 * 4, 0.5f);
  for (int64_t pix = 0; pix < 4; ++pix) mv[0 * 4 + pix] = std::numeric_limits<float>::quiet_NaN();  // (ky, kx) = (0, 0)
  mv[0 * 4 + 3] = 0.5f;  // pixel (1, 1): its (0, 0) neighbour (0, 0) is inside
  Tensor m = Tensor::of<float>({1, 9, 2, 2}, mv);
  std::vector<float> out = run("carafe", {f, m}, attrs(p))[0].values<float>();
  for (float v : out) EXPECT_TRUE(std::isfinite(v));
  const std::vector<float> fv = f.values<float>();
  EXPECT_FLOAT_EQ(out[3], 0.5f * (fv[0] + fv[1] + fv[2] + fv[3]));
}

TEST(CarafeKernel, BadAttributesAreErrors) {
  Tensor f = Tensor::random<float>({1, 4, 3, 3}, 7);
  EXPECT_NE(error_of([&] { run("carafe", {f, Tensor::random<float>({1, 4, 6, 6}, 8)}, attrs({1, 4, 3, 3, 2, 1, 2})); })
                .find("kernel_size must be odd"),
            std::string::npos);
  EXPECT_NE(error_of([&] { run("carafe", {f, Tensor::random<float>({1, 27, 6, 6}, 8)}, attrs({1, 4, 3, 3, 3, 3, 2})); })
                .find("divisible by group_size"),
            std::string::npos);
  EXPECT_NE(error_of([&] { run("carafe", {f, Tensor::random<float>({1, 9, 6, 5}, 8)}, attrs({1, 4, 3, 3, 3, 1, 2})); })
                .find("masks' width must be features' width * scale_factor"),
            std::string::npos);
}

}  // namespace
}  // namespace opbridge::testing
