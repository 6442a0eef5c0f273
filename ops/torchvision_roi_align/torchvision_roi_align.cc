// torchvision::roi_align, torchvision::roi_pool and torchvision::ps_roi_align: torchvision's own
// ops (what torchvision.ops.roi_align / RoIAlign / MultiScaleRoIAlign, roi_pool / RoIPool and
// ps_roi_align / PSRoIAlign call), given opbridge's export rules: each becomes opbridge's node of
// the same semantics, which libopbridge_ort.so runs. torchvision passes the pooled size as two
// scalars; the rules gather them into output_size.
#include <opbridge/op.h>

namespace opbridge {

namespace {
void rois_and_scale(OpBuilder& op) {
  op.types("T", {DType::Float32, DType::Float64})
      .input("input", "T", "(N, C, H, W)", 4)
      .input("rois", "T", "(K, 5): batch index, x1, y1, x2, y2", 2)
      .float_attr("spatial_scale", "RoI corners are multiplied by it")
      .int_attr("pooled_height", "output height")
      .int_attr("pooled_width", "output width");
}

ShapeRule pooled_shape(DimExpr channels) {
  return shape::dims({dim("rois", 0), std::move(channels), attr("pooled_height"), attr("pooled_width")});
}

ExportTo to(const char* op) {
  return std::move(ExportTo::opbridge_op(op, 1)
                       .inputs({"input", "rois"})
                       .attr("output_size", {"pooled_height", "pooled_width"})
                       .attr("spatial_scale", {"spatial_scale"}));
}
}  // namespace

OPBRIDGE_OP(torchvision_roi_align)
    .doc("torchvision's RoIAlign (torchvision::roi_align), exported as opbridge's RoiAlign node (average pooling).")
    .existing_torch_op("torchvision::roi_align")
    .with(rois_and_scale)
    .int_attr("sampling_ratio", "samples per bin axis; <= 0: adaptive")
    .bool_attr("aligned", false, "half-pixel corners")
    .output("output", "T", pooled_shape(dim("input", 1)), "(K, C, pooled_height, pooled_width)")
    .export_as(to("roi_align")
                   .attr("sampling_ratio", {"sampling_ratio"})
                   .attr("aligned", {"aligned"})
                   .attr_string("pool_mode", "avg"));

OPBRIDGE_OP(torchvision_roi_pool)
    .doc("torchvision's RoIPool (torchvision::roi_pool), exported as opbridge's RoiPool node (rounded corners).")
    .existing_torch_op("torchvision::roi_pool")
    .with(rois_and_scale)
    .output("output", "T", pooled_shape(dim("input", 1)), "(K, C, pooled_height, pooled_width)")
    .output("argmax", DType::Int32, pooled_shape(dim("input", 1)), "where each maximum is in its input plane")
    .export_as(to("roi_pool"));  // round_rois defaults to torchvision's rounding

OPBRIDGE_OP(torchvision_ps_roi_align)
    .doc("torchvision's position-sensitive RoIAlign (torchvision::ps_roi_align), exported as opbridge's PsRoiAlign "
         "node.")
    .existing_torch_op("torchvision::ps_roi_align")
    .with(rois_and_scale)
    .int_attr("sampling_ratio", "samples per bin axis; <= 0: adaptive")
    .output("output", "T", pooled_shape(dim("input", 1) / (attr("pooled_height") * attr("pooled_width"))),
            "(K, C / (pooled_height * pooled_width), pooled_height, pooled_width)")
    .output("channel_mapping", DType::Int32,
            pooled_shape(dim("input", 1) / (attr("pooled_height") * attr("pooled_width"))),
            "the input channel of each bin")
    .export_as(to("ps_roi_align").attr("sampling_ratio", {"sampling_ratio"}));

}  // namespace opbridge
