// The rotated-box family of oriented object detection (mmrotate, mmdet's rotated heads), with mmcv
// 2.x's CPU semantics. Boxes are (cx, cy, w, h, angle in radians); with clockwise=True a positive
// angle turns the box clockwise on screen (x right, y down), mmcv's default for IoU and NMS.
//   box_iou_rotated          the (N, M) overlaps of two sets (iou or iof)
//   box_iou_rotated_aligned  the (N,) overlaps of the pairs of rows (mmcv's aligned=True)
//   nms_rotated              greedy NMS over rotated boxes, optionally per label
//   roi_align_rotated        RoIAlign over rotated RoIs (mmcv's RoIAlignRotated), and its gradient
// The overlap geometry is rotated_box_geometry.h.
#include <opbridge/op.h>

#include "rotated_boxes_kernel.h"

namespace opbridge {
namespace {

void iou_inputs(OpBuilder& op) {
  op.types("T", {DType::Float32, DType::Float64})
      .input("boxes1", "T", "(N, 5) boxes (cx, cy, w, h, angle in radians)", 2)
      .input("boxes2", "T", "(M, 5) boxes (cx, cy, w, h, angle in radians)", 2)
      .string_attr("mode", "iou", "'iou': intersection over union; 'iof': intersection over the area of boxes1's box")
      .bool_attr("clockwise", true, "positive angles turn clockwise on screen (mmcv's default); false: counter-clockwise")
      .check(dim("boxes1", 1) == 5, "boxes1 must be (N, 5): cx, cy, w, h, angle")
      .check(dim("boxes2", 1) == 5, "boxes2 must be (M, 5): cx, cy, w, h, angle");
}

// The attributes and checks roi_align_rotated and its backward share; mmcv's RoIAlignRotated
// defaults (sampling_ratio 0, aligned, counter-clockwise).
void roi_attributes(OpBuilder& op) {
  op.types("T", {DType::Float32, DType::Float64})
      .ints_attr("output_size", "(pooled_height, pooled_width)")
      .float_attr("spatial_scale", "the factor from RoI coordinates to input pixels (1 / the feature map's stride)")
      .int_attr("sampling_ratio", 0, "samples per bin along each axis; 0: ceil(RoI side / pooled side), adaptive")
      .bool_attr("aligned", true, "shift RoIs by half a pixel (pixel centres at +0.5); false: mmcv's legacy RoIs, "
                                  "enlarged to at least 1 x 1")
      .bool_attr("clockwise", false, "positive angles turn clockwise on screen; false (mmcv's default here): "
                                     "counter-clockwise")
      .check(dim("rois", 1) == 6, "rois must be (K, 6): batch index, cx, cy, w, h, angle")
      .check(attr_at("output_size", 0) >= 1, "output_size values must be >= 1")
      .check(attr_at("output_size", 1) >= 1, "output_size values must be >= 1")
      .check(attr("sampling_ratio") >= 0, "sampling_ratio must be >= 0");
}

}  // namespace

OPBRIDGE_OP(box_iou_rotated)
    .doc("The overlap of every box of boxes1 with every box of boxes2 (mmcv's box_iou_rotated, aligned=False): the "
         "exact area of the two rotated rectangles' intersection over their union ('iou') or over boxes1's box's "
         "area ('iof'); 0 where either box's area w*h is below 1e-14; NaN where either box is not finite.")
    .with(iou_inputs)
    .output("ious", "T", shape::dims({dim("boxes1", 0), dim("boxes2", 0)}), "(N, M) overlaps")
    .cpu(box_iou_rotated_kernel);

OPBRIDGE_OP(box_iou_rotated_aligned)
    .doc("The overlap of each box of boxes1 with the box of the same row of boxes2 (mmcv's box_iou_rotated, "
         "aligned=True), as box_iou_rotated computes it.")
    .with(iou_inputs)
    .check(dim("boxes2", 0) == dim("boxes1", 0), "boxes2 must have as many rows as boxes1")
    .output("ious", "T", shape::dims({dim("boxes1", 0)}), "(N,) overlaps")
    .cpu(box_iou_rotated_aligned_kernel);

OPBRIDGE_OP(nms_rotated)
    .doc("Greedy non-maximum suppression of rotated boxes (mmcv's nms_rotated, CPU rule): in the order of descending "
         "score, ties broken by the lower index, a box is kept unless a kept box of the same label overlaps it with an "
         "IoU >= iou_threshold. Returns the kept boxes with their scores and their indices, in that order.")
    .types("T", {DType::Float32, DType::Float64})
    .types("L", {DType::Int64, DType::Int32})
    .input("dets", "T", "(N, 5) boxes (cx, cy, w, h, angle in radians), finite", 2)
    .input("scores", "T", "(N,) scores, not NaN", 1)
    .optional_input("labels", "L", "(N,) class of each box: boxes of different classes never suppress each other; "
                                    "absent: one class", 1)
    .float_attr("iou_threshold", "a box is suppressed by a kept one whose IoU with it is >= this")
    .bool_attr("clockwise", true, "positive angles turn clockwise on screen (mmcv's default)")
    .check(dim("dets", 1) == 5, "dets must be (N, 5): cx, cy, w, h, angle")
    .check(dim("scores", 0) == dim("dets", 0), "scores must have one entry per row of dets")
    .check(dim_of_first({"labels", "scores"}, 0) == dim("dets", 0), "labels must have one entry per row of dets")
    .output("kept_dets", "T", shape::dims({data_dependent("kept"), 6}),
            "(K, 6) the kept rows of dets, each followed by its score")
    .output("keep", DType::Int64, shape::dims({data_dependent("kept")}), "(K,) their indices into dets")
    .cpu(nms_rotated_kernel)
    // mmcv.ops.nms_rotated(dets, scores, iou_threshold, labels=None, clockwise=True) -> (dets with
    // scores, keep); mmcv returns (dets, None) for no boxes, this op two empty tensors.
    .replaces("mmcv.ops.nms.nms_rotated", {"dets", "scores", "iou_threshold", "labels", "clockwise"});

OPBRIDGE_OP(roi_align_rotated_backward)
    .doc("The gradient of roi_align_rotated's output with respect to its input.")
    .input("grad_output", "T", "(K, C, pooled_height, pooled_width) gradient of output", 4)
    .input("input", "T", "the forward's input (N, C, H, W)", 4)
    .input("rois", "T", "the forward's rois", 2)
    .with(roi_attributes)
    .check(dim("grad_output", 0) == dim("rois", 0), "grad_output must have one row per RoI")
    .check(dim("grad_output", 1) == dim("input", 1), "grad_output must have input's channels")
    .check(dim("grad_output", 2) == attr_at("output_size", 0), "grad_output must be output_size high")
    .check(dim("grad_output", 3) == attr_at("output_size", 1), "grad_output must be output_size wide")
    .output("grad_input", "T", shape::same({"input"}), "(N, C, H, W)")
    .cpu(roi_align_rotated_backward_kernel);

OPBRIDGE_OP(roi_align_rotated)
    .doc("RoIAlign over rotated RoIs (mmcv's roi_align_rotated): each RoI (batch index, cx, cy, w, h, angle), scaled "
         "by spatial_scale, is split into output_size bins in its own frame; a bin is the mean of bilinear samples "
         "(sampling_ratio per axis, or adaptive) at the centres of a regular grid over it, turned by the angle about "
         "the RoI's centre. Samples beyond a pixel outside the image are 0; those within it are clamped to the edge.")
    .input("input", "T", "(N, C, H, W) feature map", 4)
    .input("rois", "T", "(K, 6) RoIs: batch index (truncated to an integer in [0, N)), cx, cy, w, h, angle", 2)
    .with(roi_attributes)
    .output("output", "T",
            shape::dims({dim("rois", 0), dim("input", 1), attr_at("output_size", 0), attr_at("output_size", 1)}),
            "(K, C, pooled_height, pooled_width)")
    .cpu(roi_align_rotated_kernel)
    .backward("roi_align_rotated_backward")
    // RoIAlignRotatedFunction.forward(ctx, input, rois, output_size, spatial_scale, sampling_ratio=0,
    // aligned=True, clockwise=False): output_size as the module passes it, a (height, width) pair.
    .replaces("mmcv.ops.roi_align_rotated.RoIAlignRotatedFunction",
              {"input", "rois", "output_size", "spatial_scale", "sampling_ratio", "aligned", "clockwise"});

}  // namespace opbridge
