// dynamic_scatter against a naive loop: voxels the distinct rows without a negative entry in
// ascending order (a std::map), each voxel's features summed in point order, averaged or their
// maximum; the max gradient to the first point holding the maximum. One thread and many.
#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <string>

namespace opbridge::testing {
namespace {

TEST(DynamicScatterKernel, MatchesANaiveLoop) {
  const int64_t n = 6000, c = 3, d = 4;
  std::mt19937 gen(3);
  std::uniform_int_distribution<int64_t> coord(-1, 12);
  std::vector<int64_t> co(static_cast<size_t>(n * d));
  for (auto& v : co) v = coord(gen) < 0 && coord(gen) < 2 ? -1 : std::max<int64_t>(coord(gen), 0);
  const Tensor feats = Tensor::random<double>({n, c}, 4);
  const std::vector<double> f = feats.values<double>();
  std::map<std::vector<int64_t>, std::vector<int64_t>> voxels;  // row -> its points in order
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> row(co.begin() + i * d, co.begin() + (i + 1) * d);
    if (std::all_of(row.begin(), row.end(), [](int64_t v) { return v >= 0; })) voxels[row].push_back(i);
  }
  for (const std::string reduce : {"sum", "mean", "max"}) {
    std::vector<double> want;
    std::vector<int64_t> want_coors;
    std::vector<int32_t> want_count, want_p2v(static_cast<size_t>(n), -1);
    int32_t v = 0;
    for (const auto& [row, points] : voxels) {
      want_coors.insert(want_coors.end(), row.begin(), row.end());
      want_count.push_back(static_cast<int32_t>(points.size()));
      for (int64_t j = 0; j < c; ++j) {
        double acc = reduce == "max" ? -std::numeric_limits<double>::infinity() : 0.0;
        for (int64_t i : points) acc = reduce == "max" ? std::max(acc, f[i * c + j]) : acc + f[i * c + j];
        want.push_back(reduce == "mean" ? acc / static_cast<double>(points.size()) : acc);
      }
      for (int64_t i : points) want_p2v[i] = v;
      ++v;
    }
    for (bool threaded : {false, true}) {
      const std::vector<Tensor> got =
          run("dynamic_scatter", {feats, Tensor::of<int64_t>({n, d}, co)}, {{"reduce", reduce}}, threaded);
      EXPECT_EQ(got[0].values<double>(), want) << reduce;
      EXPECT_EQ(got[1].values<int64_t>(), want_coors);
      EXPECT_EQ(got[2].values<int32_t>(), want_p2v);
      EXPECT_EQ(got[3].values<int32_t>(), want_count);
    }
  }
}

TEST(DynamicScatterKernel, MaxGradientGoesToTheFirstPointOfATie) {
  // Points 0, 2 and 3 share a voxel; points 2 and 3 tie for its maximum in column 0.
  const Tensor feats = Tensor::of<float>({4, 2}, {1, 5, 7, 0, 9, 2, 9, 8});
  const Tensor coors = Tensor::of<int32_t>({4, 3}, {0, 0, 1, 0, 0, 2, 0, 0, 1, 0, 0, 1});
  const std::vector<Tensor> fwd = run("dynamic_scatter", {feats, coors}, {{"reduce", std::string("max")}});
  EXPECT_EQ(fwd[0].values<float>(), (std::vector<float>{9, 8, 7, 0}));
  const Tensor grad = Tensor::of<float>({2, 2}, {10, 20, 30, 40});
  const std::vector<float> g =
      run("dynamic_scatter_backward", {grad, feats, fwd[0], fwd[2], fwd[3]}, {{"reduce", std::string("max")}})[0]
          .values<float>();
  EXPECT_EQ(g, (std::vector<float>{0, 0, 30, 40, 10, 0, 0, 20}));
}

}  // namespace
}  // namespace opbridge::testing
