// asinh: an ATen op that PyTorch already implements and ai.onnx already has (Asinh, opset 9),
// where only the export mapping is missing or must be pinned. No kernel: opbridge registers the
// export rule for both exporters and ONNX Runtime runs its builtin Asinh.
#include <opbridge/op.h>

namespace opbridge {

OPBRIDGE_OP(asinh)
    .doc("Inverse hyperbolic sine, element-wise; exported as ai.onnx Asinh.")
    .existing_torch_op("aten::asinh")
    .types("T", {DType::Float32, DType::Float64})
    .input("self", "T", "input tensor")
    .output("result", "T", shape::same({"self"}), "asinh(self)")
    .export_standard("Asinh", 9);

}  // namespace opbridge
