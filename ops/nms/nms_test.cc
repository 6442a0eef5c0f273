// The NMS family's kernels against naive loops in mmcv's form: each kept box suppresses (or
// reweights, or groups) the ones after it, over a score order with ties lowest index first.
#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

namespace opbridge::testing {
namespace {

// n boxes of sizes 2..30 in a 200 x 200 image, and scores on `levels` levels (0: continuous). Every
// 50th box spans most of the image, every 37th is flipped (x2 < x1), every 41st is a point.
std::pair<std::vector<float>, std::vector<float>> scene(int64_t n, uint32_t seed, int levels = 0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> pos(0, 200), size(2, 30), score(0, 1);
  std::vector<float> b, s;
  for (int64_t i = 0; i < n; ++i) {
    const float x = pos(gen), y = pos(gen), w = size(gen), h = size(gen);
    if (i % 50 == 0)
      b.insert(b.end(), {x / 10, y / 10, 200 - w, 200 - h});
    else if (i % 37 == 0)
      b.insert(b.end(), {x + w, y, x, y + h});
    else if (i % 41 == 0)
      b.insert(b.end(), {x, y, x, y});
    else
      b.insert(b.end(), {x, y, x + w, y + h});
    const float v = score(gen);
    s.push_back(levels ? std::floor(v * levels) / levels : v);
  }
  return {b, s};
}

float iou(const float* a, const float* b, float off) {
  const float w = std::max(0.f, std::min(a[2], b[2]) - std::max(a[0], b[0]) + off);
  const float h = std::max(0.f, std::min(a[3], b[3]) - std::max(a[1], b[1]) + off);
  const float inter = w * h;
  return inter / ((a[2] - a[0] + off) * (a[3] - a[1] + off) + (b[2] - b[0] + off) * (b[3] - b[1] + off) - inter);
}

std::vector<int64_t> order(const std::vector<float>& s) {
  std::vector<int64_t> o(s.size());
  std::iota(o.begin(), o.end(), 0);
  std::stable_sort(o.begin(), o.end(), [&](int64_t a, int64_t b) { return s[a] > s[b]; });
  return o;
}

std::vector<int64_t> naive_nms(const std::vector<float>& b, const std::vector<float>& s, float thr, float off) {
  const std::vector<int64_t> o = order(s);
  std::vector<bool> alive(o.size(), true);
  std::vector<int64_t> keep;
  for (size_t i = 0; i < o.size(); ++i) {
    if (!alive[i]) continue;
    keep.push_back(o[i]);
    for (size_t j = i + 1; j < o.size(); ++j)
      if (alive[j] && iou(&b[o[i] * 4], &b[o[j] * 4], off) > thr) alive[j] = false;
  }
  return keep;
}

TEST(NmsKernel, MatchesANaiveLoop) {
  for (int levels : {0, 5}) {
    for (float off : {0.f, 1.f}) {
      for (float thr : {0.1f, 0.5f, 0.9f}) {
        auto [b, s] = scene(6000, 11 + levels, levels);  // past the grid's threshold
        const int64_t n = static_cast<int64_t>(s.size());
        std::vector<int64_t> got = run("nms", {Tensor::of<float>({n, 4}, b), Tensor::of<float>({n}, s)},
                                       {{"iou_threshold", double{thr}}, {"offset", int64_t(off)}})[0].values<int64_t>();
        EXPECT_EQ(got, naive_nms(b, s, thr, off)) << levels << " " << off << " " << thr;
      }
    }
  }
}

TEST(NmsKernel, ScoreThresholdThenMaxNum) {
  auto [b, s] = scene(2000, 3, 10);  // scores on tenths: some exactly at the threshold, which are out
  std::vector<float> fb, fs;
  std::vector<int64_t> rows;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] > 0.3f) fb.insert(fb.end(), &b[i * 4], &b[i * 4 + 4]), fs.push_back(s[i]), rows.push_back(int64_t(i));
  std::vector<int64_t> all = naive_nms(fb, fs, 0.4f, 0);
  for (int64_t& w : all) w = rows[w];
  const int64_t n = static_cast<int64_t>(s.size());
  for (int64_t max_num : {int64_t{25}, int64_t{-1}}) {
    std::vector<int64_t> got =
        run("nms", {Tensor::of<float>({n, 4}, b), Tensor::of<float>({n}, s)},
            {{"iou_threshold", 0.4}, {"score_threshold", 0.3}, {"max_num", max_num}})[0].values<int64_t>();
    EXPECT_EQ(got, max_num > 0 ? std::vector<int64_t>(all.begin(), all.begin() + max_num) : all);
  }
}

