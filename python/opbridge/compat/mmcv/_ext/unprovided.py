"""Every function mmcv 2.x's Python ops load from mmcv._ext (mmcv-lite 2.1.0 and 2.2.0 load the
same 112), by the mmcv.ops module that loads it. A function opbridge does not implement is still
defined, so that `ext_loader.load_ext` finds it and mmcv.ops (and mmdet) import in full; calling it
raises an error that names the function, the mmcv op and what to do."""

from __future__ import annotations

from typing import Callable

__all__ = ["CALLERS", "NotProvidedError", "not_provided"]

# mmcv.ops.<module>: the functions it loads.
_LOADED_BY = {
    "active_rotated_filter": "active_rotated_filter_forward active_rotated_filter_backward",
    "assign_score_withk": "assign_score_withk_forward assign_score_withk_backward",
    "ball_query": "ball_query_forward stack_ball_query_forward",
    "bbox": "bbox_overlaps",
    "bezier_align": "bezier_align_forward bezier_align_backward",
    "bias_act": "bias_act",
    "border_align": "border_align_forward border_align_backward",
    "box_iou_quadri": "box_iou_quadri",
    "box_iou_rotated": "box_iou_rotated",
    "carafe": "carafe_naive_forward carafe_naive_backward carafe_forward carafe_backward",
    "chamfer_distance": "chamfer_distance_forward chamfer_distance_backward",
    "contour_expand": "contour_expand",
    "convex_iou": "convex_iou convex_giou",
    "correlation": "correlation_forward correlation_backward",
    "deform_conv": "deform_conv_forward deform_conv_backward_input deform_conv_backward_parameters",
    "deform_roi_pool": "deform_roi_pool_forward deform_roi_pool_backward",
    "diff_iou_rotated": "diff_iou_rotated_sort_vertices_forward",
    "filtered_lrelu": "filtered_lrelu filtered_lrelu_act_",
    "focal_loss": "sigmoid_focal_loss_forward sigmoid_focal_loss_backward softmax_focal_loss_forward "
                  "softmax_focal_loss_backward",
    "furthest_point_sample": "furthest_point_sampling_forward furthest_point_sampling_with_dist_forward",
    "fused_bias_leakyrelu": "fused_bias_leakyrelu",
    "gather_points": "gather_points_forward gather_points_backward",
    "group_points": "group_points_forward group_points_backward stack_group_points_forward "
                    "stack_group_points_backward",
    "info": "get_compiler_version get_compiling_cuda_version",
    "iou3d": "iou3d_boxes_overlap_bev_forward iou3d_nms3d_forward iou3d_nms3d_normal_forward",
    "knn": "knn_forward",
    "masked_conv": "masked_im2col_forward masked_col2im_forward",
    "min_area_polygons": "min_area_polygons",
    "modulated_deform_conv": "modulated_deform_conv_forward modulated_deform_conv_backward",
    "multi_scale_deform_attn": "ms_deform_attn_backward ms_deform_attn_forward",
    "nms": "nms softnms nms_match nms_rotated nms_quadri",
    "pixel_group": "pixel_group",
    "points_in_boxes": "points_in_boxes_part_forward points_in_boxes_cpu_forward points_in_boxes_all_forward",
    "points_in_polygons": "points_in_polygons_forward",
    "prroi_pool": "prroi_pool_forward prroi_pool_backward prroi_pool_coor_backward",
    "psa_mask": "psamask_forward psamask_backward",
    "riroi_align_rotated": "riroi_align_rotated_forward riroi_align_rotated_backward",
    "roi_align": "roi_align_forward roi_align_backward",
    "roi_align_rotated": "roi_align_rotated_forward roi_align_rotated_backward",
    "roi_pool": "roi_pool_forward roi_pool_backward",
    "roiaware_pool3d": "roiaware_pool3d_forward roiaware_pool3d_backward",
    "roipoint_pool3d": "roipoint_pool3d_forward",
    "rotated_feature_align": "rotated_feature_align_forward rotated_feature_align_backward",
    "scatter_points": "dynamic_point_to_voxel_forward dynamic_point_to_voxel_backward",
    "sparse_ops": "get_indice_pairs_2d_forward get_indice_pairs_3d_forward get_indice_pairs_4d_forward "
                  "get_indice_pairs_2d_backward get_indice_pairs_3d_backward indice_conv_forward "
                  "indice_conv_backward fused_indice_conv_forward indice_maxpool_forward indice_maxpool_backward",
    "sync_bn": "sync_bn_forward_mean sync_bn_forward_var sync_bn_forward_output sync_bn_backward_param "
               "sync_bn_backward_data",
    "three_interpolate": "three_interpolate_forward three_interpolate_backward",
    "three_nn": "three_nn_forward",
    "tin_shift": "tin_shift_forward tin_shift_backward",
    "upfirdn2d": "upfirdn2d",
    "voxelize": "dynamic_voxelize_forward hard_voxelize_forward",
}

# function name -> the mmcv.ops module that calls it
CALLERS = {name: f"mmcv.ops.{module}" for module, names in _LOADED_BY.items() for name in names.split()}


class NotProvidedError(NotImplementedError):
    """An mmcv._ext function opbridge does not implement was called (a RuntimeError, as PyTorch's
    own missing kernels are)."""


def not_provided(name: str) -> Callable:
    """The stand-in for mmcv._ext.<name>: importable, and an error naming it when called."""
    caller = CALLERS[name]

    def function(*args, **kwargs):
        raise NotProvidedError(
            f"mmcv._ext.{name} (called by {caller}) is not provided by opbridge: opbridge stands in for mmcv's "
            f"compiled extension with the functions docs/compat.md lists, and this is not one of them. Avoid "
            f"{caller} in this model, install mmcv with its extension built for this torch, or write the op "
            f"once with opbridge (docs/adding-an-op.md) and substitute it for {caller}'s function "
            f"(docs/authoring.md).")

    function.__name__ = function.__qualname__ = name
    function.__doc__ = f"Not provided by opbridge: raises NotProvidedError (called by {caller})."
    return function
