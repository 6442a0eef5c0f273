// deform_conv2d: deformable convolution v1 (offsets) and v2 (offsets + modulation mask), with
// torchvision::deform_conv2d's semantics and ONNX DeformConv's input order. The kernel (im2col
// with bilinear sampling, then a GEMM per convolution group) is in deform_conv2d_kernel.cc.
#include <opbridge/op.h>

#include "deform_conv2d_kernel.h"

namespace opbridge {
namespace {

// The output size along spatial axis `axis` (0: height, 1: width), as for a plain convolution.
DimExpr out_size(int64_t axis) {
  const DimExpr k = dim("weight", axis + 2);
  return (dim("input", axis + 2) + attr_at("padding", axis) * 2 - (attr_at("dilation", axis) * (k - 1) + 1)) /
             attr_at("stride", axis) +
         1;
}

// The attributes, and the checks on input, weight, offset and mask, that the op and its backward
// share.
void attributes_and_checks(OpBuilder& op) {
  op.ints_attr("stride", {1, 1}, "(stride_h, stride_w)")
      .ints_attr("padding", {0, 0}, "(pad_h, pad_w): zero padding on both sides")
      .ints_attr("dilation", {1, 1}, "(dil_h, dil_w)")
      .int_attr("groups", 1, "convolution groups: input and output channels split into this many blocks")
      .int_attr("offset_groups", 1, "input channels split into this many blocks, each with its own offsets and mask")
      // First: the output size divides by the stride.
      .check(attr_at("stride", 0) >= 1, "attribute 'stride' values must be >= 1")
      .check(attr_at("stride", 1) >= 1, "attribute 'stride' values must be >= 1")
      .check(dim("input", 1) == dim("weight", 1) * attr("groups"), "input channels must equal weight.shape[1] * groups")
      .check(dim("offset", 0) == dim("input", 0), "offset must have the batch size of input")
      .check(dim("offset", 1) == attr("offset_groups") * dim("weight", 2) * dim("weight", 3) * 2,
             "offset must have 2*offset_groups*kh*kw channels")
      .check(dim("offset", 2) == out_size(0), "offset height must be the output height")
      .check(dim("offset", 3) == out_size(1), "offset width must be the output width")
      // An absent mask falls back to an input for which the check holds by construction.
      .check(dim_of_first({"mask", "offset"}, 0) == dim("input", 0), "mask must have the batch size of input")
      .check(dim_of_first({"mask", "offset"}, 2) == out_size(0), "mask height must be the output height")
      .check(dim_of_first({"mask", "offset"}, 3) == out_size(1), "mask width must be the output width");
}

}  // namespace

// The gradients of deform_conv2d, as torchvision's: bilinear sampling is differentiable in the
// sample position except on whole pixels, where the derivative is taken from the neighbours at
// floor(position) and floor(position) + 1; positions outside the image have zero gradient.
OPBRIDGE_OP(deform_conv2d_backward)
    .doc("The gradients of deform_conv2d's output with respect to input, weight, offset, bias and mask.")
    .types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    .input("grad_output", "T", "(N, C_out, H_out, W_out) gradient of output", 4)
    .input("input", "T", "the forward's input", 4)
    .input("weight", "T", "the forward's weight", 4)
    .input("offset", "T", "the forward's offset", 4)
    .optional_input("mask", "T", "the forward's mask; absent: 1", 4)
    .with(attributes_and_checks)
    .check(dim("grad_output", 0) == dim("input", 0), "grad_output must have the batch size of input")
    .check(dim("grad_output", 1) == dim("weight", 0), "grad_output must have weight.shape[0] channels")
    .check(dim("grad_output", 2) == out_size(0), "grad_output height must be the output height")
    .check(dim("grad_output", 3) == out_size(1), "grad_output width must be the output width")
    .output("grad_input", "T", shape::same({"input"}), "(N, C_in, H, W)")
    .output("grad_weight", "T", shape::same({"weight"}), "(C_out, C_in/groups, kh, kw)")
    .output("grad_offset", "T", shape::same({"offset"}), "(N, 2*offset_groups*kh*kw, H_out, W_out)")
    .output("grad_bias", "T", shape::dims({dim("weight", 0)}), "(C_out): grad_output summed over N, H_out, W_out")
    .output("grad_mask", "T",
            shape::dims({dim("offset", 0), dim("offset", 1) / 2, dim("offset", 2), dim("offset", 3)}),
            "(N, offset_groups*kh*kw, H_out, W_out); without a mask, the gradient of an all-ones mask")
    .cpu(deform_conv2d_backward_kernel);

OPBRIDGE_OP(deform_conv2d)
    .doc("Deformable 2-D convolution (v1; v2 with a modulation mask), as torchvision.ops.deform_conv2d: "
         "each kernel tap samples the input bilinearly at its regular position plus a learned offset, "
         "optionally scaled by a mask, then the samples are convolved with the weight.")
    // float16 / bfloat16 compute in float32 (sampling and GEMM) and round the output once.
    .types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    .input("input", "T", "(N, C_in, H, W)", 4)
    .input("weight", "T", "(C_out, C_in/groups, kh, kw)", 4)
    .input("offset", "T",
           "(N, 2*offset_groups*kh*kw, H_out, W_out): channel 2*(g*kh*kw + i*kw + j) is the row (y) offset of "
           "offset group g at kernel position (i, j), the next channel the column (x) offset",
           4)
    .optional_input("bias", "T", "(C_out)", 1)
    .optional_input("mask", "T", "(N, offset_groups*kh*kw, H_out, W_out): modulation (v2); absent: 1 (v1)", 4)
    .with(attributes_and_checks)
    // An absent bias falls back to an input for which the check holds by construction.
    .check(dim_of_first({"bias", "weight"}, 0) == dim("weight", 0), "bias must have weight.shape[0] values")
    .output("output", "T", shape::dims({dim("input", 0), dim("weight", 0), out_size(0), out_size(1)}),
            "(N, C_out, H_out, W_out), H_out = (H + 2*pad_h - (dil_h*(kh - 1) + 1)) // stride_h + 1, W_out alike")
    .cpu(deform_conv2d_kernel)
    // ai.onnx DeformConv (opset 19) has this op's inputs in this order; its pads list both sides.
    // Below 19, or with custom_nodes=True, the opbridge node runs this kernel instead; so it does
    // for the 16-bit types, which ONNX Runtime's DeformConv lacks.
    .export_as(ExportTo("DeformConv", 19)
                   .target_types("T", {DType::Float32, DType::Float64})
                   .attr("strides", {"stride"})
                   .attr("pads", {"padding", "padding"})
                   .attr("dilations", {"dilation"})
                   .attr("group", {"groups"})
                   .attr("offset_group", {"offset_groups"}))
    .backward("deform_conv2d_backward")
    // mmcv's Functions over its extension (their own symbolic writes mmcv:: nodes no runtime has):
    // ModulatedDeformConv2dFunction.forward(ctx, input, offset, mask, weight, bias=None, stride=1,
    // padding=0, dilation=1, groups=1, deform_groups=1), and DeformConv2dFunction.forward(ctx,
    // input, offset, weight, stride=1, padding=0, dilation=1, groups=1, deform_groups=1,
    // bias=False, im2col_step=32), whose bias must be False and im2col_step only batches its work.
    .replaces("mmcv.ops.modulated_deform_conv.ModulatedDeformConv2dFunction",
              {"input", "offset", "mask", "weight", "bias", "stride", "padding", "dilation", "groups", "offset_groups"})
    .replaces("mmcv.ops.deform_conv.DeformConv2dFunction",
              {"input", "offset", "weight", "stride", "padding", "dilation", "groups", "offset_groups", "", ""});

}  // namespace opbridge
