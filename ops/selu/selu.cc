// selu: an op PyTorch already has (aten::selu), exported as an ONNX function in opbridge's
// domain rather than a custom kernel, as an onnxscript function in a custom domain would be. The body composes standard
// ONNX ops, so any ONNX Runtime runs it (it inlines model-local functions) with no library.
#include <opbridge/op.h>

namespace opbridge {

// selu(x) = scale * x for x > 0, else (alpha * scale) * expm1(x): PyTorch's formula (its elu kernel),
// constants (double, so float64 keeps all their digits; CastLike rounds them to float32 as
// PyTorch's float32 kernel does) and order of operations, so the special values give PyTorch's bits:
// -0.0 stays -0.0, a subnormal x gives its subnormal result, -inf gives -alpha*scale. CastLike
// (opset 15) makes one body serve float and double.
//
// ONNX has no Expm1; exp(x) - 1 loses every digit as x nears 0 (0 instead of x for |x| < 2^-25 in
// float32). Kahan's way keeps them: with u = exp(x) rounded, expm1(x) = x * ((u - 1) / log(u)),
// exactly x where u rounds to 1, and -1 where u - 1 rounds to -1 (log(u) is -inf or inaccurate).
// Values that may be -0.0 only ever pass through Where's false branch: ONNX Runtime's CPU Where
// returns +0.0 for a -0.0 taken from its true branch (it merges its two selections by comparing
// with zero), and fuses Where(Not(c), a, b) into Where(c, b, a), so no Not either.
OPBRIDGE_OP(selu)
    .doc("Scaled exponential linear unit, element-wise; exported as an ONNX function (Exp, Log, Where, ...).")
    .existing_torch_op("aten::selu")
    .types("T", {DType::Float32, DType::Float64})
    .input("self", "T", "input tensor")
    .output("result", "T", shape::same({"self"}), "selu(self)")
    .export_function(15, R"(
    alpha = Constant <value = double {1.6732632423543772848170429916717}> ()
    scale = Constant <value = double {1.0507009873554804934193349852946}> ()
    zero = Constant <value_float = 0.0> ()
    one = Constant <value_float = 1.0> ()
    alpha_t = CastLike (alpha, self)
    scale_t = CastLike (scale, self)
    zero_t = CastLike (zero, self)
    one_t = CastLike (one, self)
    minus_one = Neg (one_t)
    negcoef = Mul (alpha_t, scale_t)
    u = Exp (self)
    um1 = Sub (u, one_t)
    log_u = Log (u)
    kahan = Div (um1, log_u)
    u_is_one = Equal (u, one_t)
    factor = Where (u_is_one, one_t, kahan)
    near = Mul (self, factor)
    saturated = Equal (um1, minus_one)
    em1 = Where (saturated, minus_one, near)
    neg = Mul (em1, negcoef)
    pos = Mul (self, scale_t)
    positive = Greater (self, zero_t)
    result = Where (positive, pos, neg)
)");

}  // namespace opbridge
