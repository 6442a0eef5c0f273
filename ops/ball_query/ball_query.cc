// ball_query: pointnet2_ops' ball query. For each centre, the first `nsample` points (in index
// order) whose squared distance to it is below radius², with pointnet2_ops' padding: the first
// found fills the slots left, and an empty ball gives index 0. The search uses a grid of cells
// no smaller than the radius (ball_query_kernel.cc); the points it returns are exactly those of a
// scan over every point. A positive min_radius makes the ball a shell, as mmcv's ball query
// takes it (points at distance 0 always kept). Its family: ball_query_offset, pointops' ball query over batch segments
// given by offsets, with a minimum radius and pointops' order of the points kept; radius,
// torch_cluster's pairs within a radius (as many as there are: a data-dependent size); and
// batch_pointers, a batch vector's row pointers, through which the compat functions that take a
// batch vector (knn, nearest, fps, ...) turn it into the segments their ops take, so the exported
// graph checks the vector as radius does.
#include <opbridge/op.h>

#include "ball_query_kernel.h"

namespace opbridge {

OPBRIDGE_OP(ball_query)
    .doc("For each centre of new_xyz, the first nsample points of xyz (by index) whose squared distance to it is "
         "below radius² (pointnet2_ops' ball_query): slots past the points found repeat the first one, and an "
         "empty ball gives index 0. With min_radius > 0 a shell (mmcv's ball_query): the points at squared "
         "distance in [min_radius², radius²), and those at distance 0.")
    .types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    .input("xyz", "T", "(B, N, 3) points", 3)
    .input("new_xyz", "T", "(B, M, 3) centres", 3)
    .float_attr("radius", "the ball's radius: a point is in it when its squared distance is below radius²")
    .int_attr("nsample", "points per centre, >= 1")
    .float_attr("min_radius", 0.0,
                "0: a ball. Else below radius: a shell, points at squared distance in [min_radius², radius²) and "
                "those at distance 0 (mmcv's rule)")
    .check(dim("xyz", 2) == 3, "xyz must be (B, N, 3)")
    .check(dim("new_xyz", 2) == 3, "new_xyz must be (B, M, 3)")
    .check(dim("new_xyz", 0) == dim("xyz", 0), "new_xyz must have the batch size of xyz")
    .check(attr("nsample") >= 1, "nsample must be >= 1")
    .output("idx", DType::Int32, shape::dims({dim("xyz", 0), dim("new_xyz", 1), attr("nsample")}),
            "(B, M, nsample) indices into each batch item's points")
    .cpu(ball_query_kernel)
    // BallQuery.forward(ctx, radius, nsample, xyz, new_xyz)
    .replaces("pointnet2_ops.pointnet2_utils.BallQuery", {"radius", "nsample", "xyz", "new_xyz"})
    .replaces("openpoints.models.layers.group.BallQuery", {"radius", "nsample", "xyz", "new_xyz"});

OPBRIDGE_OP(ball_query_offset)
    .doc("For each centre, the points of its batch segment at squared distance in [min_radius², max_radius²) or "
         "at most 1e-5 (pointops' ball_query, offset layout), in pointops' order: all of them when they fit in "
         "nsample slots (the rest index -1 at distance 1e5), else every (count / nsample)-th. Distances are "
         "Euclidean.")
    .types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    .types("I", {DType::Int32, DType::Int64})
    .input("xyz", "T", "(n, 3) points", 2)
    .input("offset", "I", "(b,) cumulative end row of each segment of xyz", 1)
    .optional_input("new_xyz", "T", "(m, 3) centres; default xyz", 2)
    .optional_input("new_offset", "I", "(b,) cumulative end row of each segment of new_xyz; default offset", 1)
    .int_attr("nsample", "slots per centre, >= 1")
    .float_attr("max_radius", "points closer than this are in the ball")
    .float_attr("min_radius", 0.0, "points closer than this are not (except the centre's own, within 1e-5 squared)")
    .check(attr("nsample") >= 1, "nsample must be >= 1")
    .check(dim("xyz", 1) == 3, "xyz must be (n, 3)")
    .check(dim_of_first({"new_xyz", "xyz"}, 1) == 3, "new_xyz must be (m, 3)")
    .check(dim_of_first({"new_offset", "offset"}, 0) == dim("offset", 0),
           "new_offset must have one entry per segment of offset")
    .output("idx", DType::Int32, shape::dims({dim_of_first({"new_xyz", "xyz"}, 0), attr("nsample")}),
            "(m, nsample) row indices into xyz; -1 for an empty slot")
    .output("dist", "T", shape::dims({dim_of_first({"new_xyz", "xyz"}, 0), attr("nsample")}),
            "(m, nsample) Euclidean distances; 1e5 for an empty slot")
    .cpu(ball_query_offset_kernel);

OPBRIDGE_OP(radius)
    .doc("Every pair (y row, x row) of one batch item closer than r (torch_cluster's radius): per row of y, the "
         "rows of x whose squared distance is below r², the max_num_neighbors lowest ones; as edge_index (2, pairs), "
         "y's rows first, ordered by y's row, then x's.")
    .types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    .types("B", {DType::Int64})
    .input("x", "T", "(n, d) points", 2)
    .input("y", "T", "(m, d) query points", 2)
    .optional_input("batch_x", "B", "(n,) sorted batch item of each row of x; default all 0", 1)
    .optional_input("batch_y", "B", "(m,) sorted batch item of each row of y; default all 0", 1)
    .float_attr("r", "the radius: a pair is closer than r")
    .int_attr("max_num_neighbors", 32, "pairs per row of y at most, >= 1")
    .check(dim("y", 1) == dim("x", 1), "y must have x's number of coordinates")
    .check(dim_of_first({"batch_x", "x"}, 0) == dim("x", 0), "batch_x must have one entry per row of x")
    .check(dim_of_first({"batch_y", "y"}, 0) == dim("y", 0), "batch_y must have one entry per row of y")
    .check(attr("max_num_neighbors") >= 1, "max_num_neighbors must be >= 1")
    .output("edge_index", DType::Int64, shape::dims({constant(2), data_dependent("pairs")}),
            "(2, pairs): row 0 the rows of y, row 1 the rows of x")
    .cpu(radius_kernel);

OPBRIDGE_OP(batch_pointers)
    .doc("For each entry v of bounds, the number of rows of the batch vector below example v: with bounds "
         "0, 1, ..., B the (B + 1,) row pointers of B examples (PyG's ptr). The batch vector is checked as every "
         "op that takes one checks it: non-negative and sorted.")
    .types("B", {DType::Int32, DType::Int64})
    .types("V", {DType::Int64})
    .input("batch", "B", "(n,) the example of each row: numbered from 0, sorted", 1)
    .input("bounds", "V", "(c,) the example numbers to count the rows below", 1)
    .string_attr("name", "batch", "what the caller calls the batch vector, for its errors")
    .string_attr("caller", "", "the function that converts it (e.g. torch_cluster.knn), named first in its errors")
    .output("ptr", DType::Int64, shape::same({"bounds"}), "(c,) rows of batch below each entry of bounds")
    .cpu(batch_pointers_kernel);

}  // namespace opbridge
