// The 3-D box kernels against naive loops: points_in_boxes against the box's own frame computed in
// double (points kept clear of the faces, where rounding may decide), part as the first of all's
// boxes; boxes_overlap_bev at heading 0 (and a quarter turn with dx and dy swapped) against
// interval overlaps, and a whole scene turned about the origin keeping every area; nms3d and
// nms3d_normal against a greedy loop over the pairwise IoUs, with more boxes than one chunk.
#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace opbridge::testing {
namespace {

std::vector<double> random_boxes(int64_t n, uint32_t seed, double spread, bool turned) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> c(-spread, spread), z(-2, 0), s(1, 4), a(-M_PI, M_PI);
  std::vector<double> b;
  for (int64_t i = 0; i < n; ++i) b.insert(b.end(), {c(gen), c(gen), z(gen), s(gen), s(gen), s(gen), turned ? a(gen) : 0.0});
  return b;
}

// Where the point lies against box k: 1 inside, 0 outside, -1 within 1e-6 of a face.
int naive_inside(const double* p, const double* b) {
  const double lz = p[2] - (b[2] + b[5] / 2);
  const double c = std::cos(b[6]), s = std::sin(b[6]);
  const double lx = (p[0] - b[0]) * c + (p[1] - b[1]) * s, ly = -(p[0] - b[0]) * s + (p[1] - b[1]) * c;
  const double margin = std::min({b[3] / 2 - std::fabs(lx), b[4] / 2 - std::fabs(ly), b[5] / 2 - std::fabs(lz)});
  return std::fabs(margin) < 1e-6 ? -1 : margin > 0;
}

TEST(PointsInBoxes, MatchTheBoxFrameInDouble) {
  const int64_t nb = 2, n = 3000, m = 25;
  std::vector<double> boxes = random_boxes(nb * m, 1, 8, true);
  std::mt19937 gen(2);
  std::uniform_real_distribution<double> c(-10, 10), z(-3, 3);
  std::vector<double> pts;
  for (int64_t i = 0; i < nb * n; ++i) pts.insert(pts.end(), {c(gen), c(gen), z(gen)});
  auto all = run("points_in_boxes_all", {Tensor::of<double>({nb, n, 3}, pts), Tensor::of<double>({nb, m, 7}, boxes)});
  auto part = run("points_in_boxes_part", {Tensor::of<double>({nb, n, 3}, pts), Tensor::of<double>({nb, m, 7}, boxes)});
  const std::vector<int32_t> mask = all[0].values<int32_t>(), first = part[0].values<int32_t>();
  int64_t inside = 0;
  for (int64_t i = 0; i < nb * n; ++i) {
    const int64_t b = i / n;
    int32_t want_first = -1;
    for (int64_t k = 0; k < m; ++k) {
      const int want = naive_inside(&pts[i * 3], &boxes[(b * m + k) * 7]);
      const int32_t got = mask[i * m + k];
      if (got && want_first < 0) want_first = static_cast<int32_t>(k);
      if (want < 0) continue;
      EXPECT_EQ(got, want) << "point " << i << ", box " << k;
      inside += want;
    }
    EXPECT_EQ(first[i], want_first) << "point " << i;
  }
  EXPECT_GT(inside, 200);
}

double interval(double c1, double s1, double c2, double s2) {
  return std::max(0.0, std::min(c1 + s1 / 2, c2 + s2 / 2) - std::max(c1 - s1 / 2, c2 - s2 / 2));
}

TEST(BoxesOverlapBev, HeadingZeroGivesIntervalProducts) {
  const int64_t n = 40, m = 30;
  std::vector<double> a = random_boxes(n, 3, 4, false), b = random_boxes(m, 4, 4, false);
  auto got = run("boxes_overlap_bev", {Tensor::of<double>({n, 7}, a), Tensor::of<double>({m, 7}, b)})[0].values<double>();
  std::vector<double> a2 = a;  // a quarter turn, dx and dy swapped: the same rectangles
  for (int64_t i = 0; i < n; ++i) std::swap(a2[i * 7 + 3], a2[i * 7 + 4]), a2[i * 7 + 6] = M_PI / 2;
  auto turned = run("boxes_overlap_bev", {Tensor::of<double>({n, 7}, a2), Tensor::of<double>({m, 7}, b)})[0].values<double>();
  int overlapping = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      const double* p = &a[i * 7];
      const double* q = &b[j * 7];
      const double want = interval(p[0], p[3], q[0], q[3]) * interval(p[1], p[4], q[1], q[4]);
      overlapping += want > 0;
      EXPECT_NEAR(got[i * m + j], want, 1e-12) << i << ", " << j;
      EXPECT_NEAR(turned[i * m + j], want, 1e-12) << i << ", " << j;
    }
  EXPECT_GT(overlapping, 100);
}

