// hard_voxelize and dynamic_voxelize: mmcv's Voxelization (mmcv.ops.voxelize), the first step of
// PointPillars, SECOND and every voxel-based LiDAR detector. Hard voxelization groups the points
// into voxels with at most max_points each and at most max_voxels in all: the number of voxels
// depends on the points (a data-dependent size). Dynamic voxelization gives each point its voxel.
// Coordinates are mmcv's (z, y, x). The kernels are in voxelization_kernel.cc.
#include <opbridge/op.h>

#include "voxelization_kernel.h"

namespace opbridge {
namespace {

void grid_attributes(OpBuilder& op) {
  op.types("T", {DType::Float32, DType::Float64})
      .input("points", "T", "(N, C) points, C >= 3: x, y, z, then any other features", 2)
      .floats_attr("voxel_size", "(x, y, z) size of a voxel, each positive")
      .floats_attr("point_cloud_range",
                   "(x_min, y_min, z_min, x_max, y_max, z_max): the grid has round((max - min) / voxel_size) voxels "
                   "along each axis (in float32)")
      .check(dim("points", 1) >= 3, "points must be (N, C) with C >= 3 (x, y, z first)");
}

}  // namespace

OPBRIDGE_OP(hard_voxelize)
    .doc("mmcv's hard voxelization (Voxelization with max_num_points > 0): the points in the range grouped into "
         "voxels, voxel ids in the order of each voxel's first point, at most max_points points per voxel (the "
         "first ones, in input order; the voxel's other slots zero) and at most max_voxels voxels (points of "
         "later voxels dropped). Points outside the range, NaN and infinite ones included, are dropped.")
    .with(grid_attributes)
    .int_attr("max_points", 35, "points kept per voxel, >= 1")
    .int_attr("max_voxels", 20000, "voxels kept, >= 1")
    .check(attr("max_points") >= 1, "max_points must be >= 1")
    .check(attr("max_voxels") >= 1, "max_voxels must be >= 1")
    .output("voxels", "T", shape::dims({data_dependent("voxels"), attr("max_points"), dim("points", 1)}),
            "(M, max_points, C) the points of each voxel, zero past its count")
    .output("coors", DType::Int32, shape::dims({data_dependent("voxels"), constant(3)}),
            "(M, 3) each voxel's (z, y, x) coordinates")
    .output("num_points_per_voxel", DType::Int32, shape::dims({data_dependent("voxels")}),
            "(M,) points kept in each voxel")
    .cpu(hard_voxelize_kernel);

OPBRIDGE_OP(dynamic_voxelize)
    .doc("mmcv's dynamic voxelization (Voxelization with max_num_points -1): each point's (z, y, x) voxel, or "
         "(-1, -1, -1) for a point outside the range (NaN and infinite ones included).")
    .with(grid_attributes)
    .output("coors", DType::Int32, shape::dims({dim("points", 0), constant(3)}), "(N, 3) each point's voxel")
    .cpu(dynamic_voxelize_kernel);

}  // namespace opbridge
