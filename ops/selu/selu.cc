// selu: an op PyTorch already has (aten::selu), exported as an ONNX function in opbridge's
// domain rather than a custom kernel, as an onnxscript function in a custom domain would be. The body composes standard
// ONNX ops, so any ONNX Runtime runs it (it inlines model-local functions) with no library.
#include <opbridge/op.h>

namespace opbridge {

// selu(x) = scale * (x if x > 0 else alpha * (exp(x) - 1)), PyTorch's constants. CastLike (opset
// 15) makes one body serve float and double.
OPBRIDGE_OP(selu)
    .doc("Scaled exponential linear unit, element-wise; exported as an ONNX function (Exp, Where, ...).")
    .existing_torch_op("aten::selu")
    .types("T", {DType::Float32, DType::Float64})
    .input("self", "T", "input tensor")
    .output("result", "T", shape::same({"self"}), "selu(self)")
    .export_function(15, R"(
    alpha = Constant <value_float = 1.6732632423543772> ()
    scale = Constant <value_float = 1.0507009873554805> ()
    zero = Constant <value_float = 0.0> ()
    one = Constant <value_float = 1.0> ()
    alpha_t = CastLike (alpha, self)
    scale_t = CastLike (scale, self)
    zero_t = CastLike (zero, self)
    one_t = CastLike (one, self)
    e = Exp (self)
    em1 = Sub (e, one_t)
    neg = Mul (alpha_t, em1)
    positive = Greater (self, zero_t)
    inner = Where (positive, self, neg)
    result = Mul (scale_t, inner)
)");

}  // namespace opbridge
