// The voxelization ops' CPU kernels (voxelization_kernel.cc); voxelization.cc defines the ops.
#pragma once

#include <opbridge/kernel_context.h>

#include <vector>

namespace opbridge {

// mmcv's hard voxelization: the points grouped into voxels in the order their first point comes,
// at most max_points per voxel (in input order) and max_voxels voxels. Allocates its three outputs.
void hard_voxelize_kernel(KernelContext& ctx, const TensorView& points, const std::vector<double>& voxel_size,
                          const std::vector<double>& point_cloud_range, int64_t max_points, int64_t max_voxels,
                          TensorView& voxels, TensorView& coors, TensorView& num_points_per_voxel);

// mmcv's dynamic voxelization: each point's (z, y, x) voxel, or -1s for a point outside the range.
void dynamic_voxelize_kernel(KernelContext& ctx, const TensorView& points, const std::vector<double>& voxel_size,
                             const std::vector<double>& point_cloud_range, TensorView& coors);

}  // namespace opbridge
