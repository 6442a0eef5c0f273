// ball_query's kernel against a naive scan over every point, on one thread and many.
#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

#include <algorithm>
#include <string>

namespace opbridge::testing {
namespace {

std::vector<int32_t> naive(const std::vector<float>& p, int64_t n, const std::vector<float>& q, int64_t m, float radius,
                           int64_t nsample) {
  std::vector<int32_t> out(static_cast<size_t>(m * nsample), 0);
  const float r2 = radius * radius;
  for (int64_t j = 0; j < m; ++j) {
    int64_t found = 0;
    for (int64_t k = 0; k < n && found < nsample; ++k) {
      const float dx = q[j * 3] - p[k * 3], dy = q[j * 3 + 1] - p[k * 3 + 1], dz = q[j * 3 + 2] - p[k * 3 + 2];
      if (dx * dx + dy * dy + dz * dz < r2) {
        if (found == 0)
          for (int64_t s = 0; s < nsample; ++s) out[j * nsample + s] = static_cast<int32_t>(k);
        out[j * nsample + found++] = static_cast<int32_t>(k);
      }
    }
  }
  return out;
}

TEST(BallQueryKernel, MatchesANaiveScan) {
  for (float radius : {0.05f, 0.4f, 1.5f, 10.0f}) {
    for (bool threaded : {false, true}) {
      Tensor xyz = Tensor::random<float>({1, 3000, 3}, 3), centres = Tensor::random<float>({1, 150, 3}, 4);
      std::vector<int32_t> got = run("ball_query", {xyz, centres}, {{"radius", double{radius}}, {"nsample", int64_t{16}}},
                                     threaded)[0].values<int32_t>();
      EXPECT_EQ(got, naive(xyz.values<float>(), 3000, centres.values<float>(), 150, radius, 16)) << radius;
    }
  }
}

TEST(BallQueryKernel, AShellKeepsThePointsFromMinRadiusAndThoseOnTheCentre) {
  // mmcv's rule: d² == 0, or min_radius² <= d² < radius². Along x from the centre at 0: a copy of
  // the centre, 0.25 (inside min_radius 0.5), 0.5 (on it: kept), 0.75, 1.0 (on radius: out).
  Tensor xyz = Tensor::of<float>({1, 5, 3}, {0.25f, 0, 0, 0, 0, 0, 0.5f, 0, 0, 1, 0, 0, 0.75f, 0, 0});
  Tensor centre = Tensor::of<float>({1, 1, 3}, {0, 0, 0});
  auto query = [&](double min_radius) {
    return run("ball_query", {xyz, centre}, {{"radius", 1.0}, {"nsample", int64_t{4}}, {"min_radius", min_radius}},
               false)[0].values<int32_t>();
  };
  EXPECT_EQ(query(0.5), (std::vector<int32_t>{1, 2, 4, 1}));
  EXPECT_EQ(query(0.0), (std::vector<int32_t>{0, 1, 2, 4}));  // a ball: the first four by index
  // A large cloud, many threads: the grid search finds what a scan finds.
  Tensor cloud = Tensor::random<float>({1, 3000, 3}, 11), centres = Tensor::random<float>({1, 100, 3}, 12);
  const std::vector<float> p = cloud.values<float>(), q = centres.values<float>();
  std::vector<int32_t> want(100 * 16, 0);
  const float lo2 = 0.2f * 0.2f, hi2 = 0.3f * 0.3f;
  for (int64_t j = 0; j < 100; ++j) {
    int64_t found = 0;
    for (int64_t k = 0; k < 3000 && found < 16; ++k) {
      const float dx = q[j * 3] - p[k * 3], dy = q[j * 3 + 1] - p[k * 3 + 1], dz = q[j * 3 + 2] - p[k * 3 + 2];
      const float d2 = dx * dx + dy * dy + dz * dz;
      if (d2 == 0 || (d2 >= lo2 && d2 < hi2)) {
        if (found == 0)
          for (int64_t s = 0; s < 16; ++s) want[j * 16 + s] = static_cast<int32_t>(k);
        want[j * 16 + found++] = static_cast<int32_t>(k);
      }
    }
  }
  EXPECT_EQ(run("ball_query", {cloud, centres}, {{"radius", 0.3}, {"nsample", int64_t{16}}, {"min_radius", 0.2}},
                true)[0].values<int32_t>(),
            want);
  EXPECT_NE(error_of([&] { run("ball_query", {xyz, centre}, {{"radius", 0.5}, {"nsample", int64_t{2}},
                                                             {"min_radius", 0.6}}); })
                .find("min_radius (0.6"),
            std::string::npos);
}

TEST(BallQueryKernel, EmptyBallsAndNoPointsGiveZeros) {
  Tensor centres = Tensor::random<float>({2, 5, 3}, 6);
  for (const Tensor& xyz : {Tensor::random<float>({2, 0, 3}, 5), Tensor::of<float>({2, 1, 3}, {90, 90, 90, 90, 90, 90})})
    for (int32_t v : run("ball_query", {xyz, centres}, {{"radius", 1.0}, {"nsample", int64_t{3}}})[0].values<int32_t>())
      EXPECT_EQ(v, 0);
}

TEST(RadiusKernel, MatchesANaiveScanOnOneThreadAndMany) {
  const int64_t n = 2000, m = 700;
  Tensor x = Tensor::random<float>({n, 3}, 7), y = Tensor::random<float>({m, 3}, 8);
  std::vector<int64_t> bx(n), by(m);
  for (int64_t i = 0; i < n; ++i) bx[i] = i < 800 ? 0 : 2;  // item 1 has no points
  for (int64_t j = 0; j < m; ++j) by[j] = j < 300 ? 0 : j < 400 ? 1 : 2;
  const std::vector<float> px = x.values<float>(), py = y.values<float>();
  const float r = 0.2f, r2 = static_cast<float>(double{r} * double{r});
  std::vector<int64_t> rows, cols;
  for (int64_t j = 0; j < m; ++j) {
    int64_t kept = 0;
    for (int64_t i = 0; i < n && kept < 12; ++i) {
      if (bx[i] != by[j]) continue;
      float d2 = 0;
      for (int a = 0; a < 3; ++a) d2 += (py[j * 3 + a] - px[i * 3 + a]) * (py[j * 3 + a] - px[i * 3 + a]);
      if (d2 < r2) rows.push_back(j), cols.push_back(i), ++kept;
    }
  }
  rows.insert(rows.end(), cols.begin(), cols.end());
  for (bool threaded : {false, true}) {
    Tensor edges = run("radius", {x, y, Tensor::of<int64_t>({n}, bx), Tensor::of<int64_t>({m}, by)},
                       {{"r", double{r}}, {"max_num_neighbors", int64_t{12}}}, threaded)[0];
    EXPECT_EQ(edges.values<int64_t>(), rows) << threaded;
  }
}

TEST(BallQueryOffsetKernel, KeepsEveryPointOfASmallBallAndPadsTheRest) {
  // Points on a line 0.1 apart; a centre at point 0 with max_radius 0.25 holds points 0-2, with
  // min_radius 0.15 only point 2 and the centre itself (within 1e-5 squared).
  std::vector<float> line;
  for (int i = 0; i < 10; ++i) line.insert(line.end(), {0.1f * static_cast<float>(i), 0.0f, 0.0f});
  Tensor xyz = Tensor::of<float>({10, 3}, line), offset = Tensor::of<int32_t>({1}, {10});
  Tensor centre = Tensor::of<float>({1, 3}, {0, 0, 0}), one = Tensor::of<int32_t>({1}, {1});
  auto out = run("ball_query_offset", {xyz, offset, centre, one},
                 {{"nsample", int64_t{4}}, {"max_radius", 0.25}, {"min_radius", 0.15}});
  std::vector<int32_t> idx = out[0].values<int32_t>();
  std::sort(idx.begin(), idx.begin() + 2);
  EXPECT_EQ(idx, (std::vector<int32_t>{0, 2, -1, -1}));
  EXPECT_EQ(out[1].values<float>()[3], 1e5f);
}

TEST(BatchPointersKernel, CountsTheRowsBelowEachExample) {
  // Examples 0..4 with 2, 0, 3, 0, 1 rows; bounds past the last example count every row.
  Tensor batch = Tensor::of<int64_t>({6}, {0, 0, 2, 2, 2, 4}), bounds = Tensor::of<int64_t>({7}, {0, 1, 2, 3, 4, 5, 6});
  EXPECT_EQ(run("batch_pointers", {batch, bounds})[0].values<int64_t>(), (std::vector<int64_t>{0, 2, 2, 5, 5, 6, 6}));
  Tensor b32 = Tensor::of<int32_t>({3}, {1, 1, 1});
  EXPECT_EQ(run("batch_pointers", {b32, Tensor::of<int64_t>({3}, {0, 1, 2})})[0].values<int64_t>(),
            (std::vector<int64_t>{0, 0, 3}));
}

// One rule for every op that takes a batch vector: batch_pointers, radius and segment_coo refuse
// the same vectors with the same words.
TEST(BatchVectorRule, EveryOpRefusesANegativeOrUnsortedBatchVector) {
  const Tensor unsorted = Tensor::of<int64_t>({4}, {0, 1, 0, 1}), negative = Tensor::of<int64_t>({4}, {-1, -1, 0, 0});
  const Tensor x = Tensor::random<float>({4, 3}, 9), bounds = Tensor::of<int64_t>({3}, {0, 1, 2});
  const std::string sorted = " must be sorted, but ", below = "[0] = -1 is negative";
  auto pointers = [&](const Tensor& b) {
    return error_of([&] { run("batch_pointers", {b, bounds}, {{"name", std::string("batch_x")}}); });
  };
  auto radius = [&](const Tensor& b) { return error_of([&] { run("radius", {x, x, b, b}, {{"r", 1.0}}); }); };
  auto coo = [&](const Tensor& b) {
    return error_of([&] { run("segment_coo", {x, b}, {{"dim_size", int64_t{2}}, {"reduce", std::string("sum")}}); });
  };
  EXPECT_NE(pointers(unsorted).find("batch_x" + sorted + "batch_x[1] = 1 > batch_x[2] = 0"), std::string::npos)
      << pointers(unsorted);
  EXPECT_NE(radius(unsorted).find("batch_x" + sorted + "batch_x[1] = 1 > batch_x[2] = 0"), std::string::npos)
      << radius(unsorted);
  EXPECT_NE(coo(unsorted).find("index" + sorted + "index[1] = 1 > index[2] = 0"), std::string::npos) << coo(unsorted);
  EXPECT_NE(pointers(negative).find("batch_x" + below), std::string::npos) << pointers(negative);
  EXPECT_NE(radius(negative).find("batch_x" + below), std::string::npos) << radius(negative);
  EXPECT_NE(coo(negative).find("index" + below), std::string::npos) << coo(negative);
}

}  // namespace
}  // namespace opbridge::testing
