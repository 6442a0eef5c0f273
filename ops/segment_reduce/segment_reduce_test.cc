// The segment and scatter reductions' kernel against naive loops, on one thread and many: segments
// of every size (empty ones included), ties, and the rows min and max report.
#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

#include <algorithm>
#include <limits>

namespace opbridge::testing {
namespace {

struct Reduced {
  std::vector<float> out;
  std::vector<int64_t> arg;
};

// Each output row s reduces the rows r with group(r) == s, visited in increasing r.
template <typename Group>
Reduced naive(const std::vector<float>& src, int64_t n, int64_t f, int64_t segments, Group group,
              const std::string& reduce, bool untouched_zero) {
  Reduced r{std::vector<float>(static_cast<size_t>(segments * f), 0.0f),
            std::vector<int64_t>(static_cast<size_t>(segments * f), n)};
  const bool max = reduce == "max", min = reduce == "min";
  for (int64_t s = 0; s < segments; ++s) {
    for (int64_t c = 0; c < f; ++c) {
      const float big = std::numeric_limits<float>::max();
      float acc = max ? -big : min ? big : 0.0f;
      int64_t at = n, count = 0;
      for (int64_t row = 0; row < n; ++row) {
        if (group(row) != s) continue;
        const float v = src[row * f + c];
        ++count;
        if ((max && v > acc) || (min && v < acc)) acc = v, at = row;
        else if (!max && !min) acc += v;
      }
      if (reduce == "mean" && count > 0) acc /= static_cast<float>(count);
      if ((max || min) && (count == 0 || (at == n && untouched_zero))) acc = 0.0f;
      r.out[s * f + c] = acc;
      r.arg[s * f + c] = at;
    }
  }
  return r;
}

// Segments of sizes 0, 1, 2, ... up to a few hundred rows, so some are empty and some span more
// rows than one task's grain.
std::vector<int64_t> ragged_indptr(int64_t segments) {
  std::vector<int64_t> indptr{0};
  for (int64_t s = 0; s < segments; ++s) indptr.push_back(indptr.back() + (s * 37) % 301);
  return indptr;
}

TEST(SegmentReduceKernel, SegmentCsrMatchesANaiveLoop) {
  const std::vector<int64_t> indptr = ragged_indptr(60);
  const int64_t n = indptr.back(), f = 5, segments = 60;
  Tensor src = Tensor::random<float>({n, f}, 11);
  auto group = [&](int64_t row) {
    return static_cast<int64_t>(std::upper_bound(indptr.begin(), indptr.end(), row) - indptr.begin()) - 1;
  };
  for (const char* reduce : {"sum", "mean", "min", "max"}) {
    for (bool threaded : {false, true}) {
      Reduced want = naive(src.values<float>(), n, f, segments, group, reduce, false);
      Tensor ptr = Tensor::of<int64_t>({segments + 1}, indptr);
      std::vector<float> got = run("segment_csr", {src, ptr}, {{"reduce", std::string(reduce)}}, threaded)[0].values<float>();
      ASSERT_EQ(got.size(), want.out.size());
      for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want.out[i], 1e-4f) << reduce << " at " << i;
      if (std::string(reduce) == "min" || std::string(reduce) == "max") {
        auto both = run("segment_csr_arg", {src, ptr}, {{"reduce", std::string(reduce)}}, threaded);
        EXPECT_EQ(both[0].values<float>(), want.out) << reduce;
        EXPECT_EQ(both[1].values<int64_t>(), want.arg) << reduce;
      }
    }
  }
}

TEST(SegmentReduceKernel, ScatterMatchesANaiveLoop) {
  const int64_t n = 4000, f = 3, dim_size = 700;  // some output rows get no row
  std::vector<int32_t> index(n);
  for (int64_t r = 0; r < n; ++r) index[r] = static_cast<int32_t>((r * r + 7 * r) % (dim_size - 50));
  Tensor src = Tensor::random<float>({n, f}, 12), idx = Tensor::of<int32_t>({n}, index);
  auto group = [&](int64_t row) { return int64_t{index[row]}; };
  for (const char* reduce : {"sum", "mean", "min", "max"}) {
    for (bool threaded : {false, true}) {
      Reduced want = naive(src.values<float>(), n, f, dim_size, group, reduce, true);
      const std::map<std::string, AttrValue> attrs{{"dim_size", dim_size}, {"reduce", std::string(reduce)}};
      std::vector<float> got = run("scatter_reduce", {src, idx}, attrs, threaded)[0].values<float>();
      for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want.out[i], 1e-4f) << reduce << " at " << i;
      if (std::string(reduce) == "min" || std::string(reduce) == "max") {
        auto both = run("scatter_reduce_arg", {src, idx}, attrs, threaded);
        EXPECT_EQ(both[0].values<float>(), want.out) << reduce;
        EXPECT_EQ(both[1].values<int64_t>(), want.arg) << reduce;
      }
    }
  }
}

