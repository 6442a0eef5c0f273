// furthest_point_sampling's kernel against a naive loop: the greedy chain with the running minimum,
// ties by index or by the CUDA block rule, on one thread and split over threads.
#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

#include "fps_kernel.h"

#include <random>

namespace opbridge::testing {
namespace {

// The picks of one segment of `n` points (x, y, z rows), ties to the lowest index.
std::vector<int32_t> naive(const std::vector<float>& p, int64_t n, int64_t m) {
  std::vector<float> dist(static_cast<size_t>(n), 1e10f);
  std::vector<int32_t> out{0};
  int64_t pick = 0;
  for (int64_t j = 1; j < m; ++j) {
    int64_t best = 0;
    for (int64_t k = 0; k < n; ++k) {
      const float dx = p[k * 3] - p[pick * 3], dy = p[k * 3 + 1] - p[pick * 3 + 1], dz = p[k * 3 + 2] - p[pick * 3 + 2];
      dist[k] = std::min(dist[k], dx * dx + dy * dy + dz * dz);
      if (dist[k] > dist[best]) best = k;
    }
    pick = best;
    out.push_back(static_cast<int32_t>(pick));
  }
  return out;
}

// Points on a grid of step 0.5: many equal distances.
Tensor grid(int64_t b, int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> u(-3, 3);
  std::vector<float> v(static_cast<size_t>(b * n * 3));
  for (float& x : v) x = 0.5f * static_cast<float>(u(g));
  return Tensor::of<float>({b, n, 3}, v);
}

TEST(FurthestPointSamplingKernel, MatchesANaiveLoopWithTiesToTheLowestIndex) {
  for (bool threaded : {false, true}) {
    Tensor xyz = grid(3, 257, 7);
    std::vector<int32_t> got = run("furthest_point_sampling", {xyz},
                                   {{"npoint", int64_t{64}}, {"tie_threads", int64_t{0}}, {"skip_near_origin", false}},
                                   threaded)[0].values<int32_t>();
    const std::vector<float> all = xyz.values<float>();
    for (int64_t b = 0; b < 3; ++b) {
      std::vector<float> seg(all.begin() + b * 257 * 3, all.begin() + (b + 1) * 257 * 3);
      EXPECT_EQ(std::vector<int32_t>(got.begin() + b * 64, got.begin() + (b + 1) * 64), naive(seg, 257, 64)) << b;
    }
  }
}

TEST(FurthestPointSamplingKernel, OneLargeSegmentSplitOverThreadsGivesTheSamePicks) {
  // 40 000 points: each step's scan runs in chunks on the harness's threads.
  Tensor xyz = grid(1, 40000, 3);
  const std::map<std::string, AttrValue> attrs{{"npoint", int64_t{32}}, {"tie_threads", int64_t{0}},
                                               {"skip_near_origin", false}};
  EXPECT_EQ(run("furthest_point_sampling", {xyz}, attrs, true)[0].values<int32_t>(), naive(xyz.values<float>(), 40000, 32));
}

TEST(FurthestPointSamplingKernel, CudaTieRuleKeepsTheSmallestBitReversedThread) {
  // Points 1 and 2 tie; with 4 threads, thread 2 (bits 10, reversed 01) beats thread 1 (01 -> 10).
  Tensor xyz = Tensor::of<float>({1, 4, 3}, {0, 0, 0, 1, 0, 0, -1, 0, 0, 0.1f, 0, 0});
  auto picks = [&](int64_t threads) {
    return run("furthest_point_sampling", {xyz}, {{"npoint", int64_t{2}}, {"tie_threads", threads},
                                                   {"skip_near_origin", false}})[0].values<int32_t>();
  };
  EXPECT_EQ(picks(4), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(picks(0), (std::vector<int32_t>{0, 1}));
}

TEST(FurthestPointSamplingKernel, OffsetFormAllocatesTheAskedPicks) {
  Tensor xyz = Tensor::random<float>({30, 3}, 5);
  Tensor offset = Tensor::of<int32_t>({2}, {10, 30}), new_offset = Tensor::of<int32_t>({2}, {4, 9});
  Tensor idx = run("furthest_point_sampling_offset", {xyz, offset, new_offset})[0];
  ASSERT_EQ(idx.view.shape, (Shape{9}));
  const std::vector<int32_t> v = idx.values<int32_t>();
  EXPECT_EQ(v[0], 0);
  EXPECT_EQ(v[4], 10);  // each segment starts at its first row
  for (int i = 0; i < 4; ++i) EXPECT_LT(v[i], 10);
  for (int i = 4; i < 9; ++i) EXPECT_GE(v[i], 10);
  EXPECT_NE(error_of([&] { run("furthest_point_sampling_offset", {xyz, Tensor::of<int32_t>({2}, {10, 29}), new_offset}); }),
            "");
}

TEST(FurthestPointSamplingKernel, RatioAskingForMoreSamplesThanAnOutputHoldsIsRefused) {
  // ceil(n * ratio) of a huge ratio: a sample count past int64 (it overflowed into the total).
  Tensor src = Tensor::of<float>({2, 3}, {0, 0, 0, 1, 1, 1}), ptr = Tensor::of<int64_t>({2}, {0, 2});
  const std::string e = error_of([&] { run("furthest_point_sampling_ratio", {src, ptr}, {{"ratio", 3.4e38}}); });
  EXPECT_NE(e.find("more than an output can hold"), std::string::npos) << e;
  EXPECT_EQ(run("furthest_point_sampling_ratio", {src, ptr}, {{"ratio", 1.5}})[0].view.shape, (Shape{3}));
}

TEST(FurthestPointSamplingKernel, TheCudaBlockSizeOfHugeSegmentsAndCapsDoesNotOverflow) {
  // The largest power of two within both: doubling past 2^62 overflowed (and then never ended).
  EXPECT_EQ(fps::cuda_threads(int64_t{1} << 62, int64_t{1} << 62), int64_t{1} << 62);
  EXPECT_EQ(fps::cuda_threads(INT64_MAX, INT64_MAX), int64_t{1} << 62);
  EXPECT_EQ(fps::cuda_threads(1000, 512), 512);
  EXPECT_EQ(fps::cuda_threads(300, 1024), 256);
  Tensor y = run("furthest_point_sampling", {Tensor::of<float>({0, int64_t{1} << 62, 3}, {})},
                 {{"npoint", int64_t{2}}, {"tie_threads", int64_t{1} << 62}})[0];
  EXPECT_EQ(y.view.shape, (Shape{0, 2}));
}

TEST(FurthestPointSamplingKernel, RandomStartIsDeclaredAndOnlyABoolAttributeCanSayIt) {
  // Tools that compare two runs (the fuzzer) read this; a definition naming anything but a bool
  // attribute is refused.
  const OpSpec* op = registry().find("furthest_point_sampling_ratio");
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->random_when, "random_start");
  OpSpec bad = *op;
  bad.random_when = "ratio";
  EXPECT_NE(error_of([&] { validate_spec(bad); }).find("random_when names 'ratio', which is not a bool attribute"),
            std::string::npos);
}

}  // namespace
}  // namespace opbridge::testing
