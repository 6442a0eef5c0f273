// my_add's kernel against a naive broadcasting loop.
#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

namespace opbridge::testing {
namespace {

template <typename T>
void check_my_add(Shape sa, Shape sb, Shape expected) {
  Tensor a = Tensor::random<T>(sa, 1), b = Tensor::random<T>(sb, 2);
  Tensor y = run("my_add", {a, b})[0];
  ASSERT_EQ(y.view.shape, expected);
  auto va = a.values<T>(), vb = b.values<T>(), vy = y.values<T>();
  for (int64_t i = 0; i < y.view.numel(); ++i)
    EXPECT_EQ(vy[i], T(2) * va[broadcast_offset(expected, sa, i)] + vb[broadcast_offset(expected, sb, i)]) << i;
}

TEST(MyAddKernel, SameShape) { check_my_add<float>({17, 33}, {17, 33}, {17, 33}); }
TEST(MyAddKernel, Broadcast) { check_my_add<double>({4, 1, 5}, {3, 1}, {4, 3, 5}); }
TEST(MyAddKernel, ScalarAndEmpty) {
  check_my_add<float>({}, {6}, {6});
  check_my_add<float>({0, 3}, {3}, {0, 3});
}

}  // namespace
}  // namespace opbridge::testing
