// furthest_point_sampling's kernel against a naive loop: the greedy chain with the running minimum,
// ties by index or by the CUDA block rule, on one thread and split over threads.
#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

#include "fps_kernel.h"
#include "fps_variants.h"

#include <opbridge/cpu.h>
#include <opbridge/half.h>

#include <algorithm>
#include <cmath>
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

TEST(FurthestPointSamplingKernel, WithDistReadsTheRowsOfTheMatrixAsMmcvsBlockDoes) {
  // Squared distances of a grid cloud: the same picks as the batched form with mmcv's settings.
  Tensor xyz = grid(2, 3000, 7);
  const std::vector<float> p = xyz.values<float>();
  std::vector<float> d(2 * 3000 * 3000);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 3000; ++i)
      for (int64_t k = 0; k < 3000; ++k) {
        const float* u = &p[(b * 3000 + i) * 3];
        const float* v = &p[(b * 3000 + k) * 3];
        const float dx = v[0] - u[0], dy = v[1] - u[1], dz = v[2] - u[2];
        d[(b * 3000 + i) * 3000 + k] = dx * dx + dy * dy + dz * dz;
      }
  const Tensor dist = Tensor::of<float>({2, 3000, 3000}, d);
  EXPECT_EQ(run("furthest_point_sampling_with_dist", {dist}, {{"npoint", int64_t{200}}}, true)[0].values<int32_t>(),
            run("furthest_point_sampling", {xyz}, {{"npoint", int64_t{200}}, {"tie_threads", int64_t{1024}},
                                                    {"skip_near_origin", false}})[0].values<int32_t>());
  // A thread whose minima are all below -1 offers point 0 (mmcv's start value), which then wins
  // over larger negatives: 4 points, 4 threads, every entry below -1.
  Tensor negative = Tensor::of<float>({1, 4, 4}, {-5, -3, -2, -4, -5, -3, -2, -4, -5, -3, -2, -4, -5, -3, -2, -4});
  EXPECT_EQ(run("furthest_point_sampling_with_dist", {negative}, {{"npoint", int64_t{3}}})[0].values<int32_t>(),
            (std::vector<int32_t>{0, 0, 0}));
  EXPECT_NE(error_of([&] { run("furthest_point_sampling_with_dist", {Tensor::of<float>({1, 2, 2}, {0, NAN, 1, 0})},
                               {{"npoint", int64_t{2}}}); })
                .find("dist has a value that is not finite (nan at batch item 0, row 0, column 1)"),
            std::string::npos);
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


// The kernel's variants (fps_variants.h) against a plain loop over every point at every pick, on
// clouds of thousands of points (dozens of blocks, so that blocks are skipped) and many picks.
struct SerialHost final : KernelHost {
  void* output_memory(size_t, DType, const Shape&) override { return nullptr; }
  void parallel_for(int64_t n, int64_t, ParallelBody body) override { body(0, n); }
};

std::vector<fps::Variant> every_variant() {
  std::vector<fps::Variant> v{fps::scalar_variant()};
  if (cpu_has_avx2() && fps::avx2_variant().isa) v.push_back(fps::avx2_variant());
  if (cpu_has_avx512() && fps::avx512_variant().isa) v.push_back(fps::avx512_variant());
  return v;
}

struct Chain {
  int64_t n = 0, dims = 3, m = 0, start = 0, threads = 0;
  bool skip = false;
  double initial = 1e10;
};

