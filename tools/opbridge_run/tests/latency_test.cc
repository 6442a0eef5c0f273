// The latency summary against values worked out by hand.
#include <gtest/gtest.h>

#include <vector>

#include "latency.h"

namespace {

using opbridge::run::summarize;

TEST(LatencyStats, OddCount) {
  // Sorted: 1 2 3 4 5; nearest rank: p90 -> ceil(4.5) = 5th, p99 -> ceil(4.95) = 5th.
  const auto s = summarize({5, 1, 4, 2, 3});
  EXPECT_EQ(s.min_ms, 1);
  EXPECT_EQ(s.median_ms, 3);
  EXPECT_EQ(s.p90_ms, 5);
  EXPECT_EQ(s.p99_ms, 5);
  EXPECT_DOUBLE_EQ(1e3 / s.runs_per_s, 3);  // throughput is the reciprocal of the mean run, 3 ms
  EXPECT_DOUBLE_EQ(s.runs_per_s, 5 * 1e3 / 15);
}

TEST(LatencyStats, EvenCountMedianIsTheMiddlePairsMean) {
  const auto s = summarize({4, 1, 3, 2});
  EXPECT_EQ(s.median_ms, 2.5);
  EXPECT_EQ(s.p90_ms, 4);  // ceil(3.6) = 4th
}

TEST(LatencyStats, PercentilesOfAHundredRuns) {
  std::vector<double> t;
  for (int i = 100; i >= 1; --i) t.push_back(i);  // 1..100 ms, reversed
  const auto s = summarize(t);
  EXPECT_EQ(s.min_ms, 1);
  EXPECT_EQ(s.median_ms, 50.5);
  EXPECT_EQ(s.p90_ms, 90);
  EXPECT_EQ(s.p99_ms, 99);
  EXPECT_DOUBLE_EQ(s.runs_per_s, 100 * 1e3 / 5050);
}

TEST(LatencyStats, OneRun) {
  const auto s = summarize({2.5});
  EXPECT_EQ(s.min_ms, 2.5);
  EXPECT_EQ(s.median_ms, 2.5);
  EXPECT_EQ(s.p99_ms, 2.5);
  EXPECT_EQ(s.runs_per_s, 400);
}

}  // namespace
