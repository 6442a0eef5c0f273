// carafe: content-aware reassembly of features (CARAFE, mmcv's carafe and carafe_naive), the
// upsampler of mmdet's CARAFE necks. Each output pixel is a weighted sum of the k×k window of
// input pixels centred on the pixel it maps to, with a window of weights of its own per channel
// group (zero outside the image):
//   output[n, c, oy, ox] = sum over ky, kx of masks[n, (g * k + ky) * k + kx, oy, ox] *
//                          features[n, c, oy / s + ky - r, ox / s + kx - r]
// where r = (k - 1) / 2, g = c / (C / group_size) and / is integer division. Gradients for
// features and masks (carafe_kernel.cc).
#include <opbridge/op.h>

#include "carafe_kernel.h"

namespace opbridge {
namespace {

// The inputs, attributes and checks the op and its backward share.
void inputs_and_checks(OpBuilder& op) {
  op.types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
      .input("features", "T", "(N, C, H, W)", 4)
      .input("masks", "T", "(N, group_size * k * k, H * s, W * s): each output pixel's window weights, per group", 4)
      .int_attr("kernel_size", "k, the window's side: odd, >= 1")
      .int_attr("group_size", "channel groups, each with its own window weights; divides C")
      .int_attr("scale_factor", "s, the upsampling factor, >= 1")
      .check(attr("kernel_size") >= 1, "kernel_size must be >= 1")
      .check(attr("kernel_size") / 2 * 2 + 1 == attr("kernel_size"), "kernel_size must be odd")
      .check(attr("group_size") >= 1, "group_size must be >= 1")
      .check(attr("scale_factor") >= 1, "scale_factor must be >= 1")
      .check(dim("features", 1) / attr("group_size") * attr("group_size") == dim("features", 1),
             "features' channels must be divisible by group_size")
      .check(dim("masks", 0) == dim("features", 0), "masks must have the batch size of features")
      .check(dim("masks", 1) == attr("group_size") * attr("kernel_size") * attr("kernel_size"),
             "masks must have group_size * kernel_size * kernel_size channels")
      .check(dim("masks", 2) == dim("features", 2) * attr("scale_factor"),
             "masks' height must be features' height * scale_factor")
      .check(dim("masks", 3) == dim("features", 3) * attr("scale_factor"),
             "masks' width must be features' width * scale_factor");
}

ShapeRule upsampled() {
  return shape::dims({dim("features", 0), dim("features", 1), dim("masks", 2), dim("masks", 3)});
}

}  // namespace

OPBRIDGE_OP(carafe_backward)
    .doc("The gradients of carafe's output with respect to features and masks.")
    .input("grad_output", "T", "(N, C, H * s, W * s) gradient of output", 4)
    .with(inputs_and_checks)
    .check(dim("grad_output", 0) == dim("features", 0), "grad_output must have the shape of carafe's output")
    .check(dim("grad_output", 1) == dim("features", 1), "grad_output must have the shape of carafe's output")
    .check(dim("grad_output", 2) == dim("masks", 2), "grad_output must have the shape of carafe's output")
    .check(dim("grad_output", 3) == dim("masks", 3), "grad_output must have the shape of carafe's output")
    .output("grad_features", "T", shape::same({"features"}), "(N, C, H, W)")
    .output("grad_masks", "T", shape::same({"masks"}), "(N, group_size * k * k, H * s, W * s)")
    .cpu(carafe_backward_kernel);

OPBRIDGE_OP(carafe)
    .doc("Content-aware reassembly of features (CARAFE, mmcv's carafe): output pixel (oy, ox) is the sum over the "
         "k×k window centred on input pixel (oy / s, ox / s) (integer division; zero outside) of features times "
         "masks[(g * k + ky) * k + kx] at (oy, ox), g the channel's group.")
    .with(inputs_and_checks)
    .output("output", "T", upsampled(), "(N, C, H * s, W * s)")
    .cpu(carafe_kernel)
    .backward("carafe_backward")
    // mmcv's two Functions compute the same thing (carafe reorders to channels-last for its CUDA
    // kernel): forward(ctx, features, masks, kernel_size, group_size, scale_factor).
    .replaces("mmcv.ops.carafe.CARAFEFunction", {"features", "masks", "kernel_size", "group_size", "scale_factor"})
    .replaces("mmcv.ops.carafe.CARAFENaiveFunction",
              {"features", "masks", "kernel_size", "group_size", "scale_factor"});

}  // namespace opbridge
