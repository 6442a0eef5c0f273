// The rotated-box kernels against naive loops and identities that need no polygon code: boxes at
// angle 0 (and a quarter turn with w and h swapped) against interval-overlap IoU, a whole scene
// turned about the origin keeping every overlap, NMS against a greedy loop over the pairwise
// overlaps, roi_align_rotated at angle 0 against bilinear samples at the bin centres, and its
// backward as the exact transpose of its forward (<forward(x), g> == <x, backward(g)>).
#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace opbridge::testing {
namespace {

std::vector<double> random_boxes(int64_t n, uint32_t seed, double angle_range) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> c(0, 6), s(0.5, 3), a(-angle_range, angle_range);
  std::vector<double> b;
  for (int64_t i = 0; i < n; ++i) {
    const double cx = c(gen), cy = c(gen), w = s(gen), h = s(gen);
    b.insert(b.end(), {cx, cy, w, h, angle_range > 0 ? a(gen) : 0.0});
  }
  return b;
}

double interval_iou(const double* a, const double* b) {
  auto overlap = [](double c1, double s1, double c2, double s2) {
    return std::max(0.0, std::min(c1 + s1 / 2, c2 + s2 / 2) - std::max(c1 - s1 / 2, c2 - s2 / 2));
  };
  const double inter = overlap(a[0], a[2], b[0], b[2]) * overlap(a[1], a[3], b[1], b[3]);
  return inter / (a[2] * a[3] + b[2] * b[3] - inter);
}

TEST(BoxIouRotated, AxisAlignedBoxesGiveIntervalIou) {
  const int64_t n = 40, m = 30;
  std::vector<double> a = random_boxes(n, 1, 0), b = random_boxes(m, 2, 0);
  auto got = run("box_iou_rotated", {Tensor::of<double>({n, 5}, a), Tensor::of<double>({m, 5}, b)})[0].values<double>();
  // The same boxes a quarter turn on, w and h swapped: the same rectangles.
  std::vector<double> a2 = a;
  for (int64_t i = 0; i < n; ++i) std::swap(a2[i * 5 + 2], a2[i * 5 + 3]), a2[i * 5 + 4] = M_PI / 2;
  auto turned = run("box_iou_rotated", {Tensor::of<double>({n, 5}, a2), Tensor::of<double>({m, 5}, b)})[0].values<double>();
  int overlapping = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      const double want = interval_iou(&a[i * 5], &b[j * 5]);
      overlapping += want > 0;
      EXPECT_NEAR(got[i * m + j], want, 1e-12) << i << ", " << j;
      EXPECT_NEAR(turned[i * m + j], want, 1e-12) << i << ", " << j;
    }
  EXPECT_GT(overlapping, 50);
}

TEST(BoxIouRotated, TurningTheSceneKeepsEveryOverlap) {
  const int64_t n = 50;
  std::vector<double> a = random_boxes(n, 3, M_PI), b = random_boxes(n, 4, M_PI);
  auto turn = [](std::vector<double> v, double phi) {
    for (size_t i = 0; i < v.size(); i += 5) {
      const double x = v[i], y = v[i + 1];
      v[i] = x * std::cos(phi) - y * std::sin(phi), v[i + 1] = x * std::sin(phi) + y * std::cos(phi);
      v[i + 4] += phi;  // clockwise on screen is counter-clockwise in (x, y) with y up: both turn alike
    }
    return v;
  };
  for (const std::string mode : {"iou", "iof"}) {
    auto base = run("box_iou_rotated_aligned", {Tensor::of<double>({n, 5}, a), Tensor::of<double>({n, 5}, b)},
                    {{"mode", mode}})[0].values<double>();
    auto moved = run("box_iou_rotated_aligned", {Tensor::of<double>({n, 5}, turn(a, 0.7)),
                                                 Tensor::of<double>({n, 5}, turn(b, 0.7))}, {{"mode", mode}})[0]
                     .values<double>();
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(base[i], moved[i], 1e-10) << mode << " " << i;
  }
}

