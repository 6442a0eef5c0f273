// my_add(a, b) = 2·a + b, with numpy broadcasting: the classic C++-extension example. float16 and
// bfloat16 compute in float32 and round once.
#include <opbridge/elementwise.h>
#include <opbridge/op.h>

namespace opbridge {
namespace {

void my_add_kernel(KernelContext& ctx) {
  const TensorView& a = ctx.input("a");
  const TensorView& b = ctx.input("b");
  TensorView& y = ctx.output(0);
  visit_dtype<float, double, Float16, BFloat16>(y.dtype, [&](auto zero) {
    using T = decltype(zero);
    using C = compute_t<T>;
    const T* pa = a.data_as<T>();
    const T* pb = b.data_as<T>();
    T* py = y.data_as<T>();
    broadcast_for_each<2>(ctx, y.shape, {&a, &b}, [&](int64_t i, const std::array<int64_t, 2>& o) {
      py[i] = narrow<T>(C(2) * widen(pa[o[0]]) + widen(pb[o[1]]));
    });
  });
}

}  // namespace

OPBRIDGE_OP(my_add)
    .doc("Computes 2*a + b element-wise, with numpy broadcasting.")
    .types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    .input("a", "T", "first operand; doubled")
    .input("b", "T", "second operand")
    .output("y", "T", shape::broadcast({"a", "b"}), "2*a + b")
    .cpu(my_add_kernel);

}  // namespace opbridge
