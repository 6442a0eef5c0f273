// Furthest point sampling in the three forms real models call it, one kernel (fps_kernel.cc):
//   furthest_point_sampling         pointnet2_ops' furthest_point_sample: [B, N, 3] -> [B, npoint]
//   furthest_point_sampling_offset  Pointcept's pointops: segments by cumulative ends, picks per
//                                   segment given by new_offset
//   furthest_point_sampling_ratio   torch_cluster's / PyG's fps: segments by ptr, ceil(n * ratio)
//                                   picks each, any number of coordinates
// and furthest_point_sampling_with_dist, mmcv's sampling over a given distance matrix
// (fps_dist_kernel.cc: the distances are read, not computed).
// Each picks, from a start point, the point furthest (squared Euclidean) from those picked so far;
// ties and the points considered follow each original (see docs/ops/furthest_point_sampling.md).
#include <cmath>
#include <random>

#include <opbridge/op.h>
#include <opbridge/segments.h>

#include "fps_kernel.h"

namespace opbridge {
namespace {

// NaN and infinite coordinates have no distance order: refused, naming the first.
template <typename T>
void check_finite(const TensorView& t, const char* name) {
  const T* p = t.data_as<T>();
  const int64_t dims = t.dim(-1);
  for (int64_t i = 0; i < t.numel(); ++i)
    OB_CHECK(std::isfinite(static_cast<double>(widen(p[i]))), name, " has a coordinate that is not finite (",
             static_cast<double>(widen(p[i])), " at row ", i / dims, ", column ", i % dims, ")");
}

void check_points(const TensorView& points, const char* name) {
  visit_dtype<float, double, Float16, BFloat16>(points.dtype, [&](auto zero) { check_finite<decltype(zero)>(points, name); });
}

void batched_kernel(KernelContext& ctx, const TensorView& xyz, int64_t npoint, int64_t tie_threads,
                    bool skip_near_origin, TensorView& idx) {
  const int64_t b = xyz.dim(0), n = xyz.dim(1);
  OB_CHECK(n > 0 || npoint == 0 || b == 0, "xyz has no points to sample ", npoint, " from");
  check_points(xyz, "xyz");
  std::vector<fps::Segment> segments;
  for (int64_t i = 0; i < b; ++i) segments.push_back({i * n, n, i * npoint, npoint, 0});
  const TensorView rows{xyz.data, xyz.dtype, {b * n, 3}, {3, 1}};
  fps::sample(ctx, rows, segments, {fps::cuda_threads(n, tie_threads), skip_near_origin, 1e10, true}, idx);
}

void offset_kernel(KernelContext& ctx, const TensorView& xyz, const TensorView& offset, const TensorView& new_offset,
                   int64_t tie_threads, TensorView& idx_out) {
  const std::vector<int64_t> pb = segment_bounds(offset, "offset", xyz.dim(0), "xyz");
  const std::vector<int64_t> qb = segment_bounds(new_offset, "new_offset");
  check_points(xyz, "xyz");
  std::vector<fps::Segment> segments;
  int64_t largest = 0;
  for (size_t i = 0; i + 1 < pb.size(); ++i) {
    const int64_t n = pb[i + 1] - pb[i], m = qb[i + 1] - qb[i];
    OB_CHECK(n > 0 || m == 0, "segment ", i, " of xyz has no points to sample ", m, " from");
    segments.push_back({pb[i], n, qb[i], m, 0});
    largest = std::max(largest, n);
  }
  // pointops gives every segment's block as many threads as the largest segment's.
  TensorView& idx = ctx.allocate_output(idx_out, {qb.back()});
  fps::sample(ctx, xyz, segments, {fps::cuda_threads(largest, tie_threads), false, 1e10, false}, idx);
}

void ratio_kernel(KernelContext& ctx, const TensorView& src, const TensorView& ptr, double ratio, bool random_start,
                  TensorView& idx_out) {
  OB_CHECK(std::isfinite(ratio) && ratio > 0, "ratio must be finite and > 0, got ", ratio);
  const std::vector<int64_t> bounds = segment_pointers(ptr, "ptr", src.dim(0), "src");
  check_points(src, "src");
  std::vector<fps::Segment> segments;
  int64_t total = 0;
  std::mt19937_64 random(random_start ? std::random_device{}() : 0);
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    const int64_t n = bounds[i + 1] - bounds[i];
    // ceil(n * ratio) in float32, as torch_cluster and pyg-lib compute it; a ratio far above 1
    // could ask for more samples than any output holds (or than int64 counts).
    const float want = n > 0 ? std::ceil(static_cast<float>(n) * static_cast<float>(ratio)) : 0.0f;
    OB_CHECK(want <= 0x1p62f && static_cast<int64_t>(want) <= (int64_t{1} << 62) - total, "ratio ", ratio,
             " asks for ", want, " samples of segment ", i, " (", n, " points): more than an output can hold");
    const int64_t start = random_start && n > 0 ? static_cast<int64_t>(random() % static_cast<uint64_t>(n)) : 0;
    segments.push_back({bounds[i], n, total, static_cast<int64_t>(want), start});
    total += segments.back().samples;
  }
  TensorView& idx = ctx.allocate_output(idx_out, {total});
  fps::sample(ctx, src, segments, {0, false, INFINITY, false}, idx);
}

}  // namespace

