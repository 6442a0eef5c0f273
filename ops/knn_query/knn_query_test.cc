// knn_query's kernel against a brute-force loop: every (distance², index) pair of the segment,
// sorted, the first k kept. Compared bit for bit, so ties and rounding must agree exactly.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <utility>

#include <gtest/gtest.h>
#include <opbridge/cpu.h>
#include <opbridge/testing/kernel_harness.h>

#include "knn_leaf_variants.h"

namespace opbridge::testing {
namespace {

template <typename T, typename I>
void brute_force(const std::vector<T>& xyz, const std::vector<I>& offset, const std::vector<T>& q,
                 const std::vector<I>& q_offset, int64_t k, std::vector<int32_t>& idx, std::vector<T>& dist) {
  const int64_t m = static_cast<int64_t>(q.size() / 3);
  idx.assign(static_cast<size_t>(m * k), -1);
  dist.assign(static_cast<size_t>(m * k), std::numeric_limits<T>::infinity());
  for (size_t s = 0; s < offset.size(); ++s) {
    const int64_t pb = s ? offset[s - 1] : 0, pe = offset[s];
    const int64_t qb = s ? q_offset[s - 1] : 0, qe = q_offset[s];
    for (int64_t i = qb; i < qe; ++i) {
      std::vector<std::pair<T, int32_t>> all;
      for (int64_t j = pb; j < pe; ++j) {
        T dx = xyz[3 * j] - q[3 * i], dy = xyz[3 * j + 1] - q[3 * i + 1], dz = xyz[3 * j + 2] - q[3 * i + 2];
        all.emplace_back(dx * dx + dy * dy + dz * dz, static_cast<int32_t>(j));
      }
      std::sort(all.begin(), all.end());
      for (int64_t r = 0; r < std::min<int64_t>(k, static_cast<int64_t>(all.size())); ++r) {
        idx[i * k + r] = all[r].second;
        dist[i * k + r] = std::sqrt(all[r].first);
      }
    }
  }
}

template <typename T>
std::vector<T> random_points(int64_t n, uint32_t seed, double grid = 0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  std::vector<T> v(static_cast<size_t>(3 * n));
  // With a grid step, coordinates are multiples of it: many exactly equal distances.
  for (T& x : v) x = static_cast<T>(grid > 0 ? std::round(u(gen) / grid) * grid : u(gen));
  return v;
}

// Runs the op (queries absent when q_offset is empty) and checks it against brute force.
template <typename T, typename I>
void check(const std::vector<T>& xyz, const std::vector<I>& offset, const std::vector<T>& q,
           const std::vector<I>& q_offset, int64_t k, bool with_queries, bool threaded = true) {
  const int64_t n = static_cast<int64_t>(xyz.size() / 3), m = static_cast<int64_t>(q.size() / 3);
  const int64_t b = static_cast<int64_t>(offset.size());
  std::vector<std::optional<Tensor>> in = {Tensor::of<T>({n, 3}, xyz), Tensor::of<I>({b}, offset)};
  if (with_queries) {
    in.push_back(Tensor::of<T>({m, 3}, q));
    in.push_back(Tensor::of<I>({b}, q_offset));
  }
  auto out = run("knn_query", in, {{"k", k}}, threaded);
  ASSERT_EQ(out[0].view.shape, (Shape{m, k}));
  ASSERT_EQ(out[1].view.shape, (Shape{m, k}));
  std::vector<int32_t> want_idx;
  std::vector<T> want_dist;
  brute_force(xyz, offset, q, q_offset, k, want_idx, want_dist);
  auto got_idx = out[0].values<int32_t>();
  auto got_dist = out[1].values<T>();
  int64_t bad = 0;
  for (size_t i = 0; i < want_idx.size() && bad < 10; ++i) {
    // Bitwise: EXPECT_EQ on floats is exact, and +inf == +inf.
    if (got_idx[i] != want_idx[i] || !(got_dist[i] == want_dist[i])) {
      ++bad;
      ADD_FAILURE() << "query " << i / k << " slot " << i % k << ": got (" << got_idx[i] << ", " << got_dist[i]
                    << "), want (" << want_idx[i] << ", " << want_dist[i] << ")";
    }
  }
}

template <typename T, typename I>
void check_self(const std::vector<T>& xyz, const std::vector<I>& offset, int64_t k, bool threaded = true) {
  check<T, I>(xyz, offset, xyz, offset, k, false, threaded);
}

TEST(KnnQueryKernel, Float32SelfQuerySegments) {
  // Segments: 700, 0 (empty), 5 (fewer than k), 1, 1200 points.
  check_self<float, int64_t>(random_points<float>(1906, 1), {700, 700, 705, 706, 1906}, 8);
}

TEST(KnnQueryKernel, Float64Int32OffsetsSeparateQueries) {
  auto xyz = random_points<double>(3000, 2), q = random_points<double>(2500, 3);
  check<double, int32_t>(xyz, {1000, 1000, 3000}, q, {900, 1700, 2500}, 16, true);
}

TEST(KnnQueryKernel, SerialMatchesToo) {
  check_self<float, int32_t>(random_points<float>(2000, 4), {1000, 2000}, 5, /*threaded=*/false);
}

TEST(KnnQueryKernel, KOne) { check_self<double, int64_t>(random_points<double>(500, 5), {500}, 1); }

TEST(KnnQueryKernel, LargeK) {
  // k = 100 (sorted insertion), k = 200 (above the insertion limit: a max-heap), each with a
  // segment smaller than k; and ties on the heap path.
  auto xyz = random_points<float>(1040, 6), q = random_points<float>(300, 7);
  check<float, int64_t>(xyz, {1000, 1040}, q, {200, 300}, 100, true);
  check<float, int64_t>(xyz, {1000, 1040}, q, {200, 300}, 200, true);
  check_self<double, int64_t>(random_points<double>(1500, 8, 0.5), {1500}, 150);
}

TEST(KnnQueryKernel, KLargerThanEverySegment) {
  check_self<float, int64_t>(random_points<float>(30, 8), {10, 10, 30}, 64);
}

TEST(KnnQueryKernel, GridTies) {
  // Integer coordinates on a small grid: huge numbers of equal distances and duplicate points.
  check_self<float, int64_t>(random_points<float>(4000, 9, 0.5), {2500, 4000}, 12);
  auto q = random_points<double>(800, 10, 0.25);
  check<double, int64_t>(random_points<double>(3000, 11, 0.5), {3000}, q, {800}, 40, true);
}

TEST(KnnQueryKernel, AllPointsIdentical) {
  // Every distance ties: the k smallest indices of the segment, for every query.
  const int64_t n = 20000;
  std::vector<float> xyz(3 * n, 0.5f);
  auto out = run("knn_query", {Tensor::of<float>({n, 3}, xyz), Tensor::of<int64_t>({2}, {n / 2, n})}, {{"k", 10}});
  auto idx = out[0].values<int32_t>();
  auto dist = out[1].values<float>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < 10; ++r) {
      ASSERT_EQ(idx[i * 10 + r], (i < n / 2 ? 0 : n / 2) + r) << "query " << i;
      ASSERT_EQ(dist[i * 10 + r], 0.f);
    }
  // And against brute force on a smaller copy with separate queries on a duplicate.
  std::vector<double> small(3 * 600, -1.25);
  check<double, int32_t>(small, {600}, {-1.25, -1.25, -1.25, 0.0, 0.0, 0.0}, {2}, 33, true);
}

TEST(KnnQueryKernel, EmptyInputs) {
  check_self<float, int64_t>({}, {0}, 4);                               // n = m = 0
  check_self<float, int64_t>({}, {}, 4);                                // no segments at all
  check<float, int64_t>(random_points<float>(50, 12), {50}, {}, {0}, 4, true);  // m = 0
  check<float, int64_t>({}, {0, 0}, random_points<float>(3, 13), {1, 3}, 4, true);  // n = 0
}

TEST(KnnPointsKernel, HugeBatchOfEmptyCloudsIsAnEmptyResultAtOnce) {
  // 2^40 batch items of no query points: nothing may be sized by the batch (a per-item table of
  // lengths was 8 TiB).
  const int64_t huge = int64_t{1} << 40;
  auto out = run("knn_points", {Tensor::of<float>({huge, 0, 3}, {}), Tensor::of<float>({huge, 0, 3}, {}),
                                std::nullopt, std::nullopt}, {{"K", int64_t{2}}});
  EXPECT_EQ(out[0].view.shape, (Shape{huge, 0, 2}));
  EXPECT_EQ(out[1].view.shape, (Shape{huge, 0, 2}));
}

TEST(KnnQueryKernel, SinglePoint) {
  check_self<double, int64_t>({0.5, -1.0, 2.0}, {1}, 3);
}

TEST(KnnQueryKernel, Clustered) {
  // Dense clusters far apart and a flat sheet: unbalanced extents exercise the split choice.
  std::mt19937 gen(14);
  std::normal_distribution<float> g(0.f, 0.01f);
  std::vector<float> xyz;
  for (int c = 0; c < 5; ++c)
    for (int i = 0; i < 400; ++i) {
      xyz.push_back(c * 100.f + g(gen));
      xyz.push_back(g(gen));
      xyz.push_back(c % 2 ? 0.f : g(gen));
    }
  check_self<float, int64_t>(xyz, {2000}, 16);
}

// ---- k = 1: one key per query, each leaf reduced in vectors --------------------------------------

TEST(KnnQueryKernel, KOneFloat32MatchesBruteForce) {
  // Segments of 1, 39 (one leaf), 1460 and 1000 points; then grids: ties and duplicates everywhere.
  check_self<float, int64_t>(random_points<float>(2500, 21), {1, 40, 1500, 2500}, 1);
  check_self<float, int64_t>(random_points<float>(2400, 22, 0.5), {1500, 2400}, 1);
  check_self<float, int32_t>(random_points<float>(1500, 23, 0.5), {1500}, 1, /*threaded=*/false);
  check<float, int32_t>(random_points<float>(1500, 24, 0.25), {1500}, random_points<float>(600, 25, 0.25), {600}, 1,
                        true);
  check<double, int64_t>(random_points<double>(1500, 26, 0.5), {500, 1500}, random_points<double>(500, 27, 0.5),
                         {200, 500}, 1, true);
}

TEST(KnnQueryKernel, KOneIsTheFirstNeighbourOfLargerK) {
  auto first_column = [](const auto& xyz, int64_t n, int64_t k) {
    using T = typename std::decay_t<decltype(xyz)>::value_type;
    auto out = run("knn_query", {Tensor::of<T>({n, 3}, xyz), Tensor::of<int64_t>({2}, {n / 3, n})}, {{"k", k}});
    std::vector<std::pair<int32_t, T>> got;
    auto idx = out[0].template values<int32_t>();
    auto dist = out[1].template values<T>();
    for (int64_t i = 0; i < n; ++i) got.emplace_back(idx[i * k], dist[i * k]);
    return got;
  };
  const auto grid = random_points<float>(6000, 28, 0.5);
  const auto uniform = random_points<double>(3000, 29);
  EXPECT_EQ(first_column(grid, 6000, 1), first_column(grid, 6000, 5));
  EXPECT_EQ(first_column(grid, 6000, 1), first_column(grid, 6000, 40));
  EXPECT_EQ(first_column(uniform, 3000, 1), first_column(uniform, 3000, 3));
}

std::vector<knn_leaf::Variant> every_leaf_variant() {
  std::vector<knn_leaf::Variant> v{knn_leaf::scalar_variant()};
  if (cpu_has_avx2() && knn_leaf::avx2_variant().isa) v.push_back(knn_leaf::avx2_variant());
  if (cpu_has_avx512() && knn_leaf::avx512_variant().isa) v.push_back(knn_leaf::avx512_variant());
  return v;
}

// A leaf's smallest (squared distance's bits, index) key, by a plain loop.
uint64_t plain_nearest(const std::vector<float>& x, const std::vector<float>& y, const std::vector<float>& z,
                       const std::vector<int32_t>& idx, const float* q) {
  uint64_t best = ~uint64_t{0};
  for (size_t i = 0; i < x.size(); ++i) {
    const float dx = x[i] - q[0], dy = y[i] - q[1], dz = z[i] - q[2];
    const float d2 = dx * dx + dy * dy + dz * dz;
    uint32_t bits;
    std::memcpy(&bits, &d2, sizeof bits);
    best = std::min(best, (uint64_t{bits} << 32) | static_cast<uint32_t>(idx[i]));
  }
  return best;
}

TEST(KnnLeafVariants, EveryVariantFindsThePlainLoopsNearestKey) {
  // Every leaf length, points on a coarse grid (many equal distances, copies, distance 0) or
  // not, indices shuffled (the smallest at any lane, up to the largest the op allows).
  std::mt19937 gen(30);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::uniform_int_distribution<int> grid(-2, 2);
  const std::vector<knn_leaf::Variant> variants = every_leaf_variant();
  std::vector<int> wrong(variants.size(), 0);
  for (int trial = 0; trial < 400; ++trial) {
    const bool on_grid = trial % 2 == 0;
    for (int len = 1; len <= 32; ++len) {
      // Vectors of exactly len: a variant reading past the leaf's end reads past the allocation.
      std::vector<float> x(len), y(len), z(len);
      for (int i = 0; i < len; ++i)
        for (float* c : {&x[i], &y[i], &z[i]}) *c = on_grid ? 0.5f * grid(gen) : u(gen);
      std::vector<int32_t> idx(len);
      std::iota(idx.begin(), idx.end(), trial % 3 == 0 ? std::numeric_limits<int32_t>::max() - 40 : 0);
      std::shuffle(idx.begin(), idx.end(), gen);
      float q[3] = {on_grid ? 0.5f * grid(gen) : u(gen), on_grid ? 0.5f * grid(gen) : u(gen), u(gen)};
      if (trial % 4 == 0) std::copy_n(std::initializer_list<float>{x[len / 2], y[len / 2], z[len / 2]}.begin(), 3, q);
      const uint64_t want = plain_nearest(x, y, z, idx, q);
      for (size_t v = 0; v < variants.size(); ++v)
        wrong[v] += variants[v].nearest_f(x.data(), y.data(), z.data(), idx.data(), len, q) != want;
    }
  }
  for (size_t v = 0; v < variants.size(); ++v) EXPECT_EQ(wrong[v], 0) << variants[v].isa << ": leaves wrong of 12800";
}

TEST(KnnLeafVariants, EveryVariantRoundsEachProductAsThePlainLoopDoes) {
  // From the origin, (b, c, 0) is at b² + c² and (a, 0, 0) at a², equal when every product is
  // rounded, so the smaller index wins; an FMA (b·b + c² rounded once, either way round) puts
  // (b, c, 0) and (c, b, 0) an ulp nearer. a, b, c found by an exact search.
  const float a = 0.9678275f, b = 0.65591574f, c = 0.71166325f, q[3] = {0, 0, 0};
  for (int len : {3, 17, 32})
    for (int at : {0, len - 1}) {  // the tie's winner in the first or the last lane
      std::vector<float> x(len, 3.f), y(len, 3.f), z(len, 3.f);
      std::vector<int32_t> idx(len);
      std::iota(idx.begin(), idx.end(), 10);
      const int other = at == 0 ? 1 : 0, third = at == 0 ? 2 : 1;
      x[at] = a, y[at] = 0, z[at] = 0, idx[at] = 1;
      x[other] = b, y[other] = c, z[other] = 0;
      x[third] = c, y[third] = b, z[third] = 0;
      const uint64_t want = plain_nearest(x, y, z, idx, q);
      ASSERT_EQ(static_cast<uint32_t>(want), 1u);
      for (const knn_leaf::Variant& v : every_leaf_variant())
        EXPECT_EQ(v.nearest_f(x.data(), y.data(), z.data(), idx.data(), len, q), want) << v.isa << " len " << len;
    }
}

// ---- errors ---------------------------------------------------------------------------------

void expect_error(const std::vector<std::optional<Tensor>>& in, int64_t k, const std::string& what) {
  try {
    run("knn_query", in, {{"k", k}});
    ADD_FAILURE() << "no error; expected: " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(KnnQueryKernel, RejectsBadInput) {
  Tensor xyz = Tensor::random<float>({4, 3}, 1), q = Tensor::random<float>({2, 3}, 2);
  auto off = [](std::vector<int64_t> v) { return Tensor::of<int64_t>({static_cast<int64_t>(v.size())}, v); };
  expect_error({xyz, off({3, 2, 4})}, 2, "offset must be non-decreasing, but offset[0] = 3 > offset[1] = 2");
  expect_error({xyz, off({-1, 4})}, 2, "offset[0] = -1 is negative");
  expect_error({xyz, off({1, 3})}, 2, "the last entry of offset (3) must equal the number of rows of xyz (4)");
  expect_error({xyz, off({})}, 2, "the last entry of offset (0, none given) must equal the number of rows of xyz (4)");
  expect_error({xyz, off({4}), q, off({1})}, 2,
               "the last entry of new_offset (1) must equal the number of rows of new_xyz (2)");
  expect_error({xyz, off({2, 4}), q, off({2})}, 2, "new_offset must have one entry per segment of offset");
  expect_error({xyz, off({4}), q, std::nullopt}, 2, "new_xyz and new_offset must be given together");
  expect_error({xyz, off({4}), std::nullopt, off({2})}, 2, "new_xyz and new_offset must be given together");
  expect_error({xyz, off({4})}, 0, "k must be >= 1, got 0");
  expect_error({Tensor::random<float>({4, 2}, 1), off({4})}, 2, "xyz must be (n, 3)");
  expect_error({xyz, off({4}), Tensor::random<float>({2, 4}, 1), off({2})}, 2, "new_xyz must be (m, 3)");
  expect_error({Tensor::random<float>({12}, 1), off({4})}, 2, "input 'xyz' must have rank 2");
  expect_error({xyz, Tensor::of<float>({1}, {4.f})}, 2, "input 'offset' has dtype float32");
  expect_error({xyz, off({4}), Tensor::random<double>({2, 3}, 1), off({2})}, 2, "must have the same dtype");
  Tensor nan_xyz = Tensor::of<float>({2, 3}, {0.f, 1.f, 2.f, 3.f, std::nanf(""), 5.f});
  expect_error({nan_xyz, off({2})}, 1, "xyz[1, 1] = nan is not finite");
  Tensor inf_q = Tensor::of<double>({1, 3}, {0.0, 0.0, -INFINITY});
  expect_error({Tensor::random<double>({3, 3}, 1), off({3}), inf_q, off({1})}, 1, "new_xyz[0, 2] = -inf is not finite");
}

}  // namespace
}  // namespace opbridge::testing
