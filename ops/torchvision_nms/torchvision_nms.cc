// torchvision::nms: torchvision's own op (what torchvision.ops.nms and batched_nms call), given
// opbridge's export rules: it becomes opbridge's Nms node with offset 0, which
// libopbridge_ort.so runs. torchvision computes the same IoU and suppresses above the threshold;
// its sort leaves equal scores in no documented order, the node takes the lowest index first.
#include <opbridge/op.h>

namespace opbridge {

OPBRIDGE_OP(torchvision_nms)
    .doc("torchvision's non-maximum suppression (torchvision::nms), exported as opbridge's Nms node (offset 0, no "
         "score threshold, no cap).")
    .existing_torch_op("torchvision::nms")
    .types("T", {DType::Float32, DType::Float64})
    .input("dets", "T", "(N, 4) boxes x1, y1, x2, y2", 2)
    .input("scores", "T", "(N,) their scores", 1)
    .float_attr("iou_threshold", "a box whose IoU with a kept box is above this is suppressed")
    .check(dim("dets", 1) == 4, "dets must be (N, 4)")
    .check(dim("scores", 0) == dim("dets", 0), "scores must have one entry per box")
    .output("keep", DType::Int64, shape::dims({data_dependent("kept")}), "(kept,) indices, by descending score")
    .export_as(ExportTo::opbridge_op("nms").inputs({"dets", "scores"}).attr("iou_threshold", {"iou_threshold"}));

}  // namespace opbridge