OPBRIDGE_OP(furthest_point_sampling)
    .doc("Furthest point sampling of each batch item (pointnet2_ops' furthest_point_sample): from point 0, "
         "repeatedly the point whose squared distance to the points picked so far is largest.")
    .types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    .input("xyz", "T", "(B, N, 3) points", 3)
    .sym_int_attr("npoint", "points to pick per batch item (often computed from N: a graph value in ONNX)")
    .int_attr("tie_threads", 512,
              "equal distances are broken as pointnet2_ops' CUDA block of this many threads breaks them (openpoints: "
              "1024); 0: the lowest index")
    .bool_attr("skip_near_origin", true,
               "as pointnet2_ops, never pick a point with x² + y² + z² <= 1e-3 after the first (openpoints: false)")
    .check(dim("xyz", 2) == 3, "xyz must be (B, N, 3)")
    .check(attr("npoint") >= 0, "npoint must be >= 0")
    .check(attr("tie_threads") >= 0, "tie_threads must be >= 0")
    .output("idx", DType::Int32, shape::dims({dim("xyz", 0), attr("npoint")}),
            "(B, npoint) indices into each batch item's points, in the order picked")
    .cpu(batched_kernel)
    // FurthestPointSampling.forward(ctx, xyz, npoint), in pointnet2_ops and in openpoints' copy
    // (whose CUDA kernel runs 1024 threads and takes points near the origin like any other).
    .replaces("pointnet2_ops.pointnet2_utils.FurthestPointSampling", {"xyz", "npoint"})
    .replaces("openpoints.models.layers.subsample.FurthestPointSampling", {"xyz", "npoint"},
              {{"tie_threads", int64_t{1024}}, {"skip_near_origin", false}})
    // mmcv's, whose Python allocates CUDA tensors: on a CPU it runs only substituted. Its kernel
    // is openpoints' (1024 threads, no skipping).
    .replaces("mmcv.ops.furthest_point_sample.FurthestPointSampling", {"xyz", "npoint"},
              {{"tie_threads", int64_t{1024}}, {"skip_near_origin", false}});

OPBRIDGE_OP(furthest_point_sampling_with_dist)
    .doc("Furthest point sampling of each batch item over a given distance matrix (mmcv's "
         "furthest_point_sample_with_dist, 3DSSD's feature-space FPS): from point 0, repeatedly the point whose "
         "smallest distance to the points picked so far, read from row j of the matrix for pick j, is largest.")
    .types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    .input("dist", "T", "(B, N, N) distances: dist[b, i, k] from point i to point k", 3)
    .sym_int_attr("npoint", "points to pick per batch item")
    .int_attr("tie_threads", 1024,
              "equal distances are broken as mmcv's CUDA block of this many threads breaks them; 0: the lowest index")
    .check(dim("dist", 2) == dim("dist", 1), "dist must be (B, N, N)")
    .check(attr("npoint") >= 0, "npoint must be >= 0")
    .check(attr("tie_threads") >= 0, "tie_threads must be >= 0")
    .output("idx", DType::Int32, shape::dims({dim("dist", 0), attr("npoint")}),
            "(B, npoint) indices into each batch item's points, in the order picked")
    .cpu(fps_with_dist_kernel)
    // FurthestPointSamplingWithDist.forward(ctx, points_dist, num_points): its Python allocates on
    // the CPU, so it also runs eagerly on mmcv._ext; substituted, it exports as this one node.
    .replaces("mmcv.ops.furthest_point_sample.FurthestPointSamplingWithDist", {"dist", "npoint"});

OPBRIDGE_OP(furthest_point_sampling_offset)
    .doc("Furthest point sampling of each segment of a batch given by cumulative ends (Pointcept's pointops "
         "farthest_point_sampling): new_offset[i] - new_offset[i-1] points of segment i, from its first point.")
    .types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    .types("I", {DType::Int32, DType::Int64})
    .input("xyz", "T", "(n, 3) points", 2)
    .input("offset", "I", "(b,) cumulative end row of each segment of xyz", 1)
    .input("new_offset", "I", "(b,) cumulative number of picks of each segment", 1)
    .int_attr("tie_threads", 1024, "equal distances are broken as pointops' CUDA block of this many threads breaks "
                                   "them; 0: the lowest index")
    .check(dim("xyz", 1) == 3, "xyz must be (n, 3)")
    .check(dim("new_offset", 0) == dim("offset", 0), "new_offset must have one entry per segment of offset")
    .check(attr("tie_threads") >= 0, "tie_threads must be >= 0")
    .output("idx", DType::Int32, shape::dims({data_dependent()}),
            "(new_offset[-1],) rows of xyz, segment by segment, each in the order picked")
    .cpu(offset_kernel);

OPBRIDGE_OP(furthest_point_sampling_ratio)
    .doc("Furthest point sampling of each segment given by ptr (torch_cluster's and PyG's fps): ceil(n * ratio) "
         "points of a segment of n, from its first point (or a random one), ties to the lowest index.")
    .types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    .types("P", {DType::Int32, DType::Int64})
    .input("src", "T", "(n, d) points, any number of coordinates", 2)
    .input("ptr", "P", "(b + 1,) first row of each segment, then n", 1)
    .float_attr("ratio", 0.5, "the share of each segment's points to pick, computed as ceil(float32(n) * ratio)")
    .bool_attr("random_start", false, "start each segment at a random point (this op's own random numbers)")
    .output("idx", DType::Int64, shape::dims({data_dependent()}),
            "(sum of ceil(n_i * ratio),) rows of src, segment by segment, each in the order picked")
    .random_when("random_start")
    .cpu(ratio_kernel);

}  // namespace opbridge