TEST(BoxesOverlapBev, TurningTheSceneKeepsEveryArea) {
  const int64_t n = 50;
  std::vector<double> a = random_boxes(n, 5, 3, true), b = random_boxes(n, 6, 3, true);
  auto turn = [](std::vector<double> v, double phi) {
    for (size_t i = 0; i < v.size(); i += 7) {
      const double x = v[i], y = v[i + 1];
      v[i] = x * std::cos(phi) - y * std::sin(phi), v[i + 1] = x * std::sin(phi) + y * std::cos(phi);
      v[i + 6] += phi;
    }
    return v;
  };
  auto base = run("boxes_overlap_bev", {Tensor::of<double>({n, 7}, a), Tensor::of<double>({n, 7}, b)})[0].values<double>();
  auto moved = run("boxes_overlap_bev", {Tensor::of<double>({n, 7}, turn(a, 0.7)),
                                         Tensor::of<double>({n, 7}, turn(b, 0.7))})[0].values<double>();
  int overlapping = 0;
  for (size_t k = 0; k < base.size(); ++k) {
    overlapping += base[k] > 0.01;
    EXPECT_NEAR(moved[k], base[k], 1e-9) << k;
  }
  EXPECT_GT(overlapping, 100);
}

// Greedy NMS over the boxes in the order given, from a pairwise IoU.
template <typename Iou>
std::vector<int64_t> greedy(int64_t n, float thr, Iou iou) {
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < n; ++i) {
    bool drop = false;
    for (int64_t k : keep) drop = drop || iou(k, i) > thr;
    if (!drop) keep.push_back(i);
  }
  return keep;
}

TEST(Nms3d, MatchesAGreedyLoopOverThePairwiseIous) {
  const int64_t n = 700;
  std::vector<double> b = random_boxes(n, 7, 25, true);
  Tensor boxes = Tensor::of<double>({n, 7}, b);
  const std::vector<double> inter = run("boxes_overlap_bev", {boxes, boxes})[0].values<double>();
  const auto keep = run("nms3d", {boxes, std::nullopt}, {{"iou_threshold", 0.2}})[0].values<int64_t>();
  const auto want = greedy(n, 0.2f, [&](int64_t k, int64_t i) {
    const double u = b[k * 7 + 3] * b[k * 7 + 4] + b[i * 7 + 3] * b[i * 7 + 4] - inter[k * n + i];
    return inter[k * n + i] / std::max(u, 1e-8);
  });
  EXPECT_GT(want.size(), 300u);
  EXPECT_LT(want.size(), 690u);
  EXPECT_EQ(keep, want);
}

TEST(Nms3dNormal, MatchesAGreedyLoopOverIntervalIous) {
  const int64_t n = 700;
  std::vector<double> b = random_boxes(n, 8, 25, true);
  std::vector<double> s(n);
  std::mt19937 gen(9);
  for (auto& v : s) v = std::uniform_real_distribution<double>(0, 1)(gen);
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return s[x] > s[y]; });
  const auto keep = run("nms3d_normal", {Tensor::of<double>({n, 7}, b), Tensor::of<double>({n}, s)},
                        {{"iou_threshold", 0.1}})[0].values<int64_t>();
  auto kept = greedy(n, 0.1f, [&](int64_t k, int64_t i) {
    const double* p = &b[order[k] * 7];
    const double* q = &b[order[i] * 7];
    const double inter = interval(p[0], p[3], q[0], q[3]) * interval(p[1], p[4], q[1], q[4]);
    return inter / std::max(p[3] * p[4] + q[3] * q[4] - inter, 1e-8);
  });
  for (auto& k : kept) k = order[k];
  EXPECT_GT(kept.size(), 200u);
  EXPECT_EQ(keep, kept);
}

}  // namespace
}  // namespace opbridge::testing
