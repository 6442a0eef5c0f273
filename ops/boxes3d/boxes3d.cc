// The 3-D box family of LiDAR detection (mmdet3d through mmcv 2.x's iou3d and points_in_boxes).
// A box is a row (x, y, z, dx, dy, dz, heading): (x, y, z) the centre of its bottom face, dx, dy, dz
// its sides, heading in radians about +z, its dx side along (cos heading, sin heading).
//   points_in_boxes_part   the first box holding each point (-1: none)
//   points_in_boxes_all    which boxes hold each point (0/1)
//   boxes_overlap_bev      the area common to two boxes' footprints (bird's-eye view)
//   nms3d, nms3d_normal    greedy NMS on the footprints' IoU, rotated or with the headings ignored
// The kernels are points_in_boxes_kernel.cc and bev_kernel.cc.
#include <opbridge/op.h>

#include "boxes3d_kernel.h"

namespace opbridge {
namespace {

void points_and_boxes(OpBuilder& op) {
  op.types("T", {DType::Float32, DType::Float64})
      .input("points", "T", "(B, N, 3) points x, y, z", 3)
      .input("boxes", "T", "(B, M, 7) boxes x, y, z (bottom centre), dx, dy, dz, heading", 3)
      .check(dim("points", 2) == 3, "points must be (B, N, 3)")
      .check(dim("boxes", 2) == 7, "boxes must be (B, M, 7): x, y, z, dx, dy, dz, heading")
      .check(dim("boxes", 0) == dim("points", 0), "boxes must have the batch size of points");
}

void nms_inputs(OpBuilder& op) {
  op.types("T", {DType::Float32, DType::Float64})
      .input("boxes", "T", "(N, 7) boxes x, y, z, dx, dy, dz, heading; x, y, dx, dy and heading finite", 2)
      .optional_input("scores", "T", "(N,) scores, not NaN; absent: the boxes are taken in their own order", 1)
      .float_attr("iou_threshold", "a box is suppressed by a kept one whose IoU with it is above this")
      .check(dim("boxes", 1) == 7, "boxes must be (N, 7): x, y, z, dx, dy, dz, heading")
      .check(dim_of_first({"scores", "boxes"}, 0) == dim("boxes", 0), "scores must have one entry per box")
      .output("keep", DType::Int64, shape::dims({data_dependent("kept")}),
              "(K,) indices of the kept boxes, in the order taken");
}

}  // namespace

OPBRIDGE_OP(points_in_boxes_part)
    .doc("For each point, the first box of its batch item that holds it, or -1 (mmcv's points_in_boxes_part). A "
         "box holds a point when |z - (z_box + dz / 2)| <= dz / 2 and, in the box's frame (the point's offset "
         "from the centre turned by -heading), -dx/2 < local x < dx/2 and -dy/2 < local y < dy/2, in the points' "
         "type as mmcv computes it. A point with a NaN coordinate is in no box.")
    .with(points_and_boxes)
    .output("box_idx", DType::Int32, shape::dims({dim("points", 0), dim("points", 1)}),
            "(B, N) index of the first box holding each point, -1 for none")
    .cpu(points_in_boxes_part_kernel)
    .replaces("mmcv.ops.points_in_boxes.points_in_boxes_part", {"points", "boxes"});

OPBRIDGE_OP(points_in_boxes_all)
    .doc("For each point and each box of its batch item, 1 when the box holds the point, else 0 (mmcv's "
         "points_in_boxes_all and points_in_boxes_cpu), with points_in_boxes_part's test.")
    .with(points_and_boxes)
    .output("box_mask", DType::Int32, shape::dims({dim("points", 0), dim("points", 1), dim("boxes", 1)}),
            "(B, N, M) 1 where box m holds point n")
    .cpu(points_in_boxes_all_kernel)
    .replaces("mmcv.ops.points_in_boxes.points_in_boxes_all", {"points", "boxes"})
    .replaces("mmcv.ops.points_in_boxes.points_in_boxes_cpu", {"points", "boxes"});

OPBRIDGE_OP(boxes_overlap_bev)
    .doc("The area common to the footprints (x, y, dx, dy, heading) of every box of boxes_a and every box of "
         "boxes_b (mmcv's boxes_overlap_bev), the exact area of the two rectangles' intersection; 0 where a box "
         "has a side dx or dy that is not positive; NaN where x, y, dx, dy or heading of either is not finite.")
    .types("T", {DType::Float32, DType::Float64})
    .input("boxes_a", "T", "(N, 7) boxes x, y, z, dx, dy, dz, heading", 2)
    .input("boxes_b", "T", "(M, 7) boxes x, y, z, dx, dy, dz, heading", 2)
    .check(dim("boxes_a", 1) == 7, "boxes_a must be (N, 7): x, y, z, dx, dy, dz, heading")
    .check(dim("boxes_b", 1) == 7, "boxes_b must be (M, 7): x, y, z, dx, dy, dz, heading")
    .output("overlap", "T", shape::dims({dim("boxes_a", 0), dim("boxes_b", 0)}), "(N, M) common areas")
    .cpu(boxes_overlap_bev_kernel)
    .replaces("mmcv.ops.iou3d.boxes_overlap_bev", {"boxes_a", "boxes_b"});

OPBRIDGE_OP(nms3d)
    .doc("Greedy NMS on the boxes' rotated footprints (mmcv's nms3d): by descending score (ties lowest index "
         "first), a box is kept unless a box kept before it has an IoU above iou_threshold with it; the IoU is "
         "boxes_overlap_bev's area over max(dx_a dy_a + dx_b dy_b - area, 1e-8).")
    .with(nms_inputs)
    .cpu(nms3d_kernel)
    .replaces("mmcv.ops.iou3d.nms3d", {"boxes", "scores", "iou_threshold"});

OPBRIDGE_OP(nms3d_normal)
    .doc("Greedy NMS as nms3d, on the footprints with their headings ignored (mmcv's nms3d_normal): the IoU of "
         "the axis-aligned rectangles [x - dx/2, x + dx/2] x [y - dy/2, y + dy/2], over max(union, 1e-8).")
    .with(nms_inputs)
    .cpu(nms3d_normal_kernel)
    .replaces("mmcv.ops.iou3d.nms3d_normal", {"boxes", "scores", "iou_threshold"});

}  // namespace opbridge
