// foo(x, y) = x + y: the minimal ONNX Runtime custom op (ONNX Runtime's own "Foo" example).
// Unlike my_add it does not broadcast: both inputs must have the same shape.
#include <opbridge/elementwise.h>
#include <opbridge/op.h>

namespace opbridge {
namespace {

void foo_kernel(KernelContext& ctx) {
  const TensorView& x = ctx.input("x");
  const TensorView& y = ctx.input("y");
  TensorView& z = ctx.output(0);
  const float* px = x.data_as<float>();
  const float* py = y.data_as<float>();
  float* pz = z.data_as<float>();
  ctx.parallel_for(z.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) pz[i] = px[i] + py[i];
  });
}

}  // namespace

OPBRIDGE_OP(foo)
    .doc("Computes x + y element-wise for two float32 tensors of the same shape.")
    .types("T", {DType::Float32})
    .input("x", "T", "first operand")
    .input("y", "T", "second operand, same shape as x")
    .output("z", "T", shape::same({"x", "y"}), "x + y")
    .cpu(foo_kernel);

}  // namespace opbridge
