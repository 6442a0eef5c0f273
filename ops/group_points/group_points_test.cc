// group_points / gather_points kernels at the edges the Python suite cannot reach (numpy
// references for the values are in test_group_points.py).
#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

namespace opbridge::testing {
namespace {

TEST(GroupPointsKernel, HugeBatchWithNoIndicesIsAnEmptyResultAtOnce) {
  // 2^40 batch items, no index per item: an empty output, returned without walking 2^40 rows.
  const int64_t huge = int64_t{1} << 40;
  Tensor y = run("group_points", {Tensor::of<float>({huge, 1, 0}, {}), Tensor::of<int64_t>({huge, 0, 4}, {})})[0];
  EXPECT_EQ(y.view.shape, (Shape{huge, 1, 0, 4}));
  y = run("gather_points", {Tensor::of<float>({huge, 3, 0}, {}), Tensor::of<int64_t>({huge, 0}, {})})[0];
  EXPECT_EQ(y.view.shape, (Shape{huge, 3, 0}));
}

TEST(GroupPointsKernel, GathersByIndexAndRefusesAnIndexOutsideThePoints) {
  Tensor f = Tensor::of<float>({1, 2, 3}, {1, 2, 3, 10, 20, 30});
  Tensor y = run("group_points", {f, Tensor::of<int32_t>({1, 2, 2}, {2, 0, 1, 1})})[0];
  EXPECT_EQ(y.values<float>(), (std::vector<float>{3, 1, 2, 2, 30, 10, 20, 20}));
  EXPECT_NE(error_of([&] { run("group_points", {f, Tensor::of<int32_t>({1, 1, 1}, {3})}); })
                .find("is not an index of features' 3 points"),
            std::string::npos);
}

}  // namespace
}  // namespace opbridge::testing
