// grid_cluster's kernel against a naive loop written the way torch_cluster computes it:
// start/end from a plain min/max, num_voxels, their cumulative product, then one sum per point.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>
#include <opbridge/cpu.h>
#include <opbridge/testing/kernel_harness.h>

#include "grid_cluster_variants.h"

namespace opbridge::testing {
namespace {

template <typename T>
std::vector<int64_t> naive_grid(const std::vector<T>& pos, int64_t n, int64_t d, const std::vector<T>& size,
                                std::optional<std::vector<T>> start, std::optional<std::vector<T>> end) {
  if (n == 0) return {};
  std::vector<T> lo(pos.begin(), pos.begin() + d), hi = lo;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) {
      lo[j] = std::min(lo[j], pos[i * d + j]);
      hi[j] = std::max(hi[j], pos[i * d + j]);
    }
  const std::vector<T> s = start.value_or(lo), e = end.value_or(hi);
  std::vector<int64_t> stride(d, 1);
  for (int64_t j = 1; j < d; ++j)
    stride[j] = stride[j - 1] * (static_cast<int64_t>(T(e[j - 1] - s[j - 1]) / size[j - 1]) + 1);
  std::vector<int64_t> out(n, 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) {
      T shifted = pos[i * d + j] - s[j];  // in T, as torch_cluster does
      T q = shifted / size[j];
      out[i] += static_cast<int64_t>(q) * stride[j];
    }
  return out;
}

template <typename T>
std::vector<T> random_values(int64_t count, uint32_t seed, double lo, double hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(static_cast<size_t>(count));
  for (T& x : v) x = static_cast<T>(dist(gen));
  return v;
}

template <typename T>
std::optional<Tensor> vec(const std::optional<std::vector<T>>& v) {
  if (!v) return std::nullopt;
  return Tensor::of<T>({static_cast<int64_t>(v->size())}, *v);
}

template <typename T>
void check_grid(int64_t n, int64_t d, std::vector<T> size, std::optional<std::vector<T>> start = std::nullopt,
                std::optional<std::vector<T>> end = std::nullopt, uint32_t seed = 1, double lo = -3.0,
                double hi = 7.0) {
  std::vector<T> pos = random_values<T>(n * d, seed, lo, hi);
  auto want = naive_grid<T>(pos, n, d, size, start, end);
  for (bool threaded : {true, false}) {
    std::vector<Tensor> out = run("grid_cluster", {Tensor::of<T>({n, d}, pos), Tensor::of<T>({d}, size), vec(start), vec(end)},
                   {}, threaded);
    ASSERT_EQ(out[0].view.dtype, DType::Int64);
    ASSERT_EQ(out[0].view.shape, (Shape{n}));
    EXPECT_EQ(out[0].values<int64_t>(), want) << "n=" << n << " d=" << d << " threaded=" << threaded;
  }
}

std::string error_of(const std::vector<std::optional<Tensor>>& in) {
  try {
    run("grid_cluster", in);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

#define EXPECT_ERROR(in, text) EXPECT_NE(error_of(in).find(text), std::string::npos) << error_of(in)

TEST(GridClusterKernel, TorchClusterDocExample) {
  Tensor pos = Tensor::of<float>({5, 2}, {0, 0, 11, 9, 2, 8, 2, 2, 8, 3});
  auto out = run("grid_cluster", {pos, Tensor::of<float>({2}, {5, 5})});
  EXPECT_EQ(out[0].values<int64_t>(), (std::vector<int64_t>{0, 5, 3, 0, 1}));
}

// Many rows: several min/max partial results and blocks cut at odd task boundaries.
TEST(GridClusterKernel, Float32ThreeDimsDerivedBounds) { check_grid<float>(40000, 3, {0.37f, 0.5f, 0.11f}); }
TEST(GridClusterKernel, Float64TwoDimsDerivedBounds) { check_grid<double>(20011, 2, {0.1, 0.3}, {}, {}, 2); }
TEST(GridClusterKernel, OtherDimensionCounts) {
  check_grid<float>(1000, 1, {0.25f});
  check_grid<double>(999, 4, {0.5, 1.0, 0.75, 2.0});
  check_grid<float>(777, 5, {1.f, 0.5f, 2.f, 1.5f, 0.7f});
  check_grid<double>(300, 7, std::vector<double>(7, 3.0));
  // Many dimensions: most voxels span the whole extent, so the grid stays within int64.
  auto sizes = [](int64_t d, int64_t narrow) {
    std::vector<double> s(static_cast<size_t>(d), 20.0);
    for (int64_t j = 0; j < narrow; ++j) s[static_cast<size_t>(j * 3)] = j % 2 ? 3.0 : 6.0;
    return s;
  };
  auto s100 = sizes(100, 30);
  check_grid<float>(50, 100, std::vector<float>(s100.begin(), s100.end()));  // two rows per block
  check_grid<double>(20, 300, sizes(300, 40));                                // wider than a block
}

// Given start/end: points below start (negative quotients truncate toward zero) and beyond end.
TEST(GridClusterKernel, GivenStartAndEnd) {
  check_grid<float>(5000, 3, {0.5f, 0.25f, 1.f}, std::vector<float>{0.f, -1.f, 2.f}, std::vector<float>{4.f, 3.f, 5.f});
  check_grid<double>(3001, 2, {0.3, 0.7}, std::vector<double>{1.0, -1.0}, std::vector<double>{2.0, 0.0});
}
TEST(GridClusterKernel, StartOnlyAndEndOnly) {
  check_grid<float>(2000, 3, {0.5f, 0.4f, 0.3f}, std::vector<float>{-1.f, 0.f, 1.f});
  check_grid<double>(2000, 3, {0.5, 0.4, 0.3}, std::nullopt, std::vector<double>{10.0, 9.0, 8.0});
}

TEST(GridClusterKernel, TruncatesTowardZero) {
  // start 0, size 1: -1.5 -> -1, -0.5 -> 0 (not floor's -1), 0.5 -> 0, 1.5 -> 1; num = 3.
  Tensor pos = Tensor::of<double>({4, 1}, {-1.5, -0.5, 0.5, 1.5});
  auto out = run("grid_cluster", {pos, Tensor::of<double>({1}, {1.0}), Tensor::of<double>({1}, {0.0}),
                                  Tensor::of<double>({1}, {2.0})});
  EXPECT_EQ(out[0].values<int64_t>(), (std::vector<int64_t>{-1, 0, 0, 1}));
  // In two dimensions the negative first coordinate borrows from the second.
  Tensor pos2 = Tensor::of<float>({2, 2}, {-1.f, 1.f, 3.f, 0.f});
  auto out2 = run("grid_cluster", {pos2, Tensor::of<float>({2}, {1.f, 1.f}), Tensor::of<float>({2}, {0.f, 0.f}),
                                   Tensor::of<float>({2}, {3.f, 1.f})});
  EXPECT_EQ(out2[0].values<int64_t>(), (std::vector<int64_t>{-1 + 4, 3}));
}

// Quotients beyond int32 (the vector conversion) and beyond the fast-path bounds, but inside
// int64, still give exact indices.
TEST(GridClusterKernel, LargeIndicesStayExact) {
  Tensor mid = Tensor::of<double>({4, 1}, {3e9, -5e9, 0.5, -2147483648.5});
  auto m = run("grid_cluster", {mid, Tensor::of<double>({1}, {1.0}), Tensor::of<double>({1}, {0.0}),
                                Tensor::of<double>({1}, {1.0})});
  EXPECT_EQ(m[0].values<int64_t>(), (std::vector<int64_t>{3000000000, -5000000000, 0, -2147483648}));
  check_grid<float>(3000, 2, {1e-3f, 1e-6f}, std::vector<float>{0.f, 0.f}, std::vector<float>{1.f, 1.f}, 3, -1e4, 1e4);
  const double big = 4611686018427387904.0;  // 2^62
  Tensor pos = Tensor::of<double>({3, 1}, {big, -2 * big, 0.5});
  auto out = run("grid_cluster", {pos, Tensor::of<double>({1}, {1.0}), Tensor::of<double>({1}, {0.0}),
                                  Tensor::of<double>({1}, {1.0})});
  EXPECT_EQ(out[0].values<int64_t>(), (std::vector<int64_t>{int64_t{1} << 62, std::numeric_limits<int64_t>::min(), 0}));
  // A 2-D grid of 2^31 x 2^31 voxels: the far corner's index is just below 2^62.
  const double side = 2147483647.0;  // num = 2^31 per dimension
  Tensor corner = Tensor::of<double>({2, 2}, {side, side, 0.0, 0.0});
  auto c = run("grid_cluster", {corner, Tensor::of<double>({2}, {1.0, 1.0})})[0].values<int64_t>();
  EXPECT_EQ(c, (std::vector<int64_t>{2147483647 + 2147483647 * (int64_t{1} << 31), 0}));
}

// Every vector loop this build has and this CPU runs, called directly: rows it writes equal the
// float32 formula, it takes every row of a range in reach, and it stops at (not past) the first
// group holding a quotient it cannot take.
std::vector<grid_cluster_impl::Variant> runnable_variants() {
  std::vector<grid_cluster_impl::Variant> v;
  if (cpu_has_avx2() && grid_cluster_impl::avx2_variant().isa) v.push_back(grid_cluster_impl::avx2_variant());
  if (cpu_has_avx512() && grid_cluster_impl::avx512_variant().isa) v.push_back(grid_cluster_impl::avx512_variant());
  return v;
}

int64_t formula_row(const float* p, int64_t d, const grid_cluster_impl::FastGrid& g) {
  int64_t sum = 0;
  for (int64_t j = 0; j < d; ++j) sum += static_cast<int64_t>((p[j] - g.start[j]) / g.size[j]) * g.stride[j];
  return sum;
}

TEST(GridClusterVariants, EqualTheFormulaAndStopWhereTheyMust) {
  if (runnable_variants().empty()) GTEST_SKIP() << "no vector variant on this CPU or in this build";
  for (const auto& v : runnable_variants()) {
    for (int64_t d : {2, 3}) {
      const grid_cluster_impl::FastRows rows = d == 2 ? v.rows2 : v.rows3;
      grid_cluster_impl::FastGrid g{};
      const float size[3] = {0.37f, 0.5f, 0.11f}, start[3] = {-1.f, 0.25f, -2.f};
      int64_t stride = 1;
      for (int64_t j = 0; j < d; ++j) {
        g.start[j] = start[j];
        g.size[j] = size[j];
        g.bound[j] = 1099511627776.f;  // 2^40
        g.bound32[j] = 2147483648.f;
        g.stride[j] = stride;
        stride *= 1000;
      }
      const int64_t n = 16 * 40;
      // Negative quotients too (positions below start): truncation toward zero.
      std::vector<float> pos = random_values<float>(n * d, 7, -5.0, 40.0);
      std::vector<int64_t> out(static_cast<size_t>(n), -7);
      SCOPED_TRACE(std::string(v.isa) + " d=" + std::to_string(d));
      ASSERT_EQ(rows(pos.data(), 0, n, g, out.data()), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], formula_row(&pos[i * d], d, g)) << "row " << i;
      // Fewer rows than a group are left to the caller; a range may start anywhere.
      EXPECT_EQ(rows(pos.data(), 0, 7, g, out.data()), 0);
      const int64_t stop = rows(pos.data(), 5, n - 3, g, out.data());
      EXPECT_GT(stop, n - 3 - 16);
      EXPECT_LE(stop, n - 3);
      // A NaN, an infinity, a quotient past the bound: the loop stops at that row's group.
      for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(), -3e12f, 3e9f}) {
        std::vector<float> p = pos;
        p[(200 + 1) * d - 1] = bad;  // row 200, last coordinate
        std::fill(out.begin(), out.end(), -7);
        const int64_t r = rows(p.data(), 0, n, g, out.data());
        const bool int32_only = std::string(v.isa) == "avx2";
        if (bad == 3e9f && !int32_only) {  // within 2^40: AVX-512 converts to int64 directly
          ASSERT_EQ(r, n);
          EXPECT_EQ(out[200], formula_row(&p[200 * d], d, g));
          continue;
        }
        EXPECT_LE(r, 200) << bad;
        EXPECT_GT(r, 200 - 16) << bad;
        for (int64_t i = 0; i < r; ++i) ASSERT_EQ(out[i], formula_row(&p[i * d], d, g));
        for (int64_t i = r; i < n; ++i) ASSERT_EQ(out[i], -7) << "row " << i << " written past the stop";
      }
      // A stride of 2^31 or more: AVX2's 32-bit products cannot take it, AVX-512's can.
      g.stride[d - 1] = int64_t{1} << 33;
      g.bound[d - 1] = 1024.f;
      const int64_t r = rows(pos.data(), 0, n, g, out.data());
      if (std::string(v.isa) == "avx2") {
        EXPECT_EQ(r, 0);
      } else {
        ASSERT_EQ(r, n);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], formula_row(&pos[i * d], d, g));
      }
    }
  }
}