TEST(SegmentReduceKernel, TiesGoToTheFirstRowAndNaNIsNeverPicked) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor src = Tensor::of<float>({5, 2}, {2, nan, 7, nan, 7, 1, 2, 1, nan, nan});
  Tensor ptr = Tensor::of<int64_t>({3}, {0, 4, 5});
  auto mx = run("segment_csr_arg", {src, ptr}, {{"reduce", std::string("max")}});
  EXPECT_EQ(mx[1].values<int64_t>(), (std::vector<int64_t>{1, 2, 5, 5}));  // the last segment is all NaN
  EXPECT_EQ(mx[0].values<float>()[0], 7.0f);
  EXPECT_EQ(mx[0].values<float>()[2], -std::numeric_limits<float>::max());  // segment_csr keeps the start
  auto mn = run("scatter_reduce_arg", {src, Tensor::of<int64_t>({5}, {0, 0, 0, 0, 1})},
                {{"dim_size", int64_t{2}}, {"reduce", std::string("min")}});
  EXPECT_EQ(mn[1].values<int64_t>(), (std::vector<int64_t>{0, 2, 5, 5}));
  EXPECT_EQ(mn[0].values<float>()[2], 0.0f);  // scatter writes 0 where nothing beat the start
}

TEST(SegmentReduceKernel, BackwardSendsEachGradientToItsRows) {
  Tensor src = Tensor::of<float>({4, 1}, {1, 5, 3, 5});
  Tensor ptr = Tensor::of<int64_t>({3}, {0, 3, 4}), grad = Tensor::of<float>({2, 1}, {6, 10});
  auto grad_of = [&](const char* reduce) {
    return run("segment_csr_backward", {src, ptr, grad}, {{"reduce", std::string(reduce)}})[0].values<float>();
  };
  EXPECT_EQ(grad_of("sum"), (std::vector<float>{6, 6, 6, 10}));
  EXPECT_EQ(grad_of("mean"), (std::vector<float>{2, 2, 2, 10}));
  EXPECT_EQ(grad_of("max"), (std::vector<float>{0, 6, 0, 10}));
  EXPECT_EQ(grad_of("min"), (std::vector<float>{6, 0, 0, 10}));
}

TEST(SegmentReduceKernel, BackwardOfManyRowsWithNoColumnsReturnsAtOnce) {
  // 2^40 rows of no column: an empty gradient, without walking the rows one by one.
  const int64_t rows = int64_t{1} << 40;
  for (const char* reduce : {"sum", "mean", "max"}) {
    Tensor g = run("segment_csr_backward", {Tensor::of<float>({rows, 0}, {}), Tensor::of<int64_t>({3}, {0, rows / 2, rows}),
                                            Tensor::of<float>({2, 0}, {})}, {{"reduce", std::string(reduce)}})[0];
    EXPECT_EQ(g.view.shape, (Shape{rows, 0}));
  }
}

TEST(SegmentReduceKernel, BadBoundsAndIndicesAreErrors) {
  Tensor src = Tensor::random<float>({4, 2}, 13);
  EXPECT_THROW(run("segment_csr", {src, Tensor::of<int64_t>({3}, {0, 3, 2})}), std::exception);
  EXPECT_THROW(run("segment_csr", {src, Tensor::of<int64_t>({2}, {0, 5})}), std::exception);
  EXPECT_THROW(run("scatter_reduce", {src, Tensor::of<int64_t>({4}, {0, 1, 2, 3})}, {{"dim_size", int64_t{3}}}),
               std::exception);
  EXPECT_THROW(run("scatter_reduce", {src, Tensor::of<int64_t>({4}, {0, -1, 0, 0})}, {{"dim_size", int64_t{3}}}),
               std::exception);
  EXPECT_THROW(run("segment_csr", {src, Tensor::of<int64_t>({2}, {0, 4})}, {{"reduce", std::string("prod")}}),
               std::exception);
}

}  // namespace
}  // namespace opbridge::testing