// One segment's picks as the originals compute them: every point's running minimum of
// ((v0² + v1²) + v2²) + ..., in C; the largest minimum, equal ones ordered by (bit-reversed
// k mod threads, k); points with x² + y² + z² <= 1e-3 never taken when `skip`; point 0 when no
// point counts. No shortcut: every pick scans every point.
template <typename C>
std::vector<int64_t> plain_loop(const std::vector<C>& p, const Chain& c) {
  auto order = [&](int64_t k) {
    int64_t r = 0;
    for (int64_t t = c.threads > 0 ? k % c.threads : 0, w = c.threads; w > 1; w /= 2, t /= 2) r = r * 2 + t % 2;
    return std::pair<int64_t, int64_t>{r, k};
  };
  std::vector<C> dist(static_cast<size_t>(c.n), static_cast<C>(c.initial));
  std::vector<bool> out_of_play(static_cast<size_t>(c.n), false);
  for (int64_t k = 0; c.skip && k < c.n; ++k) {
    C mag = 0;
    for (int64_t d = 0; d < c.dims; ++d) mag += p[k * c.dims + d] * p[k * c.dims + d];
    out_of_play[k] = static_cast<double>(mag) <= 1e-3;
  }
  std::vector<int64_t> picks{c.start};
  for (int64_t j = 1; j < c.m; ++j) {
    const int64_t last = picks.back();
    int64_t best = -1;
    for (int64_t k = 0; k < c.n; ++k) {
      if (out_of_play[k]) continue;
      C sum = 0;
      for (int64_t d = 0; d < c.dims; ++d) {
        const C v = p[k * c.dims + d] - p[last * c.dims + d];
        sum = d == 0 ? v * v : sum + v * v;
      }
      dist[k] = std::min(dist[k], sum);
      if (best < 0 || dist[k] > dist[best] || (dist[k] == dist[best] && order(k) < order(best))) best = k;
    }
    picks.push_back(best < 0 ? 0 : best);
  }
  return picks;
}

// fps::sample in `variant` over one segment of points `p` (stored as S).
template <typename S>
std::vector<int64_t> kernel_picks(const std::vector<S>& p, const Chain& c, const fps::Variant& variant) {
  OpSpec spec;
  std::vector<const TensorView*> inputs;
  std::vector<TensorView> outputs;
  std::vector<AttrValue> attrs;
  SerialHost host;
  KernelContext ctx(spec, inputs, outputs, attrs, host);
  std::vector<int64_t> idx(static_cast<size_t>(c.m), -1);
  TensorView points{const_cast<S*>(p.data()), DTypeOf<S>::value, {c.n, c.dims}, {c.dims, 1}};
  TensorView out{idx.data(), DType::Int64, {c.m}, {1}};
  fps::sample(ctx, points, {{0, c.n, 0, c.m, c.start}}, {c.threads, c.skip, c.initial, true}, out, &variant);
  return idx;
}

// Points of a named kind: "uniform" in the unit cube, "grid" (7 values per coordinate: many
// equal distances), "copies" (each point three times), "origin" (within 0.05 of the origin),
// "far" (coordinates up to 3e5: distances above the 1e10 start), "huge" (float64 up to ±1e308:
// differences overflow to infinity).
std::vector<double> cloud(const std::string& kind, int64_t n, int64_t dims, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(0, 1);
  std::vector<double> v(static_cast<size_t>(n * dims));
  for (size_t i = 0; i < v.size(); ++i) {
    if (kind == "grid") v[i] = 0.5f * static_cast<float>(static_cast<int>(u(g) * 7) - 3);
    else if (kind == "copies") v[i] = (i / dims) % 3 ? v[i - dims] : u(g);
    else if (kind == "origin") v[i] = 0.1f * u(g) - 0.05f;
    else if (kind == "far") v[i] = 3e5f * u(g);
    else if (kind == "huge") v[i] = 1e308 * (2.0 * u(g) - 1.0);
    else v[i] = u(g);
  }
  return v;
}

template <typename S>
void expect_every_variant_matches(const std::string& kind, const Chain& c, uint32_t seed) {
  std::vector<S> p;
  std::vector<compute_t<S>> wide;
  for (double v : cloud(kind, c.n, c.dims, seed))
    p.push_back(narrow<S>(static_cast<compute_t<S>>(v))), wide.push_back(widen(p.back()));
  const std::vector<int64_t> want = plain_loop(wide, c);
  for (const fps::Variant& v : every_variant())
    EXPECT_EQ(kernel_picks(p, c, v), want) << kind << " " << v.isa << " n " << c.n << " dims " << c.dims;
}

TEST(FurthestPointSamplingVariants, EveryVariantMatchesAPlainLoopOnCloudsOfManyBlocks) {
  expect_every_variant_matches<float>("uniform", {12000, 3, 1500}, 1);
  expect_every_variant_matches<float>("far", {4000, 3, 600}, 2);
  expect_every_variant_matches<double>("uniform", {6000, 3, 1500}, 3);
  expect_every_variant_matches<double>("huge", {3000, 3, 500}, 17);
  expect_every_variant_matches<Float16>("uniform", {5000, 3, 1000, 0, 512, true}, 4);
  expect_every_variant_matches<BFloat16>("uniform", {4000, 3, 800, 0, 0}, 5);
}

