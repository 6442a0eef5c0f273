// knn_query: the k nearest points of the same batch segment for every query point, as in
// point-transformer style networks (KNNQuery). Results equal a brute-force loop bit for bit;
// the kernel (one k-d tree per segment) is in knn_query_kernel.cc.
#include <opbridge/op.h>

#include "knn_query_kernel.h"

namespace opbridge {

OPBRIDGE_OP(knn_query)
    .doc("k nearest neighbours of each query point among the points of its batch segment (point-transformer "
         "KNNQuery). Segments are given by cumulative end offsets. Returns global row indices into xyz, nearest "
         "first, ties broken by the smaller index, and Euclidean distances; slots beyond a segment's size are "
         "index -1, distance +inf.")
    .types("T", {DType::Float32, DType::Float64})
    .types("I", {DType::Int32, DType::Int64})
    .input("xyz", "T", "(n, 3) points", 2)
    .input("offset", "I", "(b,) cumulative end row of each segment of xyz", 1)
    .optional_input("new_xyz", "T", "(m, 3) query points; default xyz", 2)
    .optional_input("new_offset", "I", "(b,) cumulative end row of each segment of new_xyz; default offset", 1)
    .int_attr("k", "neighbours per query, >= 1")
    .output("idx", DType::Int32, shape::dims({dim_of_first({"new_xyz", "xyz"}, 0), attr("k")}),
            "(m, k) row indices into xyz, nearest first; -1 where the segment has fewer than k points")
    .output("dist", "T", shape::dims({dim_of_first({"new_xyz", "xyz"}, 0), attr("k")}),
            "(m, k) Euclidean distances; +inf where idx is -1")
    .check(attr("k") >= 1, "k must be >= 1")
    .check(dim("xyz", 1) == 3, "xyz must be (n, 3)")
    .check(dim_of_first({"new_xyz", "xyz"}, 1) == 3, "new_xyz must be (m, 3)")
    .check(dim_of_first({"new_offset", "offset"}, 0) == dim("offset", 0),
           "new_offset must have one entry per segment of offset")
    .cpu(knn_query_kernel);

}  // namespace opbridge