TEST(GridClusterKernel, EmptyAndZeroDimensions) {
  auto empty = run("grid_cluster", {Tensor::of<float>({0, 3}, {}), Tensor::of<float>({3}, {1.f, 1.f, 1.f})});
  EXPECT_EQ(empty[0].view.shape, (Shape{0}));
  auto with_bounds = run("grid_cluster", {Tensor::of<double>({0, 2}, {}), Tensor::of<double>({2}, {1.0, 1.0}),
                                          Tensor::of<double>({2}, {0.0, 0.0}), Tensor::of<double>({2}, {1.0, 1.0})});
  EXPECT_EQ(with_bounds[0].view.shape, (Shape{0}));
  auto no_dims = run("grid_cluster", {Tensor::of<float>({4, 0}, {}), Tensor::of<float>({0}, {})});
  EXPECT_EQ(no_dims[0].values<int64_t>(), (std::vector<int64_t>(4, 0)));
  check_grid<float>(1, 3, {1.f, 2.f, 3.f});  // one point: its own min and max
}

TEST(GridClusterKernel, RejectsBadValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  Tensor pos = Tensor::of<float>({3, 2}, {0.f, 0.f, 1.f, 2.f, 3.f, 1.f});
  auto v2 = [](float a, float b) { return Tensor::of<float>({2}, {a, b}); };
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{pos, v2(1.f, 0.f)}), "size[1] is 0; voxel sizes must be finite and > 0");
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{pos, v2(-1.f, 1.f)}), "size[0] is -1");
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{pos, v2(nan, 1.f)}), "size[0] is nan");
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{pos, v2(1.f, inf)}), "size[1] is inf");
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{pos, v2(1.f, 1.f), v2(nan, 0.f)}), "start[0] is nan; it must be finite");
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{pos, v2(1.f, 1.f), std::nullopt, v2(0.f, -inf)}), "end[1] is -inf");
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{pos, v2(1.f, 1.f), v2(0.f, 0.f), v2(-1.f, 5.f)}),
               "end[0] = -1 lies a voxel or more below start[0] = 0");
  // Less than a voxel below start is still a one-voxel grid, as in torch_cluster.
  EXPECT_EQ(error_of({pos, v2(1.f, 1.f), v2(0.f, 0.f), v2(-0.5f, 5.f)}), "no error");
}