// A box and its partner at IoU exactly 0.5, 20 boxes apart in score order (a full block of kept
// boxes between them): nms keeps both (above the threshold only), nms_match groups them (at least),
// linear soft-NMS halves the partner's score (from the threshold on).
TEST(NmsKernel, AtTheThresholds) {
  std::vector<float> b = {0, 0, 10, 10}, s = {0.99f};
  for (int i = 0; i < 20; ++i) b.insert(b.end(), {100.f + 10 * i, 0, 105.f + 10 * i, 5}), s.push_back(0.9f - 0.01f * i);
  b.insert(b.end(), {0, 0, 10, 5}), s.push_back(0.1f);
  Tensor boxes = Tensor::of<float>({22, 4}, b), scores = Tensor::of<float>({22}, s);
  EXPECT_EQ(run("nms", {boxes, scores}, {{"iou_threshold", 0.5}})[0].values<int64_t>().size(), 22u);
  std::vector<float> d;
  for (size_t i = 0; i < s.size(); ++i) d.insert(d.end(), {b[i * 4], b[i * 4 + 1], b[i * 4 + 2], b[i * 4 + 3], s[i]});
  std::vector<int64_t> matched = run("nms_match", {Tensor::of<float>({22, 5}, d)}, {{"iou_threshold", 0.5}})[0]
                                     .values<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(matched.begin(), matched.begin() + 2), (std::vector<int64_t>{0, 21}));
  auto soft = run("softnms", {boxes, scores}, {{"iou_threshold", 0.5}, {"method", int64_t{1}}, {"min_score", 0.0}});
  EXPECT_EQ(soft[1].values<int64_t>().back(), 21);
  EXPECT_EQ(soft[0].values<float>().back(), 0.1f * 0.5f);
}

// 6 000 boxes far smaller than offset 1 (they overlap through the offset alone), through the grid;
// and a negative threshold, which the grid cannot serve (boxes apart suppress each other).
TEST(NmsKernel, TinyBoxesWithOffsetAndANegativeThreshold) {
  std::mt19937 gen(41);
  std::uniform_real_distribution<float> pos(0, 60), size(0, 0.3f), score(0, 1);
  std::vector<float> b, s;
  for (int i = 0; i < 6000; ++i) {
    const float x = pos(gen), y = pos(gen);
    b.insert(b.end(), {x, y, x + size(gen), y + size(gen)}), s.push_back(score(gen));
  }
  for (auto [thr, off] : {std::pair{0.5f, 1.f}, std::pair{-0.1f, 0.f}}) {
    std::vector<int64_t> got = run("nms", {Tensor::of<float>({6000, 4}, b), Tensor::of<float>({6000}, s)},
                                   {{"iou_threshold", double{thr}}, {"offset", int64_t(off)}})[0].values<int64_t>();
    EXPECT_EQ(got, naive_nms(b, s, thr, off)) << thr;
  }
}

