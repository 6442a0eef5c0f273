// roi_align's and roi_pool's kernels against naive loops over every sample (mmcv's order: per
// bin, per sample, four weighted neighbours), on one thread and in tiny chunks on four.
#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>

namespace opbridge::testing {
namespace {

constexpr int64_t N = 2, C = 3, H = 9, W = 11;

Tensor rois() {
  return Tensor::of<float>({6, 5}, {0, 1.3f, 1.1f, 6.2f, 7.9f, 1, 0, 0, 11, 9,   0, -3, -2, 4, 20,
                                    1, 5, 5, 5, 5,       0, 8, 7, 2, 3,         1, -20, -20, -10, -10});
}

float bilinear(const float* p, float y, float x) {
  if (y < -1 || y > H || x < -1 || x > W) return 0;
  y = std::max(y, 0.f), x = std::max(x, 0.f);
  int yl = static_cast<int>(y), xl = static_cast<int>(x), yh = yl + 1, xh = xl + 1;
  if (yl >= H - 1) yl = yh = H - 1, y = static_cast<float>(yl);
  if (xl >= W - 1) xl = xh = W - 1, x = static_cast<float>(xl);
  const float ly = y - yl, lx = x - xl, hy = 1 - ly, hx = 1 - lx;
  return hy * hx * p[yl * W + xl] + hy * lx * p[yl * W + xh] + ly * hx * p[yh * W + xl] + ly * lx * p[yh * W + xh];
}

std::vector<float> naive_align(const std::vector<float>& in, const std::vector<float>& r, int64_t oh, int64_t ow,
                               float scale, int64_t ratio, bool max_pool, bool aligned) {
  std::vector<float> out;
  for (size_t k = 0; k < r.size() / 5; ++k) {
    const float* b = &r[k * 5];
    const float off = aligned ? 0.5f : 0.f;
    const float sw = b[1] * scale - off, sh = b[2] * scale - off;
    float rw = b[3] * scale - off - sw, rh = b[4] * scale - off - sh;
    if (!aligned) rw = std::max(rw, 1.f), rh = std::max(rh, 1.f);
    const float bh = rh / oh, bw = rw / ow;
    const int gh = ratio > 0 ? static_cast<int>(ratio) : static_cast<int>(std::ceil(bh));
    const int gw = ratio > 0 ? static_cast<int>(ratio) : static_cast<int>(std::ceil(bw));
    for (int64_t c = 0; c < C; ++c) {
      const float* p = &in[(static_cast<int64_t>(b[0]) * C + c) * H * W];
      for (int64_t ph = 0; ph < oh; ++ph)
        for (int64_t pw = 0; pw < ow; ++pw) {
          float sum = 0, best = -10000;
          for (int iy = 0; iy < gh; ++iy)
            for (int ix = 0; ix < gw; ++ix) {
              const float v = bilinear(p, sh + ph * bh + (iy + .5f) * bh / gh, sw + pw * bw + (ix + .5f) * bw / gw);
              sum += v;
              best = v > best ? v : best;
            }
          out.push_back(max_pool ? best : sum / std::max(gh * gw, 1));
        }
    }
  }
  return out;
}

TEST(RoiAlignKernel, MatchesANaiveLoop) {
  Tensor x = Tensor::random<float>({N, C, H, W}, 1), r = rois();
  for (bool max_pool : {false, true})
    for (bool aligned : {true, false})
      for (int64_t ratio : {0, 2})
        for (bool threaded : {false, true}) {
          std::vector<float> got =
              run("roi_align", {x, r},
                  {{"output_size", std::vector<int64_t>{3, 4}}, {"spatial_scale", 0.5}, {"sampling_ratio", ratio},
                   {"pool_mode", std::string(max_pool ? "max" : "avg")}, {"aligned", aligned}},
                  threaded)[0].values<float>();
          std::vector<float> want = naive_align(x.values<float>(), r.values<float>(), 3, 4, 0.5f, ratio, max_pool,
                                                aligned);
          ASSERT_EQ(got.size(), want.size());
          for (size_t i = 0; i < got.size(); ++i)
            EXPECT_NEAR(got[i], want[i], 2e-6f) << i << " max=" << max_pool << " aligned=" << aligned << " ratio="
                                                << ratio;
        }
}

TEST(RoiPoolKernel, MatchesANaiveLoopWithTorchvisionsRounding) {
  Tensor x = Tensor::random<float>({N, C, H, W}, 2), r = rois();
  std::vector<Tensor> got = run("roi_pool", {x, r}, {{"output_size", std::vector<int64_t>{3, 2}}, {"spatial_scale", 0.5}});
  std::vector<float> in = x.values<float>(), b = r.values<float>(), out = got[0].values<float>();
  std::vector<int32_t> arg = got[1].values<int32_t>();
  size_t i = 0;
  for (size_t k = 0; k < 6; ++k) {
    const int x1 = static_cast<int>(std::round(b[k * 5 + 1] * 0.5f)), y1 = static_cast<int>(std::round(b[k * 5 + 2] * 0.5f));
    const int x2 = static_cast<int>(std::round(b[k * 5 + 3] * 0.5f)), y2 = static_cast<int>(std::round(b[k * 5 + 4] * 0.5f));
    const float bh = std::max(y2 - y1 + 1, 1) / 3.f, bw = std::max(x2 - x1 + 1, 1) / 2.f;
    for (int64_t c = 0; c < C; ++c)
      for (int ph = 0; ph < 3; ++ph)
        for (int pw = 0; pw < 2; ++pw, ++i) {
          const int h0 = std::clamp(static_cast<int>(std::floor(ph * bh)) + y1, 0, int(H));
          const int h1 = std::clamp(static_cast<int>(std::ceil((ph + 1) * bh)) + y1, 0, int(H));
          const int w0 = std::clamp(static_cast<int>(std::floor(pw * bw)) + x1, 0, int(W));
          const int w1 = std::clamp(static_cast<int>(std::ceil((pw + 1) * bw)) + x1, 0, int(W));
          float best = (h1 <= h0 || w1 <= w0) ? 0.f : -FLT_MAX;
          int at = -1;
          const float* p = &in[(static_cast<int64_t>(b[k * 5]) * C + c) * H * W];
          for (int y = h0; y < h1; ++y)
            for (int xx = w0; xx < w1; ++xx)
              if (p[y * W + xx] > best) best = p[y * W + xx], at = y * static_cast<int>(W) + xx;
          EXPECT_EQ(out[i], best) << i;
          EXPECT_EQ(arg[i], at) << i;
        }
  }
}

TEST(RoiAlignKernel, RefusesABatchIndexOutsideTheInput) {
  Tensor x = Tensor::random<float>({N, C, H, W}, 1);
  for (float bad : {2.f, -1.f, NAN}) {
    Tensor r = Tensor::of<float>({1, 5}, {bad, 1, 1, 4, 4});
    try {
      run("roi_align", {x, r}, {{"output_size", std::vector<int64_t>{2, 2}}});
      ADD_FAILURE() << "no error for batch index " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("(the batch index) is"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace opbridge::testing
