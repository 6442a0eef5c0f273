// roi_align, roi_pool and ps_roi_align: pooling a feature map over boxes (RoIs), with mmcv's and
// torchvision's CPU semantics, and their gradients with respect to the input. The kernels are in
// roi_align_kernel.cc, roi_pool_kernel.cc and ps_roi_align_kernel.cc; the sampling geometry in
// roi_geometry.h.
#include <opbridge/op.h>

#include "roi_align_kernel.h"

namespace opbridge {
namespace {

DimExpr pooled(int64_t axis) { return attr_at("output_size", axis); }

// The inputs, the output size and spatial scale, and the checks every op of the family shares.
void float_types(OpBuilder& op) { op.types("T", {DType::Float32, DType::Float64}); }

void rois_and_size(OpBuilder& op) {
  op.input("input", "T", "(N, C, H, W) feature map", 4)
      .input("rois", "T", "(K, 5): batch index, x1, y1, x2, y2 in image coordinates", 2)
      .ints_attr("output_size", {1, 1}, "(pooled height, pooled width)")
      .float_attr("spatial_scale", 1.0, "feature-map pixels per image unit: RoI corners are multiplied by it")
      .check(dim("rois", 1) == 5, "rois must be (K, 5): batch index, x1, y1, x2, y2")
      .check(pooled(0) >= 1, "output_size values must be >= 1")
      .check(pooled(1) >= 1, "output_size values must be >= 1");
}

void sampling(OpBuilder& op) {
  op.int_attr("sampling_ratio", 0,
              "bilinear samples per bin along each axis; <= 0: adaptive, ceil(bin size) (ceil(roi_h / oh) rows)")
      .check(attr("sampling_ratio") <= 1 << 20, "sampling_ratio must be <= 1048576");
}

void align_attributes(OpBuilder& op) {
  op.with(rois_and_size)
      .with(sampling)
      .string_attr("pool_mode", "avg", "'avg': the mean of a bin's samples; 'max': their maximum (mmcv's)")
      .bool_attr("aligned", true,
                 "true: corners shifted by -0.5 (pixel centres); false: the legacy rule, a RoI at least 1x1");
}

DimExpr rois_count() { return dim("rois", 0); }

void grad_output_is_pooled(OpBuilder& op, DimExpr channels) {
  op.check(dim("grad_output", 0) == rois_count(), "grad_output must have one row per RoI")
      .check(dim("grad_output", 1) == channels, "grad_output must have the output's channels")
      .check(dim("grad_output", 2) == pooled(0), "grad_output height must be output_size[0]")
      .check(dim("grad_output", 3) == pooled(1), "grad_output width must be output_size[1]");
}

DimExpr ps_channels() { return dim("input", 1) / (pooled(0) * pooled(1)); }

void ps_channels_divide(OpBuilder& op) {
  op.check(ps_channels() * (pooled(0) * pooled(1)) == dim("input", 1),
           "input channels must be a multiple of output_size[0] * output_size[1]");
}

}  // namespace

OPBRIDGE_OP(roi_align_backward)
    .with(float_types)
    .doc("The gradient of roi_align's output with respect to its input (none with respect to the RoIs).")
    .input("grad_output", "T", "(K, C, oh, ow) gradient of output", 4)
    .with(align_attributes)
    .with([](OpBuilder& op) { grad_output_is_pooled(op, dim("input", 1)); })
    .output("grad_input", "T", shape::same({"input"}), "(N, C, H, W)")
    .cpu(roi_align_backward_kernel);

OPBRIDGE_OP(roi_align)
    .with(float_types)
    .doc("RoIAlign (Mask R-CNN), as mmcv.ops.roi_align and torchvision.ops.roi_align: each RoI is cut into "
         "output_size bins, each bin samples the feature map bilinearly on a regular grid and pools the samples "
         "(mean, or mmcv's max).")
    .with(align_attributes)
    .output("output", "T", shape::dims({rois_count(), dim("input", 1), pooled(0), pooled(1)}), "(K, C, oh, ow)")
    .cpu(roi_align_kernel)
    .backward("roi_align_backward")
    // RoIAlignFunction.forward(ctx, input, rois, output_size, spatial_scale, sampling_ratio, pool_mode, aligned)
    .replaces("mmcv.ops.roi_align.RoIAlignFunction",
              {"input", "rois", "output_size", "spatial_scale", "sampling_ratio", "pool_mode", "aligned"});

OPBRIDGE_OP(roi_pool_backward)
    .with(float_types)
    .doc("The gradient of roi_pool's output with respect to its input: each bin's gradient goes to its argmax.")
    .input("grad_output", "T", "(K, C, oh, ow) gradient of output", 4)
    .with(rois_and_size)
    .types("I", {DType::Int32})
    .input("argmax", "I", "(K, C, oh, ow): the forward's argmax", 4)
    .bool_attr("round_rois", true, "as the forward's")
    .with([](OpBuilder& op) { grad_output_is_pooled(op, dim("input", 1)); })
    .check(dim("argmax", 0) == rois_count(), "argmax must have the shape of grad_output")
    .check(dim("argmax", 1) == dim("input", 1), "argmax must have the shape of grad_output")
    .check(dim("argmax", 2) == pooled(0), "argmax must have the shape of grad_output")
    .check(dim("argmax", 3) == pooled(1), "argmax must have the shape of grad_output")
    .output("grad_input", "T", shape::same({"input"}), "(N, C, H, W)")
    .cpu(roi_pool_backward_kernel);

OPBRIDGE_OP(roi_pool)
    .with(float_types)
    .doc("RoIPool (Fast R-CNN), as torchvision.ops.roi_pool and mmcv.ops.roi_pool: the maximum over each of "
         "output_size whole-pixel bins of a RoI, and where it was.")
    .with(rois_and_size)
    .bool_attr("round_rois", true,
               "true: torchvision's bins (corners scaled and rounded, both inclusive); false: mmcv's (bins cut "
               "from x1*s .. (x2 + 1)*s by floor and ceil)")
    .output("output", "T", shape::dims({rois_count(), dim("input", 1), pooled(0), pooled(1)}), "(K, C, oh, ow)")
    .output("argmax", DType::Int32, shape::dims({rois_count(), dim("input", 1), pooled(0), pooled(1)}),
            "(K, C, oh, ow): y * W + x of each maximum in its input plane, -1 for an empty bin")
    .cpu(roi_pool_kernel)
    .backward("roi_pool_backward")
    // RoIPoolFunction.forward(ctx, input, rois, output_size, spatial_scale) returns the output alone.
    .replaces("mmcv.ops.roi_pool.RoIPoolFunction", {"input", "rois", "output_size", "spatial_scale"},
              {{"round_rois", false}}, {"output"});

OPBRIDGE_OP(ps_roi_align_backward)
    .with(float_types)
    .doc("The gradient of ps_roi_align's output with respect to its input.")
    .input("grad_output", "T", "(K, C / (oh * ow), oh, ow) gradient of output", 4)
    .with(rois_and_size)
    .with(sampling)
    .with(ps_channels_divide)
    .with([](OpBuilder& op) { grad_output_is_pooled(op, ps_channels()); })
    .output("grad_input", "T", shape::same({"input"}), "(N, C, H, W)")
    .cpu(ps_roi_align_backward_kernel);

OPBRIDGE_OP(ps_roi_align)
    .with(float_types)
    .doc("Position-sensitive RoIAlign (R-FCN), as torchvision.ops.ps_roi_align: bin (ph, pw) of output channel c "
         "averages the bilinear samples of input channel (c * oh + ph) * ow + pw.")
    .with(rois_and_size)
    .with(sampling)
    .with(ps_channels_divide)
    .output("output", "T", shape::dims({rois_count(), ps_channels(), pooled(0), pooled(1)}),
            "(K, C / (oh * ow), oh, ow)")
    .output("channel_mapping", DType::Int32, shape::dims({rois_count(), ps_channels(), pooled(0), pooled(1)}),
            "(K, C / (oh * ow), oh, ow): the input channel each bin read")
    .cpu(ps_roi_align_kernel)
    .backward("ps_roi_align_backward");

}  // namespace opbridge