TEST(NmsKernel, EmptyAndErrors) {
  EXPECT_TRUE(run("nms", {Tensor::of<float>({0, 4}, {}), Tensor::of<float>({0}, {})}, {{"iou_threshold", 0.5}})[0]
                  .values<int64_t>()
                  .empty());
  const std::string err = error_of([] {
    run("nms", {Tensor::of<float>({1, 4}, {0, 0, 1, INFINITY}), Tensor::of<float>({1}, {1})}, {{"iou_threshold", 0.5}});
  });
  EXPECT_NE(err.find("boxes has a value that is not finite (inf at row 0)"), std::string::npos) << err;
}

TEST(SoftNmsKernel, MatchesANaiveLoop) {
  for (int64_t method : {0, 1, 2}) {
    auto [b, s] = scene(400, 21, 8);
    const int64_t n = static_cast<int64_t>(s.size());
    auto out = run("softnms", {Tensor::of<float>({n, 4}, b), Tensor::of<float>({n}, s)},
                   {{"method", method}, {"iou_threshold", 0.3}, {"sigma", 0.5}, {"min_score", 0.01}});
    // The naive form: the remaining box of highest score (lowest index on a tie), then reweight.
    std::vector<float> score = s;
    std::vector<bool> live(s.size(), true);
    std::vector<int64_t> want;
    std::vector<float> want_scores;
    for (;;) {
      int64_t best = -1;
      for (int64_t i = 0; i < n; ++i)
        if (live[i] && (best < 0 || score[i] > score[best])) best = i;
      if (best < 0) break;
      live[best] = false, want.push_back(best), want_scores.push_back(score[best]);
      for (int64_t j = 0; j < n; ++j) {
        if (!live[j]) continue;
        const float o = iou(&b[best * 4], &b[j * 4], 0);
        float w = 1;
        if (method == 0 && o >= 0.3f) w = 0;
        if (method == 1 && o >= 0.3f) w = 1 - o;
        if (method == 2 && !std::isnan(o)) w = std::exp(-(o * o) / 0.5f);  // a zero union keeps the score
        score[j] *= w;
        if (score[j] < 0.01f) live[j] = false;
      }
    }
    EXPECT_EQ(out[1].values<int64_t>(), want) << method;
    std::vector<float> dets = out[0].values<float>();
    ASSERT_EQ(dets.size(), want.size() * 5);
    for (size_t k = 0; k < want.size(); ++k) {
      for (int c = 0; c < 4; ++c) EXPECT_EQ(dets[k * 5 + c], b[want[k] * 4 + c]);
      EXPECT_EQ(dets[k * 5 + 4], want_scores[k]);
    }
  }
}

TEST(NmsMatchKernel, MatchesANaiveLoop) {
  auto [b, s] = scene(1500, 31, 6);
  const int64_t n = static_cast<int64_t>(s.size());
  std::vector<float> d;
  for (int64_t i = 0; i < n; ++i) d.insert(d.end(), {b[i * 4], b[i * 4 + 1], b[i * 4 + 2], b[i * 4 + 3], s[i]});
  auto out = run("nms_match", {Tensor::of<float>({n, 5}, d)}, {{"iou_threshold", 0.2}});
  const std::vector<int64_t> o = order(s);
  std::vector<bool> done(o.size(), false);
  std::vector<int64_t> matched, group;
  for (size_t i = 0, g = 0; i < o.size(); ++i) {
    if (done[i]) continue;
    matched.push_back(o[i]), group.push_back(int64_t(g));
    for (size_t j = i + 1; j < o.size(); ++j)
      if (!done[j] && iou(&b[o[i] * 4], &b[o[j] * 4], 0) >= 0.2f)
        done[j] = true, matched.push_back(o[j]), group.push_back(int64_t(g));
    ++g;
  }
  EXPECT_EQ(out[0].values<int64_t>(), matched);
  EXPECT_EQ(out[1].values<int64_t>(), group);
  EXPECT_GT(group.back(), 10);  // many groups, several with more than one box
  EXPECT_LT(group.back() + 1, n);
}

}  // namespace
}  // namespace opbridge::testing
