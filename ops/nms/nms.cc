// The NMS family of mmcv (2.x, CPU semantics): nms, softnms and nms_match. Boxes are (x1, y1, x2,
// y2); a box's width is x2 - x1 + offset. The IoU of two boxes is inter / (area_a + area_b - inter),
// computed in the boxes' type as mmcv does, so a pair whose union is 0 has a NaN IoU, which never
// passes a threshold. Order is by descending score; equal scores go lowest index first (mmcv's sort
// is not stable, so it leaves ties in no documented order: this rule makes every runtime agree).
// The kernels are in nms_kernel.cc.
#include <opbridge/op.h>

#include "nms_kernel.h"

namespace opbridge {

namespace {
// nms and softnms take the same boxes and scores.
void boxes_and_scores(OpBuilder& op) {
  op.types("T", {DType::Float32, DType::Float64})
      .input("boxes", "T", "(N, 4) boxes x1, y1, x2, y2", 2)
      .input("scores", "T", "(N,) their scores", 1)
      .check(dim("boxes", 1) == 4, "boxes must be (N, 4)")
      .check(dim("scores", 0) == dim("boxes", 0), "scores must have one entry per box");
}

void offset_attr(OpBuilder& op) {
  op.int_attr("offset", 0, "0 or 1: a box's width is x2 - x1 + offset, its height y2 - y1 + offset")
      .check(attr("offset") >= 0, "offset must be 0 or 1")
      .check(attr("offset") <= 1, "offset must be 0 or 1");
}
}  // namespace

OPBRIDGE_OP(nms)
    .doc("Greedy non-maximum suppression (mmcv's nms, with NMSop's score_threshold and max_num): the boxes whose "
         "score is above score_threshold (all when it is <= 0), by descending score, ties lowest index first; a "
         "box is dropped when its IoU with a box kept before it is above iou_threshold; the first max_num kept "
         "(all when it is <= 0).")
    .with(boxes_and_scores)
    .float_attr("iou_threshold", "a box whose IoU with a kept box is above this is suppressed")
    .with(offset_attr)
    .float_attr("score_threshold", 0.0, "when > 0, only boxes scoring above it take part")
    .int_attr("max_num", -1, "when > 0, at most this many boxes are kept")
    .output("inds", DType::Int64, shape::dims({data_dependent("kept")}),
            "(kept,) indices of the kept boxes, by descending score")
    .cpu(nms_kernel)
    // NMSop.forward(ctx, bboxes, scores, iou_threshold, offset, score_threshold, max_num)
    .replaces("mmcv.ops.nms.NMSop", {"boxes", "scores", "iou_threshold", "offset", "score_threshold", "max_num"});

OPBRIDGE_OP(softnms)
    .doc("Soft non-maximum suppression (mmcv's soft_nms): repeatedly take the remaining box of highest score "
         "(ties lowest index first), then scale every other remaining box's score by a weight of its IoU with it "
         "and drop those that fall below min_score. Weights: naive (method 0) 0 when IoU >= iou_threshold, linear "
         "(1) 1 - IoU when IoU >= iou_threshold, gaussian (2) exp(-IoU² / sigma); else 1.")
    .with(boxes_and_scores)
    .float_attr("iou_threshold", 0.3, "the IoU from which naive and linear weights apply")
    .float_attr("sigma", 0.5, "the gaussian weight's spread, > 0")
    .float_attr("min_score", 1e-3, "a box whose weighted score falls below this is dropped")
    .int_attr("method", 1, "0 naive, 1 linear, 2 gaussian")
    .with(offset_attr)
    .check(attr("method") >= 0, "method must be 0 (naive), 1 (linear) or 2 (gaussian)")
    .check(attr("method") <= 2, "method must be 0 (naive), 1 (linear) or 2 (gaussian)")
    .output("dets", "T", shape::dims({data_dependent("kept"), constant(5)}),
            "(kept, 5) the boxes taken, in order, with their weighted score when taken")
    .output("inds", DType::Int64, shape::dims({data_dependent("kept")}), "(kept,) their indices")
    .cpu(softnms_kernel)
    // SoftNMSop.forward(ctx, boxes, scores, iou_threshold, sigma, min_score, method, offset)
    .replaces("mmcv.ops.nms.SoftNMSop", {"boxes", "scores", "iou_threshold", "sigma", "min_score", "method", "offset"});

OPBRIDGE_OP(nms_match)
    .doc("mmcv's nms_match: greedy NMS by descending score (ties lowest index first) that records, for each kept "
         "box, the boxes it suppresses (IoU >= iou_threshold, widths x2 - x1). Every box is in exactly one group; "
         "the groups are listed flat, each kept box first and its matches after it in score order.")
    .types("T", {DType::Float32, DType::Float64})
    .input("dets", "T", "(N, 5) boxes x1, y1, x2, y2 and score", 2)
    .float_attr("iou_threshold", "a box whose IoU with a kept box is at least this joins its group")
    .check(dim("dets", 1) == 5, "dets must be (N, 5): x1, y1, x2, y2, score")
    .output("matched", DType::Int64, shape::dims({dim("dets", 0)}), "(N,) box indices, group by group")
    .output("group", DType::Int64, shape::dims({dim("dets", 0)}),
            "(N,) the group of each entry of matched: 0, 0, ..., 1, ...")
    .cpu(nms_match_kernel);

}  // namespace opbridge
