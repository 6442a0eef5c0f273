// A kernel test of an out-of-tree op, written exactly as the built-in ops' tests are: the
// installed harness runs the kernel through the same validation and allocation as both runtimes.
#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

namespace {
using namespace opbridge;
using namespace opbridge::testing;

TEST(Axpy, MatchesANaiveLoop) {
  Tensor x = Tensor::random<float>({5, 7}, 1), bias = Tensor::random<float>({5, 7}, 2);
  for (bool with_bias : {true, false}) {
    std::vector<std::optional<Tensor>> in{x};
    if (with_bias) in.push_back(bias);
    std::vector<float> y = run("axpy", in, {{"alpha", 1.5}})[0].values<float>();
    std::vector<float> xs = x.values<float>(), bs = bias.values<float>();
    ASSERT_EQ(y.size(), xs.size());
    for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], 1.5f * xs[i] + (with_bias ? bs[i] : 0.0f)) << i;
  }
}

TEST(Axpy, RejectsWhatTheSpecForbids) {
  Tensor x = Tensor::random<float>({5, 7}, 1), bias = Tensor::random<float>({7}, 2);
  try {
    run("axpy", {x, bias}, {{"alpha", 1.0}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must have the same shape"), std::string::npos) << e.what();
  }
  EXPECT_THROW(run("axpy", {x}), Error);  // the required attribute alpha is missing
}
}  // namespace