TEST(NmsRotated, MatchesAGreedyLoopOverThePairwiseOverlaps) {
  const int64_t n = 300;
  std::vector<float> d;
  for (double v : random_boxes(n, 5, M_PI)) d.push_back(static_cast<float>(v));
  std::vector<float> s(n);
  std::mt19937 gen(6);
  std::uniform_real_distribution<float> u(0, 1);
  for (float& x : s) x = u(gen);
  Tensor dets = Tensor::of<float>({n, 5}, d);
  auto iou = run("box_iou_rotated", {dets, dets})[0].values<float>();
  auto out = run("nms_rotated", {dets, Tensor::of<float>({n}, s), std::nullopt}, {{"iou_threshold", 0.2}});
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[a] > s[b]; });
  std::vector<int64_t> keep;
  for (int64_t i : order)
    if (std::none_of(keep.begin(), keep.end(), [&](int64_t k) { return iou[k * n + i] >= 0.2f; })) keep.push_back(i);
  EXPECT_EQ(out[1].values<int64_t>(), keep);
  ASSERT_EQ(out[0].view.shape, (Shape{static_cast<int64_t>(keep.size()), 6}));
  auto kept = out[0].values<float>();
  for (size_t r = 0; r < keep.size(); ++r) {
    for (int c = 0; c < 5; ++c) EXPECT_EQ(kept[r * 6 + c], d[keep[r] * 5 + c]);
    EXPECT_EQ(kept[r * 6 + 5], s[keep[r]]);
  }
}

TEST(RoiAlignRotated, AtAngleZeroSamplesTheBinCentres) {
  const int64_t h = 7, w = 9;
  Tensor x = Tensor::random<double>({1, 2, h, w}, 7);
  // Centre (4.5, 3.5), 4 x 2 in pixels; aligned shifts by half a pixel; one sample per bin.
  Tensor roi = Tensor::of<double>({1, 6}, {0, 4.5, 3.5, 4, 2, 0});
  auto got = run("roi_align_rotated", {x, roi},
                 {{"output_size", std::vector<int64_t>{2, 4}}, {"spatial_scale", 1.0}, {"sampling_ratio", int64_t{1}}})[0]
                 .values<double>();
  auto v = x.values<double>();
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t ph = 0; ph < 2; ++ph)
      for (int64_t pw = 0; pw < 4; ++pw) {
        // Bin centres in pixel coordinates: x from 4 - 2 + 0.5 + pw, y from 3 - 1 + 0.5 + ph.
        const double sy = 2.5 + ph, sx = 2.5 + pw;
        const int64_t y0 = static_cast<int64_t>(sy), x0 = static_cast<int64_t>(sx);
        const double ly = sy - y0, lx = sx - x0;
        auto at = [&](int64_t yy, int64_t xx) { return v[(c * h + yy) * w + xx]; };
        const double want = (1 - ly) * (1 - lx) * at(y0, x0) + (1 - ly) * lx * at(y0, x0 + 1) +
                            ly * (1 - lx) * at(y0 + 1, x0) + ly * lx * at(y0 + 1, x0 + 1);
        EXPECT_NEAR(got[(c * 2 + ph) * 4 + pw], want, 1e-12);
      }
}

TEST(RoiAlignRotated, BackwardIsTheTransposeOfForward) {
  Tensor x = Tensor::random<double>({2, 3, 8, 10}, 8);
  std::vector<double> r;
  std::mt19937 gen(9);
  std::uniform_real_distribution<double> c(-1, 10), s(0.5, 7), a(-3.2, 3.2);
  for (int k = 0; k < 12; ++k) r.insert(r.end(), {double(k % 2), c(gen), c(gen), s(gen), s(gen), a(gen)});
  Tensor rois = Tensor::of<double>({12, 6}, r);
  const std::map<std::string, AttrValue> attrs = {{"output_size", std::vector<int64_t>{3, 2}}, {"spatial_scale", 1.0},
                                                  {"clockwise", true}};
  Tensor g = Tensor::random<double>({12, 3, 3, 2}, 10);
  auto y = run("roi_align_rotated", {x, rois}, attrs)[0].values<double>();
  auto gx = run("roi_align_rotated_backward", {g, x, rois}, attrs)[0].values<double>();
  auto gv = g.values<double>(), xv = x.values<double>();
  const double lhs = std::inner_product(y.begin(), y.end(), gv.begin(), 0.0);
  const double rhs = std::inner_product(xv.begin(), xv.end(), gx.begin(), 0.0);
  EXPECT_NEAR(lhs, rhs, 1e-10 * std::max(1.0, std::abs(lhs)));
  EXPECT_NE(lhs, 0.0);
}

}  // namespace
}  // namespace opbridge::testing