TEST(FurthestPointSamplingVariants, EveryVariantKeepsTheTieRulesOnGridsAndCopies) {
  // Hundreds of equal distances at every pick: the blocks' best points and the choice among
  // blocks must follow the key, not the (spatial) order the blocks hold the points in.
  expect_every_variant_matches<float>("grid", {6000, 3, 2000, 0, 1024}, 6);
  expect_every_variant_matches<float>("grid", {6000, 3, 2000, 0, 0, true}, 7);
  expect_every_variant_matches<float>("copies", {6000, 3, 3000, 0, 512}, 8);
  expect_every_variant_matches<double>("grid", {3000, 3, 1200, 0, 256}, 9);
  // More picks than points: every minimum reaches 0, then the same pick over and over.
  expect_every_variant_matches<float>("grid", {300, 3, 500, 0, 64}, 10);
}

TEST(FurthestPointSamplingVariants, EveryVariantSkipsPointsNearTheOrigin) {
  expect_every_variant_matches<float>("origin", {5000, 3, 800, 0, 512, true}, 11);
  expect_every_variant_matches<float>("origin", {200, 3, 5, 0, 0, true}, 12);  // none counts
}

TEST(FurthestPointSamplingVariants, EveryVariantTakesAnyNumberOfCoordinatesFromAnyStart) {
  // The ratio form: any number of coordinates, minima from +inf, a start other than 0.
  expect_every_variant_matches<float>("uniform", {4000, 5, 1000, 17, 0, false, INFINITY}, 13);
  expect_every_variant_matches<float>("grid", {3000, 1, 3000, 0, 0, false, INFINITY}, 14);
  expect_every_variant_matches<double>("grid", {3000, 2, 1500, 2999, 0, false, INFINITY}, 15);
  expect_every_variant_matches<float>("uniform", {600, 70, 200, 3, 0, false, INFINITY}, 16);  // > 64 coordinates
  expect_every_variant_matches<float>("uniform", {40, 0, 5, 7, 0, false, INFINITY}, 19);  // none: every distance 0
}

TEST(FurthestPointSamplingVariants, EveryVariantRoundsEachProductAsThePlainLoopDoes) {
  // From point 0, points 1 and 2 are at b² + c² and point 3 at a², equal when every product is
  // rounded (the tie goes to point 1); an FMA (b·b + c² rounded once, either way round) puts
  // points 1 and 2 an ulp nearer, and point 3 would be picked. b, c, a found by an exact search.
  auto picks = [](auto b, auto c, auto a) {
    using C = decltype(b);
    const std::vector<C> p{0, 0, 0, b, c, 0, c, b, 0, a, 0, 0};
    std::vector<std::vector<int64_t>> got;
    for (const fps::Variant& v : every_variant()) got.push_back(kernel_picks(p, {4, 3, 2, 0, 0}, v));
    return got;
  };
  for (const auto& got : picks(0.65591574f, 0.71166325f, 0.9678275f)) EXPECT_EQ(got, (std::vector<int64_t>{0, 1}));
  for (const auto& got : picks(0.7706134277737171, 0.6384456020226854, 1.0007286554342627))
    EXPECT_EQ(got, (std::vector<int64_t>{0, 1}));
}

TEST(FurthestPointSamplingVariants, EveryVariantUpdatesABlockWhoseBoundIsAHairBelowItsTop) {
  // Point 2 sits alone in its block, its minimum R² (from the start, point 0). The second pick,
  // point 1, is (R - 2h)² from it, 5e-7 below R² (h: one float32 step below 2048): the block must
  // be updated, and then point 3, at (R - h)² from point 0, is the third pick. Skipping the block
  // (a bound compared with any slack) keeps R² and picks point 2. 300 copies of point 0 make
  // more than one block.
  const float r = 1024, h = 1.0f / 8192;
  std::vector<float> p{r, 0, 0, r - 2 * h, 0, 0, 2 * r - h, 0};
  for (int i = 0; i < 300; ++i) p.insert(p.end(), {r, 0});
  const Chain c{static_cast<int64_t>(p.size() / 2), 2, 3};
  ASSERT_EQ(plain_loop(p, c), (std::vector<int64_t>{0, 1, 3}));
  for (const fps::Variant& v : every_variant())
    EXPECT_EQ(kernel_picks(p, c, v), (std::vector<int64_t>{0, 1, 3})) << v.isa;
}

}  // namespace
}  // namespace opbridge::testing