TEST(GridClusterKernel, RejectsNonFinitePositions) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  auto ones = Tensor::of<double>({2}, {1.0, 1.0});
  auto zeros = Tensor::of<double>({2}, {0.0, 0.0});
  auto tens = Tensor::of<double>({2}, {10.0, 10.0});
  std::vector<double> v(2 * 500, 1.0);
  v[2 * 321 + 1] = nan;  // NaN away from the first row: min/max skip it, the cluster pass names it
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{Tensor::of<double>({500, 2}, v), ones}),
               "pos[321, 1] is nan; positions must be finite");
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{Tensor::of<double>({500, 2}, v), ones, zeros, tens}),
               "pos[321, 1] is nan");
  v[2 * 321 + 1] = 1.0;
  v[0] = nan;  // NaN in the first row becomes the derived start
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{Tensor::of<double>({500, 2}, v), ones}),
               "pos has a non-finite value (NaN or infinity) in column 0");
  v[0] = 1.0;
  v[7] = -inf;
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{Tensor::of<double>({500, 2}, v), ones}),
               "pos has a non-finite value (NaN or infinity) in column 1");
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{Tensor::of<double>({500, 2}, v), ones, zeros, tens}),
               "pos[3, 1] is -inf");
}

TEST(GridClusterKernel, RejectsInt64Overflow) {
  // Too many voxels: 1e10 per dimension in 2-D is 1e20 > 2^63.
  Tensor pos = Tensor::of<double>({2, 2}, {0.0, 0.0, 1e10, 1e10});
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{pos, Tensor::of<double>({2}, {1.0, 1.0})}),
               "the grid has more than 2^63 - 1 voxels (dimension 1");
  // One dimension alone beyond int64.
  Tensor wide = Tensor::of<float>({2, 1}, {0.f, 1e30f});
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{wide, Tensor::of<float>({1}, {1e-3f})}),
               "the grid has more than 2^63 - 1 voxels (dimension 0");
  // A small grid, a point so far outside it that its index does not fit.
  Tensor far = Tensor::of<double>({3, 2}, {0.0, 0.0, 1.0, 1.0, 1.0, 1e19});
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{far, Tensor::of<double>({2}, {1.0, 1.0}),
                                                   Tensor::of<double>({2}, {0.0, 0.0}),
                                                   Tensor::of<double>({2}, {4.0, 4.0})}),
               "the cluster index of row 2 overflows int64: pos[2, 1] = 1e+19");
  // Each term fits but the sum does not.
  Tensor sum = Tensor::of<double>({1, 2}, {9.0e18, 9.0e17});
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{sum, Tensor::of<double>({2}, {1.0, 1.0}),
                                                   Tensor::of<double>({2}, {0.0, 0.0}),
                                                   Tensor::of<double>({2}, {9.0, 0.0})}),
               "the cluster index of row 0 overflows int64");
}

TEST(GridClusterKernel, RejectsMismatchedLengths) {
  Tensor pos = Tensor::of<float>({3, 2}, {0.f, 0.f, 1.f, 2.f, 3.f, 1.f});
  Tensor two = Tensor::of<float>({2}, {1.f, 1.f}), three = Tensor::of<float>({3}, {1.f, 1.f, 1.f});
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{pos, three}), "size must have one value per column of pos");
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{pos, two, three}), "start must have one value per column of pos");
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{pos, two, std::nullopt, three}),
               "end must have one value per column of pos");
  EXPECT_ERROR((std::vector<std::optional<Tensor>>{Tensor::of<float>({6}, {0, 0, 1, 2, 3, 1}), two}),
               "input 'pos' must have rank 2");
}

}  // namespace
}  // namespace opbridge::testing
