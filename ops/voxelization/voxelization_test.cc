// hard_voxelize and dynamic_voxelize against a naive loop over the points (mmcv's CPU algorithm:
// per axis floor((p - min) / size) in float32, a map from voxel to id in order of first point),
// with the dense table of cells (a small grid) and the hash table (a large one), on one thread and
// many.
#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <tuple>

namespace opbridge::testing {
namespace {

const std::vector<double> kRange = {0, -40, -3, 70.4, 40, 1};

std::vector<float> cloud(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> x(-4, 74), y(-44, 44), z(-3.5f, 1.5f), r(0, 1);
  std::vector<float> p;
  for (int64_t i = 0; i < n; ++i) p.insert(p.end(), {x(gen), y(gen), z(gen), r(gen)});
  p[5 * 4] = std::numeric_limits<float>::quiet_NaN(), p[9 * 4 + 1] = std::numeric_limits<float>::infinity();
  return p;
}

// (z, y, x) or nothing.
bool cell(const float* p, const std::vector<double>& size, std::array<int32_t, 3>& zyx) {
  for (int a = 0; a < 3; ++a) {
    const float s = static_cast<float>(size[a]), lo = static_cast<float>(kRange[a]);
    const float grid = std::round((static_cast<float>(kRange[a + 3]) - lo) / s);
    const float c = std::floor((p[a] - lo) / s);
    if (!(c >= 0 && c < grid)) return false;
    zyx[2 - a] = static_cast<int32_t>(c);
  }
  return true;
}

struct Hard {
  std::vector<float> voxels;
  std::vector<int32_t> coors, num;
};

Hard naive(const std::vector<float>& p, int64_t n, const std::vector<double>& size, int64_t max_points,
           int64_t max_voxels) {
  Hard h;
  std::map<std::array<int32_t, 3>, int64_t> ids;
  for (int64_t i = 0; i < n; ++i) {
    std::array<int32_t, 3> zyx{};
    if (!cell(&p[i * 4], size, zyx)) continue;
    auto it = ids.find(zyx);
    if (it == ids.end()) {
      if (static_cast<int64_t>(h.num.size()) >= max_voxels) continue;
      it = ids.emplace(zyx, static_cast<int64_t>(h.num.size())).first;
      h.coors.insert(h.coors.end(), zyx.begin(), zyx.end());
      h.num.push_back(0);
      h.voxels.resize(h.voxels.size() + static_cast<size_t>(max_points) * 4, 0.0f);
    }
    const int64_t v = it->second;
    if (h.num[v] >= max_points) continue;
    for (int k = 0; k < 4; ++k) h.voxels[(v * max_points + h.num[v]) * 4 + k] = p[i * 4 + k];
    ++h.num[v];
  }
  return h;
}

TEST(HardVoxelizeKernel, MatchesANaiveLoopWithBothTables) {
  const int64_t n = 20000;
  const std::vector<float> p = cloud(n, 1);
  // Pillars: 440 x 500 x 1 cells, a dense table; SECOND's 1408 x 1600 x 40, the hash table.
  for (auto [size, max_points, max_voxels] :
       {std::tuple{std::vector<double>{0.16, 0.16, 4}, int64_t{32}, int64_t{4000}},
        std::tuple{std::vector<double>{0.05, 0.05, 0.1}, int64_t{2}, int64_t{9000}},
        std::tuple{std::vector<double>{2.0, 2.0, 1.0}, int64_t{3}, int64_t{100000}}}) {
    const Hard want = naive(p, n, size, max_points, max_voxels);
    for (bool threaded : {false, true}) {
      const std::vector<Tensor> got =
          run("hard_voxelize", {Tensor::of<float>({n, 4}, p)},
              {{"voxel_size", size}, {"point_cloud_range", kRange}, {"max_points", max_points},
               {"max_voxels", max_voxels}},
              threaded);
      EXPECT_EQ(got[0].values<float>(), want.voxels) << size[0];
      EXPECT_EQ(got[1].values<int32_t>(), want.coors) << size[0];
      EXPECT_EQ(got[2].values<int32_t>(), want.num) << size[0];
    }
  }
}

TEST(HardVoxelizeKernel, AnEmptyCloudGivesNoVoxelsAndZeroVoxelsIsRefused) {
  const std::vector<double> size = {0.05, 0.05, 0.1};
  const std::vector<Tensor> got =
      run("hard_voxelize", {Tensor::of<float>({0, 4}, {})}, {{"voxel_size", size}, {"point_cloud_range", kRange}});
  EXPECT_EQ(got[0].view.shape, (Shape{0, 35, 4}));
  EXPECT_EQ(got[1].view.shape, (Shape{0, 3}));
  try {
    run("hard_voxelize", {Tensor::of<float>({1, 3}, {1, 1, 0})},
        {{"voxel_size", size}, {"point_cloud_range", kRange}, {"max_voxels", int64_t{0}}});
    FAIL() << "max_voxels 0 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_voxels must be >= 1"), std::string::npos) << e.what();
  }
}

TEST(DynamicVoxelizeKernel, MatchesANaiveLoop) {
  const int64_t n = 5000;
  const std::vector<float> p = cloud(n, 2);
  const std::vector<double> size = {0.05, 0.05, 0.1};
  std::vector<int32_t> want;
  for (int64_t i = 0; i < n; ++i) {
    std::array<int32_t, 3> zyx{};
    if (!cell(&p[i * 4], size, zyx)) zyx = {-1, -1, -1};
    want.insert(want.end(), zyx.begin(), zyx.end());
  }
  for (bool threaded : {false, true})
    EXPECT_EQ(run("dynamic_voxelize", {Tensor::of<float>({n, 4}, p)}, {{"voxel_size", size}, {"point_cloud_range", kRange}},
                  threaded)[0]
                  .values<int32_t>(),
              want);
}

}  // namespace
}  // namespace opbridge::testing
