// grid_cluster: torch_cluster's voxel grid clustering (torch_cluster::grid). A regular grid of
// voxels of `size` is laid over the points, starting at `start`; each point gets the row-major
// (first dimension fastest) index of its voxel:
//   c_j = trunc((pos_ij - start_j) / size_j)            (in the input dtype, then to int64)
//   num_j = trunc((end_j - start_j) / size_j) + 1
//   cluster_i = sum_j c_j * prod_{l<j} num_l            (int64)
// start/end default to the per-dimension min/max of pos. The result is bit for bit
// torch_cluster's; where torch_cluster would silently wrap or read garbage (NaN positions,
// indices beyond int64, an empty grid) this op raises an error instead. The kernel is in
// grid_cluster_kernel.cc.
#include <opbridge/op.h>

#include "grid_cluster_kernel.h"

namespace opbridge {

OPBRIDGE_OP(grid_cluster)
    .doc("Voxel grid clustering (torch_cluster.grid_cluster): the row-major index of the voxel of size `size`, "
         "on a grid from `start` to `end` (default: per-dimension min and max of pos), that holds each point.")
    // float16 / bfloat16 positions: each subtraction and division rounds to the 16-bit type, as
    // torch_cluster's tensor arithmetic on them does.
    .types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    .input("pos", "T", "(n, d) point positions; must be finite", 2)
    .input("size", "T", "(d,) voxel size per dimension, each finite and > 0", 1)
    .optional_input("start", "T", "(d,) grid origin; default: min of pos per dimension", 1)
    .optional_input("end", "T", "(d,) grid end; default: max of pos per dimension", 1)
    .output("cluster", DType::Int64, shape::dims({dim("pos", 0)}), "(n,) voxel index of each point")
    .check(dim("size", 0) == dim("pos", 1), "size must have one value per column of pos")
    // An absent start/end falls back to size, already checked: only a given one is compared.
    .check(dim_of_first({"start", "size"}, 0) == dim("pos", 1), "start must have one value per column of pos")
    .check(dim_of_first({"end", "size"}, 0) == dim("pos", 1), "end must have one value per column of pos")
    .cpu(grid_cluster_kernel);

}  // namespace opbridge
