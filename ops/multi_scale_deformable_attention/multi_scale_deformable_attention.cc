// multi_scale_deformable_attention: the attention of Deformable DETR and its family (DINO,
// Grounding DINO, Mask2Former's pixel decoder). Each query's head samples every level of a
// feature pyramid at P learned locations, bilinearly with zero padding (grid_sample with
// align_corners=False), and sums the samples weighted by its attention weights:
//   output[b, q, h*D + d] = sum over l, p of attention_weights[b, q, h, l, p] *
//                           bilinear(value[b, level l, h, d], sampling_locations[b, q, h, l, p])
// One fused pass (msda_kernel.cc) instead of a grid_sample per level, a stack and a weighted sum.
#include <opbridge/op.h>

#include "msda_kernel.h"

namespace opbridge {
namespace {

// The inputs and checks the op and its backward share.
void inputs_and_checks(OpBuilder& op) {
  op.types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
      .types("I", {DType::Int64, DType::Int32})
      .input("value", "T", "(B, S, H, D): every level's positions, one level after another, per head", 4)
      .input("spatial_shapes", "I", "(L, 2): (height, width) of each level", 2)
      .input("level_start_index", "I", "(L,): the first position of each level along S", 1)
      .input("sampling_locations", "T",
             "(B, Q, H, L, P, 2): (x, y) of each sample, normalised to [0, 1] over its level (outside: zero)", 6)
      .input("attention_weights", "T", "(B, Q, H, L, P): the weight of each sample", 5)
      .check(dim("spatial_shapes", 1) == 2, "spatial_shapes must be (L, 2)")
      .check(dim("level_start_index", 0) == dim("spatial_shapes", 0),
             "level_start_index must have one entry per level of spatial_shapes")
      .check(dim("sampling_locations", 0) == dim("value", 0), "sampling_locations must have the batch size of value")
      .check(dim("sampling_locations", 2) == dim("value", 2), "sampling_locations must have the heads of value")
      .check(dim("sampling_locations", 3) == dim("spatial_shapes", 0),
             "sampling_locations must have one level per row of spatial_shapes")
      .check(dim("sampling_locations", 5) == 2, "sampling_locations must end in (x, y) pairs")
      .check(dim("attention_weights", 0) == dim("sampling_locations", 0),
             "attention_weights must be sampling_locations' shape without its last axis")
      .check(dim("attention_weights", 1) == dim("sampling_locations", 1),
             "attention_weights must be sampling_locations' shape without its last axis")
      .check(dim("attention_weights", 2) == dim("sampling_locations", 2),
             "attention_weights must be sampling_locations' shape without its last axis")
      .check(dim("attention_weights", 3) == dim("sampling_locations", 3),
             "attention_weights must be sampling_locations' shape without its last axis")
      .check(dim("attention_weights", 4) == dim("sampling_locations", 4),
             "attention_weights must be sampling_locations' shape without its last axis");
}

}  // namespace

// The gradients as grid_sample's: on a whole pixel the derivative in x and y is taken from the
// corners at floor(position) and floor(position) + 1; a sample outside its level has none.
OPBRIDGE_OP(multi_scale_deformable_attention_backward)
    .doc("The gradients of multi_scale_deformable_attention's output with respect to value, sampling_locations and "
         "attention_weights.")
    .input("grad_output", "T", "(B, Q, H*D) gradient of output", 3)
    .with(inputs_and_checks)
    .check(dim("grad_output", 0) == dim("value", 0), "grad_output must have the batch size of value")
    .check(dim("grad_output", 1) == dim("sampling_locations", 1), "grad_output must have a row per query")
    .check(dim("grad_output", 2) == dim("value", 2) * dim("value", 3), "grad_output must have H*D columns")
    .output("grad_value", "T", shape::same({"value"}), "(B, S, H, D)")
    .output("grad_sampling_locations", "T", shape::same({"sampling_locations"}), "(B, Q, H, L, P, 2)")
    .output("grad_attention_weights", "T", shape::same({"attention_weights"}), "(B, Q, H, L, P)")
    .cpu(msda_backward_kernel);

namespace {
// transformers' detection models hold a MultiScaleDeformableAttention module whose forward(self,
// value, value_spatial_shapes, value_spatial_shapes_list, level_start_index, sampling_locations,
// attention_weights, im2col_step) is the grid_sample path (the class is also a hub-kernel hook,
// which swaps the forward only where the `kernels` package is installed and asked to). The rule
// replaces the class's forward; the list of shapes repeats the tensor, and im2col_step only
// batches the CUDA kernel's work. Mask2Former's and OneFormer's module-level
// multi_scale_deformable_attention(value, shapes, locations, weights) passes no level_start_index,
// which a rule here cannot derive: its rule is opbridge/compat/deformable_attention.py.
void transformers_modules(OpBuilder& op) {
  for (const char* model : {"deformable_detr", "grounding_dino", "mm_grounding_dino", "rt_detr", "lw_detr", "rf_detr",
                            "omdet_turbo", "pp_doclayout_v2", "pp_doclayout_v3", "pp_doclayout_v4"})
    op.replaces(std::string("transformers.models.") + model + ".modeling_" + model + ".MultiScaleDeformableAttention.forward",
                {"value", "spatial_shapes", "", "level_start_index", "sampling_locations", "attention_weights", ""});
}
}  // namespace

OPBRIDGE_OP(multi_scale_deformable_attention)
    .doc("Multi-scale deformable attention (Deformable DETR's MSDeformAttn core): for each query and head, the sum "
         "over levels and points of attention_weights times value sampled bilinearly at sampling_locations (zero "
         "outside a level, grid_sample's align_corners=False); heads concatenated.")
    .with(inputs_and_checks)
    .output("output", "T", shape::dims({dim("value", 0), dim("sampling_locations", 1), dim("value", 2) * dim("value", 3)}),
            "(B, Q, H*D)")
    .cpu(msda_kernel)
    .backward("multi_scale_deformable_attention_backward")
    .with(transformers_modules)
    // mmcv's Function over its CUDA extension: forward(ctx, value, value_spatial_shapes,
    // value_level_start_index, sampling_locations, attention_weights, im2col_step).
    .replaces("mmcv.ops.multi_scale_deform_attn.MultiScaleDeformableAttnFunction",
              {"value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights", ""});

}  // namespace opbridge
